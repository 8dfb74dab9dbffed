"""Truncation is never silent: an export that lost steps to the ring says so, and the report prints it (issue #32 item 11)."""

from __future__ import annotations

import json
import logging

import pytest
from psum_step import run_psum

import jaxpace as jp
from jaxpace.errors import RecordsError
from jaxpace.records.synthetic import synthetic_records
from jaxpace.report import analyze, load_records


def _run(pacer: jp.Pacer, steps: int) -> None:
    run_psum(pacer, "grads", steps, width=2)


@pytest.mark.timeout(300)
def test_an_export_that_kept_only_the_last_capacity_steps_says_so(tmp_path, caplog):
    """After more steps than `capacity`, the header has `truncated` and the report a TRUNCATED note."""
    pacer = jp.Pacer(capacity=8)
    try:
        _run(pacer, 20)
        with caplog.at_level(logging.WARNING, logger="jaxpace"):
            path = pacer.export(tmp_path / "run" / "records-p0.jsonl")
    finally:
        pacer.close(timeout_s=10)
    with open(path) as f:
        head = json.loads(f.readline())
    assert head["truncated"] == {"capacity": 8, "first_step": {"grads": 12}}
    assert any("capacity" in r.getMessage() and "grads" in r.getMessage() for r in caplog.records)
    rep = analyze(tmp_path / "run", warmup_steps=0)
    note = [n for n in rep.notes if n.startswith("TRUNCATED:")]
    assert len(note) == 1 and "last 8 steps" in note[0] and "`grads` from step 12" in note[0]
    assert "capacity=" in note[0]


@pytest.mark.timeout(300)
def test_an_export_within_capacity_has_no_truncation(tmp_path):
    pacer = jp.Pacer(capacity=64)
    try:
        _run(pacer, 10)
        path = pacer.export(tmp_path / "records-p0.jsonl")
    finally:
        pacer.close(timeout_s=10)
    with open(path) as f:
        assert "truncated" not in json.loads(f.readline())


def test_a_malformed_truncated_field_names_it():
    recs = synthetic_records(2, 20)
    recs[0]["truncated"] = {"capacity": "big", "first_step": {}}
    with pytest.raises(RecordsError, match="`truncated`"):
        load_records(recs)
