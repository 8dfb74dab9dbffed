"""Every code block of README.md and docs/ marked `<!-- runnable -->` runs as written, so the
README cannot drift from the code; the README stays short (under 250 lines)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MARKED = re.compile(r"<!-- runnable -->\n```python\n(.*?)```", re.S)


def _blocks() -> list[tuple[str, int, str]]:
    out = []
    for md in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for i, code in enumerate(MARKED.findall(md.read_text())):
            out.append((md.relative_to(REPO).as_posix(), i, code))
    return out


BLOCKS = _blocks()


def test_the_readme_marks_its_examples_runnable_and_stays_short():
    readme = [b for b in BLOCKS if b[0] == "README.md"]
    assert len(readme) >= 2, "README.md's watch and exporter examples are marked runnable"
    assert any("jaxpace.watch(" in code for _, _, code in readme)
    assert len((REPO / "README.md").read_text().splitlines()) < 250


@pytest.mark.timeout(300)
@pytest.mark.parametrize("where,index,code", BLOCKS, ids=[f"{w}[{i}]" for w, i, _ in BLOCKS])
def test_a_runnable_block_runs_as_written(tmp_path, where, index, code):
    (tmp_path / "block.py").write_text(code)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [sys.executable, "block.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, (
        f"{where} block {index}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    )
