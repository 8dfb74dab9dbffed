"""Issue 47, "one number per fact": one cost figure per culprit, no one-spike mode, one
transfer share, each sentence once, and words that agree with the decision."""

from __future__ import annotations

import io
import re

from rich.console import Console

from jaxpace.report import analyze, print_summary, synthetic_records
from jaxpace.report.advice import next_steps
from jaxpace.report.fleet_view import slowest_rows
from jaxpace.report.render.html import render_report_html


def _text(rep, verbose=True) -> str:
    buf = io.StringIO()
    print_summary(rep, Console(file=buf, width=200), verbose=verbose)
    return buf.getvalue()


def _spiky(n_spikes: int, extra_ns: int = 100_000_000) -> list[dict]:
    """A healthy 8-rank run whose collective takes `extra_ns` longer on `n_spikes` steps
    (every rank leaves late; later steps shift with it, so compute is unchanged)."""
    recs = synthetic_records(8, 60, seed=4)
    spikes = list(range(30, 30 + 7 * n_spikes, 7))
    for r in recs:
        if r["type"] == "step":
            shift = extra_ns * sum(r["step"] > s for s in spikes)
            r["arrive_ns"] += shift
            r["done_ns"] += shift + (extra_ns if r["step"] in spikes else 0)
            r["wait_ns"] = r["done_ns"] - r["arrive_ns"]
    return recs


def test_a_culprit_late_with_its_process_has_one_cost_everywhere():
    # Both devices of process 1 late (the demo's shape): the summary said "if rank 3 ran
    # like the median: 1.4% faster" above the process decision's 13.8%.
    rep = analyze(synthetic_records(8, 60, late_rank=[2, 3], late_s=0.004, ranks_per_process=2))
    assert rep.culprit_process == 1
    cost = next(w for w in rep.costs if w.target == "process 1")
    assert rep.what_if.target == "process 1"
    assert rep.what_if.saving_s == cost.saving_s
    pct = f"{cost.saving_fraction:.1%}"
    text = _text(rep, verbose=False)
    assert "if process 1 ran like the median" in text and f"({pct} faster)" in text
    assert any(pct in line for line in next_steps(rep))
    assert any(pct in d for d in rep.decisions)
    assert pct in render_report_html(rep)
    percents = set(re.findall(r"(\d+\.\d)% faster", text))
    assert percents == {pct[:-1]}, percents


def test_one_spike_is_an_event_not_a_mode():
    rep = analyze(_spiky(1))
    m = rep.mode("topology_contention")
    assert not m.detected and m.score == 0.0 and rep.primary_mode == "balanced"
    assert any("one spike (step 30) is an event" in e for e in m.evidence)
    assert "topology_contention (1.00)" not in _text(rep, verbose=False)
    three = analyze(_spiky(3)).mode("topology_contention")
    assert three.detected and three.score == 1.0


def test_the_transfer_share_is_one_figure():
    rep = analyze(_spiky(4, extra_ns=20_000_000))
    ev = rep.mode("topology_contention").evidence[0]
    share = re.search(r": (\d+)% of the step", ev)[1]
    advice = next(line for line in next_steps(rep) if "moving data" in line)
    assert f"({share}% moving data" in advice


def test_the_straggler_sentence_is_said_once():
    rep = analyze(synthetic_records(8, 60, late_rank=3, late_s=0.002, seed=1))
    text = _text(rep)
    assert text.count("later than the median rank (95% CI") == 1
    assert text.count("last in 100%") <= 2  # the headline's short form and the decision


def test_an_unnamed_rank_on_a_small_job_is_below_its_line_not_within_the_spread():
    # 9 SDs out on a small job (the line there is 9.7 SDs or 10% of the step): not named,
    # and "within normal spread" beside a named rank a few SDs further out contradicted it.
    g = {r: f"g{r}" for r in range(8)}
    rep = analyze(synthetic_records(8, 60, groups=g, group_late_s={"g1": 0.0005, "g0": 0.0004}))
    assert rep.culprits == () and rep.fleet.rule == "small job"
    verdicts = [row[4] for row in slowest_rows(rep)[1:]]
    assert verdicts and all("normal spread" not in v for v in verdicts)
    assert "below the line this job's size names" in verdicts[0]
    assert "normal spread" not in " ".join(rep.decisions)
    assert "normal spread" not in rep.mode("persistent_straggler").evidence[0]
