"""Issue 47: the records' `execution` column (docs/records.md): how raw ids become
executions, and how files carry them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from jaxpace.records.executions import number_executions
from jaxpace.records.format import NO_EXECUTION, header_record, step_record, write_records
from jaxpace.records.reader import load_records


def _grid(ids_of, processes=2, ranks=2, executions=4, repeats=2):
    """Records of `repeats` calls an execution on each rank; `ids_of(p, e)` the raw id."""
    ids, proc, rank, t = [], [], [], []
    for p in range(processes):
        for r in range(ranks):
            for e in range(executions):
                for j in range(repeats):
                    ids.append(ids_of(p, e))
                    proc.append(p)
                    rank.append(p * ranks + r)
                    t.append(10**6 * p + 1000 * e + 10 * j + r)  # each process's own clock
    return [np.asarray(a, np.int64) for a in (ids, proc, rank, t)]


def test_ids_that_agree_match_by_value_even_when_a_process_lost_the_first():
    ids, proc, rank, t = _grid(lambda p, e: -1846094283 + e)  # JAX's launch ids
    ex, note = number_executions(ids, proc, rank, t)
    assert note is None and np.array_equal(ex, ids + 1846094283)
    keep = ~((proc == 1) & (ids == ids.min()))  # process 1's ring lost execution 0
    ex, note = number_executions(ids[keep], proc[keep], rank[keep], t[keep])
    assert note is None and np.array_equal(ex, ids[keep] + 1846094283)


def test_ids_numbered_per_process_match_by_order_and_say_so():
    ids, proc, rank, t = _grid(lambda p, e: 1000 * (p + 1) + 7 * e)
    ex, note = number_executions(ids, proc, rank, t)
    assert np.array_equal(ex, (ids % 1000) // 7) and "matched by order" in note


def test_an_id_seen_again_after_another_is_not_an_execution():
    ids, proc, rank, t = _grid(lambda p, e: e % 2)  # 0, 1, 0, 1: reused
    ex, note = number_executions(ids, proc, rank, t)
    assert ex is None and "folds the sites by their step counts" in note


def _write(path, execs):
    head = header_record(
        run_id="r", process_index=0, process_count=1, host="h", pid=1,
        granularity="device", jaxpace_version="0", policy="measure",
        local_devices=[0, 1], rank_groups=None,
    )  # fmt: skip
    steps = [
        step_record(
            site="s",
            step=k,
            rank=r,
            process=0,
            arrive_ns=1000 * k + r,
            done_ns=1000 * k + 500,
            delay_ns=0,
            engaged=False,
            execution=execs(k, r),
        )  # fmt: skip
        for k in range(6)
        for r in range(2)
    ]
    write_records(path, [head, *steps], format="jsonl" if path.suffix == ".jsonl" else "parquet")


@pytest.mark.parametrize("name", ["records-p0.jsonl", "records-p0.parquet"])
def test_files_carry_the_column_and_a_partial_one_is_not_used(tmp_path, name):
    _write(tmp_path / "a" / name, lambda k, r: 50 + k // 2)
    recs = load_records(tmp_path / "a")
    assert np.array_equal(recs.columns["execution"], np.repeat([0, 0, 1, 1, 2, 2], 2) * 1)
    _write(tmp_path / "b" / name, lambda k, r: None if k == 3 else 50 + k)
    recs = load_records(tmp_path / "b")
    assert "execution" not in recs.columns
    assert any("have no `execution` id" in n for n in recs.notes)
    _write(tmp_path / "c" / name, lambda k, r: None)  # older files: no column, no note
    recs = load_records(tmp_path / "c")
    assert "execution" not in recs.columns and not recs.notes
    assert recs.to_dicts()[1].get("execution") is None
    assert NO_EXECUTION not in recs.columns["step"]


def test_a_bad_execution_value_names_the_field(tmp_path):
    _write(tmp_path / "records-p0.jsonl", lambda k, r: k)
    lines = (tmp_path / "records-p0.jsonl").read_text().splitlines()
    rec = json.loads(lines[1])
    rec["execution"] = "7"
    lines[1] = json.dumps(rec)
    (tmp_path / "records-p0.jsonl").write_text("\n".join(lines) + "\n")
    # Read through the engine: the line is dropped, counted and located, never cast.
    recs = load_records(tmp_path)
    assert any(
        "records-p0.jsonl:2" in n and "`execution` must be an integer" in n for n in recs.notes
    )
    assert len(recs) == len(lines) - 2
