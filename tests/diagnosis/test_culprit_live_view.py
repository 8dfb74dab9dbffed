"""The runtime's live view (`stats()`, sink summaries) carries the report's culprit decision."""

import math

from psum_step import run_psum

import jaxpace as jp


def test_stats_has_the_decision_and_arrived_last_counts_from_the_exchange():
    got = []
    pacer = jp.Pacer(
        granularity="device",
        policy=jp.adaptive(warmup_steps=1000),  # exchanges waits, never paces here
        sinks=[got.append],
    )
    run_psum(pacer, "s", 12)
    pacer.flush()
    s = pacer.stats()["s"]
    assert len(s.arrived_last) == len(s.arrived_last_top1pct) == 8
    exchanged = sum(s.arrived_last)
    assert 2 <= exchanged <= 12  # one count per exchanged step, not one per local rank
    assert s.arrived_last == s.arrived_last_top1pct  # 8 ranks: the latest 1% is the last one
    assert 2 <= s.culprit_window_steps <= exchanged
    assert len(s.fleet_sd) == 8 and all(math.isfinite(v) or math.isinf(v) for v in s.fleet_sd)
    assert all(0 <= r < 8 for r in s.culprits)
    with_exchange = [g for g in got if g["earliness_s"] is not None]
    assert with_exchange and all("step_time_s" in g for g in got)
    pacer.close()


def test_stats_without_an_exchange_decide_nothing():
    pacer = jp.Pacer(granularity="device")  # measure only: no waits exchanged
    run_psum(pacer, "m", 4)
    s = pacer.stats()["m"]
    assert s.culprits == [] and s.culprit_window_steps == 0 and s.arrived_last == []
    pacer.close()
