"""The fast simulator and `adaptive` give bit for bit what the step-by-step versions gave.

The engine runs `lag` steps side by side (a whole chunk for `no_pacing`/`fixed`),
and `adaptive` keeps each window's order instead of sorting it (from
`_ORDER_MIN_RANKS` ranks) and skips the budget sum when it cannot bind. The
reference here is the engine as it was before (one step at a time, copied
below) and `adaptive`'s sort path, which the same module still runs below
`_ORDER_MIN_RANKS` ranks.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import jaxpace.policy as P
import jaxpace.policy._adaptive_fast as F
import jaxpace.policy._window_order as WO
import jaxpace.sim._engine as E
from jaxpace.diagnosis.earliness import earliness
from jaxpace.policy.adaptive import AdaptiveState, adaptive, reference
from jaxpace.sim import load_scenario
from jaxpace.sim._scenario import Scenario

# --------------------------------------------------------------------------- reference engine
# `jaxpace.sim._engine` at b020b01: one step per call, every rank gathered.


def _ref_advance(t, work, spin_u, spin_v, ptr, nk, slow, ar):
    if nk == 0:
        return t + work
    p = np.minimum(ptr, nk - 1)
    v = spin_v[p]
    start = np.maximum(t, spin_u[p, ar])
    rem = work - (start - t)
    cap = np.maximum(v - start, 0.0) / slow
    after = np.maximum(v, start)
    out = np.where(rem <= 0, t + work, np.where(rem <= cap, start + rem * slow, after + rem - cap))
    passed = rem > cap
    ptr += passed
    np.minimum(ptr, nk, out=ptr)
    q = np.minimum(ptr, nk - 1)
    bad = passed & (ptr < nk) & (out > spin_u[q, ar])
    if bad.any():
        idx = np.nonzero(bad)[0]
        out[idx] = after[idx]
        w = (rem - cap)[idx]
        while idx.size:
            p = ptr[idx]
            ti = out[idx]
            start = np.maximum(ti, spin_u[p, idx])
            gap = start - ti
            cap = np.maximum(spin_v[p] - start, 0.0) / slow
            before = w <= gap
            inside = ~before & (w - gap <= cap)
            out[idx] = np.where(
                before,
                ti + w,
                np.where(inside, start + (w - gap) * slow, np.maximum(spin_v[p], start)),
            )
            passed = ~(before | inside)
            w = w - gap - cap
            idx, w = idx[passed], w[passed]
            ptr[idx] += 1
            done = ptr[idx] >= nk
            out[idx[done]] += w[done]
            idx, w = idx[~done], w[~done]
    return out


def _ref_node_coupled(a, d0, su):
    g = su.g
    A = a.reshape(-1, g)
    Am = A[:, None, :]
    Ai = A[:, :, None]
    Em = Am + d0.reshape(-1, g)[:, None, :]
    adj = np.zeros_like(A)
    if su.k_pow > 0:
        adj -= su.k_pow * np.clip(np.minimum(Ai, Em) - Am, 0.0, None).sum(axis=2) / (g - 1)
    if su.k_host > 0:
        adj += su.k_host * np.clip(Ai - Em, 0.0, None).sum(axis=2) / (g - 1)
    return (A + adj).reshape(-1)


def _ref_step(a, D, jit, tc, su):
    R, ar = su.ranks, np.arange(su.ranks)
    spin_u, spin_v = np.empty((su.buckets, R)), np.empty(su.buckets)
    bucket_work = a * su.bwd_frac
    x = a * su.fwd_frac
    ptr = np.zeros(R, dtype=np.int64)
    launch_prev = np.zeros(R)
    end_prev = 0.0
    waits, spins = [], []
    for j in range(su.buckets):
        w = bucket_work if jit is None else bucket_work * jit[j]
        if su.spin_coupled and j > 0:
            x = _ref_advance(x, w, spin_u, spin_v, ptr, j, su.slow, ar)
        else:
            x = x + w
        launch = x if j >= su.n_sites else x + D[j]
        if j > 0:
            launch = np.maximum(launch, launch_prev)
        last = max(float(launch.max()), end_prev)
        start = np.minimum(np.maximum(launch, end_prev), last)
        spins.append(float((last - start).sum()))
        spin_u[j] = start
        spin_v[j] = last
        if j < su.n_sites:
            waits.append(last - x)
        end_prev = last + tc
        launch_prev = launch
    return end_prev, waits, spins, spin_v


def _ref_run(draws, su, pol, steps, lag):
    """The step loop as it was; returns its sums and every step's delays, waits and ends."""
    batch = pol.batched
    if batch is not None:
        state = batch.init(su.n_sites, su.ranks)
    else:
        state = [pol.init(su.ranks) for _ in range(su.n_sites)]
    pending = [np.zeros((su.n_sites, su.ranks)) for _ in range(lag)]
    times, seen = np.empty(steps), []
    total_delay, engaged, spin_sum = 0.0, 0, 0.0
    k = 0
    while k < steps:
        n = min(E._BLOCK_STEPS, steps - k)
        comp, t_coll = draws.block(k, n)
        for t in range(n):
            slot = (k + t) % lag
            D = pending[slot]
            a = _ref_node_coupled(comp[t], D[0], su) if su.node_coupled else comp[t]
            jit = draws.bucket_jitter()
            jit = None if jit is None else jit[0]
            step, waits, spins, ends = _ref_step(a, D, jit, t_coll[t], su)
            for sp in spins:
                spin_sum += sp
            times[k + t] = step
            seen.append((D.copy(), np.stack(waits), ends.copy()))
            if D.any():
                engaged += 1
                total_delay += float(D.sum())
            if batch is not None:
                e = earliness(np.stack(waits), axis=-1)
                obs = P.Observation(e, np.full(len(waits), float(step)))
                new, state = batch.update(obs, state)
            else:
                new = np.empty_like(D)
                for j, w in enumerate(waits):
                    d, state[j] = pol.update(P.Observation(earliness(w), float(step)), state[j])
                    new[j] = d
            pending[slot] = np.asarray(new, dtype=np.float64)
        k += n
    return times, total_delay, engaged, spin_sum, seen


def _variant(**over):
    d = load_scenario("paper").to_dict()
    for key, value in over.items():
        section, field = key.split("__")
        d[section][field] = value
    return Scenario.from_dict(d)


def _custom():
    base = adaptive(threshold_s=0.001, max_delay_s=0.01, warmup_steps=3, engage_steps=4)
    return P.PacingPolicy(base.init, lambda o, s: base.update(o, s), name="custom")


SCENARIOS = {
    "paper": lambda: load_scenario("paper"),
    "pure-bsp": lambda: load_scenario("pure-bsp"),
    "first-bucket": lambda: _variant(pacing__sites="first_bucket", pacing__lag_steps=3),
    "strag": lambda: _variant(stragglers__onset_prob=0.01, coupling__spin_compute=1.0),
    "one-bucket": lambda: _variant(collective__buckets=1),
    "no-coupling": lambda: _variant(
        coupling__spin_compute=0.0, coupling__power_budget=0.0, coupling__host_runahead=0.0
    ),
}
POLICIES = {
    "none": lambda sc: P.no_pacing(),
    "fixed": lambda sc: P.fixed(0.002),
    "adaptive": lambda sc: E.resolve_policy("adaptive", sc),
    "ab": lambda sc: adaptive(
        threshold_s=0.001, max_delay_s=0.01, ab_test=True, ab_period=4, window=8, warmup_steps=7
    ),
    "tight-budget": lambda sc: adaptive(
        threshold_s=0.0005,
        max_delay_s=0.004,
        quantile=1.0,
        window=5,
        budget_fraction=0.3,
        warmup_steps=0,
        engage_steps=1,
    ),  # fmt: skip
    "custom": lambda sc: _custom(),
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "scenario,policy,nodes,steps,lag",
    [(s, p, 2, 120, None) for s in SCENARIOS for p in POLICIES]
    + [("paper", "adaptive", 16, 300, None), ("strag", "adaptive", 16, 300, 1)]
    + [("paper", "adaptive", 64, 40, None)],  # 512 ranks: adaptive keeps each window's order
)
def test_engine_matches_the_step_by_step_engine(scenario, policy, nodes, steps, lag):
    sc = SCENARIOS[scenario]()
    pol = POLICIES[policy](sc)
    lag = sc.pacing.lag_steps if lag is None else lag
    ref = _ref_run(
        E._Draws(sc, nodes, 7), E._Setup.of(sc, nodes * sc.gpus_per_node), pol, steps, lag
    )
    seen = []

    def keep(step, waits, ends, D, t_coll):
        seen.append((np.array(D), np.array(waits), np.array(ends)))

    draws = E._Draws(sc, nodes, 7)
    got = E._run(draws, E._Setup.of(sc, draws.ranks), pol, steps, lag, None, on_step=keep)
    assert np.array_equal(got[0], ref[0])
    assert got[1:] == ref[1:4]  # total delay, engaged steps, spin rank-seconds
    assert len(seen) == steps
    for (d, w, e), (rd, rw, re) in zip(seen, ref[4], strict=True):
        assert np.array_equal(d, rd) and np.array_equal(w, rw) and np.array_equal(e, re)
    if policy not in ("none", "fixed") and scenario != "pure-bsp":
        assert ref[2] > 0, "the case should pace"


@pytest.mark.parametrize("L", [1, 2, 5, 32])
def test_steps_side_by_side_are_the_steps_one_by_one(L):
    sc = _variant(stragglers__onset_prob=0.02)
    draws = E._Draws(sc, 8, 3)
    su = E._Setup.of(sc, draws.ranks)
    comp, tc = draws.block(0, L)
    jit = draws.bucket_jitter(L)
    rng = np.random.default_rng(L)
    D = rng.uniform(0.0, 0.01, (L, su.n_sites, su.ranks)) * (rng.random((L, 1, su.ranks)) < 0.5)
    ends, waits, bucket_ends, spins = E._run_buckets(comp, D, jit, tc, su)
    for i in range(L):
        end, w, sp, be = _ref_step(comp[i], D[i], jit[i], tc[i], su)
        assert end == ends[i] and sp == spins[i].tolist()
        assert np.array_equal(np.stack(w), waits[:, i]) and np.array_equal(be, bucket_ends[:, i])


def test_bucket_jitter_in_blocks_is_the_per_step_stream():
    sc = load_scenario("paper")
    one, many = E._Draws(sc, 2, 5), E._Draws(sc, 2, 5)
    per_step = np.concatenate([one.bucket_jitter() for _ in range(7)])
    assert np.array_equal(np.concatenate([many.bucket_jitter(3), many.bucket_jitter(4)]), per_step)


# --------------------------------------------------------------------------- adaptive


# The fields every path keeps alike (the kept order lives outside the state).
AdaptiveFields = list(AdaptiveState._fields)

CONFIGS = [
    {},
    {"threshold_s": 0.001, "max_delay_s": 0.01, "warmup_steps": 0, "engage_steps": 2, "window": 4},
    {"threshold_s": 0.001, "max_delay_s": 0.01, "ab_test": True, "ab_period": 3,
     "ab_min_windows": 1, "warmup_steps": 2, "engage_steps": 1, "quantile": 0.7},
    {"threshold_s": 0.0, "max_delay_s": 0.002, "window": 1, "quantile": 0.0, "engage_steps": 1,
     "budget_fraction": 0.5},
    {"threshold_s": 0.0, "max_delay_s": 0.002, "window": 20, "quantile": 1 / 3,
     "engage_steps": 1, "warmup_steps": 0, "gain": 1.0},
]  # fmt: skip


@pytest.mark.parametrize("cfg", range(len(CONFIGS)))
def test_kept_order_gives_the_sorted_windows_delays(cfg):
    """NaN, inf, -0.0 and 0.0 ties, partial windows, and a budget that binds."""
    R = F.ORDER_MIN_RANKS + 88
    pol = adaptive(**CONFIGS[cfg])
    sorting = reference(**CONFIGS[cfg])  # sorts every window
    fast = pol.init(R)
    slow = sorting.init(R)
    rng = np.random.default_rng(cfg)
    paced = 0
    for k in range(120):
        e = rng.exponential(0.003, R) * np.where(np.arange(R) < 40, 3.0, 1.0)
        e[rng.integers(0, R, 3)] = np.round(e[rng.integers(0, R, 3)], 3)  # ties
        if k in (20, 21, 75):
            e[rng.integers(0, R)] = np.nan
        if k == 40:
            e[:] = np.nan
        if k in (22, 80):
            e[rng.integers(0, R)] = np.inf
        if k in (55, 56):
            e[rng.integers(0, R, 2)] = -0.0
        if k % 5 == 1:
            e[:30] = 0.0
        if k > 90:
            e *= 4.0  # long sleeps: the budget binds
        t = float(rng.uniform(0.09, 0.11)) if k % 11 else np.nan
        d_fast, fast = pol.update(P.Observation(e, t), fast)
        d_slow, slow = sorting.update(P.Observation(e, t), slow)
        kept = pol.update.__self__.kept.get(fast.history)
        assert kept.order.shape == (1, fast.history.shape[0], R)  # a batch of one site
        assert np.array_equal(d_fast, d_slow), k
        paced += int((d_fast > 0).any())
        for name in AdaptiveFields:
            assert np.array_equal(
                np.asarray(getattr(fast, name)), np.asarray(getattr(slow, name)), equal_nan=True
            ), (k, name)
    assert paced > 0


def test_batched_sites_with_kept_order_match_single_sites():
    R, B = F.ORDER_MIN_RANKS, 3
    pol = adaptive(threshold_s=0.0005, budget_fraction=0.4)
    b = pol.batched
    state_b, singles = b.init(B, R), [pol.init(R) for _ in range(B)]
    rng = np.random.default_rng(4)
    for k in range(60):
        e = rng.exponential(0.002, (B, R)) * np.array([[1.0], [3.0], [0.2]])
        if k % 9 == 0:
            e[1, 7] = np.nan
        t = 0.1 + 0.01 * rng.random(B)
        d_b, state_b = b.update(P.Observation(e, t), state_b)
        for j in range(B):
            d, singles[j] = pol.update(P.Observation(e[j], float(t[j])), singles[j])
            assert np.array_equal(d, d_b[j])
    for j in range(B):
        for name, v in singles[j]._asdict().items():
            assert np.array_equal(np.asarray(v), getattr(state_b, name)[j], equal_nan=True), name


def test_single_site_update_stays_pure():
    R = F.ORDER_MIN_RANKS
    pol = adaptive(warmup_steps=0)
    s0 = pol.init(R)
    snap = [np.array(v, copy=True) for v in s0]
    pol.update(P.Observation(np.linspace(0.0, 0.01, R)), s0)
    for before, after in zip(snap, s0, strict=True):
        assert np.array_equal(before, np.asarray(after), equal_nan=True)


def test_hand_built_state_without_the_fast_paths_caches_still_works():
    pol = adaptive(warmup_steps=0, engage_steps=1, threshold_s=0.0)
    R = F.ORDER_MIN_RANKS
    full = pol.init(R)
    old = AdaptiveState(*(np.array(v, copy=True) for v in full))  # built by hand
    e = np.linspace(0.0, 0.004, R)
    d_old, _ = pol.update(P.Observation(e), old)
    d_new, _ = pol.update(P.Observation(e), full)
    assert np.array_equal(d_old, d_new) and d_new.max() > 0


def test_scenario_dataclass_replace_still_runs():
    sc = load_scenario("paper")
    sc = dataclasses.replace(sc, pacing=dataclasses.replace(sc.pacing, lag_steps=1))
    r = E.simulate(sc, nodes=2, steps=50, policy="adaptive", seed=1)
    assert r.steps == 50 and np.isfinite(r.mean_step_s)


@pytest.mark.parametrize("q", [0.0, 0.1, 1 / 3, 0.5, 0.9, 1.0])
def test_nan_windows_take_nanquantile_from_the_kept_order(q):
    """A missing rank (NaN) no longer sends the window to `np.nanquantile`; same values."""
    R, W = F.ORDER_MIN_RANKS, 6
    pol = adaptive(window=W, quantile=q, warmup_steps=0)
    st = pol.init(R)
    rng = np.random.default_rng(int(q * 100))
    calls = []
    real = WO._order_nanquantile
    try:
        WO._order_nanquantile = lambda *a: calls.append(1) or real(*a)
        for k in range(3 * W):
            e = np.round(rng.exponential(0.002, R), 4)  # ties
            e[rng.random(R) < 0.3] = np.nan
            e[:5] = np.nan  # never measured: an all-NaN window
            e[5] = np.nan if k % W else 0.001  # one finite entry
            _, st = pol.update(P.Observation(e), st)
            rows = st.history[: st.filled]
            have = np.isfinite(rows).any(axis=0)
            want = np.full(R, np.nan)
            want[have] = np.nanquantile(rows[:, have], q, axis=0)
            kept = pol.update.__self__.kept.get(st.history)
            got = WO.window_quantile(
                st.history[None], kept.order, kept.odd, np.array([0]), st.filled, q, 1
            )[0]
            assert np.array_equal(got, want, equal_nan=True), k
    finally:
        WO._order_nanquantile = real
    assert calls


def test_engine_earliness_is_the_runtime_earliness():
    rng = np.random.default_rng(0)
    for case in range(40):
        w = rng.exponential(1e-3, (3, 2, 50))
        w[rng.random(w.shape) < 0.05] = 0.0
        bad = [None, np.nan, np.inf, -1e-9][case % 4]
        if bad is not None:
            w[case % 3, case % 2, case % 50] = bad
        assert np.array_equal(E._earliness(w), earliness(w, axis=-1), equal_nan=True)
