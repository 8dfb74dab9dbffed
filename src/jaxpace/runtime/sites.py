"""Per-site host state (one `Site` per collective call site, one `RankState` per rank) and stats."""

from __future__ import annotations

import dataclasses
import math
import struct
import threading
import warnings
import weakref
from typing import Any

import numpy as np

from jaxpace.collectives import exchange as _exchange
from jaxpace.diagnosis import culprit as _culprit
from jaxpace.policy.base import Observation, PacingPolicy, PolicyStatus
from jaxpace.policy.quantile import sorted_nanquantile
from jaxpace.runtime.probe import Recorder

__all__ = ["RankState", "Site", "SiteMemo", "SiteNames", "SiteStats", "site_stats"]


@dataclasses.dataclass
class SiteStats:
    """Per-site summary returned by `Pacer.stats()`.

    Attributes:
      site: the site name.
      measured: False when every call at this site passed straight to `jax.lax`.
      unmeasured_reason: why it was passed through (e.g. "vmap axis"), or None.
      ranks: the ranks this process recorded (process index or axis index).
      steps: steps recorded (after sampling) on this process: the most any of its
        ranks recorded, so 100 steps of 8 device shards count 100, not 800.
      engaged: whether the policy was pacing at the last step.
      steps_paced: steps on which this process slept before the collective (the
        most of any of its ranks, like `steps`).
      total_delay_s: seconds this process slept at this site.
      wait_mean_s: mean time this process's ranks waited inside the collective.
      earliness_mean_s / earliness_p50_s / earliness_p99_s: per rank of the job
        (list indexed by rank), from the exchanged vectors; NaN if never seen.
      errors: callback exceptions caught (each gave "no delay").
      backed_off: the policy refused to chase a skew beyond its bounds.
      ab_effect: `{"paced_step_s", "unpaced_step_s", "rejected"}` when the A/B
        guard ran, else None.
      layout: which shards measure: the source of the concrete mesh used to
        find each process's first shard ("Pacer(mesh=...)", "jax.set_mesh",
        "jaxpace.make_mesh", or an assumption of process-contiguous blocks), or
        every shard at device granularity.
      probe: which probes time this site and why: the native XLA FFI handlers,
        or the io_callback fallback with the reason the native ones do not apply.
      in_flight: measured collectives of this process that had arrived but not
        finished when `stats()` stopped waiting (0 once every dispatched step ran).
      culprits: ranks the report's culprit decision (`jaxpace.diagnosis.culprit.decide`:
        late against per-step noise and outside the fleet's own spread) names
        over the last `culprit_window_steps` exchanged steps, latest first.
      culprit_window_steps: complete exchanged steps that decision covered (0
        when the policy exchanges no waits, e.g. `no_pacing` and `fixed`).
      fleet_sd: per rank of the job, its distance above the fleet's median in
        robust SDs of the per-rank spread over that window (any real number).
      arrived_last: per rank of the job, exchanged steps in which it arrived
        last, over the run; arrived_last_top1pct: steps in which it was among
        the latest 1% of ranks (the latest `ceil(R / 100)`).
      pacing: what the pacing policy does at this site: paced (psum/pmean, where the
        in-band exchange rides), or measure only and why (all_gather, psum_scatter,
        ppermute, all_to_all, pmax, pmin: no exchange can ride without an extra collective).
    """

    site: str
    measured: bool
    unmeasured_reason: str | None
    ranks: list[int]
    steps: int = 0
    engaged: bool = False
    steps_paced: int = 0
    total_delay_s: float = 0.0
    wait_mean_s: float = math.nan
    earliness_mean_s: list[float] = dataclasses.field(default_factory=list)
    earliness_p50_s: list[float] = dataclasses.field(default_factory=list)
    earliness_p99_s: list[float] = dataclasses.field(default_factory=list)
    errors: int = 0
    backed_off: bool = False
    ab_effect: dict[str, Any] | None = None
    layout: str | None = None
    probe: str | None = None
    in_flight: int = 0
    culprits: list[int] = dataclasses.field(default_factory=list)
    culprit_window_steps: int = 0
    fleet_sd: list[float] = dataclasses.field(default_factory=list)
    arrived_last: list[int] = dataclasses.field(default_factory=list)
    arrived_last_top1pct: list[int] = dataclasses.field(default_factory=list)
    pacing: str | None = None


class RankState:
    """Host state of one (site, rank) on this process. Guarded by `lock`."""

    def __init__(
        self, capacity: int, policy: PacingPolicy, num_slots: int, initial_state: Any = None
    ) -> None:
        self.lock = threading.Lock()
        self.recorder = Recorder(capacity)
        self.next_step = 0
        self.prev_wait_s = math.nan
        self.prev_step_s = math.nan
        self.last_done_ns: int | None = None
        self.last_arrive_ns: int | None = None
        self.open_step: int | None = None  # arrived, not yet done
        self.wd_in = -1  # last sampled step arrived at (after its pacing sleep); watchdog
        self.wd_out = -1  # last sampled step done; the watchdog reads both, off the hot path
        self.pending_delay_s = 0.0
        # Shared with the site's other ranks until they see different observations (the
        # states are immutable: policies are pure).
        self.policy_state = policy.init(num_slots) if initial_state is None else initial_state
        self.engaged = False
        self.can_pace = False  # engaged and not rejected by an A/B guard: may delay now
        self.backed_off = False
        self.steps = 0
        self.steps_paced = 0
        self.total_delay_ns = 0
        self.wait_sum_ns = 0
        # Earliness history for stats: a fixed ring of (rows, num_slots), at most 4 MiB.
        self.early_hist = np.full((early_rows(capacity, num_slots), num_slots), np.nan, np.float32)
        self.step_hist = np.full(len(self.early_hist), np.nan)  # the exchanged step times
        self.early_n = 0


def early_rows(capacity: int, num_slots: int) -> int:
    """Steps of earliness a rank keeps for `stats()`: `capacity`, at most 1024, and at most
    what fits in `_EARLY_HIST_BYTES` (float32), but at least 64 (or `capacity`).

    At 1024 slots that is 1024 steps (4 MiB); at 8192, 128 steps (4 MiB instead of 32 MiB
    per rank and site, which for 8 local ranks and 20 sites would be 5 GiB).
    """
    fit = max(_EARLY_HIST_MIN_ROWS, _EARLY_HIST_BYTES // (4 * max(int(num_slots), 1)))
    return max(1, min(int(capacity), 1024, fit))


_EARLY_HIST_BYTES = 4 << 20
_EARLY_HIST_MIN_ROWS = 64


class SiteNames:
    """Gives every distinct collective call its own site name, deterministically.

    Two calls share a name when the user passes one `site=` at two places, or
    one line runs in a loop inside one traced body. Their records would land in
    one ring and overwrite each other (3 of 4 calls were lost). Here each
    distinct call (its caller's `file:line:function`, and its position among
    the calls of that name in one traced body) keeps a name of its own: the
    first keeps `name`, the next ones `name#2`, `name#3`, ... in trace order,
    which is the same on every process. A call traced again (a retrace, a
    second jit of the same code) keeps the name it had. `resolve` returns the
    name and, at a name's first duplicate, the one warning to log.
    """

    def __init__(self) -> None:
        self._keys: dict[str, list[tuple[str, int]]] = {}  # name -> its calls, in order
        self._given: dict[tuple[str, str, int], str] = {}  # (name, caller, nth) -> name used
        self._taken: set[str] = set()
        self._trace: Any = None  # weak reference to the trace of the last call
        self._in_trace: dict[tuple[str, str], int] = {}  # calls so far in that trace

    def resolve(self, name: str, caller: str, trace: Any) -> tuple[str, str | None]:
        """`(name to record under, warning or None)` for one traced call of `name`."""
        if not self._same_trace(trace):
            self._in_trace = {}
        nth = self._in_trace.get((name, caller), 0)
        self._in_trace[(name, caller)] = nth + 1
        key = (name, caller, nth)
        if key in self._given:
            return self._given[key], None
        calls = self._keys.setdefault(name, [])
        calls.append((caller, nth))
        if len(calls) == 1 and name not in self._taken:
            used = name
        else:
            k = len(calls)
            while f"{name}#{k}" in self._taken:
                k += 1
            used = f"{name}#{k}"
        self._given[key] = used
        self._taken.add(used)
        if len(calls) != 2:
            return used, None
        first, second = (f"{c} (call {n + 1} in one traced body)" if n else c for c, n in calls)
        return used, (
            f"jaxpace: site `{name}` names two different collective calls: {first} and "
            f"{second}. Each is recorded on its own: the first as `{name}`, the second as "
            f"`{used}` (any further ones as `{name}#3`, ...). Pass each call its own "
            "`site=` to choose the names."
        )

    def _same_trace(self, trace: Any) -> bool:
        prev = self._trace() if self._trace is not None else None
        if trace is None:
            return False
        try:
            self._trace = weakref.ref(trace)
        except TypeError:
            self._trace = lambda t=trace: t
        return prev is trace


class Site:
    """One collective call site: its static layout and its ranks' host state."""

    def __init__(
        self, name: str, num_slots: int, capacity: int, policy: PacingPolicy, layout: str | None
    ) -> None:
        self.name = name
        self.num_slots = num_slots
        self.capacity = capacity
        self.policy = policy
        self.ranks: dict[int, RankState] = {}
        self.lock = threading.Lock()
        self.errors = 0
        self.layout = layout  # how each process's measuring shard was found
        self.probe: str | None = None  # which probes time it, and why (set at trace time)
        self.measure_only = False  # a collective the in-band exchange cannot ride (never paced)
        self.pacing: str | None = None  # what the policy does here, and why (set at trace time)
        self.layout_info: dict | None = (
            None  # collective, groups, ppermute pairs (set at trace time)
        )
        self.native = None  # (native site id, layout key) on the native path
        self.flush = _no_flush  # brings host state up to date (the native drain)
        self.memo = SiteMemo(num_slots)
        self.latest = _culprit.LatestCounts(num_slots)  # arrived-last counts, over the run
        self._initial_state: Any = None

    def observe(self, st: RankState, step: int, view: _exchange.Decoded) -> None:
        """Keeps an exchanged view for `stats()` (hold `st.lock`): the earliness and step
        time windows of `st`, and the site's arrived-last counts."""
        i = st.early_n % len(st.early_hist)
        st.early_hist[i] = view.earliness_s
        st.step_hist[i] = view.step_time_s
        st.early_n += 1
        self.latest.add(step, view.earliness_s)

    def rank(self, r: int) -> RankState:
        st = self.ranks.get(r)
        if st is None:
            with self.lock:
                st = self.ranks.get(r)
                if st is None:
                    if self._initial_state is None:
                        self._initial_state = self.policy.init(self.num_slots)
                    st = RankState(self.capacity, self.policy, self.num_slots, self._initial_state)
                    self.ranks[r] = st
        return st


class SiteMemo:
    """The last payload decoded and the last policy update run at a site, for its other ranks.

    Every rank of a process reads the same all-reduced payload each step and, starting from the
    same state, makes the same (pure) policy update: with 8 devices per host at device
    granularity that was 8 decodes and 8 updates per step of identical work. Each entry is one
    tuple, stored whole, so concurrent readers see an old entry or a new one, never a mix; an
    entry is only used for the very state object it was computed from.
    """

    def __init__(self, num_slots: int) -> None:
        self.num_slots = int(num_slots)
        self._decoded: tuple | None = None  # (payload bytes, scale, Decoded | None)
        self.mismatched = 0  # exchanged waits dropped: another step than most ranks'
        # id(state in) -> (state in, earliness bytes, step-time bits, delays, state out,
        # status, step): one entry per state lineage (ranks that missed a step have their own).
        self._updated: dict[int, tuple] = {}
        self._lock = threading.Lock()

    def decode(self, reduced: np.ndarray, scale: float) -> _exchange.Decoded | None:
        """`_exchange.decode(reduced, num_slots, scale)`, once per distinct payload."""
        key = np.ascontiguousarray(reduced).tobytes()
        hit = self._decoded
        if hit is not None and hit[0] == key and hit[1] == scale:
            return hit[2]
        view = _exchange.decode(reduced, self.num_slots, scale)
        if view is not None and view.mismatched:
            self.mismatched += view.mismatched  # waits of another step, dropped (stats)
        self._decoded = (key, scale, view)
        return view

    def update(
        self,
        policy: PacingPolicy,
        state: Any,
        earliness: np.ndarray,
        step_time_s: float,
        step: int,
    ) -> tuple[np.ndarray, Any, PolicyStatus]:
        """`policy.update` on `state` (and its status), reused when this exact update ran.

        Entries live for the step they were made at and the next one (a rank's records come
        in step order), so at most a step's few lineages are held, never old states.
        """
        e_key = np.ascontiguousarray(earliness, dtype=np.float64).tobytes()
        t_key = struct.pack("<d", float(step_time_s))  # NaN-safe equality, bit for bit
        with self._lock:
            hit = self._updated.get(id(state))
        if hit is not None and hit[0] is state and hit[1] == e_key and hit[2] == t_key:
            return hit[3], hit[4], hit[5]
        obs = Observation(earliness_s=earliness, step_time_s=step_time_s)
        delays, new = policy.update(obs, state)
        delays = np.asarray(delays, dtype=np.float64).reshape(-1)
        status = policy.status(new)
        with self._lock:  # ranks' callbacks may run on several threads (io_callback path)
            memo = self._updated
            for key in [k for k, v in memo.items() if v[6] < step - 1]:
                del memo[key]
            while len(memo) >= _MEMO_LINEAGES:  # the oldest entry goes (insertion order)
                del memo[next(iter(memo))]
            memo[id(state)] = (state, e_key, t_key, delays, new, status, int(step))
        return delays, new, status


# The most entries `SiteMemo` keeps (held states keep their ids unique): ranks whose
# histories differ (missed or dropped steps) each need one.
_MEMO_LINEAGES = 16


def _no_flush() -> None:
    return None


def site_stats(site: Site, policy: PacingPolicy) -> SiteStats:
    """Summarizes one measured site over this process's ranks."""
    site.flush()
    ranks = sorted(site.ranks)
    s = SiteStats(
        site=site.name,
        measured=True,
        unmeasured_reason=None,
        ranks=ranks,
        errors=site.errors,
        layout=site.layout,
        probe=site.probe,
        pacing=site.pacing,
    )
    waits, hists = [], []
    window: tuple[int, np.ndarray, np.ndarray] | None = None  # the longest rank's, in order
    for r in ranks:
        st = site.ranks[r]
        with st.lock:
            s.steps = max(s.steps, st.steps)  # steps, not rank-steps (granularity="device")
            s.steps_paced = max(s.steps_paced, st.steps_paced)
            s.total_delay_s += st.total_delay_ns / 1e9
            s.engaged = s.engaged or st.engaged
            if st.steps:
                waits.append(st.wait_sum_ns / st.steps / 1e9)
            k = min(st.early_n, len(st.early_hist))
            if k:
                hists.append(st.early_hist[:k].astype(np.float64))
                if window is None or st.early_n > window[0]:
                    window = (st.early_n, *_in_order(st, k))
            status = policy.status(st.policy_state)
            s.backed_off = s.backed_off or bool(status.backed_off)
            if status.ab_effect is not None:
                s.ab_effect = dict(status.ab_effect)
    if waits:
        s.wait_mean_s = float(np.mean(waits))
    if hists:
        h = np.concatenate(hists)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            s.earliness_mean_s = np.nanmean(h, axis=0).tolist()
            v = np.sort(h, axis=0).T  # each rank's history sorted, NaN last
            s.earliness_p50_s = sorted_nanquantile(v, 0.5).tolist()
            s.earliness_p99_s = sorted_nanquantile(v, 0.99).tolist()
    _live_decision(s, site, window)
    return s


def _in_order(st: RankState, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The last `k` rows of a rank's earliness and step-time rings, oldest first."""
    n = len(st.early_hist)
    idx = (np.arange(st.early_n - k, st.early_n)) % n
    return st.early_hist[idx].astype(np.float64), st.step_hist[idx].copy()


def _live_decision(s: SiteStats, site: Site, window) -> None:
    """The report's culprit decision over the window, and the arrived-last counts."""
    if site.latest.steps:
        s.arrived_last = site.latest.last.tolist()
        s.arrived_last_top1pct = site.latest.top.tolist()
    if window is None:
        return
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        dec = _culprit.decide_earliness(window[1], window[2])
    if dec is None:
        return
    s.culprits = [int(i) for i in dec.culprits]
    s.culprit_window_steps = int(dec.n)
    s.fleet_sd = [float(x) for x in dec.fleet.distance]
