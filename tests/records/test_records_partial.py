"""Issue 46: partial steps are used; at fleet scale data is always partial.

Each step compares the ranks present in it; a missing rank is neither late nor
early there; the report says how much was missing and never refuses for it; a
run where no step has two ranks is the only refusal. Every case is read from
Parquet and from JSONL, with the same result.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from jaxpace.errors import RecordsError
from jaxpace.records.format import records_filename, write_records
from jaxpace.records.reader import Records
from jaxpace.records.synthetic import synthetic_run
from jaxpace.report import analyze

LATE = 700


def _drop(recs: Records, drop: np.ndarray) -> Records:
    return dataclasses.replace(recs, columns={k: v[~drop] for k, v in recs.columns.items()})


def _both(tmp_path, recs: Records):
    """The report of `recs` written as Parquet and as JSONL (the same, asserted)."""
    recs.write_parquet(tmp_path / "pq")
    recs.write_jsonl(tmp_path / "js")
    a, b = analyze(tmp_path / "pq"), analyze(tmp_path / "js")
    assert (a.culprit, a.analyzed_steps, a.notes) == (b.culprit, b.analyzed_steps, b.notes)
    return a


@pytest.fixture(scope="module")
def fleet() -> Records:
    # 1024 ranks, 8 per process; rank 700 computes 3 ms longer every step.
    return synthetic_run(1024, 60, late_rank=LATE, late_s=0.003, seed=0, ranks_per_process=8)


def _missing_note(rep) -> str:
    [note] = [n for n in rep.notes if "(step, rank) records" in n]
    return note


def test_one_percent_of_lines_lost_at_1024_ranks_still_names_the_culprit(tmp_path, fleet):
    rng = np.random.default_rng(1)
    rep = _both(tmp_path, _drop(fleet, rng.random(len(fleet)) < 0.01))
    assert rep.culprit == LATE and rep.partial
    # Before: "no step with records from all 1024 ranks; nothing to compare" (0.99^1024).
    assert rep.analyzed_steps >= 0.9 * (rep.num_steps - rep.warmup_steps)
    assert rep.num_steps == 60
    note = _missing_note(rep)
    m = re.search(r"(\d+) of (\d+) \(step, rank\) records .* are missing \(([\d.]+)%\)", note)
    assert m and int(m[2]) == 60 * 1024 and 0.8 < float(m[3]) < 1.2, note
    assert "compares the ranks present in it" in note and "of 1024" in note


def test_the_late_ranks_own_lines_lost_it_is_still_named_and_the_loss_stated(tmp_path, fleet):
    rng = np.random.default_rng(2)
    c = fleet.columns
    own = (c["rank"] == LATE) & (rng.random(len(fleet)) < 0.4)  # its writer was cut
    rep = _both(tmp_path, _drop(fleet, own))
    assert rep.culprit == LATE and rep.partial
    note = _missing_note(rep)
    assert f"Most missing: rank {LATE}: {int(own.sum())}" in note, note


def test_a_rank_missing_from_most_steps_is_named(tmp_path):
    recs = synthetic_run(8, 40, late_rank=2, late_s=0.004, seed=3)
    c = recs.columns
    gone = (c["rank"] == 5) & (c["step"] % 4 != 0)  # rank 5 kept 1 step in 4
    rep = _both(tmp_path, _drop(recs, gone))
    assert rep.culprit == 2 and rep.num_steps == 40
    assert any("missing from most steps" in n and "5 (75%)" in n for n in rep.notes), rep.notes


def test_no_step_with_two_ranks_is_the_only_refusal(tmp_path):
    recs = synthetic_run(4, 12, seed=0)
    c = recs.columns
    alone = c["rank"] != c["step"] % 4  # each step kept by one rank only
    _drop(recs, alone).write_parquet(tmp_path)
    with pytest.raises(RecordsError, match="no step with records of two or more ranks"):
        analyze(tmp_path)


def test_a_record_with_a_rank_outside_the_headers_is_dropped_and_noted(tmp_path):
    """Issue 49 item 6: one such record made the whole report refuse ("no step with records
    from all 9 ranks ... records of different sites or runs mixed")."""
    recs = synthetic_run(8, 30, late_rank=3, late_s=0.004, seed=2)
    dicts = recs.to_dicts()
    stray = dict(dicts[-1], rank=12, step=7)  # process 7's file, a rank the run has not
    dicts.append(stray)
    for f in ("parquet", "jsonl"):
        for p in range(8):
            mine = [d for d in dicts if d.get("process", d.get("process_index")) == p]
            write_records(tmp_path / f / records_filename(p, f), mine, f)
    for d in ("parquet", "jsonl"):
        rep = analyze(tmp_path / d)
        assert rep.culprit == 3 and rep.partial and rep.num_ranks == 8
        [note] = [n for n in rep.notes if "outside the run's ranks" in n]
        assert "dropped 1 step record(s)" in note and "rank 12 at step 7" in note
        assert "records-p7" in note, note


def test_integers_beyond_int64_range_are_dropped_and_noted_never_a_traceback(tmp_path):
    """Issue 49 item 4, for jaxpace's own records: a 2^64 `wait_ns` raised OverflowError."""
    recs = synthetic_run(4, 20, late_rank=1, late_s=0.01, seed=0)
    recs.write_jsonl(tmp_path / "js")
    f = tmp_path / "js" / "records-p2.jsonl"
    lines = f.read_text().splitlines(keepends=True)
    lines[3] = lines[3].replace('"wait_ns":', f'"wait_ns":{2**64},"was":')
    f.write_text("".join(lines))
    rep = analyze(tmp_path / "js")
    assert rep.culprit == 1 and rep.partial
    assert any("skipped 1 step record(s) with an integer beyond the int64" in n and ":4" in n
               for n in rep.notes), rep.notes  # fmt: skip
    # Parquet: the same bound (no wrap when the report subtracts times).
    big = dataclasses.replace(recs, columns={**recs.columns})
    big.columns["arrive_ns"] = big.columns["arrive_ns"].copy()
    big.columns["arrive_ns"][5] = -(2**63)
    big.write_parquet(tmp_path / "pq")
    rep = analyze(tmp_path / "pq")
    assert rep.culprit == 1 and rep.partial
    assert any("beyond the int64 range" in n and "row " in n for n in rep.notes), rep.notes


def test_the_sites_table_uses_partial_steps_too(tmp_path):
    """Every step of a site lacked some rank at 256 ranks x 1% lost: the sites table,
    which compared complete steps only, had 2 and 5 steps left of 35."""
    from jaxpace.records.reader import load_records

    a = synthetic_run(256, 40, late_rank=7, late_s=0.003, seed=0, site="a")
    b = synthetic_run(256, 40, late_rank=7, late_s=0.003, seed=1, site="b")
    recs = load_records(a.to_dicts() + [d for d in b.to_dicts() if d["type"] == "step"])
    lost = np.random.default_rng(1).random(len(recs)) < 0.01
    rep = _both(tmp_path, _drop(recs, lost))
    assert rep.culprit == 7
    assert [(r.site, r.steps, [g.rank for g in r.late]) for r in rep.sites_table] == [
        ("b", 35, [7]),
        ("a", 35, [7]),
    ]
