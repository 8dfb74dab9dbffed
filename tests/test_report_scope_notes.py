"""Issue 47: where the clock-free rule holds. Sites whose ranks do not finish together
(broadcast, all-to-all, point-to-point) and GPU async collectives get a note saying so."""

from __future__ import annotations

import io

from rich.console import Console

from jaxpace.records.reader import load_records
from jaxpace.report import analyze, print_summary, synthetic_records
from jaxpace.report.advice import scope_notes
from jaxpace.report.render.html import render_report_html


def _two_sites(second: str):
    first = synthetic_records(4, 30, site="train.py:10:grads_psum", seed=1)
    more = [r for r in synthetic_records(4, 30, site=second, seed=2) if r["type"] != "header"]
    return load_records(first + more)


def _summary(rep) -> str:
    buf = io.StringIO()
    print_summary(rep, Console(file=buf, width=150))
    return buf.getvalue()


def test_a_broadcast_site_is_named_as_evidence_only():
    rep = analyze(_two_sites("train.py:20:params_broadcast"), site="train.py:10:grads_psum")
    notes = scope_notes(rep)
    assert len(notes) == 1 and notes[0].startswith("SCOPE: the clock-free rule needs")
    assert "broadcast: `train.py:20:params_broadcast`" in notes[0]
    assert "evidence only" in notes[0]
    assert "SCOPE: the clock-free rule needs" in " ".join(_summary(rep).split())
    assert "SCOPE: the clock-free rule" in render_report_html(rep)


def test_the_analyzed_site_being_point_to_point_says_check_elsewhere():
    rep = analyze(_two_sites("train.py:30:ring_ppermute"), site="train.py:30:ring_ppermute")
    (note,) = scope_notes(rep)
    assert "point-to-point" in note and "check it at an all-reduce" in note


def test_all_reduce_only_runs_get_no_note():
    rep = analyze(synthetic_records(4, 30, seed=1))
    assert scope_notes(rep) == ()
    assert "SCOPE:" not in _summary(rep)


def test_a_gpu_async_collective_says_what_its_time_holds(tmp_path):
    recs = synthetic_records(4, 30, site="jit_step/all-reduce-start.1", seed=1)
    for r in recs:
        if r["type"] == "header":
            r["platform"] = "gpu"
    rep = analyze(recs)
    (note,) = scope_notes(rep)
    assert "asynchronously beside compute" in note and "upper bound" in note
    cpu = analyze(synthetic_records(4, 30, site="jit_step/all-reduce-start.1", seed=1))
    assert scope_notes(cpu) == ()  # on CPU the collective runs in line
