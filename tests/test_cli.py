"""Every `jaxpace` subcommand is wired, has help, and runs (or fails clearly) end to end."""

import json
import subprocess
import sys

import pytest
from conftest import REPO

SUBCOMMANDS = ["launch", "demo", "report", "simulate", "topo"]


def jaxpace(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "jaxpace", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def test_top_level_help_lists_every_subcommand():
    proc = jaxpace("--help")
    assert proc.returncode == 0
    for name in SUBCOMMANDS:
        assert name in proc.stdout


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_subcommand_help(name):
    proc = jaxpace(name, "--help")
    assert proc.returncode == 0, proc.stderr
    assert f"jaxpace {name}" in proc.stdout


def test_simulate_runs_and_writes_json(tmp_path):
    out = tmp_path / "sim.json"
    proc = jaxpace(
        "simulate", "--nodes", "2,4", "--scenario", "pure-bsp", "--steps", 100, "--json", out
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data  # one entry per node count and pacing setting
    assert "pure-bsp" in proc.stdout


def test_simulate_bad_scenario_is_a_clear_error():
    proc = jaxpace("simulate", "--nodes", "2", "--scenario", "nope")
    assert proc.returncode == 2
    assert "paper" in proc.stderr and "Traceback" not in proc.stderr


def test_topo_on_a_machine_without_gpus_says_so():
    proc = jaxpace("topo")
    assert proc.returncode == 0, proc.stderr
    assert "flat topology" in proc.stdout or "No GPU topology" in proc.stdout


def test_report_on_synthetic_records(tmp_path):
    from jaxpace import report

    recs = report.synthetic_records(4, 40, late_rank=2, late_s=0.01, seed=1)
    run = tmp_path / "run"
    run.mkdir()
    with open(run / "records-p0.jsonl", "w") as f:
        for r in recs.to_dicts() if hasattr(recs, "to_dicts") else recs:
            f.write(json.dumps(r) + "\n")
    proc = jaxpace("report", run)
    assert proc.returncode == 0, proc.stderr
    assert (run / "report.html").exists() and (run / "trace.json").exists()


def test_report_on_missing_dir_is_a_clear_error(tmp_path):
    proc = jaxpace("report", tmp_path / "nope")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_demo_rejects_bad_options_clearly():
    proc = jaxpace("demo", "--processes", "1")
    assert proc.returncode == 2
    assert "`--processes` must be in [2, 16]" in proc.stderr
