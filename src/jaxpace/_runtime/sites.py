"""Per-site host state (one `Site` per collective call site, one `RankState` per rank) and stats."""

from __future__ import annotations

import dataclasses
import math
import struct
import threading
import warnings
from typing import Any

import numpy as np

from jaxpace import _exchange
from jaxpace._policy import Observation, PacingPolicy, PolicyStatus, sorted_nanquantile
from jaxpace._probe import Recorder

__all__ = ["RankState", "Site", "SiteMemo", "SiteStats", "site_stats"]


@dataclasses.dataclass
class SiteStats:
    """Per-site summary returned by `Pacer.stats()`.

    Attributes:
      site: the site name.
      measured: False when every call at this site passed straight to `jax.lax`.
      unmeasured_reason: why it was passed through (e.g. "vmap axis"), or None.
      ranks: the ranks this process recorded (process index or axis index).
      steps: steps recorded (after sampling) on this process.
      engaged: whether the policy was pacing at the last step.
      steps_paced: steps on which this process slept before the collective.
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
        self.native = None  # (native site id, layout key) on the native path
        self.flush = _no_flush  # brings host state up to date (the native drain)
        self.memo = SiteMemo(num_slots)
        self._initial_state: Any = None

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
    for r in ranks:
        st = site.ranks[r]
        with st.lock:
            s.steps += st.steps
            s.steps_paced += st.steps_paced
            s.total_delay_s += st.total_delay_ns / 1e9
            s.engaged = s.engaged or st.engaged
            if st.steps:
                waits.append(st.wait_sum_ns / st.steps / 1e9)
            k = min(st.early_n, len(st.early_hist))
            if k:
                hists.append(st.early_hist[:k].astype(np.float64))
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
    return s
