"""Pacing policies on synthetic earliness traces: pure functions, no clocks, no sleeps."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxpace as jp
from jaxpace.policy.base import Observation

MAX = 0.03

POLICIES = {
    "no_pacing": lambda: jp.no_pacing(),
    "fixed": lambda: jp.fixed(0.002),
    "adaptive": lambda: jp.adaptive(
        max_delay_s=MAX,
        threshold_s=0.001,
        warmup_steps=2,
        engage_steps=3,
        disengage_steps=4,
        window=8,
    ),
    "adaptive_ab": lambda: jp.adaptive(
        max_delay_s=MAX, warmup_steps=0, engage_steps=1, ab_test=True, ab_period=4, ab_min_windows=1
    ),
}


def run(policy, trace, step_times=None):
    """Feeds rows of `trace` (steps x ranks) to the policy; returns delays (steps x ranks)."""
    state = policy.init(trace.shape[1])
    out = []
    for k, row in enumerate(trace):
        t = math.nan if step_times is None else step_times[k]
        d, state = policy.update(Observation(np.asarray(row, float), t), state)
        out.append(np.asarray(d, float))
    return np.array(out), state


# ------------------------------------------------------------------ contract, every policy


@pytest.fixture(params=sorted(POLICIES))
def policy(request):
    return POLICIES[request.param]()


def test_contract_shapes_bounds_and_purity(policy):
    rng = np.random.default_rng(0)
    trace = np.abs(rng.normal(0, 0.01, (40, 6)))
    trace[:, 2] = 0.0
    d1, s1 = run(policy, trace)
    d2, s2 = run(policy, trace)
    assert d1.shape == trace.shape
    assert np.isfinite(d1).all()
    assert (d1 >= 0).all() and (d1 <= policy.max_delay_s + 1e-12).all()
    np.testing.assert_array_equal(d1, d2)  # same inputs, same decisions (on every rank)
    assert isinstance(policy.name, str) and policy.name
    assert isinstance(policy.needs_exchange, bool)


def test_contract_nan_inf_negative_inputs_never_produce_bad_delays(policy):
    bad = np.array([[np.nan, np.inf, -1.0, 0.01, -np.inf, 0.0]] * 20)
    d, _ = run(policy, bad)
    assert np.isfinite(d).all() and (d >= 0).all() and (d <= policy.max_delay_s + 1e-12).all()


def test_contract_state_is_not_mutated_in_place(policy):
    state = policy.init(3)
    snapshot = [np.array(v, copy=True) if isinstance(v, np.ndarray) else v for v in state]
    policy.update(Observation(np.array([0.02, 0.0, 0.01])), state)
    for before, after in zip(snapshot, state, strict=True):
        if isinstance(before, np.ndarray):
            np.testing.assert_array_equal(before, after)
        else:
            assert before == after


# ------------------------------------------------------------------ adaptive behaviour


def adaptive(**kw):
    base = dict(
        max_delay_s=MAX,
        threshold_s=0.001,
        warmup_steps=2,
        engage_steps=3,
        disengage_steps=4,
        window=8,
        gain=0.9,
    )
    base.update(kw)
    return jp.adaptive(**base)


def late_rank_trace(steps, ranks=4, late=1, lateness=0.02, jitter=0.0005, seed=0):
    """Earliness when rank `late` arrives `lateness` s after the others (plus jitter)."""
    rng = np.random.default_rng(seed)
    arrive = rng.normal(0, jitter, (steps, ranks))
    arrive[:, late] += lateness
    waits = arrive.max(axis=1, keepdims=True) - arrive
    return waits - waits.min(axis=1, keepdims=True)


def test_balanced_negative_control_gives_zero_delay():
    trace = late_rank_trace(200, lateness=0.0, jitter=0.0002)
    d, state = run(adaptive(), trace)
    assert (d == 0).all()
    assert not state.engaged and state.steps_paced == 0


def test_persistent_late_rank_converges_toward_its_lateness_within_bounds():
    lateness = 0.02
    trace = late_rank_trace(100, lateness=lateness)
    d, state = run(adaptive(gain=0.9), trace)
    assert state.engaged
    tail = d[-50:]
    assert (tail[:, 1] == 0).all()  # the late rank never sleeps
    early = tail[:, [0, 2, 3]]
    np.testing.assert_allclose(np.median(early, axis=0), 0.9 * lateness, rtol=0.1)
    assert (d <= MAX).all()


def test_warmup_steps_are_ignored():
    trace = late_rank_trace(30, lateness=0.02)
    d, _ = run(adaptive(warmup_steps=10, engage_steps=1), trace)
    assert (d[:10] == 0).all() and (d[12:, 0] > 0).all()


def test_delay_capped_at_max_delay():
    trace = late_rank_trace(60, lateness=0.05)  # larger than max_delay_s=0.03
    d, state = run(adaptive(giveup_factor=10), trace)
    assert state.engaged and not state.backed_off
    assert d.max() == pytest.approx(MAX)


def test_transient_spike_does_not_engage():
    trace = late_rank_trace(100, lateness=0.0, jitter=0.0002)
    trace[40:42, 0] += 0.05  # two-step spike on rank 0
    d, state = run(adaptive(), trace)
    assert (d == 0).all() and not state.engaged


def test_disengages_after_imbalance_ends_within_configured_steps():
    trace = np.concatenate(
        [
            late_rank_trace(60, lateness=0.02),
            late_rank_trace(60, lateness=0.0, jitter=0.0002, seed=1),
        ]
    )
    pol = adaptive(disengage_steps=4, window=8)
    state = pol.init(4)
    engaged = []
    for row in trace:
        _, state = pol.update(Observation(row), state)
        engaged.append(state.engaged)
    assert engaged[59]
    off_at = next(k for k in range(60, 120) if not engaged[k])
    # The window must first forget the old imbalance (median of 8 -> 4 steps),
    # then `disengage_steps` consecutive quiet steps.
    assert off_at - 60 <= 8 // 2 + 4 + 1
    assert not any(engaged[off_at:])


def test_huge_skew_backs_off_instead_of_chasing():
    trace = late_rank_trace(60, lateness=2.0)  # seconds of skew
    d, state = run(adaptive(giveup_factor=20), trace)
    assert state.backed_off and not state.engaged
    assert (d == 0).all()


def test_budget_limits_total_sleep_over_a_window():
    trace = late_rank_trace(80, lateness=0.02)
    pol = adaptive(budget_fraction=0.25, window=8, engage_steps=1, warmup_steps=0)
    d, _ = run(pol, trace)
    budget = 0.25 * 8 * MAX
    for k in range(8, len(d)):
        assert d[k - 7 : k + 1, 0].sum() <= budget + 1e-9


def test_ab_guard_rejects_pacing_that_makes_steps_slower():
    trace = late_rank_trace(200, lateness=0.02)
    pol = jp.adaptive(
        max_delay_s=MAX,
        warmup_steps=0,
        engage_steps=1,
        ab_test=True,
        ab_period=5,
        ab_min_windows=2,
        ab_tolerance=0.01,
    )
    state = pol.init(4)
    delays = []
    for row in trace:
        # Pretend paced steps are 10% slower than unpaced ones.
        t = 0.11 if state.ab_arm == 1 else 0.10
        d, state = pol.update(Observation(row, t), state)
        delays.append(d)
    assert state.ab_rejected
    assert (np.array(delays[-20:]) == 0).all()
    assert state.ab_sum_s[1] / state.ab_count[1] > state.ab_sum_s[0] / state.ab_count[0]


def test_ab_guard_keeps_pacing_that_does_not_hurt():
    trace = late_rank_trace(200, lateness=0.02)
    pol = jp.adaptive(
        max_delay_s=MAX, warmup_steps=0, engage_steps=1, ab_test=True, ab_period=5, ab_min_windows=2
    )
    d, state = run(pol, trace, step_times=[0.1] * 200)
    assert not state.ab_rejected
    assert (d[-20:, 0] > 0).any()  # paced windows still pace


# ------------------------------------------------------------------ properties


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), min_size=3, max_size=3),
        min_size=1,
        max_size=30,
    ),
    st.floats(min_value=1e-4, max_value=5.0),
    st.floats(min_value=0.01, max_value=1.0),
)
def test_property_delay_always_within_bounds_and_deterministic(rows, max_delay, gain):
    pol = jp.adaptive(
        max_delay_s=max_delay, gain=gain, warmup_steps=0, engage_steps=1, threshold_s=0.0
    )
    trace = np.array(rows, dtype=float)
    d1, _ = run(pol, trace)
    d2, _ = run(pol, trace)
    assert np.isfinite(d1).all()
    assert (d1 >= 0).all() and (d1 <= max_delay).all()
    np.testing.assert_array_equal(d1, d2)


@settings(max_examples=30, deadline=None)
@given(st.integers(min_value=1, max_value=64), st.integers(min_value=0, max_value=2**31 - 1))
def test_property_last_arriver_never_sleeps(ranks, seed):
    rng = np.random.default_rng(seed)
    late = int(rng.integers(ranks))
    trace = late_rank_trace(40, ranks=ranks, late=late, lateness=0.01, seed=seed)
    d, _ = run(jp.adaptive(max_delay_s=MAX, warmup_steps=0, engage_steps=1), trace)
    assert (d[:, late] == 0).all()
