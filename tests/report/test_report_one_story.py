"""Issue 26, items 3, 5 and 6: one decision, one story, in every part of the report.

3. A culprit named with high confidence is always in "What to do next", and a
   straggler and contention detected together are ranked by what they cost.
5. No forecast in the advice where the forecast table and plot say none fits.
6. The pacing table compares like with like, or says why it cannot.
"""

from __future__ import annotations

import io
import math
import re

import pytest
from rich.console import Console

from jaxpace.report import analyze, print_summary, synthetic_records
from jaxpace.report.advice import next_steps
from jaxpace.report.render.html import render_report_html
from jaxpace.report.render.tables import forecast_rows, forecast_support, pacing_table


def _text(rep, verbose=True) -> str:
    buf = io.StringIO()
    print_summary(rep, Console(file=buf, width=120), verbose=verbose)
    return buf.getvalue()


def _straggler_and_contention(growth: float):
    """The issue's run: 2 processes, process 1 about 18 ms late every step; transfer grows."""
    recs = synthetic_records(
        2, 30, late_rank=1, late_s=0.018, jitter_s=0.002, transfer_growth=growth, seed=0
    )
    return analyze(recs)


# --------------------------------------------------------------------------- item 3


@pytest.mark.parametrize("growth", [3.0, 30.0])
def test_a_confident_culprit_is_always_in_the_advice(growth):
    rep = _straggler_and_contention(growth)
    assert rep.culprit == 1
    assert rep.mode("persistent_straggler").detected and rep.mode("topology_contention").detected
    steps = next_steps(rep)
    assert any(s.startswith("Rank 1 (process 1") for s in steps), steps
    assert not any("not one rank" in s for s in steps), steps
    # The terminal (short and verbose) and the HTML carry the same advice about rank 1.
    for text in (_text(rep, verbose=False), _text(rep), render_report_html(rep)):
        assert "Rank 1 (process 1" in text
        assert "not one rank" not in text


@pytest.mark.parametrize("growth", [3.0, 30.0])
def test_straggler_and_contention_are_ranked_by_what_they_cost(growth):
    rep = _straggler_and_contention(growth)
    detected = [m for m in rep.failure_modes if m.detected and m.name != "balanced"]
    assert len(detected) == 2 and all(math.isfinite(m.cost_s) for m in detected)
    costliest = max(detected, key=lambda m: m.cost_s)
    assert rep.primary_mode == costliest.name
    first = next_steps(rep)[0]
    assert first.startswith("Rank 1") == (costliest.name == "persistent_straggler")


def test_growing_transfer_with_a_small_straggler_cost_puts_contention_first():
    rep = _straggler_and_contention(30.0)
    assert rep.primary_mode == "topology_contention"
    assert "besides rank 1" in next_steps(rep)[0]


def test_the_issue_case_puts_the_straggler_first():
    """Rank 1 costs 9 ms a step, the growing transfer about 1 ms: the straggler leads."""
    rep = _straggler_and_contention(3.0)
    assert rep.primary_mode == "persistent_straggler"
    assert re.search(r"primary failure mode +persistent_straggler", _text(rep)), _text(rep)


# --------------------------------------------------------------------------- item 5


def test_no_forecast_in_the_advice_where_none_can_be_fitted():
    """2 ranks, 15 steps: the plot says no forecast; the advice once said 54% at 1024."""
    rep = analyze(synthetic_records(2, 15, seed=0))
    assert rep.primary_mode == "balanced"
    top, _, why = forecast_support(rep)
    assert top == 0 and forecast_rows(rep) == []
    for text in (" ".join(next_steps(rep)), _text(rep), render_report_html(rep)):
        assert "scaling efficiency at" not in text and "1024 ranks" not in text


def test_no_note_about_a_forecast_that_is_not_shown():
    rep = analyze(synthetic_records(4, 9, late_rank=1, late_s=0.02, seed=0))
    assert rep.culprit == 1 and forecast_support(rep)[0] == 0  # 28 samples: no rank count
    assert not any("forecast treats" in n for n in rep.notes)


def test_the_advice_forecasts_only_as_far_as_the_table_goes():
    rep = analyze(synthetic_records(16, 200, seed=0, straggler_prob=0.05, straggler_factor=2.0))
    assert rep.primary_mode == "synchronization_amplification"
    top, _, _ = forecast_support(rep)
    assert top >= 8
    line = next(s for s in next_steps(rep) if "grows with scale" in s)
    assert f"at {top} ranks" in line
    assert str(top) == forecast_rows(rep)[-1][0]


# --------------------------------------------------------------------------- item 6


def test_pacing_after_warm_up_is_not_compared_with_the_warm_up():
    """All unengaged steps came before pacing engaged: not a comparison, and it says so."""
    rep = analyze(synthetic_records(4, 60, seed=0, engaged_from_step=20, max_delay_s=0.002))
    p = rep.pacing
    assert p is not None and not p.comparable
    assert "not comparable" in p.caveat and "warm-up" in p.caveat
    assert pacing_table(p)[1][0] == "not engaged (warm-up)"
    assert "not comparable" in _text(rep) and "not comparable" in render_report_html(rep)


def test_pacing_compares_interleaved_steps_only():
    recs = synthetic_records(4, 60, seed=0, engaged_from_step=20, max_delay_s=0.002)
    for r in recs:  # after step 30 the policy disengages every other step
        if r["type"] == "step" and r["step"] >= 30 and r["step"] % 2:
            r["engaged"] = False
    p = analyze(recs).pacing
    assert p.comparable and p.unengaged_steps == 15  # steps 31, 33, ..., 59
    assert "left out" in p.caveat


def test_pacing_on_cpu_says_it_cannot_shorten_a_step():
    recs = synthetic_records(4, 60, seed=0, engaged_from_step=20, max_delay_s=0.002)
    for r in recs:
        if r["type"] == "header":
            r["platform"] = "cpu"
    p = analyze(recs).pacing
    assert "cannot shorten a step" in p.caveat
