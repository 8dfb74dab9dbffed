"""The compiled kernels (`jaxpace.native.kernels`) give the NumPy fallback's bits, and the
fallback runs when the library is absent or disabled."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import jaxpace.policy._adaptive_fast as F
import jaxpace.policy._window_order as WO
import jaxpace.sim._engine as E
from jaxpace.collectives.exchange import sanitize_seconds
from jaxpace.native import kernels
from jaxpace.policy.adaptive import AdaptiveConfig, AdaptiveState, ab_guard, adaptive
from jaxpace.policy.base import Observation
from jaxpace.policy.quantile import quantile_of_window
from jaxpace.sim import load_scenario, simulate
from jaxpace.sim._scenario import Scenario


@pytest.fixture
def numpy_only(monkeypatch):
    """Runs the test body with the kernels switched off (as if the library were absent)."""

    def off():
        monkeypatch.setitem(kernels._state, "lib", None)
        monkeypatch.setitem(kernels._state, "reason", "switched off by the test")

    return off


def test_the_library_is_built_here():
    """CI installs with a C++ compiler: the kernels must be there, or this says why not."""
    if os.environ.get("JAXPACE_KERNELS", "1") == "0":
        pytest.skip("JAXPACE_KERNELS=0 in this environment: the NumPy paths are under test")
    ok, why = kernels.available()
    assert ok, why


def _variant(**over) -> Scenario:
    d = load_scenario("paper").to_dict()
    for key, value in over.items():
        section, field = key.split("__")
        d[section][field] = value
    return Scenario.from_dict(d)


ENGINE_CASES = {
    "paper": lambda: load_scenario("paper"),
    "strong-spin": lambda: _variant(coupling__spin_compute=1.0, stragglers__onset_prob=0.05),
    "no-jitter": lambda: _variant(compute__bucket_jitter_sigma=0.0),
    "first-bucket": lambda: _variant(pacing__sites="first_bucket"),
    "no-spin": lambda: _variant(coupling__spin_compute=0.0),
    "one-bucket": lambda: _variant(collective__buckets=1),
}


@pytest.mark.parametrize("case", sorted(ENGINE_CASES))
@pytest.mark.parametrize("L", [1, 2, 7, 32])
def test_run_buckets_kernel_is_the_numpy_loop(case, L, numpy_only):
    sc = ENGINE_CASES[case]()
    draws = E._Draws(sc, 4, L)
    su = E._Setup.of(sc, draws.ranks)
    comp, tc = draws.block(0, L)
    jit = draws.bucket_jitter(L)
    rng = np.random.default_rng(L)
    # Delays from none to far beyond a bucket: ranks run into many spin intervals.
    D = rng.uniform(0.0, 0.05, (L, su.n_sites, su.ranks)) * (rng.random((L, 1, su.ranks)) < 0.5)
    D[:, :, :3] = 0.0
    fast = E._run_buckets(comp, D, jit, tc, su)
    assert kernels.available()[0]
    numpy_only()
    slow = E._run_buckets(comp, D, jit, tc, su)
    for f, s in zip(fast, slow, strict=True):
        assert f.shape == s.shape and np.array_equal(f, s)


def test_kernel_declines_arrays_it_cannot_take():
    a = np.ones((2, 8), dtype=np.float32)
    assert kernels.run_buckets(
        a, np.zeros((2, 1, 8)), None, np.ones(2), buckets=2, sites=1, fwd_frac=0.3,
        bwd_frac=0.35, spin=True, slow=1.3,
    ) is None  # fmt: skip
    h = np.zeros((1, 200, 4))
    o = np.zeros((1, 200, 4), dtype=np.int16)  # windows over 127: int16 order, NumPy's path
    assert kernels.order_pick(h, o, 0, 1) is None
    assert kernels.order_insert(h, o, 0, np.zeros((1, 4))) is False


@pytest.mark.parametrize("W", [1, 2, 16, 127])
def test_window_kernels_are_the_numpy_upkeep(W, numpy_only):
    """Ties, NaN, inf, -0.0 and 0.0, partial windows: the same orders and the same picks."""
    S, R = 3, 64
    rng = np.random.default_rng(W)
    h = np.full((S, W, R), np.nan)
    o = np.repeat(np.arange(W, dtype=np.int8)[None, :, None], S, axis=0).repeat(R, axis=2)
    odd = np.zeros((S, W), dtype=np.int64)
    ia = np.arange(S)
    states = []
    for k in range(3 * W + 5):
        x = np.round(rng.exponential(0.002, (S, R)), 4)
        x[rng.random((S, R)) < 0.05] = np.nan
        x[rng.random((S, R)) < 0.03] = np.inf
        x[rng.random((S, R)) < 0.05] = 0.0
        x[rng.random((S, R)) < 0.05] = -0.0
        x = sanitize_seconds(x).reshape(S, R)
        r0 = k % W
        states.append((r0, x))
    h_k, o_k, odd_k = h.copy(), o.copy(), odd.copy()
    picks_k = []
    for r0, x in states:
        WO.insert(h_k, o_k, odd_k, ia, np.full(S, r0), x, True, r0)
        picks_k.append(kernels.order_pick(h_k, o_k, 0, min(1, W - 1)))
    numpy_only()
    for r0, x in states:
        WO.insert(h, o, odd, ia, np.full(S, r0), x, True, r0)
        want = (WO._at_rank(h, o, 0), WO._at_rank(h, o, min(1, W - 1)))
        got = picks_k.pop(0)
        assert np.array_equal(got[0], want[0], equal_nan=True)
        assert np.array_equal(got[1], want[1], equal_nan=True)
    assert np.array_equal(h_k, h, equal_nan=True)
    assert np.array_equal(o_k, o) and np.array_equal(odd_k, odd)


@pytest.mark.parametrize(
    "scenario,policy,nodes,steps",
    [("paper", "adaptive", 64, 300), ("paper", "none", 16, 600), ("paper", "fixed:0.002", 8, 300)],
)
def test_whole_runs_are_the_same_with_and_without_kernels(scenario, policy, nodes, steps,
                                                          numpy_only):  # fmt: skip
    """512 ranks: `adaptive` keeps each window's order (the window kernels); more than one
    block of draws: the draw thread hands blocks over."""
    fast = simulate(scenario, nodes=nodes, steps=steps, policy=policy, seed=3)
    numpy_only()
    slow = simulate(scenario, nodes=nodes, steps=steps, policy=policy, seed=3)
    assert np.array_equal(fast.step_times_s, slow.step_times_s)
    assert fast.summary() == slow.summary()


def test_disabled_by_environment_runs_numpy():
    code = (
        "from jaxpace.native import kernels; from jaxpace.sim import simulate;"
        "print(kernels.available());"
        "r = simulate('paper', nodes=2, steps=20, policy='adaptive', seed=1);"
        "print(r.steps)"
    )
    env = dict(os.environ, JAXPACE_KERNELS="0")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "(False, 'disabled by JAXPACE_KERNELS=0')" in out.stdout and "20" in out.stdout


def test_missing_library_is_reported_not_fatal(monkeypatch):
    monkeypatch.setattr(kernels, "_path", lambda: None)
    monkeypatch.setitem(kernels._state, "lib", None)
    monkeypatch.setitem(kernels._state, "reason", None)
    ok, why = kernels.available()
    assert not ok and "not built" in why
    r = simulate("paper", nodes=2, steps=10, policy="adaptive", seed=0)
    assert r.steps == 10


def test_draw_thread_matches_drawing_in_the_loop():
    """`_blocks` (the next block drawn on a second thread) yields the blocks in order, with the
    numbers a single-threaded loop draws."""
    sc = _variant(stragglers__onset_prob=0.02)
    steps = 3 * E._BLOCK_STEPS + 17
    one = E._Draws(sc, 2, 9)
    got = list(E._blocks(E._Draws(sc, 2, 9), steps))
    assert [b[0] for b in got] == list(range(0, steps, E._BLOCK_STEPS))
    for k, n, comp, tc, jit in got:
        c1, t1 = one.block(k, n)
        j1 = one.bucket_jitter(n)
        assert np.array_equal(comp, c1) and np.array_equal(tc, t1) and np.array_equal(jit, j1)


def test_simulate_cli_says_when_the_numpy_engine_runs(monkeypatch, capsys):
    from jaxpace.cli import main

    monkeypatch.setattr(kernels, "_path", lambda: None)
    monkeypatch.setitem(kernels._state, "lib", None)
    monkeypatch.setitem(kernels._state, "reason", None)
    assert main(["simulate", "--nodes", "1", "--steps", "20"]) == 0
    err = capsys.readouterr().err
    assert "running the NumPy engine" in err and "not built" in err
    monkeypatch.setitem(kernels._state, "reason", "disabled by JAXPACE_KERNELS=0")
    assert main(["simulate", "--nodes", "1", "--steps", "20"]) == 0
    assert "NumPy engine" not in capsys.readouterr().err  # asked for: no note


def _earliness_stream(rng, S, R, steps, dirty):
    """Sanitized `(S, R)` earliness per step: ties, zeros, and (`dirty`) NaN, inf and -0.0 on
    some steps only, so that windows turn odd and clean again."""
    out = []
    for k in range(steps):
        x = np.round(rng.exponential(0.003, (S, R)), 4)
        x[rng.random((S, R)) < 0.05] = 0.0
        if dirty and k % 7 in (3, 4):
            x[rng.random((S, R)) < 0.02] = np.nan
            x[rng.random((S, R)) < 0.02] = np.inf
        if dirty and k % 37 == 5:  # a window with -0.0 is sorted afresh (slow): rarely
            x[rng.random((S, R)) < 0.02] = -0.0
        out.append(sanitize_seconds(x).reshape(S, R))
    return out


ADAPTIVE_CASES = {
    "defaults": {},
    "paper": dict(threshold_s=0.002, max_delay_s=0.01, quantile=0.1, gain=0.3, warmup_steps=0),
    "median-w1": dict(window=1, engage_steps=1, warmup_steps=0),
    "q0-w2": dict(window=2, quantile=0.0, engage_steps=1),
    "q1-w127": dict(window=127, quantile=1.0, engage_steps=2, warmup_steps=0),
    "budget-binds": dict(budget_fraction=0.05, max_delay_s=0.01, engage_steps=1, gain=1.0),
}


@pytest.mark.parametrize("dirty", [False, True])
@pytest.mark.parametrize("case", sorted(ADAPTIVE_CASES))
def test_adaptive_update_kernels_are_the_numpy_update(case, dirty, numpy_only):
    """`_adaptive_update` with the fused window kernel and the budget kernel against the NumPy
    stages, step by step from `init`: delays and every state field (partial windows, windows
    that turn odd and clean, a budget that binds, quantiles at both ends)."""
    cfg = AdaptiveConfig(**ADAPTIVE_CASES[case])
    S, R = 3, F.ORDER_MIN_RANKS
    steps = 2 * cfg.window + 40 if cfg.window < 100 else cfg.window + 20
    stream = _earliness_stream(np.random.default_rng(len(case)), S, R, steps, dirty)
    policy = adaptive(cfg)
    t = np.full(S, 0.1)

    def run():
        st = policy.batched.init(S, R)
        kept = policy.update.__self__._kept_for(st, st)  # the fast path's caches, from init
        out = []
        for x in stream:
            d, st, kept = F.update_sites(cfg, ab_guard, x, t, st, kept, owned=True)
            out.append((d, [np.array(v, copy=True) for v in (*st, *kept[:3])]))
        return out

    fast = run()
    numpy_only()
    slow = run()
    for (df, sf), (ds, ss) in zip(fast, slow, strict=True):
        assert np.array_equal(df.view(np.uint64), ds.view(np.uint64))
        for name, a, b in zip((*AdaptiveState._fields, *F.Kept._fields[:3]), sf, ss, strict=True):
            assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True), name
    assert any(d.any() for d, _ in fast), "the policy never paced: the delay kernel untested"


def test_window_step_declines_odd_windows_and_changes_nothing():
    S, W, R = 2, 4, 8
    h = np.random.default_rng(0).random((S, W, R))
    o = np.argsort(np.argsort(h, axis=1), axis=1).astype(np.int8)
    odd = np.zeros((S, W), dtype=np.int64)
    x = np.full((S, R), 0.5)
    for bad_x, bad_row in ((-0.0, None), (np.nan, None), (None, 2)):
        hh, oo, dd, xx = h.copy(), o.copy(), odd.copy(), x.copy()
        if bad_x is not None:
            xx[1, 3] = bad_x
        if bad_row is not None:
            dd[0, bad_row] = 1
        assert kernels.window_step(hh, oo, dd, 1, xx, (0, 1, 1, 0.5, 0.5)) is None
        assert np.array_equal(hh, h) and np.array_equal(oo, o)
        assert np.array_equal(dd[:, [0, 1, 3]], (odd if bad_row is None else dd)[:, [0, 1, 3]])
    dd = odd.copy()
    dd[:, 1] = 5  # the row being replaced may be odd: it leaves the window
    assert kernels.window_step(h.copy(), o.copy(), dd, 1, x, (0, 1, 1, 0.5, 0.5)) is not None
    assert (dd == 0).all()


@pytest.mark.parametrize("g", [2, 3, 7, 8, 9, 16, 17, 130])
def test_node_coupling_kernel_is_the_numpy_code(g, numpy_only):
    """Node sizes below, at and above NumPy's 8-wide pairwise sum and its 128-entry block."""
    import types

    rng = np.random.default_rng(g)
    a = rng.uniform(0.05, 0.15, g * 13)
    cases = []
    for k_pow, k_host in ((0.05, 0.5), (0.0, 0.3), (0.4, 0.0)):
        d0 = rng.uniform(0.0, 0.01, a.size) * (rng.random(a.size) < 0.4)
        for d in (d0, np.zeros(a.size)):
            cases.append((types.SimpleNamespace(g=g, k_pow=k_pow, k_host=k_host), d))
    fast = [E._node_coupled_compute(a, d, su) for su, d in cases]
    numpy_only()
    for (su, d), f in zip(cases, fast, strict=True):
        assert np.array_equal(f.view(np.uint64), E._node_coupled_compute(a, d, su).view(np.uint64))


def test_kernels_take_read_only_arrays():
    """`_addr` falls back to `ndarray.ctypes` for a buffer it cannot write (a read-only view)."""
    a = np.random.default_rng(1).uniform(0.05, 0.15, 16)
    ro = a.copy()
    ro.flags.writeable = False
    want = kernels.node_coupled(a, None, 8, 0.0, 0.5)
    got = kernels.node_coupled(ro, None, 8, 0.0, 0.5)
    assert want is not None and np.array_equal(want, got)
    assert kernels._addr(ro) == ro.ctypes.data and kernels._addr(a) == a.ctypes.data


@pytest.mark.parametrize("q", [0.0, 0.1, 1 / 3, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("filled", [1, 2, 7, 16])
def test_sorted_window_quantile_is_numpys(q, filled):
    """Below `_ORDER_MIN_RANKS` the window is sorted: with NaN (a rank not measured, an
    all-NaN window, one finite entry) the values are `np.nanquantile`'s, without NaN
    `np.quantile`'s, bit for bit."""
    rng = np.random.default_rng(filled)
    h = np.round(rng.exponential(0.002, (3, 16, 40)), 4)  # ties
    h[1][rng.random((16, 40)) < 0.3] = np.nan
    h[1][:, :3] = np.nan
    h[1][:, 3] = np.nan
    h[1][0, 3] = 0.001
    got = quantile_of_window(h[:, :filled], q)
    for s in range(3):
        rows = h[s, :filled]
        have = ~np.isnan(rows).all(axis=0)
        want = np.full(40, np.nan)
        with np.errstate(all="ignore"):
            if have.all() and not np.isnan(rows).any():
                want[:] = np.quantile(rows, q, axis=0)
            else:
                want[have] = np.nanquantile(rows[:, have], q, axis=0)
        assert np.array_equal(got[s].view(np.uint64), want.view(np.uint64)), s


def test_a_negative_zero_is_a_zero():
    from jaxpace.collectives.exchange import sanitize_seconds

    out = sanitize_seconds(np.array([-0.0, 0.0, 0.001, -0.001, np.nan, np.inf, -np.inf]))
    assert not np.signbit(out[:3]).any() and out[:3].tolist() == [0.0, 0.0, 0.001]
    assert np.isnan(out[3:]).all()
    clean = sanitize_seconds(np.array([-0.0, 0.002]))  # the all-valid shortcut
    assert not np.signbit(clean).any()


def test_an_idle_update_shares_its_rings_instead_of_copying():
    """A pure update that asks for no delay, with none leaving the ring, returns the same
    delay ring and running sums (nothing in them changes); one that paces writes its own."""
    R = F.ORDER_MIN_RANKS
    e = np.linspace(0.0, 0.004, R)
    idle = adaptive(warmup_steps=0, threshold_s=1.0)  # above any spread here: never engages
    _, st = idle.update(Observation(e), idle.init(R))  # a state whose caches the policy keeps
    d, new = idle.update(Observation(e), st)
    assert not d.any() and new.step == 2
    kept = idle.update.__self__.kept
    slept_new, slept_old = kept.get(new.history).slept_s, kept.get(st.history).slept_s
    assert np.shares_memory(new.delays, st.delays) and np.shares_memory(slept_new, slept_old)
    assert not np.shares_memory(new.history, st.history)
    busy = adaptive(warmup_steps=0, threshold_s=0.0, engage_steps=1)
    st = busy.init(R)
    d, new = busy.update(Observation(e), st)
    assert d.any() and not np.shares_memory(new.delays, st.delays) and not st.delays.any()
