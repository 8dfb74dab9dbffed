"""`adaptive`'s fast path gives the reference's results bit for bit.

`jaxpace.policy.adaptive.reference_update` is the algorithm in plain NumPy, one site at a
time. `jaxpace.adaptive` runs it through `jaxpace.policy._adaptive_fast` (sites batched, a
kept order of each window from 512 ranks on, compiled kernels). Edit the reference; this
file says what the fast path must match: every delay and every state field, as raw bytes,
at small and large rank counts, with NaN in the windows and a budget that binds, through
the single-site update, the batched update, and with the kernels on and off.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxpace.native import kernels
from jaxpace.policy import _adaptive_fast
from jaxpace.policy.adaptive import AdaptiveConfig, AdaptiveState, adaptive, reference
from jaxpace.policy.base import Observation

SMALL, LARGE = (2, 7, 64), (_adaptive_fast.ORDER_MIN_RANKS, 1024)


def _stream(seed: int, sites: int, ranks: int, steps: int, nan_p: float):
    """Raw earliness per step `(sites, ranks)`: a persistent part per rank, ties and zeros, and (with `nan_p`) NaN, inf,
    negative and -0.0 entries, a whole site unmeasured on some steps, and step times with
    NaN."""
    rng = np.random.default_rng(seed)
    persistent = np.round(rng.uniform(0.0, 0.008, ranks), 4)  # some ranks are early every step
    out = []
    for k in range(steps):
        x = np.round(rng.exponential(0.004, (sites, ranks)), 4) + persistent
        x[rng.random((sites, ranks)) < 0.1] = 0.0
        if nan_p:
            for bad in (np.nan, np.inf, -0.001, -0.0):
                x[rng.random((sites, ranks)) < nan_p / 4] = bad
            if k % 11 == 5:
                x[rng.integers(sites)] = np.nan
        t = rng.uniform(0.1, 0.2, sites)
        t[rng.random(sites) < 0.1] = np.nan
        out.append((x, t))
    return out


def _same(a, b, what):
    """Equal as raw bytes (NaN payloads and the sign of zero included), and of one type."""
    a_arr, b_arr = np.asarray(a), np.asarray(b)
    assert type(a) is type(b), (what, type(a), type(b))
    assert a_arr.dtype == b_arr.dtype and a_arr.shape == b_arr.shape, what
    assert a_arr.tobytes() == b_arr.tobytes(), what


def _same_site(ref: AdaptiveState, batch: AdaptiveState, j: int, what: str):
    """Site `j` of a batched state against a single-site state, field by field, as bytes."""
    for name, r, b in zip(AdaptiveState._fields, ref, batch, strict=True):
        r_arr = np.asarray(r)
        b_arr = np.asarray(b)[j].astype(r_arr.dtype)
        assert r_arr.tobytes() == b_arr.tobytes(), (what, name)


def _run_and_compare(cfg: AdaptiveConfig, ranks: int, sites: int, seed: int, nan_p: float):
    """Steps the reference, the fast single-site update and the batched update side by side;
    returns the reference's delays and states of site 0 (for coverage checks)."""
    steps = min(2 * cfg.window + 12, cfg.window + 40)
    ref, fast = reference(cfg), adaptive(cfg)
    r_states = [ref.init(ranks) for _ in range(sites)]
    f_states = [fast.init(ranks) for _ in range(sites)]
    b_state = fast.batched.init(sites, ranks)
    seen = []
    for k, (x, t) in enumerate(_stream(seed, sites, ranks, steps, nan_p)):
        d_b, b_state = fast.batched.update(Observation(x.copy(), t.copy()), b_state)
        for j in range(sites):
            obs = Observation(x[j].copy(), float(t[j]))
            d_r, r_states[j] = ref.update(obs, r_states[j])
            d_f, f_states[j] = fast.update(obs, f_states[j])
            _same(d_f, d_r, ("single delays", k, j))
            _same(d_b[j], d_r, ("batched delays", k, j))
            for name, a, b in zip(AdaptiveState._fields, f_states[j], r_states[j], strict=True):
                _same(a, b, ("single state", k, j, name))
            _same_site(r_states[j], b_state, j, ("batched state", k))
            if j == 0:
                seen.append((d_r, r_states[0]))
    return seen


CONFIGS = {
    "defaults": dict(),
    "paper": dict(threshold_s=0.002, max_delay_s=0.01, quantile=0.1, gain=0.3, warmup_steps=0),
    "window-1": dict(window=1, engage_steps=1, warmup_steps=0),
    "q0-w2": dict(window=2, quantile=0.0, engage_steps=1),
    "q1-w40": dict(window=40, quantile=1.0, engage_steps=2, warmup_steps=0),
    "w130-int16-order": dict(window=130, quantile=0.7, engage_steps=1, warmup_steps=0),
    "budget-binds": dict(
        budget_fraction=0.05, max_delay_s=0.01, engage_steps=1, gain=1.0, warmup_steps=0
    ),
    "ab": dict(warmup_steps=0, engage_steps=1, ab_test=True, ab_period=3, ab_min_windows=1),
    "backs-off": dict(max_delay_s=0.0001, giveup_factor=1.0, engage_steps=1, warmup_steps=0),
}


@pytest.mark.parametrize("ranks", SMALL + LARGE)
@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_fast_path_is_the_reference_bit_for_bit(case, ranks):
    seen = _run_and_compare(AdaptiveConfig(**CONFIGS[case]), ranks, 3, len(case), 0.06)
    assert any(d.any() for d, _ in seen) or case == "backs-off", "never paced: budget untested"


@pytest.mark.parametrize("ranks", [7, 1024])
def test_with_kernels_off_too(ranks, monkeypatch):
    monkeypatch.setitem(kernels._state, "lib", None)
    monkeypatch.setitem(kernels._state, "reason", "switched off by the test")
    for case in ("paper", "budget-binds", "q1-w40"):
        _run_and_compare(AdaptiveConfig(**CONFIGS[case]), ranks, 2, 7, 0.06)


@pytest.mark.parametrize("ranks", [64, 1024])
def test_the_cases_cover_nan_windows_and_a_binding_budget(ranks):
    """The streams above do reach what they are meant to: a window holding NaN while pacing,
    and a delay the budget cut below `min(gain * expected, max_delay_s)`."""
    cfg = AdaptiveConfig(**CONFIGS["budget-binds"])
    seen = _run_and_compare(cfg, ranks, 2, 3, 0.06)
    nan_while_pacing = any(d.any() and np.isnan(s.history[: s.filled]).any() for d, s in seen)
    assert nan_while_pacing
    loose = _run_and_compare(AdaptiveConfig(**{**CONFIGS["budget-binds"], "budget_fraction": 1.0}),
                             ranks, 2, 3, 0.06)  # fmt: skip
    cut = [(d < dl).any() for (d, _), (dl, _) in zip(seen, loose, strict=True)]
    assert any(cut), "the budget never bound"


def test_a_state_from_elsewhere_rebuilds_the_caches():
    """The fast path's caches are not in the state: a state it did not make (a copy of the
    reference's) or one with a replaced delay ring gives the same results as its own."""
    cfg = AdaptiveConfig(**CONFIGS["budget-binds"])
    ranks = 1024
    ref, fast = reference(cfg), adaptive(cfg)
    s_ref = s_fast = ref.init(ranks)
    for k, (x, t) in enumerate(_stream(5, 1, ranks, 40, 0.06)):
        obs = Observation(x[0], float(t[0]))
        if k % 3 == 0:  # a copy of the reference's state: no cache anywhere for it
            s_fast = AdaptiveState(*(np.array(v, copy=True) if isinstance(v, np.ndarray) else v
                                     for v in s_ref))  # fmt: skip
        elif k % 5 == 0:  # the same windows, another (equal) delay ring
            s_fast = s_fast._replace(delays=s_fast.delays.copy())
        d_r, s_ref = ref.update(obs, s_ref)
        d_f, s_fast = fast.update(obs, s_fast)
        _same(d_f, d_r, ("delays", k))
        for name, a, b in zip(AdaptiveState._fields, s_fast, s_ref, strict=True):
            _same(a, b, ("state", k, name))
    assert len(AdaptiveState._fields) == 15  # the algorithm's state, nothing of the fast path


@settings(max_examples=25, deadline=None)
@given(
    ranks=st.sampled_from([3, 16, 600]),
    window=st.integers(1, 20),
    quantile=st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.9, 1.0]),
    budget_fraction=st.sampled_from([0.02, 0.2, 1.0]),
    gain=st.sampled_from([0.3, 1.0]),
    warmup_steps=st.integers(0, 3),
    engage_steps=st.integers(1, 3),
    ab_test=st.booleans(),
    nan_p=st.sampled_from([0.0, 0.05, 0.5]),
    seed=st.integers(0, 2**16),
)
def test_property_fast_equals_reference(
    ranks, window, quantile, budget_fraction, gain, warmup_steps, engage_steps, ab_test, nan_p,
    seed,
):  # fmt: skip
    cfg = AdaptiveConfig(
        window=window, quantile=quantile, budget_fraction=budget_fraction, gain=gain,
        warmup_steps=warmup_steps, engage_steps=engage_steps, ab_test=ab_test, ab_period=2,
        ab_min_windows=1, max_delay_s=0.01, threshold_s=0.001,
    )  # fmt: skip
    _run_and_compare(cfg, ranks, 2, seed, nan_p)
