"""README's exporter example, run as written: every one of its 100 steps reaches both sinks."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

prom_parser = pytest.importorskip("prometheus_client.parser")
pytest.importorskip("tensorboardX")

REPO = Path(__file__).resolve().parent.parent


def _example() -> str:
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    found = [b for b in blocks if "jaxpace.sinks.prometheus_textfile(" in b]
    assert len(found) == 1, "README must have exactly one exporter example"
    return found[0]


def test_readme_exporter_example_shows_close():
    assert "pacer.close()" in _example()


@pytest.mark.timeout(300)
def test_readme_exporter_example_runs_as_written_and_loses_nothing(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (tmp_path / "example.py").write_text(_example())
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [sys.executable, "example.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (tmp_path / "run" / "jaxpace-0.prom").read_text()
    fams = {f.name: f.samples for f in prom_parser.text_string_to_metric_families(text)}
    assert [s.value for s in fams["jaxpace_steps_measured"]] == [100.0]
    acc = EventAccumulator(str(tmp_path / "run" / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    assert len(acc.Scalars("jaxpace/grads/wait_ms/rank0")) == 100
