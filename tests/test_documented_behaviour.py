"""Issue 26, item 8: the documented behaviour and the code agree.

- `jaxpace_culprit_last_fraction` is -1 without an exchange (docs/api.md), not NaN;
- `SiteStats.steps` counts steps, not rank-steps, at `granularity="device"`;
- `jaxpace report FOLDER_OF_RUNS` lists the runs (the README's way to list them)
  and exits 0, without `error:`.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import prometheus_client.parser as prom_parser  # the dev extra installs it
from conftest import REPO, run_report
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxpace as jp
import jaxpace.sinks
from jaxpace.records.synthetic import synthetic_run


def test_culprit_last_fraction_is_minus_one_without_an_exchange(tmp_path):
    prom = jaxpace.sinks.prometheus_textfile(tmp_path / "m.prom", write_every_s=0)
    prom({"site": "grads", "step": 0, "rank": 0, "wait_s": 0.004, "delay_s": 0.0,
          "engaged": False, "earliness_s": None})  # fmt: skip
    text = Path(prom.path).read_text()
    fams = {f.name: f for f in prom_parser.text_string_to_metric_families(text)}
    (value,) = [s.value for s in fams["jaxpace_culprit_last_fraction"].samples]
    assert value == -1.0 and not math.isnan(value)
    (rank,) = [s.value for s in fams["jaxpace_culprit_rank"].samples]
    assert rank == -1
    api = (REPO / "docs" / "api.md").read_text()
    (row,) = [ln for ln in api.splitlines() if ln.startswith("| `jaxpace_culprit_last_fraction`")]
    assert "-1" in row, row


def test_site_stats_steps_counts_steps_at_device_granularity():
    mesh = jax.make_mesh((8,), ("data",))
    pacer = jp.Pacer(granularity="device", mesh=mesh)
    f = jax.jit(
        jax.shard_map(
            lambda x: pacer.psum(x, "data", site="s"), mesh=mesh, in_specs=P("data"), out_specs=P()
        )
    )
    x = jax.device_put(jnp.ones((8, 2)), NamedSharding(mesh, P("data")))
    for _ in range(10):
        y = f(x)
    np.testing.assert_array_equal(np.asarray(y), np.full((1, 2), 8.0))
    s = pacer.stats()["s"]
    pacer.close()
    assert len(s.ranks) == 8
    assert s.steps == 10  # once 80: rank-steps
    assert s.steps_paced <= s.steps


def test_report_on_a_folder_of_runs_lists_them_and_exits_0(tmp_path):
    for sub in ("diagnose/off", "ab/off", "ab/on"):
        synthetic_run(2, 12, seed=0).write_jsonl(tmp_path / sub)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = run_report(str(tmp_path), env=env)
    assert proc.returncode == 0, proc.stderr
    assert "error" not in proc.stdout + proc.stderr
    assert "holds 3 runs" in proc.stdout
    for sub in ("diagnose/off", "ab/off", "ab/on"):
        assert f"jaxpace report {tmp_path / sub}" in proc.stdout
