"""Pacing policies: pure `(init, update)` pairs that turn earliness into bounded delays."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple, Protocol

import numpy as np

from jaxpace._exchange import sanitize_seconds
from jaxpace._native import kernels
from jaxpace._validate import check_bool, check_number
from jaxpace.errors import ConfigError

__all__ = [
    "AdaptiveConfig",
    "AdaptiveState",
    "FixedState",
    "NoPacingState",
    "Observation",
    "PacingPolicy",
    "PolicyStatus",
    "adaptive",
    "batched",
    "fixed",
    "no_pacing",
]

# Largest delay any policy may ask for. A rank asleep longer than this looks
# hung to its peers, and nothing in JAX aborts a sleeping callback.
MAX_DELAY_CAP_S = 5.0


class Observation(NamedTuple):
    """What every rank knows after a collective, identical on all of them.

    Attributes:
      earliness_s: shape `(num_ranks,)`, seconds each rank arrived before the
        last arriver at the previous step (`w_i - min_j w_j`, so >= 0). NaN marks
        a rank with no measurement (unsampled step, missing process).
      step_time_s: the previous step's iteration time in seconds (median over
        ranks of collective-exit to collective-exit), NaN when unknown.
    """

    earliness_s: np.ndarray
    step_time_s: float = math.nan


class PolicyInitFn(Protocol):
    def __call__(self, num_ranks: int) -> Any:
        """Returns the initial state for `num_ranks` ranks."""


class PolicyUpdateFn(Protocol):
    def __call__(self, obs: Observation, state: Any) -> tuple[np.ndarray, Any]:
        """Returns `(delays_s, new_state)`.

        `delays_s` has shape `(num_ranks,)`, each entry in `[0, max_delay_s]`:
        how long that rank sleeps before the next collective at this site. Pure:
        no clocks, no I/O, no globals, so every rank (and the simulator)
        computes the same decision from the same observation.
        """


class PolicyStatus(NamedTuple):
    """What a policy's state says about pacing, for `Pacer.stats()` and logs.

    Attributes:
      engaged: pacing is on (delays may be non-zero).
      backed_off: the policy refused to chase a skew beyond its bounds.
      spread_s: the latest spread estimate in seconds (NaN if the policy has none).
      ab_effect: `{"paced_step_s", "unpaced_step_s", "rejected"}` once an A/B
        guard has measured both arms, else None.
    """

    engaged: bool = False
    backed_off: bool = False
    spread_s: float = math.nan
    ab_effect: dict[str, Any] | None = None


class PolicyStatusFn(Protocol):
    def __call__(self, state: Any) -> PolicyStatus:
        """Reads a `PolicyStatus` from a state of this policy (pure, cheap)."""


def _idle_status(state: Any) -> PolicyStatus:
    """The status of a policy that never paces adaptively."""
    del state
    return PolicyStatus()


class PacingPolicy(NamedTuple):
    """A pacing policy, as an optax-style pair of pure functions.

    Attributes:
      init: `init(num_ranks) -> state`.
      update: `update(obs, state) -> (delays_s, state)`.
      name: a short description, also used to check that every process runs
        the same policy.
      max_delay_s: the hard upper bound of every delay this policy returns.
      needs_exchange: whether `update` reads the other ranks' earliness. If
        False, the runtime skips the in-band exchange (its observations then
        carry NaN earliness) and the collective's operands are exactly lax's.
      status: `status(state) -> PolicyStatus`; the only way the runtime reads
        a policy's state (default: never engaged).
    """

    init: PolicyInitFn
    update: PolicyUpdateFn
    name: str = "custom"
    max_delay_s: float = 0.0
    needs_exchange: bool = True
    status: PolicyStatusFn = _idle_status


def _zeros(num_ranks: int) -> np.ndarray:
    return np.zeros((num_ranks,), dtype=np.float64)


class BatchedPolicy(NamedTuple):
    """A policy's update for `num_sites` independent sites at once (the simulator's path).

    `init(num_sites, num_ranks)` returns one state whose fields carry a leading
    site axis; `update(obs, state)` takes `obs.earliness_s` of shape
    `(num_sites, num_ranks)` and `obs.step_time_s` of shape `(num_sites,)` and
    returns `(delays (num_sites, num_ranks), state)`. Each site's delays equal
    what the policy's own `update` returns for that site alone: the single-site
    `update` of these policies is this function on a batch of one.

    `update` may reuse the arrays of the state it is given for the state it
    returns: keep only the returned state (the simulator does).
    `constant`: the delays and the state do not depend on the observation's
    values, only on its shape (`no_pacing`, `fixed`), so a caller may run the
    update before the observation exists.
    """

    init: Any
    update: Any
    constant: bool = False


def batched(policy: PacingPolicy) -> BatchedPolicy | None:
    """The batched form of `policy` (see `BatchedPolicy`), or None if it has none.

    `no_pacing`, `fixed` and `adaptive` have one; a custom policy does not, and
    callers then update each site in turn.

    >>> b = batched(fixed(0.002))
    >>> b.update(Observation(np.zeros((2, 3)), np.zeros(2)), b.init(2, 3))[0].shape
    (2, 3)
    """
    return getattr(policy.update, "batched", None)


# --------------------------------------------------------------------------- no_pacing


class NoPacingState(NamedTuple):
    """State of `no_pacing`: the number of observed steps."""

    steps: int


def no_pacing() -> PacingPolicy:
    """Measures only: every delay is zero.

    >>> p = no_pacing()
    >>> d, s = p.update(Observation(np.array([0.0, 0.02])), p.init(2))
    >>> d.tolist()
    [0.0, 0.0]
    """

    def init_fn(num_ranks: int) -> NoPacingState:
        del num_ranks
        return NoPacingState(steps=0)

    def update_fn(obs: Observation, state: NoPacingState):
        return _zeros(len(obs.earliness_s)), NoPacingState(steps=state.steps + 1)

    def update_batch(obs: Observation, state: NoPacingState):
        return np.zeros(np.shape(obs.earliness_s)), NoPacingState(steps=state.steps + 1)

    update_fn.batched = BatchedPolicy(
        lambda num_sites, num_ranks: init_fn(num_ranks), update_batch, constant=True
    )
    return PacingPolicy(
        init_fn, update_fn, name="no_pacing()", max_delay_s=0.0, needs_exchange=False
    )


# --------------------------------------------------------------------------- fixed


class FixedState(NamedTuple):
    """State of `fixed`: the number of observed steps."""

    steps: int


def fixed(delay_s: float) -> PacingPolicy:
    """Delays every rank by the same `delay_s` before each collective.

    Useful as a control in experiments (it can only slow a balanced job down).

    Args:
      delay_s: seconds, in `[0, 5]`.

    Raises:
      ConfigError: `delay_s` is not a finite number in range.

    >>> p = fixed(0.001)
    >>> p.update(Observation(np.zeros(3)), p.init(3))[0].tolist()
    [0.001, 0.001, 0.001]
    """
    check_number("delay_s", delay_s, lo=0.0, hi=MAX_DELAY_CAP_S)
    delay_s = float(delay_s)

    def init_fn(num_ranks: int) -> FixedState:
        del num_ranks
        return FixedState(steps=0)

    def update_fn(obs: Observation, state: FixedState):
        return np.full((len(obs.earliness_s),), delay_s), FixedState(steps=state.steps + 1)

    def update_batch(obs: Observation, state: FixedState):
        return np.full(np.shape(obs.earliness_s), delay_s), FixedState(steps=state.steps + 1)

    update_fn.batched = BatchedPolicy(
        lambda num_sites, num_ranks: init_fn(num_ranks), update_batch, constant=True
    )

    return PacingPolicy(
        init_fn,
        update_fn,
        name=f"fixed(delay_s={delay_s!r})",
        max_delay_s=delay_s,
        needs_exchange=False,
    )


# --------------------------------------------------------------------------- adaptive


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdaptiveConfig:
    """Settings of `adaptive`; every field is validated on construction.

    Attributes:
      threshold_s: engage when the estimated spread (max expected earliness)
        stays above this many seconds. Below it, waiting is no bigger than the
        collective's own noise and pacing would only cost. `[0, 5]`.
      max_delay_s: hard bound on any single delay, seconds, `(0, 5]`.
      gain: fraction of a rank's expected earliness it sleeps, `(0, 1]`.
      window: number of recent steps the estimate looks at, `[1, 4096]`.
      quantile: which quantile of a rank's recent earliness is its expected
        earliness, `[0, 1]`; 0.5 (the median) ignores isolated spikes, lower is
        more conservative.
      warmup_steps: steps ignored entirely at start (compilation, caches),
        `[0, 10**9]`.
      engage_steps: consecutive steps the spread must stay above `threshold_s`
        before pacing starts (persistence), `[1, 10**6]`.
      disengage_steps: consecutive steps below `hysteresis * threshold_s` before
        pacing stops, `[1, 10**6]`.
      hysteresis: `(0, 1]`, fraction of `threshold_s` the spread must fall under
        to count towards disengaging.
      budget_fraction: the most a rank may sleep over the last `window` steps,
        as a fraction of `window * max_delay_s`, `(0, 1]`.
      giveup_factor: if the spread stays above `giveup_factor * max_delay_s`
        the skew is far beyond what pacing can absorb: the policy backs off
        (zero delay) rather than chase it, `[1, 1000]`.
      ab_test: alternate paced and unpaced windows while engaged and keep
        pacing only if paced steps are not slower than unpaced ones by more than
        `ab_tolerance`.
      ab_period: steps per A/B window, `[2, 10**6]`.
      ab_tolerance: allowed relative slowdown of paced steps, `[0, 1]`.
      ab_min_windows: windows of each arm needed before judging, `[1, 10**6]`.
    """

    threshold_s: float = 0.001
    max_delay_s: float = 0.005
    gain: float = 0.9
    window: int = 16
    quantile: float = 0.5
    warmup_steps: int = 5
    engage_steps: int = 8
    disengage_steps: int = 8
    hysteresis: float = 0.5
    budget_fraction: float = 1.0
    giveup_factor: float = 20.0
    ab_test: bool = False
    ab_period: int = 20
    ab_tolerance: float = 0.01
    ab_min_windows: int = 2

    def __post_init__(self) -> None:
        check_number("threshold_s", self.threshold_s, lo=0.0, hi=MAX_DELAY_CAP_S)
        check_number("max_delay_s", self.max_delay_s, lo=0.0, hi=MAX_DELAY_CAP_S, lo_open=True)
        check_number("gain", self.gain, lo=0.0, hi=1.0, lo_open=True)
        check_number("window", self.window, lo=1, hi=4096, integer=True)
        check_number("quantile", self.quantile, lo=0.0, hi=1.0)
        check_number("warmup_steps", self.warmup_steps, lo=0, hi=10**9, integer=True)
        check_number("engage_steps", self.engage_steps, lo=1, hi=10**6, integer=True)
        check_number("disengage_steps", self.disengage_steps, lo=1, hi=10**6, integer=True)
        check_number("hysteresis", self.hysteresis, lo=0.0, hi=1.0, lo_open=True)
        check_number("budget_fraction", self.budget_fraction, lo=0.0, hi=1.0, lo_open=True)
        check_number("giveup_factor", self.giveup_factor, lo=1.0, hi=1000.0)
        check_bool("ab_test", self.ab_test)
        check_number("ab_period", self.ab_period, lo=2, hi=10**6, integer=True)
        check_number("ab_tolerance", self.ab_tolerance, lo=0.0, hi=1.0)
        check_number("ab_min_windows", self.ab_min_windows, lo=1, hi=10**6, integer=True)


class AdaptiveState(NamedTuple):
    """State of `adaptive`.

    Attributes:
      step: observations seen so far (warm-up included).
      history: `(window, num_ranks)` ring of recent earliness (NaN = none).
      delays: `(window, num_ranks)` ring of recent delays, for the budget.
      filled: how many rows of `history` hold data.
      engaged: whether pacing is on.
      above: consecutive steps with spread above `threshold_s`.
      below: consecutive steps with spread below `hysteresis * threshold_s`.
      giveup: consecutive steps with spread above `giveup_factor * max_delay_s`.
      backed_off: pacing was refused because the skew exceeds its bounds.
      spread_s: the latest spread estimate.
      ab_arm: 1 while the current A/B window paces, 0 while it does not.
      ab_sum_s: `(2,)` summed step time per arm (index 0 unpaced, 1 paced).
      ab_count: `(2,)` steps counted per arm.
      ab_rejected: the A/B guard found pacing slower and turned it off.
      steps_paced: steps on which a non-zero delay was requested.
      order: `(window, num_ranks)` small ints, each `history` entry's rank
        among its rank's window (NaN entries last), kept up to date on each
        update so that the windowed quantile needs no sort. Empty, `(0,
        num_ranks)`, below `_ORDER_MIN_RANKS` ranks, where sorting the window
        costs less (and None in a state built by hand: sorted too).
      odd: `(window,)` ints, the entries of each `history` row that are NaN (a
        window holding any reads `np.nanquantile`'s value off `order`); empty or
        None with `order`.
      slept_s: `(num_ranks,)` each rank's `delays` summed over the window, kept
        as a running sum (summed afresh every `_RESUM_STEPS` updates): it only
        tells when the budget cannot bind, so that the exact budget sum can be
        skipped. Empty or None with `order`: the budget is always summed.
    """

    step: int
    history: np.ndarray
    delays: np.ndarray
    filled: int
    engaged: bool
    above: int
    below: int
    giveup: int
    backed_off: bool
    spread_s: float
    ab_arm: int
    ab_sum_s: np.ndarray
    ab_count: np.ndarray
    ab_rejected: bool
    steps_paced: int
    order: np.ndarray | None = None
    odd: np.ndarray | None = None
    slept_s: np.ndarray | None = None


def adaptive(config: AdaptiveConfig | None = None, **kwargs: Any) -> PacingPolicy:
    """Paces early ranks by a bounded share of their persistent earliness.

    Each rank's expected earliness is a windowed quantile of its recent
    earliness (robust to spikes). When the spread (the largest expected
    earliness) stays above `threshold_s` for `engage_steps` steps, every rank is
    asked to sleep `gain * expected_earliness`, clamped to `[0, max_delay_s]` and
    to a per-window budget; when the spread falls below
    `hysteresis * threshold_s` for `disengage_steps` steps, pacing stops. The
    last arriver always gets zero delay. A skew far beyond `max_delay_s` makes
    the policy back off instead of chasing it.

    Args:
      config: an `AdaptiveConfig`; or pass its fields as keyword arguments.
      **kwargs: fields of `AdaptiveConfig`.

    Returns:
      A `PacingPolicy`.

    Raises:
      ConfigError: a field is out of range (the message names it).

    >>> p = adaptive(threshold_s=0.001, max_delay_s=0.03, warmup_steps=0, engage_steps=2)
    >>> s = p.init(2)
    >>> for _ in range(3):
    ...     d, s = p.update(Observation(np.array([0.02, 0.0])), s)
    >>> [round(x, 4) for x in d.tolist()]
    [0.018, 0.0]
    """
    if config is None:
        try:
            config = AdaptiveConfig(**kwargs)
        except TypeError as e:
            fields = ", ".join(f"`{f.name}`" for f in dataclasses.fields(AdaptiveConfig))
            raise ConfigError(f"adaptive(): {e}. Valid fields: {fields}.") from None
    elif kwargs:
        config = dataclasses.replace(config, **kwargs)
    if not isinstance(config, AdaptiveConfig):
        raise ConfigError(f"`config` must be an AdaptiveConfig, got {type(config).__name__}.")
    c = config

    def init_fn(num_ranks: int) -> AdaptiveState:
        return _adaptive_init(c, num_ranks)

    def update_fn(obs: Observation, state: AdaptiveState) -> tuple[np.ndarray, AdaptiveState]:
        e = sanitize_seconds(obs.earliness_s)
        n = state.history.shape[1]
        if e.shape != (n,):
            raise ValueError(f"`obs.earliness_s` must have shape ({n},), got {e.shape}.")
        t = np.array([obs.step_time_s], dtype=np.float64)
        delays, new = _adaptive_update(c, e[None], t, _stack(state), owned=False)
        return delays[0], _unstack(new)

    def init_batch(num_sites: int, num_ranks: int) -> AdaptiveState:
        one = _adaptive_init(c, num_ranks)
        return AdaptiveState(
            *(None if v is None else np.repeat(np.asarray(v)[None], int(num_sites), axis=0)
              for v in one)
        )  # fmt: skip

    def update_batch(obs: Observation, state: AdaptiveState) -> tuple[np.ndarray, AdaptiveState]:
        e = sanitize_seconds(obs.earliness_s).reshape(np.shape(obs.earliness_s))
        if e.shape != state.history.shape[::2]:
            raise ValueError(
                f"`obs.earliness_s` must have shape {state.history.shape[::2]}, got {e.shape}."
            )
        t = np.asarray(obs.step_time_s, dtype=np.float64)
        if t.shape != e.shape[:1]:
            t = np.broadcast_to(t, e.shape[:1])
        return _adaptive_update(c, e, t, state, owned=True)

    update_fn.batched = BatchedPolicy(init_batch, update_batch)

    fields = ", ".join(f"{f.name}={getattr(c, f.name)!r}" for f in dataclasses.fields(c))
    return PacingPolicy(
        init_fn,
        update_fn,
        name=f"adaptive({fields})",
        max_delay_s=c.max_delay_s,
        status=adaptive_status,
    )


def _adaptive_init(c: AdaptiveConfig, num_ranks: int) -> AdaptiveState:
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, (int, np.integer)) or num_ranks < 1:
        raise ConfigError(f"`num_ranks` must be a positive integer, got {num_ranks!r}.")
    n = int(num_ranks)
    w = c.window if n >= _ORDER_MIN_RANKS else 0
    return AdaptiveState(
        step=0,
        history=np.full((c.window, n), np.nan),
        delays=np.zeros((c.window, n)),
        filled=0,
        engaged=False,
        above=0,
        below=0,
        giveup=0,
        backed_off=False,
        spread_s=0.0,
        ab_arm=1,
        ab_sum_s=np.zeros(2),
        ab_count=np.zeros(2, dtype=np.int64),
        ab_rejected=False,
        steps_paced=0,
        # All NaN: any order is the window's order. Empty: not kept.
        order=np.repeat(np.arange(w, dtype=_order_dtype(c.window))[:, None], n, axis=1),
        odd=np.zeros(w, dtype=np.int64),
        slept_s=np.zeros(n if w else 0),
    )


# From this many ranks on, `adaptive` keeps `AdaptiveState.order` (below it,
# sorting the window each update costs less than keeping the order).
_ORDER_MIN_RANKS = 512


def _order_dtype(window: int) -> type:
    return np.int8 if window <= 127 else np.int16


def _stack(state: AdaptiveState) -> AdaptiveState:
    """One site's state as a batch of one (every field gains a leading axis of 1)."""
    return AdaptiveState(*(None if v is None else np.asarray(v)[None] for v in state))


def _unstack(b: AdaptiveState) -> AdaptiveState:
    """The single-site state (Python scalars, as `init` makes them) of a batch of one."""
    return AdaptiveState(
        step=int(b.step[0]),
        history=b.history[0],
        delays=b.delays[0],
        filled=int(b.filled[0]),
        engaged=bool(b.engaged[0]),
        above=int(b.above[0]),
        below=int(b.below[0]),
        giveup=int(b.giveup[0]),
        backed_off=bool(b.backed_off[0]),
        spread_s=float(b.spread_s[0]),
        ab_arm=int(b.ab_arm[0]),
        ab_sum_s=b.ab_sum_s[0],
        ab_count=b.ab_count[0],
        ab_rejected=bool(b.ab_rejected[0]),
        steps_paced=int(b.steps_paced[0]),
        order=None if b.order is None else b.order[0],
        odd=None if b.odd is None else b.odd[0],
        slept_s=None if b.slept_s is None else b.slept_s[0],
    )


def _adaptive_update(
    c: AdaptiveConfig,
    e: np.ndarray,
    step_time_s: np.ndarray,
    st: AdaptiveState,
    *,
    owned: bool = False,
) -> tuple[np.ndarray, AdaptiveState]:
    """`adaptive`'s update for B sites at once: `e` (B, R) sanitized, state with a site axis.

    Every site follows the stages below on its own (estimate -> gate -> A/B guard
    -> budget); only the array work is shared. `owned`: the caller gives up `st`,
    so its rings are updated in place instead of copied (the batched path; the
    single-site `update` stays pure).
    """
    B, n = e.shape
    step = st.step + 1
    active = step > c.warmup_steps
    every = bool(active.all())
    if not every and not active.any():
        return np.zeros((B, n)), st._replace(step=step)
    ia = _site_index(B) if every else np.flatnonzero(active)
    row = (step - c.warmup_steps - 1) % c.window
    history, delay_hist = st.history, st.delays
    # `order`, `odd` and `slept_s` are kept from `_ORDER_MIN_RANKS` ranks on; below,
    # each update sorts the window and sums the budget (fewer NumPy calls).
    kept = st.order is not None and st.order.shape[1] > 0 and st.odd is not None
    order, odd = (st.order, st.odd) if kept else (None, None)
    slept = st.slept_s if kept and st.slept_s is not None else None
    if not owned:
        history = history.copy()
        if order is not None:
            order, odd = order.copy(), odd.copy()
    grown = np.minimum(st.filled + 1, c.window)
    filled = grown if every else np.where(active, grown, st.filled)
    # Sites in step (the simulator's): one row for all, written through slices.
    r0 = int(row[0]) if kept and every and (B == 1 or (row == row[0]).all()) else None
    expected, spread = _insert_estimate(c, history, order, odd, ia, row, e, every, r0, filled)
    gate = _gate(c, st, spread)
    ab = _ab_all(c, st, gate, step_time_s)
    pacing_now = gate.engaged & active
    if c.ab_test:
        pacing_now &= ~(ab.rejected | (ab.arm == 0))
    delays, delay_hist, slept, paced = _delays_all(
        c, delay_hist, slept, row, r0, expected, e, ia, step, pacing_now, owned
    )
    new = AdaptiveState(
        step=step,
        history=history,
        delays=delay_hist,
        filled=filled,
        engaged=gate.engaged,
        above=gate.above,
        below=gate.below,
        giveup=gate.giveup,
        backed_off=gate.backed_off,
        spread_s=spread,
        ab_arm=ab.arm,
        ab_sum_s=ab.sum_s,
        ab_count=ab.count,
        ab_rejected=ab.rejected,
        steps_paced=st.steps_paced + paced,
        order=order if kept else st.order,
        odd=odd if kept else st.odd,
        slept_s=slept if slept is not None else st.slept_s,
    )
    if not every:  # sites still in warm-up only count the step (their rings were not written)
        new = _keep_warming_up(st, new, ~active, step)
    return delays, new


def _insert_estimate(c, history, order, odd, ia, row, e, every, r0, filled):
    """`_insert`, then `_estimate_all`: in one compiled pass (`kernels.window_step`) when every
    site writes row `r0` of a kept order and no window holds NaN (the kernel checks `odd` and
    `e`, and changes nothing when one does)."""
    if every and r0 is not None and order is not None and (filled == filled[0]).all():
        k = _quantile_read(int(filled[0]), c.quantile)
        got = kernels.window_step(history, order, odd, r0, e, *k)
        if got is not None:
            return got
    _insert(history, order, odd, ia, row, e, every, r0)
    return _estimate_all(c, history, order, odd, ia, filled, e.shape)


def _estimate_all(c, history, order, odd, ia, filled, shape) -> tuple[np.ndarray, np.ndarray]:
    """Estimate stage for active sites `ia`: each rank's windowed quantile, each site's spread."""
    B, n = shape
    expected = np.full((B, n), np.nan)
    fa = filled[ia]
    groups = fa[:1] if (fa == fa[0]).all() else np.unique(fa)  # sites with as many rows
    for f in groups:
        idx = ia[fa == f]
        expected[idx] = _window_quantile(history, order, odd, idx, int(f), c.quantile, B)
    fin = np.isfinite(expected)
    if fin.all():
        spread = expected.max(axis=1)
    else:
        spread = np.where(fin.any(axis=1), np.where(fin, expected, -np.inf).max(axis=1), 0.0)
    return expected, spread


def _ab_all(c, st, gate, step_time_s) -> _AB:
    """A/B guard stage for every site (unchanged state when the guard is off)."""
    if not c.ab_test:
        return _AB(st.ab_arm, st.ab_sum_s, st.ab_count, st.ab_rejected)
    abs_ = [
        _ab_guard(c, _ABView(*(x[b] for x in (st.ab_arm, st.ab_sum_s, st.ab_count,
                  st.ab_rejected))), bool(gate.engaged[b]), float(step_time_s[b]))
        for b in range(len(gate.engaged))
    ]  # fmt: skip
    return _AB(
        np.array([x.arm for x in abs_]),
        np.array([x.sum_s for x in abs_]),
        np.array([x.count for x in abs_]),
        np.array([x.rejected for x in abs_]),
    )


@functools.lru_cache(maxsize=16)
def _site_index(num_sites: int) -> np.ndarray:
    """`np.flatnonzero` of `num_sites` active sites (read-only)."""
    ia = np.arange(num_sites)
    ia.flags.writeable = False
    return ia


def _delays_all(c, delay_hist, slept, row, r0, expected, e, ia, step, pacing_now, owned):
    """Budget stage for the pacing sites, recorded in the rings: `(delays (B, R), delay ring,
    running sums, whether each site asked for a delay)`. In one compiled pass
    (`kernels.paced_delays`) when every site paces at row `r0` and the budget cannot bind."""
    B = len(pacing_now)
    on = int(np.count_nonzero(pacing_now))
    if on == B and r0 is not None and slept is not None:
        if not owned:
            delay_hist, slept = delay_hist.copy(), slept.copy()
        got = kernels.paced_delays(
            delay_hist, slept, r0, expected, e, gain=c.gain, max_delay_s=c.max_delay_s,
            unbound=_unbound_below(c, c.budget_fraction * c.window * c.max_delay_s),
        )  # fmt: skip
        if got is not None:
            delays, paced = got
            _resum(delay_hist, slept, ia, step)
            return delays, delay_hist, slept, paced
        owned = True  # the copies are this update's own
    if on == B:
        delays = _budgeted_delays(c, delay_hist, row, expected, e, slept)
    else:
        delays = np.zeros(expected.shape)
    if on == 0 and r0 is not None and not delay_hist[:, r0].any():
        if not (step % _RESUM_STEPS == 0).any():
            # Nothing asked for and nothing leaving the rings: writing zeros over zeros (and
            # `slept` - 0 + 0) leaves them as they are, so a pure update need not copy them.
            return delays, delay_hist, slept, np.zeros(B, dtype=bool)
    if 0 < on < B:
        ip = np.flatnonzero(pacing_now)
        bound = None if slept is None else slept[ip]
        delays[ip] = _budgeted_delays(c, delay_hist[ip], row[ip], expected[ip], e[ip], bound)
    delay_hist, slept = _record_delays(delay_hist, slept, delays, ia, row, r0, step, owned)
    return delays, delay_hist, slept, delays.max(axis=1) > 0  # delays are >= 0


def _resum(delay_hist, slept, ia, step) -> None:
    """Every `_RESUM_STEPS` updates a site's running sum is summed afresh from its ring."""
    due = step % _RESUM_STEPS == 0
    if not due.any():
        return
    again = ia[due[ia]]
    if again.size:
        slept[again] = delay_hist[again].sum(axis=1)


def _record_delays(delay_hist, slept, delays, ia, row, r0, step, owned):
    """Writes this step's delays into the budget rings (and their running sums)."""
    if not owned:
        delay_hist = delay_hist.copy()
        slept = None if slept is None else slept.copy()
    if r0 is not None:
        if slept is not None:  # the running sum: minus the row that leaves, plus the new one
            slept -= delay_hist[:, r0]
            slept += delays
        delay_hist[:, r0] = delays
    else:
        if slept is not None:
            slept[ia] -= delay_hist[ia, row[ia]]
            slept[ia] += delays[ia]
        delay_hist[ia, row[ia]] = delays[ia]
    if slept is not None:
        _resum(delay_hist, slept, ia, step)
    return delay_hist, slept


def _keep_warming_up(st, new, keep, step) -> AdaptiveState:
    """Sites `keep` (still in warm-up) keep their old state except the step count."""
    rings = ("history", "delays", "order", "odd", "slept_s")
    fields = {}
    for name, old, cur in zip(AdaptiveState._fields, st, new, strict=True):
        if name not in rings:
            cur = np.array(cur, copy=True)
            cur[keep] = np.asarray(old)[keep]
        fields[name] = cur
    return AdaptiveState(**fields)._replace(step=step)


def _insert(
    history: np.ndarray,
    order: np.ndarray | None,
    odd: np.ndarray | None,
    ia: np.ndarray,
    row: np.ndarray,
    e: np.ndarray,
    every: bool,
    r0: int | None = None,
) -> None:
    """Writes `e` into row `row` of sites `ia`'s windows, in place, keeping `order` and `odd`.

    `r0`: every site is active and writes this one row.

    The entry leaving the window drops out of its rank's order (every entry
    above it moves down one); the new one goes above every entry `<=` it
    (above all of them if it is NaN), and every entry above it moves up one.
    """
    if every and r0 is not None and _insert_kernel(history, order, odd, ia, r0, e):
        return
    if every:
        h, o, r, x = history, order, row, e
    else:
        h, r, x = history[ia], row[ia], e[ia]
        o = None if order is None else order[ia]
    at = (slice(None), r0) if r0 is not None else (np.arange(len(r)), r)
    if o is not None:
        o -= o > o[at][:, None, :]
    h[at] = x
    if o is not None:
        le = h <= x[:, None, :]
        if _count_odd(odd, ia, r, x):
            le |= np.isnan(x)[:, None, :]
        below = le.sum(axis=1, dtype=o.dtype)
        o += ~le
        o[at] = below - 1
    if not every:
        history[ia] = h
        if o is not None:
            order[ia] = o


_POS_INF_BITS = np.float64(np.inf).view(np.uint64)


def _insert_kernel(history, order, odd, ia, r0, e) -> bool:
    """`_insert` for every site at row `r0` through the compiled kernel; False if it cannot."""
    if order is None or not kernels.order_insert(history, order, r0, e):
        return False
    _count_odd(odd, ia, r0, e)
    return True


def _count_odd(odd: np.ndarray, ia: np.ndarray, r, x: np.ndarray) -> bool:
    """Stores in `odd[ia, r]` how many of each site's new entries `x` are NaN (what sends
    `_window_quantile` off the plain order read); True if any are.

    `x` is sanitized: NaN is the canonical quiet NaN, nothing is negative (not even -0.0).
    Read as unsigned integers, exactly NaN (and any -0.0, were one there) lie above +inf.
    """
    bad = x.view(np.uint64) > _POS_INF_BITS
    if bad.any():
        odd[ia, r] = np.count_nonzero(bad, axis=1)
        return True
    odd[ia, r] = 0
    return False


def _window_quantile(
    history: np.ndarray,
    order: np.ndarray | None,
    odd: np.ndarray | None,
    idx: np.ndarray,
    filled: int,
    quantile: float,
    num_sites: int,
) -> np.ndarray:
    """`_expected_batch(history[idx], filled, quantile)`, read off `order` where it can.

    A window with no NaN has one sorted order of its values (sanitized entries
    hold no -0.0), which `order` gives: the quantile is `_sorted_quantile`'s
    arithmetic on the entries of the two ranks it needs. With NaN (ranked
    last), each rank's finite entries are the first ranks of its window, and
    the quantile is `np.nanquantile`'s: the same arithmetic on as many entries
    as are finite.
    """
    if order is None:
        return _expected_batch(history[idx], filled, quantile)
    full = len(idx) == num_sites
    if not odd.any():
        if full:
            return _order_quantile(history, order, filled, quantile)
        return _order_quantile(history[idx], order[idx], filled, quantile)
    clean = odd[idx].sum(axis=1) == 0
    out = np.empty((len(idx), history.shape[2]))
    ic = idx[clean]
    if ic.size:
        out[clean] = _order_quantile(history[ic], order[ic], filled, quantile)
    slow = np.flatnonzero(~clean)
    if slow.size:
        i = idx[slow]
        finite = filled - np.isnan(history[i, :filled]).sum(axis=1)
        out[slow] = _order_nanquantile(history[i], order[i], finite, quantile)
    return out


def _order_nanquantile(
    h: np.ndarray, o: np.ndarray, finite: np.ndarray, quantile: float
) -> np.ndarray:
    """`np.nanquantile` of each (site, rank) window, from `o`: `finite` `(sites, ranks)` entries.

    NumPy's per-column arithmetic (method "linear"): virtual index
    `(finite - 1) q`, the entries at its floor and the next one (both the last
    when it reaches the end), and `a + (b - a) t`, `b - (b - a)(1 - t)` for
    `t >= 0.5`; NaN where nothing is finite.
    """
    k0, k1, t = _nanquantile_read(finite, quantile, o.dtype)
    return _nanquantile_lerp(_at_rank(h, o, k0), _at_rank(h, o, k1), t, finite)


def _nanquantile_read(finite: np.ndarray, quantile: float, dtype) -> tuple:
    """`np.nanquantile`'s read of windows with `finite` entries each, sorted (NaN last):
    `(k0, k1, t)`, the entries at the virtual index's floor and the next one (both the last
    when it reaches the end), and the weight."""
    n = finite.astype(np.float64)
    virtual = (n - 1) * np.float64(quantile)
    last = np.maximum(finite - 1, 0)
    prev = np.floor(virtual)
    t = virtual - prev
    at_end = virtual >= n - 1
    k0 = np.where(at_end, last, np.maximum(prev, 0)).astype(dtype)
    k1 = np.where(at_end, last, k0 + 1).astype(dtype)
    return k0, k1, t


def _nanquantile_lerp(a, b, t, finite) -> np.ndarray:
    """`a + (b - a) t`, or `b - (b - a)(1 - t)` for `t >= 0.5`; NaN where nothing is finite."""
    diff = b - a
    out = np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)
    out[finite == 0] = np.nan
    return out


def _order_quantile(h: np.ndarray, o: np.ndarray, filled: int, quantile: float) -> np.ndarray:
    """`_sorted_quantile` of each (site, rank) window's first `filled` ranks, per `o`.

    The same float64 arithmetic as `_sorted_quantile` (in Python floats for the
    index and weight).
    """
    k0, k1, mode, t, omt = _quantile_read(filled, quantile)
    if mode == 0:
        return _at_rank(h, o, k0)
    picked = kernels.order_pick(h, o, k0, k1)
    a, b = picked if picked is not None else (_at_rank(h, o, k0), _at_rank(h, o, k1))
    diff = b - a
    return b - diff * omt if mode == 2 else a + diff * t


def _quantile_read(filled: int, quantile: float) -> tuple[int, int, int, float, float]:
    """`_sorted_quantile`'s read of a window of `filled` sorted entries: `(k0, k1, mode, t,
    1 - t)`: mode 0 is entry k0 alone, 1 `a + (b - a) t`, 2 `b - (b - a)(1 - t)` (t >= 0.5),
    with `a`, `b` the entries k0 and k1 (Python floats for the index and weight)."""
    n = filled
    virtual = (n - 1) * float(quantile)
    if virtual >= n - 1:
        return n - 1, n - 1, 0, 0.0, 1.0
    if virtual < 0:
        return 0, 0, 0, 0.0, 1.0
    prev = math.floor(virtual)
    t = virtual - prev
    return prev, prev + 1, 2 if t >= 0.5 else 1, t, 1 - t


@functools.lru_cache(maxsize=32)
def _gather_index(sites: int, window: int, ranks: int) -> tuple[np.ndarray, np.ndarray]:
    """`_at_rank`'s constants: each window slot's number, and each (site, rank)'s offset."""
    slots = np.arange(window, dtype=np.uint8 if window <= 255 else np.uint16)
    base = (np.arange(sites) * (window * ranks))[:, None] + np.arange(ranks)
    slots.flags.writeable = base.flags.writeable = False
    return slots, base


def _at_rank(h: np.ndarray, o: np.ndarray, k: int | np.ndarray) -> np.ndarray:
    """`(sites, ranks)`: the entry of rank `k` (one, or one per (site, rank)) in each
    window of `h` `(sites, window, ranks)`."""
    S, W, R = h.shape
    slots, base = _gather_index(S, W, R)
    hit = o == (k if np.ndim(k) == 0 else k[:, None, :])
    # The one slot holding rank `k`: sum over the window of slot number x hit.
    slot = np.einsum("swr,w->sr", hit.view(np.uint8), slots).astype(np.intp)
    slot *= R
    slot += base
    return np.take(h.reshape(-1), slot)


def _expected_batch(history: np.ndarray, filled: int, quantile: float) -> np.ndarray:
    """Each rank's windowed quantile, every site in `history` (B, window, R) alone.

    The window axis is made the contiguous one and sorted in one call (NaN last): the same
    values as `np.quantile` / `np.nanquantile` per site, many times faster (`nanquantile`
    loops over the ranks in Python). `history` is sanitized: its only non-finite is NaN.
    """
    rows = history[:, :filled]
    v = np.sort(np.swapaxes(rows, 1, 2), axis=-1)
    if not np.isnan(rows).any():
        return _sorted_quantile(v, quantile)
    return sorted_nanquantile(v, quantile)


def sorted_nanquantile(v: np.ndarray, quantile: float) -> np.ndarray:
    """`np.nanquantile(v, quantile, axis=-1)` of `v` sorted along its last axis (NaN last):
    the same values bit for bit, NaN where a row has nothing else, without NumPy's loop over
    the rows in Python (the runtime's `stats()` and the policy's sorted windows use it)."""
    finite = v.shape[-1] - np.isnan(v).sum(axis=-1)
    k0, k1, t = _nanquantile_read(finite, quantile, np.intp)
    a = np.take_along_axis(v, k0[..., None], axis=-1)[..., 0]
    b = np.take_along_axis(v, k1[..., None], axis=-1)[..., 0]
    return _nanquantile_lerp(a, b, t, finite)


def _sorted_quantile(v: np.ndarray, quantile: float) -> np.ndarray:
    """`np.quantile(v, quantile, axis=-1)` (method "linear") of `v` already sorted on that axis.

    The same arithmetic as NumPy's: virtual index `(n - 1) q`, its floor and the
    next index clipped to the sample, and `a + (b - a) t` (`b - (b - a)(1 - t)` for
    `t >= 0.5`); tests/test_diagnosis_scale.py checks it equals `np.quantile` bit for bit.
    """
    k0, k1, mode, t, omt = _quantile_read(v.shape[-1], quantile)
    if mode == 0:
        return v[..., k0].copy()
    a, b = v[..., k0], v[..., k1]
    diff = b - a
    return b - diff * omt if mode == 2 else a + diff * t


class _ABView(NamedTuple):
    ab_arm: int
    ab_sum_s: np.ndarray
    ab_count: np.ndarray
    ab_rejected: bool


# The stages of `adaptive`'s update, in order: estimate (`_expected_batch`) -> gate ->
# A/B guard -> budget; `_adaptive_update` runs them for one or many sites.


class _Gate(NamedTuple):
    engaged: bool
    above: int
    below: int
    giveup: int
    backed_off: bool


def _gate(c: AdaptiveConfig, state: AdaptiveState, spread: np.ndarray) -> _Gate:
    """Engage after `engage_steps` above threshold; disengage below hysteresis or on back-off.

    Per site: `spread` and the state's counters have one entry per site.
    """
    above = np.where(spread > c.threshold_s, state.above + 1, 0)
    below = np.where(spread < c.hysteresis * c.threshold_s, state.below + 1, 0)
    giveup = np.where(spread > c.giveup_factor * c.max_delay_s, state.giveup + 1, 0)
    engaged = np.asarray(state.engaged, dtype=bool)
    backed_off = giveup >= c.engage_steps
    turn_on = ~engaged & (above >= c.engage_steps) & ~backed_off
    turn_off = engaged & ((below >= c.disengage_steps) | backed_off)
    engaged = np.where(turn_on, True, np.where(turn_off, False, engaged))
    return _Gate(engaged, above, below, giveup, backed_off)


class _AB(NamedTuple):
    arm: int
    sum_s: np.ndarray
    count: np.ndarray
    rejected: bool


def _ab_guard(c: AdaptiveConfig, state: AdaptiveState, engaged: bool, step_time_s: float) -> _AB:
    """Accounts the observed step time to the arm that produced it; judges when both are full."""
    arm, ab_sum, ab_count, rejected = (
        state.ab_arm,
        state.ab_sum_s,
        state.ab_count,
        state.ab_rejected,
    )
    if c.ab_test and engaged and not rejected:
        ab_sum, ab_count = ab_sum.copy(), ab_count.copy()
        t = float(step_time_s)
        if math.isfinite(t) and t >= 0:
            ab_sum[arm] += t
            ab_count[arm] += 1
        if int(ab_count.sum()) % c.ab_period == 0 and ab_count.sum() > 0:
            arm = 1 - arm
        if (ab_count >= c.ab_min_windows * c.ab_period).all():
            mean_unpaced = ab_sum[0] / ab_count[0]
            mean_paced = ab_sum[1] / ab_count[1]
            rejected = bool(mean_paced > mean_unpaced * (1.0 + c.ab_tolerance))
    return _AB(arm, ab_sum, ab_count, rejected)


# `slept_s` is summed afresh from the delay ring every this many updates.
_RESUM_STEPS = 1024


def _budgeted_delays(
    c: AdaptiveConfig,
    delays: np.ndarray,
    row: np.ndarray,
    expected: np.ndarray,
    e: np.ndarray,
    slept_bound: np.ndarray | None = None,
) -> np.ndarray:
    """`gain * expected`, clamped to `[0, max_delay_s]` and to the per-window budget.

    Per site: `delays` (B, window, R) is each site's delay ring, `row` (B,) its
    current row, `expected` and `e` (B, R); `slept_bound` (B, R) the rings'
    running sums, or None.
    """
    want = c.gain * expected  # never inf: earliness is finite, gain <= 1
    want[np.isnan(want)] = 0.0
    want += 0.0  # never -0.0 (np.clip would keep its sign): a delay is never signed
    budget = c.budget_fraction * c.window * c.max_delay_s
    if slept_bound is not None and (slept_bound <= _unbound_below(c, budget)).all():
        # The budget left is >= max_delay_s for every rank, so it cannot bind:
        # min(want, budget - slept) clipped to [0, max_delay_s] is want clipped.
        out = np.clip(want, 0.0, c.max_delay_s)
    else:
        # Budget: what the rank slept over the rest of the window, plus this.
        slept = delays.sum(axis=1) - delays[np.arange(row.size), row]
        out = np.clip(np.minimum(want, budget - slept), 0.0, c.max_delay_s)
    # The rank the others wait for never sleeps.
    out[~np.isfinite(e)] = 0.0
    return out


def _unbound_below(c: AdaptiveConfig, budget: float) -> float:
    """A running sum of a delay ring at most this means `budget - slept >= max_delay_s`.

    `slept` (the ring's float sum less one row) exceeds the exact sum by a
    relative ~`window * 2**-53`, and the running sum drifts from it by at most
    ~`(window + 4 * _RESUM_STEPS) * 2**-53 * window * max_delay_s`; both are
    far inside the 1e-9 margins here, and rounding is monotone, so the float
    `budget - slept` is then >= max_delay_s.
    """
    m = c.max_delay_s
    return (budget - m) * (1.0 - 1e-9) - 1e-9 * c.window * m


def adaptive_status(state: AdaptiveState) -> PolicyStatus:
    """`adaptive`'s `PolicyStatus`: engaged, backed off, spread, and the A/B result."""
    ab = None
    if state.ab_count.sum() > 0:
        cnt = np.maximum(state.ab_count, 1)
        ab = {
            "unpaced_step_s": float(state.ab_sum_s[0] / cnt[0]),
            "paced_step_s": float(state.ab_sum_s[1] / cnt[1]),
            "rejected": bool(state.ab_rejected),
        }
    return PolicyStatus(
        engaged=bool(state.engaged),
        backed_off=bool(state.backed_off),
        spread_s=float(state.spread_s),
        ab_effect=ab,
    )
