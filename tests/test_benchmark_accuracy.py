"""`python -m benchmarks accuracy`: the quick path runs on a tiny grid and the block's format."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

accuracy = pytest.importorskip("benchmarks.accuracy")

DOC = Path(__file__).resolve().parents[1] / "docs" / "diagnostics.md"


def test_fleet_run_is_clock_free_and_loses_lines():
    whole = accuracy.fleet_run(8, 12, sites=2, seed=3)
    assert len(whole) == 8 * 12 * 2
    c = whole.columns
    assert (c["wait_ns"] == c["done_ns"] - c["arrive_ns"]).all()
    lossy = accuracy.fleet_run(8, 12, sites=2, lost=0.05, seed=3)
    assert 0 < len(lossy) < len(whole)


def test_quick_path_on_a_tiny_grid_writes_a_block_with_run_counts(tmp_path):
    doc = tmp_path / "diagnostics.md"
    doc.write_text("# Diagnostics\n\ntext before\n")
    rc = accuracy.main(
        ["--quick", "--runs", "1", "--steps", "20", "--ranks", "8", "--doc", str(doc)]
    )
    assert rc == 0
    text = doc.read_text()
    assert text.startswith("# Diagnostics\n\ntext before\n")
    block = text.split(accuracy.BEGIN, 1)[1].split(accuracy.END, 1)[0]
    rows = [ln for ln in block.splitlines() if accuracy.BLOCK_ROW.match(ln)]
    # 8 ranks (no host case: one host) x 2 site counts x 2 loss rates x (healthy + 5 sizes)
    assert len(rows) == 2 * 2 * (1 + len(accuracy.SLOWDOWNS)) == 24
    assert all("(n=" in r for r in rows)
    assert "Quick run" in block and "without `--quick`" in block
    # a second run replaces the block instead of adding one
    accuracy.main(["--quick", "--runs", "1", "--steps", "20", "--ranks", "8", "--doc", str(doc)])
    assert doc.read_text().count(accuracy.BEGIN) == 1
    fresh = tmp_path / "new" / "accuracy.md"
    fresh.parent.mkdir()
    accuracy.write_block(accuracy.BEGIN + "\n" + accuracy.END, fresh)
    assert fresh.read_text().count(accuracy.BEGIN) == 1


def test_a_big_lag_on_a_small_job_is_named_right_at_the_first_prefix():
    late = accuracy.run_cell(8, 1, 0.0, 0.50, runs=1, steps=40)  # 1.5x: worth naming
    assert late["runs"][0]["found"] and late["runs"][0]["all_right"]
    assert late["runs"][0]["first"] == 10


def test_the_committed_block_has_the_documented_format():
    text = DOC.read_text()
    assert text.count(accuracy.BEGIN) == 1 and text.count(accuracy.END) == 1
    block = text.split(accuracy.BEGIN, 1)[1].split(accuracy.END, 1)[0]
    assert re.search(r"\d+ run\(s\) per cell", block)
    rows = [ln for ln in block.splitlines() if ln.startswith("| ") and not ln.startswith("| ranks")]
    assert rows and all(accuracy.BLOCK_ROW.match(r) for r in rows)
    for r in rows:
        cells = [c.strip() for c in r.strip("|").split("|")]
        figures = [c for c in cells[5:] if c]
        assert figures and all(
            re.fullmatch(r"(\d+(\.\d+)?%|\d+|-) \(n=\d+\)", c) for c in figures
        ), r


def _strip(row):
    return {k: v for k, v in row.items() if k != "seconds"}


def test_a_budget_run_grows_cells_together_and_resumes_the_same_seeds(tmp_path):
    grid = accuracy.cells(False, [8])
    state: dict = {}
    accuracy.run_budget(grid, 20, 1e9, state, lambda: None, lambda _: None, max_runs=60)
    cells = list(state.values())
    assert len(cells) == len(grid) and all(c["runs"] for c in cells)
    w = [accuracy.weight(c["ranks"], c["late"]) for c in cells]
    n = [len(c["runs"]) for c in cells]
    # round-robin by weight: no cell is ahead of another by more than one pick
    for i in range(len(cells)):
        for j in range(len(cells)):
            assert n[i] / w[i] <= (n[j] + 1) / w[j] + 1e-9
    # healthy cells get HEALTHY_WEIGHT x a late cell's runs (within one pick)
    healthy = [c for c in cells if c["late"] is None]
    assert all(len(h["runs"]) >= len(c["runs"]) for h in healthy for c in cells)
    path = tmp_path / "state.json"
    accuracy.save_state(path, 20, state, 1.0)
    before = {k: [_strip(r) for r in c["runs"]] for k, c in state.items()}
    resumed = accuracy.load_state(path, 20)
    accuracy.run_budget(grid, 20, 1e9, resumed, lambda: None, lambda _: None, max_runs=8)
    for k, rows in before.items():
        after = [_strip(r) for r in resumed[k]["runs"]]
        assert after[: len(rows)] == rows and len(after) >= len(rows)
    grown = next(c for c in resumed.values() if len(c["runs"]) > len(before[c["key"]]))
    i = len(before[grown["key"]])
    again = accuracy.one_run(grown["ranks"], grown["sites"], grown["lost"], grown["late"], i, 20)
    assert _strip(again) == _strip(grown["runs"][i])  # run i's seed, not a fresh one
    with pytest.raises(SystemExit, match="--steps 20"):
        accuracy.load_state(path, 160)


def test_a_budget_run_writes_each_cells_n_and_small_rates_are_not_rounded_to_zero(tmp_path):
    doc = tmp_path / "d.md"
    state = tmp_path / "s.json"
    argv = ["--budget-min", "0.01", "--ranks", "8", "--steps", "20", "--state", str(state)]
    assert accuracy.main([*argv, "--doc", str(doc)]) == 0
    block = doc.read_text().split(accuracy.BEGIN, 1)[1]
    assert "--budget-min M --state F" in block and re.search(
        r"between \d+ and \d+ run\(s\) per cell", block
    )
    assert accuracy._frac((1, 1000)) == "0.1% (n=1000)"
    assert accuracy._frac((0, 3000)) == "0% (n=3000)"
    assert accuracy._frac((3, 40)) == "8% (n=40)"


def test_healthy_cells_are_checked_against_the_target_with_their_bound():
    def cell(k, n):
        rows = [{"named": i < k} for i in range(n)]
        return {"ranks": 8, "sites": 1, "lost": 0.0, "late": None, "steps": 160, "runs": rows}

    lines = accuracy.target_lines([cell(0, 3000), cell(0, 300), cell(16, 380)])
    assert "meets it" in lines[0] and "0 of 3000" in lines[0]
    assert "not shown: 300 runs" in lines[1]
    assert "ABOVE the target" in lines[2] and "16 of 380" in lines[2]


def test_a_healthy_run_that_named_someone_is_explained_from_its_seed():
    # Run 821 of the 8-rank, 1-site healthy cell names exactly the fleet's statically
    # slowest rank (1.096x the median): a healthy fleet's slowest rank, not a lag.
    rows = [{"named": False}] * 821 + [{"named": True}]
    c = {"ranks": 8, "sites": 1, "lost": 0.0, "late": None, "steps": 160, "runs": rows}
    text = accuracy.false_alarm_causes([c])
    assert "the 1 such runs" in text and "1 named exactly the rank with the largest" in text
    assert "1.096-1.096x" in text
