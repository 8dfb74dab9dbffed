"""`adaptive`, the policy that paces early ranks: its settings, its state, and its algorithm.

The update below is the reference: plain NumPy, one site, the four stages in order.

1. **estimate**: each rank's expected earliness is a quantile of its last `window`
   observations; the spread is the largest of them.
2. **gate**: pacing engages after the spread stays above `threshold_s` for
   `engage_steps` steps, disengages when it stays below `hysteresis * threshold_s`, and backs
   off (never chases) a spread beyond `giveup_factor * max_delay_s`.
3. **A/B guard** (optional): paced and unpaced windows alternate; pacing stops if paced steps
   are slower.
4. **budget**: a rank sleeps `gain * expected`, clamped to `[0, max_delay_s]` and to what is
   left of its per-window budget; the last arriver never sleeps.

`adaptive()` runs the same algorithm through `jaxpace.policy._adaptive_fast` (many sites at
once, a kept sort order of each window from 512 ranks on, and compiled kernels), which must
give these results bit for bit: tests/policy/test_policy_fast_matches_reference.py checks it. To
change the algorithm, change it here, then make the fast path match.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import numpy as np

from jaxpace._validate import check_bool, check_number
from jaxpace.collectives.exchange import sanitize_seconds
from jaxpace.errors import ConfigError
from jaxpace.policy import _adaptive_fast
from jaxpace.policy.base import (
    MAX_DELAY_CAP_S,
    BatchedPolicy,
    Observation,
    PacingPolicy,
    PolicyStatus,
)
from jaxpace.policy.quantile import quantile_of_window

__all__ = [
    "AdaptiveConfig",
    "AdaptiveState",
    "adaptive",
    "adaptive_status",
    "reference",
    "reference_update",
]


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
    """State of `adaptive` (the same for the reference and the fast path).

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

    def advanced(self, *, history, delays, filled, gate, spread_s, ab, paced: int):
        """The state after one observation: `gate` (`_Gate`) and `ab` (`AB`) give their fields.

        The reference and the fast path both build their next state here, so a field
        added to the state is set in one place.
        """
        return type(self)(
            step=self.step + 1,
            history=history,
            delays=delays,
            filled=filled,
            engaged=gate.engaged,
            above=gate.above,
            below=gate.below,
            giveup=gate.giveup,
            backed_off=gate.backed_off,
            spread_s=spread_s,
            ab_arm=ab.arm,
            ab_sum_s=ab.sum_s,
            ab_count=ab.count,
            ab_rejected=ab.rejected,
            steps_paced=self.steps_paced + paced,
        )


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
    c = _config(config, kwargs)
    fast = _adaptive_fast.FastAdaptive(c, init=initial_state, ab_guard=ab_guard)
    return PacingPolicy(
        lambda num_ranks: initial_state(c, num_ranks),
        fast.update,
        name=_name(c),
        max_delay_s=c.max_delay_s,
        status=adaptive_status,
        batched=BatchedPolicy(fast.init_batch, fast.update_batch),
        config=c,
    )


def reference(config: AdaptiveConfig | None = None, **kwargs: Any) -> PacingPolicy:
    """`adaptive` through the reference update below: the same decisions, one site at a
    time, without the fast path (for reading, testing and debugging).

    >>> a, r = adaptive(window=4), reference(window=4)
    >>> a.name == r.name and a.identity != r.identity
    True
    """
    c = _config(config, kwargs)
    return PacingPolicy(
        lambda num_ranks: initial_state(c, num_ranks),
        lambda obs, state: reference_update(c, obs, state),
        name=_name(c),
        max_delay_s=c.max_delay_s,
        status=adaptive_status,
        config=c,
    )


def _config(config: Any, kwargs: dict) -> AdaptiveConfig:
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
    return config


def _name(c: AdaptiveConfig) -> str:
    fields = ", ".join(f"{f.name}={getattr(c, f.name)!r}" for f in dataclasses.fields(c))
    return f"adaptive({fields})"


def initial_state(c: AdaptiveConfig, num_ranks: int) -> AdaptiveState:
    """The state before any observation: empty windows (NaN), no delays, not engaged."""
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, (int, np.integer)) or num_ranks < 1:
        raise ConfigError(f"`num_ranks` must be a positive integer, got {num_ranks!r}.")
    n = int(num_ranks)
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
    )


def reference_update(
    c: AdaptiveConfig, obs: Observation, state: AdaptiveState
) -> tuple[np.ndarray, AdaptiveState]:
    """`adaptive`'s update of one site: estimate -> gate -> A/B guard -> budget. Pure."""
    e = sanitize_seconds(obs.earliness_s)
    n = state.history.shape[1]
    if e.shape != (n,):
        raise ValueError(f"`obs.earliness_s` must have shape ({n},), got {e.shape}.")
    step = state.step + 1
    if step <= c.warmup_steps:  # compilation, caches: not even recorded
        return np.zeros(n), state._replace(step=step)

    # 1. Estimate: the newest earliness replaces the oldest row of the window.
    row = (step - c.warmup_steps - 1) % c.window
    history = state.history.copy()
    history[row] = e
    filled = min(state.filled + 1, c.window)
    expected = quantile_of_window(history[:filled], c.quantile)  # NaN: nothing measured
    known = np.isfinite(expected)
    spread = float(expected[known].max()) if known.any() else 0.0

    # 2. Gate, 3. A/B guard.
    gate = _gate(c, state, spread)
    ab = ab_guard(c, state, gate.engaged, obs.step_time_s)
    pacing = gate.engaged and not (c.ab_test and (ab.rejected or ab.arm == 0))

    # 4. Budget.
    delays = budgeted_delays(c, state.delays, row, expected, e) if pacing else np.zeros(n)
    ring = state.delays.copy()
    ring[row] = delays
    return delays, state.advanced(
        history=history,
        delays=ring,
        filled=filled,
        gate=gate,
        spread_s=spread,
        ab=ab,
        paced=int(delays.max() > 0),
    )


class _Gate(NamedTuple):
    engaged: bool
    above: int
    below: int
    giveup: int
    backed_off: bool


def _gate(c: AdaptiveConfig, state: AdaptiveState, spread: float) -> _Gate:
    """Engage after `engage_steps` above threshold; disengage below hysteresis or on back-off.

    Fast twin: `_adaptive_fast._gate` (every site at once).
    """
    above = state.above + 1 if spread > c.threshold_s else 0
    below = state.below + 1 if spread < c.hysteresis * c.threshold_s else 0
    giveup = state.giveup + 1 if spread > c.giveup_factor * c.max_delay_s else 0
    backed_off = giveup >= c.engage_steps
    engaged = bool(state.engaged)
    if not engaged and above >= c.engage_steps and not backed_off:
        engaged = True
    elif engaged and (below >= c.disengage_steps or backed_off):
        engaged = False
    return _Gate(engaged, above, below, giveup, backed_off)


class AB(NamedTuple):
    """The A/B guard's state: the current arm, summed step time and steps per arm, verdict."""

    arm: int
    sum_s: np.ndarray
    count: np.ndarray
    rejected: bool


def ab_guard(c: AdaptiveConfig, state: Any, engaged: bool, step_time_s: float) -> AB:
    """Accounts the observed step time to the arm that produced it; judges when both are full.

    `state` has the fields `ab_arm`, `ab_sum_s`, `ab_count`, `ab_rejected` (one site's). The
    fast path calls this too, site by site.
    """
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
    return AB(arm, ab_sum, ab_count, rejected)


def budgeted_delays(
    c: AdaptiveConfig, ring: np.ndarray, row: int, expected: np.ndarray, e: np.ndarray
) -> np.ndarray:
    """`gain * expected`, clamped to `[0, max_delay_s]` and to what is left of the budget
    (`budget_fraction * window * max_delay_s` over the window's delays `ring`, less the row
    this step replaces); zero for a rank with no earliness (the one the others wait for).

    Fast twins: `_adaptive_fast._budgeted_delays` (every site at once, skipping the sum when
    the budget cannot bind) and kernels.cc `paced_row` / `jaxpace_paced_delays`.
    """
    want = c.gain * expected  # never inf: earliness is finite, gain <= 1
    want[np.isnan(want)] = 0.0
    want += 0.0  # never -0.0 (np.clip would keep its sign): a delay is never signed
    budget = c.budget_fraction * c.window * c.max_delay_s
    slept = ring.sum(axis=0) - ring[row]  # what the rank slept over the rest of the window
    out = np.clip(np.minimum(want, budget - slept), 0.0, c.max_delay_s)
    out[~np.isfinite(e)] = 0.0
    return out


def adaptive_status(state: AdaptiveState) -> PolicyStatus:
    """`adaptive`'s `PolicyStatus`: engaged, backed off, spread, and the A/B result."""
    ab = None
    if np.sum(state.ab_count) > 0:
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
