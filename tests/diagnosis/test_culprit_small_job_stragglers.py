"""Small jobs (2-15 ranks): several stragglers do not hide each other, healthy fleets name nobody.

Below 16 ranks the fleet test sorts the ranks latest first and tests each of the
latest `(R - 1) // 2` against the mean and SD of the ranks *below* it (a
one-sided generalized ESD test), with per-stage thresholds calibrated on normal
fleets (`SMALL_JOB_THRESHOLDS`, family-wise 0.001). The old leave-one-out test
kept the other stragglers in each one's yardstick: three stragglers 4 ms late
(2x the per-step jitter) among 8 ranks were all missed.
"""

import dataclasses

import numpy as np
import pytest

from jaxpace.diagnosis import culprit as _culprit
from jaxpace.diagnosis.culprit import ALPHA, decide, fleet_test
from jaxpace.report import analyze
from jaxpace.sim import Faults, load_scenario, simulate_records

T = 0.1


def _fleet(R, n, spread, rng, late=(), late_s=0.0, jitter=0.01):
    """(n, R) lateness and the median step: static speeds (lognormal `spread`), per-step jitter,
    ranks `late` `late_s` later every step."""
    a = spread * rng.standard_normal(R)
    extra = np.zeros(R)
    extra[list(late)] = late_s
    comp = T * np.exp(a)[None, :] * np.exp(jitter * rng.standard_normal((n, R))) + extra
    return comp - comp.min(axis=1, keepdims=True), float(np.median(comp.max(axis=1)))


def test_three_stragglers_twice_the_jitter_late_among_eight_are_all_named():
    late = (1, 4, 6)
    for seed in range(20):
        lat, step = _fleet(8, 400, 0.0, np.random.default_rng(seed), late, 0.004, jitter=0.02)
        dec = decide(lat, step)
        assert dec.fleet.rule == "small job"
        assert sorted(dec.culprits) == list(late), (seed, dec.culprits, dec.fleet.distance)


def test_three_stragglers_among_eight_end_to_end():
    # The diagnosis grid's case: simulated records, 2% jitter, three ranks 4 ms late.
    sc = load_scenario("pure-bsp")
    sc = dataclasses.replace(
        sc,
        compute=dataclasses.replace(sc.compute, static_sigma=0.0, jitter_sigma=0.02),
        fabric=dataclasses.replace(sc.fabric, ecmp_flows=0),
    )
    faults = Faults(late_ranks=(0, 3, 5), late_s=0.004)
    for seed in (0, 1):
        run = simulate_records(sc, nodes=1, steps=400, seed=seed, faults=faults)  # 8 ranks
        rep = analyze(run.records, expected_transfer_s=run.expected_transfer_s)
        assert rep.fleet.rule == "small job" and sorted(rep.culprits) == [0, 3, 5], rep.culprits


@pytest.mark.parametrize("R", [4, 8, 12])
def test_healthy_heterogeneous_small_fleets_name_nobody(R):
    # Static per-rank spread 0.5%, 1%, 2% of the step and 1% per-step jitter (benchmarks/fleet.py),
    # 150 seeds each: at a family-wise 0.001, 450 runs name nobody but rarely (P(>= 2) < 0.1%).
    named = 0
    for spread in (0.005, 0.01, 0.02):
        rng = np.random.default_rng([R, int(spread * 1e4), 30])
        for _ in range(150):
            lat, step = _fleet(R, 400, spread, rng)
            named += bool(decide(lat, step).late.any())
    assert named <= 1, named


def test_small_job_thresholds_hold_the_level_on_normal_fleets():
    # Fresh draws (the table was calibrated on another seed): anybody named <=> some stage
    # over its threshold; 200,000 fleets per R, the rate at most 0.001 plus its error.
    for R in range(4, 16):
        r = _culprit.small_job_stages(R)
        x = np.random.default_rng([R, 99]).standard_normal((200_000, R))
        st = _culprit.stage_statistics(-np.sort(-x, axis=1), r)
        rate = (st > np.asarray(_culprit.small_job_thresholds(R))).any(axis=1).mean()
        assert rate <= ALPHA + 3 * np.sqrt(ALPHA / 200_000), (R, rate)
        # ... and the vectorized check is what `fleet_test` decides, row by row.
        for row in x[:300]:
            named = fleet_test(row, float("nan")).outlier.any()
            st_row = _culprit.stage_statistics(-np.sort(-row)[None, :], r)[0]
            assert named == (st_row > np.asarray(_culprit.small_job_thresholds(R))).any()


def test_watch_levels_thresholds_hold_their_level_and_are_stricter():
    """`SMALL_JOB_THRESHOLDS_WATCH` (WATCH_ALPHA = 1e-4, watch's live decision): fresh
    normal fleets name anybody at about 1e-4 (never above it plus its error, and not far
    below: a table calibrated at another level fails one side), and every stage's
    threshold is above the report's."""
    from jaxpace.diagnosis.culprit import WATCH_ALPHA

    n = 1_000_000
    for R in (5, 8, 12, 15):
        q = np.asarray(_culprit.small_job_thresholds(R, WATCH_ALPHA))
        assert q.tolist() == list(_culprit.SMALL_JOB_THRESHOLDS_WATCH[R])
        assert (q > np.asarray(_culprit.small_job_thresholds(R))).all(), R
        r = _culprit.small_job_stages(R)
        x = np.random.default_rng([R, 98]).standard_normal((n, R))
        rate = (_culprit.stage_statistics(-np.sort(-x, axis=1), r) > q).any(axis=1).mean()
        err = 3 * np.sqrt(WATCH_ALPHA / n)
        assert WATCH_ALPHA / 4 <= rate <= WATCH_ALPHA + err, (R, rate)


def test_fleet_alpha_sets_the_fleet_lines_level_alone():
    """`fleet_alpha` (watch's `decide.FLEET_LEVEL`) moves test 2 alone. A static outlier
    of 8 ranks, 12 SDs of the others' spread over 60 quiet steps (test 1 overwhelming),
    sits between the fleet line at ALPHA (9.67) and at WATCH_ALPHA (14.22): named at
    ALPHA, not with `fleet_alpha=WATCH_ALPHA`. A rank 2 noise SDs late over 10 noisy steps
    (past the small-job step rule; 30 draws): where both tests at WATCH_ALPHA name it,
    so does `fleet_alpha=WATCH_ALPHA`, and where that does, so does ALPHA; test 1 at
    WATCH_ALPHA loses most of them (here 4 of 30 against 17)."""
    from jaxpace.diagnosis.culprit import WATCH_ALPHA

    base = np.array([-1.15, -0.67, -0.32, 0.0, 0.32, 0.67, 1.15, 12.0]) * 2e-4
    lat = base[None, :] + np.random.default_rng(0).normal(0, 2e-5, (60, 8))
    at = decide(lat, T)
    strict = decide(lat, T, fleet_alpha=WATCH_ALPHA)
    assert at.late.nonzero()[0].tolist() == [7] and not strict.late.any()
    assert strict.p_adjusted[7] < 1e-6 and strict.fleet.threshold > at.fleet.threshold
    np.testing.assert_array_equal(at.p_adjusted, strict.p_adjusted)
    named = {"report": 0, "fleet line": 0, "both": 0}
    for seed in range(30):
        noisy = np.random.default_rng(seed).normal(0, 4e-3, (10, 8))
        noisy[:, 3] += 8e-3
        got = (
            decide(noisy, 0.03).late,
            decide(noisy, 0.03, fleet_alpha=WATCH_ALPHA).late,
            decide(noisy, 0.03, WATCH_ALPHA).late,
        )
        assert not any(g[np.arange(8) != 3].any() for g in got), seed
        assert got[0][3] >= got[1][3] >= got[2][3], seed
        for k, g in zip(named, got, strict=True):
            named[k] += bool(g[3])
    assert named["fleet line"] >= 2 * named["both"] + 5, named


def test_a_calibration_at_run_time_keeps_fleets_beyond_each_stage():
    """Off the tables (groups of two kinds share a level: WATCH_ALPHA / 2), enough fleets
    that `_TAIL_FLEETS` lie beyond each stage's quantile: fresh fleets name anybody at
    about the level asked (at 200,000 fleets, 3 would lie beyond)."""
    level = _culprit.WATCH_ALPHA / 2
    R, n = 8, 1_000_000
    q = np.asarray(_culprit.small_job_thresholds(R, level))
    assert (q > np.asarray(_culprit.SMALL_JOB_THRESHOLDS_WATCH[R])).all()
    x = np.random.default_rng([R, 97]).standard_normal((n, R))
    st = _culprit.stage_statistics(-np.sort(-x, axis=1), _culprit.small_job_stages(R))
    rate = (st > q).any(axis=1).mean()
    assert level / 4 <= rate <= level + 3 * np.sqrt(level / n), rate


def test_distance_over_threshold_is_exactly_the_named_members():
    rng = np.random.default_rng(3)
    for R in range(4, 16):
        for k in range(0, _culprit.small_job_stages(R) + 2):
            m = rng.standard_normal(R)
            m[:k] += 30.0 + 5.0 * rng.random(k)
            ft = fleet_test(m, float("nan"))
            assert ft.rule == "small job"
            assert (ft.outlier == (ft.distance > ft.threshold)).all()
            if k <= _culprit.small_job_stages(R) and k and R >= 6:
                assert ft.outlier[:k].all() and not ft.outlier[k:].any(), (R, k, ft.distance)


@pytest.mark.parametrize("R", [2, 3])
def test_two_or_three_ranks_only_the_step_share(R):
    # No spread to estimate: a rank is an outlier only when it is later than the others'
    # median by more than SMALL_JOB_STEP_FRACTION of the step.
    step = 0.15
    frac = _culprit.SMALL_JOB_STEP_FRACTION
    over = np.zeros(R)
    over[0] = (frac + 0.02) * step
    assert fleet_test(over, step, over_s=over).outlier.tolist() == [True] + [False] * (R - 1)
    over[0] = (frac - 0.02) * step
    assert not fleet_test(over, step, over_s=over).outlier.any()
    assert np.isinf(fleet_test(over, step).threshold)
