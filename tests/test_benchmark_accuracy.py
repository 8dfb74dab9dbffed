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
    # 8 ranks (no host case: one host) x 2 site counts x 2 loss rates x (healthy + 4 sizes)
    assert len(rows) == 2 * 2 * 5
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
    late = accuracy.run_cell(8, 1, 0.0, 0.20, runs=1, steps=40)
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
        assert figures and all(re.fullmatch(r"(\d+%|\d+|-) \(n=\d+\)", c) for c in figures), r
