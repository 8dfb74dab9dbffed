"""`adaptive`'s fast path: many sites at once, kept window orders, compiled kernels.

It computes what `jaxpace.policy.adaptive.reference_update` computes, bit for bit
(tests/policy/test_policy_fast_matches_reference.py), with the work shared across sites and, from
`ORDER_MIN_RANKS` ranks on, three caches that spare the sort of every window and the sum of
every budget: each window's sort order and NaN count per row (`_window_order`), and each
rank's delays summed over the window (a running sum that tells when the budget cannot bind).

The caches are not part of `AdaptiveState`: they live in a `_KeptTable` of the policy,
keyed weakly by the identity of the state's `history` array, and are rebuilt from the state
when missing (a state built by hand, or a new policy object), so the state stays the
algorithm's and the update stays pure. Compiled twins in kernels.cc: `_insert_estimate` is
`jaxpace_window_step_i8`; `_delays_all`'s budget where it cannot bind is
`jaxpace_paced_delays` (per site `paced_row`).

This module does not import the reference (`adaptive.py` imports it): the reference hands it
its `initial_state` and `ab_guard`.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, NamedTuple

import numpy as np

from jaxpace.collectives.exchange import sanitize_seconds
from jaxpace.native import kernels
from jaxpace.policy import _window_order
from jaxpace.policy.base import Observation
from jaxpace.policy.quantile import quantile_read

__all__ = ["ORDER_MIN_RANKS", "RESUM_STEPS", "FastAdaptive", "Kept", "update_sites"]

# From this many ranks on, the window orders are kept (below it, sorting the window each
# update costs less than keeping the order).
ORDER_MIN_RANKS = 512

# The running sums of the delay rings are summed afresh every this many updates.
RESUM_STEPS = 1024


class Kept(NamedTuple):
    """The caches of one state, with a leading site axis (a single site's: a batch of one).

    Attributes:
      order: `(sites, window, ranks)` each `history` entry's rank in its window (NaN last).
      odd: `(sites, window)` the NaN entries of each `history` row.
      slept_s: `(sites, ranks)` each rank's `delays` summed over the window, as a running
        sum: it only tells when the budget cannot bind.
      delays: the state's `delays` array that `slept_s` sums (compared by identity).
    """

    order: np.ndarray
    odd: np.ndarray
    slept_s: np.ndarray | None
    delays: Any


class _KeptTable:
    """`Kept` caches by the identity of a state's `history` array; an entry lives as long as
    its array (a weak reference removes it). Lookups and stores are single dict operations
    (atomic under the GIL); a single site's caches are kept as a batch of one."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref, Kept]] = {}

    def get(self, history: np.ndarray) -> Kept | None:
        got = self._entries.get(id(history))
        if got is None or got[0]() is not history:
            return None
        return got[1]

    def put(self, history: np.ndarray, kept: Kept) -> None:
        key = id(history)
        got = self._entries.get(key)
        if got is not None and got[0]() is history:
            self._entries[key] = (got[0], kept)
            return
        entries = self._entries

        def drop(ref: weakref.ref, key: int = key) -> None:
            # Runs as `history` is freed, before its id can be reused.
            if entries.get(key, (None,))[0] is ref:
                entries.pop(key, None)

        entries[key] = (weakref.ref(history, drop), kept)

    def __len__(self) -> int:
        return len(self._entries)


class FastAdaptive:
    """The fast path of one `adaptive` policy: its single-site and batched updates.

    Args:
      config: the policy's `AdaptiveConfig`.
      init: `init(config, num_ranks) -> AdaptiveState` (the reference's `initial_state`).
      ab_guard: the reference's A/B guard for one site (`adaptive.ab_guard`).
    """

    def __init__(self, config: Any, *, init: Any, ab_guard: Any) -> None:
        self.config, self._init, self._ab_guard = config, init, ab_guard
        self.kept = _KeptTable()

    def update(self, obs: Observation, state: Any) -> tuple[np.ndarray, Any]:
        """One site's update (pure): `(delays (ranks,), new state)`."""
        e = sanitize_seconds(obs.earliness_s)
        n = state.history.shape[1]
        if e.shape != (n,):
            raise ValueError(f"`obs.earliness_s` must have shape ({n},), got {e.shape}.")
        t = np.array([obs.step_time_s], dtype=np.float64)
        b = _stack(state)
        kept = self._kept_for(b, state)
        delays, new, kept = update_sites(self.config, self._ab_guard, e[None], t, b, kept)
        single = _unstack(new)
        if kept is not None:  # kept as a batch of one, keyed by the single state's arrays
            self.kept.put(single.history, Kept(kept.order, kept.odd, kept.slept_s, single.delays))
        return delays[0], single

    def init_batch(self, num_sites: int, num_ranks: int) -> Any:
        """`num_sites` initial states stacked (every field gains a leading site axis)."""
        one = self._init(self.config, num_ranks)
        return type(one)(*(np.repeat(np.asarray(v)[None], int(num_sites), axis=0) for v in one))

    def update_batch(self, obs: Observation, state: Any) -> tuple[np.ndarray, Any]:
        """Every site's update at once; reuses the arrays of `state` (keep only the result)."""
        e = sanitize_seconds(obs.earliness_s).reshape(np.shape(obs.earliness_s))
        if e.shape != state.history.shape[::2]:
            raise ValueError(
                f"`obs.earliness_s` must have shape {state.history.shape[::2]}, got {e.shape}."
            )
        t = np.asarray(obs.step_time_s, dtype=np.float64)
        if t.shape != e.shape[:1]:
            t = np.broadcast_to(t, e.shape[:1])
        kept = self._kept_for(state, state)
        delays, new, kept = update_sites(self.config, self._ab_guard, e, t, state, kept, owned=True)
        if kept is not None:
            self.kept.put(new.history, kept)
        return delays, new

    def _kept_for(self, stacked: Any, state: Any) -> Kept | None:
        """The caches of `state` (`stacked`: the same with a site axis), rebuilt if missing."""
        if stacked.history.shape[2] < ORDER_MIN_RANKS:
            return None
        kept = self.kept.get(state.history)
        if kept is None:
            order, odd = _window_order.build(stacked.history, np.reshape(stacked.filled, -1))
            kept = Kept(order, odd, None, None)
        if kept.delays is not state.delays or kept.slept_s is None:
            kept = kept._replace(slept_s=stacked.delays.sum(axis=1), delays=state.delays)
        return kept


def _stack(state: Any) -> Any:
    """One site's state as a batch of one (every field gains a leading axis of 1)."""
    return type(state)(*(np.asarray(v)[None] for v in state))


def _unstack(b: Any) -> Any:
    """The single-site state (Python scalars, as `init` makes them) of a batch of one."""
    return type(b)(
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
    )


def update_sites(
    c: Any,
    ab_guard: Any,
    e: np.ndarray,
    step_time_s: np.ndarray,
    st: Any,
    kept: Kept | None,
    *,
    owned: bool = False,
) -> tuple[np.ndarray, Any, Kept | None]:
    """`adaptive`'s update for B sites at once: `e` (B, R) sanitized, state with a site axis,
    and its caches (None: sort every window). Returns `(delays, state, caches)`.

    Every site follows the stages of the reference on its own (estimate -> gate -> A/B guard
    -> budget); only the array work is shared. `owned`: the caller gives up `st` and `kept`,
    so the rings are updated in place instead of copied (the batched path; the single-site
    `update` stays pure).
    """
    B, n = e.shape
    step = st.step + 1
    active = step > c.warmup_steps
    every = bool(active.all())
    if not every and not active.any():
        return np.zeros((B, n)), st._replace(step=step), kept
    ia = _site_index(B) if every else np.flatnonzero(active)
    row = (step - c.warmup_steps - 1) % c.window
    history, delay_hist = st.history, st.delays
    order, odd, slept = (None, None, None) if kept is None else kept[:3]
    if not owned:
        history = history.copy()
        if order is not None:
            order, odd = order.copy(), odd.copy()
    grown = np.minimum(st.filled + 1, c.window)
    filled = grown if every else np.where(active, grown, st.filled)
    # Sites in step (the simulator's): one row for all, written through slices.
    r0 = int(row[0]) if kept is not None and every and (B == 1 or (row == row[0]).all()) else None
    at = _At(ia, row, r0, step, every, filled)
    expected, spread = _insert_estimate(c, history, order, odd, e, at)
    gate = _gate(c, st, spread)
    ab = _ab_all(c, ab_guard, st, gate, step_time_s)
    pacing_now = gate.engaged & active
    if c.ab_test:
        pacing_now &= ~(ab.rejected | (ab.arm == 0))
    delays, delay_hist, slept, paced = _delays_all(
        c, delay_hist, slept, expected, e, pacing_now, at, owned
    )
    new = st.advanced(  # step + 1, as above
        history=history,
        delays=delay_hist,
        filled=filled,
        gate=gate,
        spread_s=spread,
        ab=ab,
        paced=paced,
    )
    if not every:  # sites still in warm-up only count the step (their rings were not written)
        new = _keep_warming_up(st, new, ~active, step)
    return delays, new, None if kept is None else Kept(order, odd, slept, delay_hist)


def _keep_warming_up(st: Any, new: Any, keep: np.ndarray, step: Any) -> Any:
    """Sites `keep` (still in warm-up) keep their old state except the step count."""
    fields = {}
    for name, old, cur in zip(st._fields, st, new, strict=True):
        if name not in ("history", "delays"):  # the rings: not written for those sites
            cur = np.array(cur, copy=True)
            cur[keep] = np.asarray(old)[keep]
        fields[name] = cur
    return type(st)(**fields)._replace(step=step)


class _ABView(NamedTuple):
    ab_arm: int
    ab_sum_s: np.ndarray
    ab_count: np.ndarray
    ab_rejected: bool


class _AB(NamedTuple):
    arm: Any
    sum_s: np.ndarray
    count: np.ndarray
    rejected: Any


class _At(NamedTuple):
    """Where one update writes: the active sites `ia`, each site's ring `row` (`r0`: the one
    row all sites write, or None), the new step count, whether every site is active, and
    each site's filled rows after the write."""

    ia: np.ndarray
    row: np.ndarray
    r0: int | None
    step: Any
    every: bool
    filled: np.ndarray


def _insert_estimate(c, history, order, odd, e, at: _At):
    """`_window_order.insert`, then `_estimate_all`: in one compiled pass (kernels.cc
    `jaxpace_window_step_i8`) when every site writes row `r0` of a kept order and no window
    holds NaN (the kernel checks `odd` and `e`, and changes nothing when one does).

    Reference: the estimate stage of `adaptive.reference_update`."""
    ia, row, r0, _, every, filled = at
    if every and r0 is not None and order is not None and (filled == filled[0]).all():
        k = quantile_read(int(filled[0]), c.quantile)
        got = kernels.window_step(history, order, odd, r0, e, k)
        if got is not None:
            return got
    _window_order.insert(history, order, odd, ia, row, e, every, r0)
    return _estimate_all(c, history, order, odd, ia, filled, e.shape)


def _estimate_all(c, history, order, odd, ia, filled, shape) -> tuple[np.ndarray, np.ndarray]:
    """Estimate stage for active sites `ia`: each rank's windowed quantile, each site's spread."""
    B, n = shape
    expected = np.full((B, n), np.nan)
    fa = filled[ia]
    groups = fa[:1] if (fa == fa[0]).all() else np.unique(fa)  # sites with as many rows
    for f in groups:
        idx = ia[fa == f]
        expected[idx] = _window_order.window_quantile(
            history, order, odd, idx, int(f), c.quantile, B
        )
    fin = np.isfinite(expected)
    if fin.all():
        spread = expected.max(axis=1)
    else:
        spread = np.where(fin.any(axis=1), np.where(fin, expected, -np.inf).max(axis=1), 0.0)
    return expected, spread


def _ab_all(c, ab_guard, st, gate, step_time_s) -> _AB:
    """A/B guard stage for every site (unchanged state when the guard is off)."""
    if not c.ab_test:
        return _AB(st.ab_arm, st.ab_sum_s, st.ab_count, st.ab_rejected)
    abs_ = [
        ab_guard(c, _ABView(*(x[b] for x in (st.ab_arm, st.ab_sum_s, st.ab_count,
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


def _delays_all(c, delay_hist, slept, expected, e, pacing_now, at: _At, owned):
    """Budget stage for the pacing sites, recorded in the rings: `(delays (B, R), delay ring,
    running sums, whether each site asked for a delay)`. In one compiled pass
    (kernels.cc `jaxpace_paced_delays`) when every site paces at row `r0` and the budget
    cannot bind. Reference: the budget stage of `adaptive.reference_update`."""
    ia, row, r0, step = at.ia, at.row, at.r0, at.step
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
        if not (step % RESUM_STEPS == 0).any():
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
    """Every `RESUM_STEPS` updates a site's running sum is summed afresh from its ring."""
    due = step % RESUM_STEPS == 0
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


class _Gate(NamedTuple):
    engaged: bool
    above: int
    below: int
    giveup: int
    backed_off: bool


def _gate(c: Any, state: Any, spread: np.ndarray) -> _Gate:
    """Engage after `engage_steps` above threshold; disengage below hysteresis or on back-off.

    Reference: `adaptive._gate` (one site).

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


def _budgeted_delays(
    c: Any,
    delays: np.ndarray,
    row: np.ndarray,
    expected: np.ndarray,
    e: np.ndarray,
    slept_bound: np.ndarray | None = None,
) -> np.ndarray:
    """`gain * expected`, clamped to `[0, max_delay_s]` and to the per-window budget.

    Reference: `adaptive.budgeted_delays` (one site, always summing the ring); twin in
    kernels.cc: `paced_row` (where the budget cannot bind).

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


def _unbound_below(c: Any, budget: float) -> float:
    """A running sum of a delay ring at most this means `budget - slept >= max_delay_s`.

    `slept` (the ring's float sum less one row) exceeds the exact sum by a
    relative ~`window * 2**-53`, and the running sum drifts from it by at most
    ~`(window + 4 * RESUM_STEPS) * 2**-53 * window * max_delay_s`; both are
    far inside the 1e-9 margins here, and rounding is monotone, so the float
    `budget - slept` is then >= max_delay_s.
    """
    m = c.max_delay_s
    return (budget - m) * (1.0 - 1e-9) - 1e-9 * c.window * m
