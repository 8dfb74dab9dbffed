"""The `Pacer`: per-process state, sites, host callbacks, and start-up consensus."""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import json
import logging
import math
import os
import queue
import signal
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from jaxpace import _policy
from jaxpace._probe import Clock, RateLimitedLog, Recorder, Sink, interruptible_sleep
from jaxpace.errors import ConfigError, ConfigMismatchError, TracedConfigChangeError

__all__ = ["Pacer", "PacerConfig", "SiteStats", "default_pacer", "configure"]

log = logging.getLogger("jaxpace")

Granularity = Literal["process", "device"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PacerConfig:
    """Settings that shape the traced program; fixed before the first trace.

    Attributes:
      enabled: False makes every jaxpace collective the plain `jax.lax` one.
      granularity: `"process"` measures once per process (one leader shard, the
        cheap default); `"device"` measures every shard.
      sample_every: measure every k-th step of a site (1 = every step).
      capacity: ring-buffer slots per site and rank (memory is fixed).
      consensus_timeout_s: how long start-up waits for the other processes'
        settings before failing with a clear error.
    """

    enabled: bool = True
    granularity: Granularity = "process"
    sample_every: int = 1
    capacity: int = 4096
    consensus_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ConfigError(f"`enabled` must be True or False, got {self.enabled!r}.")
        if self.granularity not in ("process", "device"):
            raise ConfigError(
                f"`granularity` must be one of 'process', 'device', got {self.granularity!r}."
            )
        _policy._check_number("sample_every", self.sample_every, lo=1, hi=10**6, integer=True)
        _policy._check_number("capacity", self.capacity, lo=2, hi=10**7, integer=True)
        _policy._check_number(
            "consensus_timeout_s", self.consensus_timeout_s, lo=0.0, hi=3600.0, lo_open=True
        )


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


class _RankState:
    """Host state of one (site, rank) on this process. Guarded by `lock`."""

    def __init__(self, capacity: int, policy: _policy.PacingPolicy, num_slots: int) -> None:
        self.lock = threading.Lock()
        self.recorder = Recorder(capacity)
        self.next_step = 0
        self.prev_wait_s = math.nan
        self.prev_step_s = math.nan
        self.last_done_ns: int | None = None
        self.last_arrive_ns: int | None = None
        self.open_step: int | None = None  # arrived, not yet done
        self.pending_delay_s = 0.0
        self.policy_state = policy.init(num_slots)
        self.engaged = False
        self.backed_off = False
        self.steps = 0
        self.steps_paced = 0
        self.total_delay_ns = 0
        self.wait_sum_ns = 0
        # Earliness history for stats: a fixed ring of (capacity, num_slots).
        self.early_hist = np.full((min(capacity, 1024), num_slots), np.nan, dtype=np.float32)
        self.early_n = 0


class _Site:
    """One collective call site: its static layout and its ranks' host state."""

    def __init__(self, pacer: Pacer, name: str, num_slots: int) -> None:
        self.pacer = pacer
        self.name = name
        self.num_slots = num_slots
        self.ranks: dict[int, _RankState] = {}
        self.lock = threading.Lock()
        self.errors = 0
        self.layout: str | None = None  # how each process's measuring shard was found

    def rank(self, r: int) -> _RankState:
        st = self.ranks.get(r)
        if st is None:
            with self.lock:
                st = self.ranks.get(r)
                if st is None:
                    st = _RankState(self.pacer.config.capacity, self.pacer.policy, self.num_slots)
                    self.ranks[r] = st
        return st


_CLOCK_MAX_NS = 2**62


def _now_ns(clock: Clock) -> int | None:
    """One clock reading in integer ns, or None when it is unusable.

    NaN, inf, negative, absurdly large or non-numeric readings (and a raising
    clock) give None: the step is then simply not timed, never a delay.
    """
    try:
        t = clock()
        if isinstance(t, bool) or not isinstance(t, (int, float, np.integer, np.floating)):
            return None
        if not math.isfinite(t) or t < 0 or t >= _CLOCK_MAX_NS:
            return None
        return int(t)
    except Exception:  # noqa: BLE001 - a broken clock means "not timed"
        return None


def _host_callbacks_available() -> bool:
    """Whether JAX has a CPU backend to run host callbacks on (checked once per Pacer)."""
    try:
        import jax

        return bool(jax.local_devices(backend="cpu"))
    except Exception:  # noqa: BLE001 - e.g. JAX_PLATFORMS=cuda
        return False


class Pacer:
    """Per-process jaxpace runtime: measures collectives and applies a pacing policy.

    Build one per process before the first traced call (the module-level
    `jaxpace.psum`/`pmean` use a default instance). Settings that change the
    traced program are frozen at the first trace and agreed across processes.

    Args:
      policy: a `PacingPolicy`; default `no_pacing()` (measure only).
      enabled: False passes every call straight to `jax.lax`.
      granularity: `"process"` (default) or `"device"`.
      sample_every: measure every k-th step.
      capacity: ring-buffer slots per site and rank.
      clock: a `Clock` returning monotonic nanoseconds (default
        `time.perf_counter_ns`).
      sinks: callables receiving per-step summaries on a background thread.
      mesh: the concrete `jax.sharding.Mesh` your `shard_map` uses. Optional:
        it tells the runtime which shard is the first of each process; without
        it jaxpace uses the mesh set by `jax.set_mesh`, a mesh made by
        `jaxpace.make_mesh`, or assumes processes own contiguous blocks of the
        mesh (true for `jax.make_mesh` and `pmap`).
      consensus_timeout_s: see `PacerConfig`.
      rank_groups: optional `{kind: {rank: label}}` written into the records'
        header (e.g. `{"numa": {0: "socket0", ...}, "nic": {...}}`) so
        `jaxpace report` can test whether lateness follows a locality group.
        Each rank's host is recorded without asking.

    >>> import jaxpace as jp
    >>> pacer = jp.Pacer(policy=jp.adaptive(max_delay_s=0.005))
    >>> pacer.config.granularity
    'process'
    """

    def __init__(
        self,
        policy: _policy.PacingPolicy | None = None,
        *,
        enabled: bool = True,
        granularity: Granularity = "process",
        sample_every: int = 1,
        capacity: int = 4096,
        clock: Clock | None = None,
        sinks: Sequence[Sink] = (),
        mesh: Any = None,
        consensus_timeout_s: float = 60.0,
        rank_groups: dict[str, dict[int, str]] | None = None,
    ) -> None:
        if policy is None:
            policy = _policy.no_pacing()
        if not isinstance(policy, _policy.PacingPolicy):
            raise ConfigError(
                f"`policy` must be a jaxpace PacingPolicy (jp.no_pacing(), jp.fixed(...), "
                f"jp.adaptive(...)), got {type(policy).__name__}."
            )
        self._config = PacerConfig(
            enabled=enabled,
            granularity=granularity,
            sample_every=sample_every,
            capacity=capacity,
            consensus_timeout_s=consensus_timeout_s,
        )
        self._policy = policy
        self.clock: Clock = clock if clock is not None else time.perf_counter_ns
        self.mesh = mesh
        self.rank_groups = rank_groups
        self._sinks = list(sinks)
        self._sites: dict[str, _Site] = {}
        self._unmeasured: dict[str, str] = {}
        self._traced = False
        self._consensus_done = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._errlog = RateLimitedLog()
        self.run_id: str | None = None
        self._sink_queue: queue.Queue | None = None
        self._sink_thread: threading.Thread | None = None
        self.sink_dropped = 0
        self.sink_errors = 0
        self._fault_hook = None  # tests: called inside callbacks to inject faults
        self._callbacks_ok_cache: bool | None = None
        _install_sigterm_release(self)

    # ------------------------------------------------------------------ config

    @property
    def config(self) -> PacerConfig:
        return self._config

    @property
    def policy(self) -> _policy.PacingPolicy:
        return self._policy

    def configure(self, *, policy: _policy.PacingPolicy | None = None, **changes: Any) -> None:
        """Changes settings; only allowed before the first traced call.

        Raises:
          TracedConfigChangeError: a collective of this pacer was already traced.
          ConfigError: a value is invalid.
        """
        if self._traced:
            raise TracedConfigChangeError(
                "jaxpace settings cannot change after the first traced collective: jit "
                "caches the traced program, so the change would be silently ignored. "
                "Configure before the first call, or create a new `jaxpace.Pacer`."
            )
        if policy is not None:
            if not isinstance(policy, _policy.PacingPolicy):
                raise ConfigError(f"`policy` must be a PacingPolicy, got {type(policy).__name__}.")
            self._policy = policy
        if changes:
            fields = {f.name for f in dataclasses.fields(PacerConfig)}
            bad = sorted(set(changes) - fields)
            if bad:
                raise ConfigError(f"unknown setting(s) {bad}; valid: {sorted(fields)}.")
            self._config = dataclasses.replace(self._config, **changes)

    @property
    def _callbacks_ok(self) -> bool:
        if self._callbacks_ok_cache is None:
            self._callbacks_ok_cache = _host_callbacks_available()
            if not self._callbacks_ok_cache:
                log.warning(
                    "jaxpace: JAX has no CPU backend, so host callbacks cannot run; every "
                    "jaxpace collective is the plain jax.lax one (unmeasured). Add `cpu` to "
                    "JAX_PLATFORMS (e.g. JAX_PLATFORMS=cuda,cpu) to measure."
                )
        return self._callbacks_ok_cache

    # ------------------------------------------------------------------ collectives

    def psum(self, x, axis_name, *, axis_index_groups=None, site: str | None = None):
        """`jax.lax.psum`, measured (and paced) by this pacer. See `jaxpace.psum`."""
        from jaxpace import _collectives

        return _collectives.collective(self, "psum", x, axis_name, axis_index_groups, site)

    def pmean(self, x, axis_name, *, axis_index_groups=None, site: str | None = None):
        """`jax.lax.pmean`, measured (and paced) by this pacer. See `jaxpace.pmean`."""
        from jaxpace import _collectives

        return _collectives.collective(self, "pmean", x, axis_name, axis_index_groups, site)

    # ------------------------------------------------------------------ trace-time hooks

    def _on_trace(self) -> None:
        """Freezes settings and agrees on them across processes (once)."""
        self._traced = True
        if self._consensus_done:
            return
        with self._lock:
            if self._consensus_done:
                return
            self.run_id = _consensus(self)
            self._consensus_done = True

    def _site(self, name: str, num_slots: int) -> _Site:
        with self._lock:
            s = self._sites.get(name)
            if s is None or s.num_slots != num_slots:
                s = _Site(self, name, num_slots)
                self._sites[name] = s
            return s

    def _note_unmeasured(self, site: str, reason: str) -> None:
        with self._lock:
            if self._unmeasured.get(site) != reason:
                log.info("jaxpace: collective at %s is not measured: %s", site, reason)
            self._unmeasured[site] = reason

    # ------------------------------------------------------------------ callbacks (host)

    def _pre(self, site: _Site, rank: int) -> tuple[np.ndarray, np.int32]:
        """Pre-collective callback body: record arrival, sleep the pending delay.

        Never raises: any error gives "no delay" and an all-zero payload.
        """
        n = site.num_slots
        exchange = self._policy.needs_exchange
        payload = np.zeros(3 * n if exchange else 0, dtype=np.float32)
        try:
            if self._fault_hook is not None:
                # Before the clock: a hook that sleeps models a late arrival.
                self._fault_hook("pre", site.name, rank, site.rank(rank).next_step)
            t = _now_ns(self.clock)
            st = site.rank(rank)
            with st.lock:
                step = st.next_step
                st.next_step += 1
                sampled = step % self._config.sample_every == 0 and t is not None
                if exchange and sampled and 0 <= rank < n:
                    if math.isfinite(st.prev_wait_s):
                        payload[rank] = st.prev_wait_s
                        payload[n + rank] = 1.0
                    if math.isfinite(st.prev_step_s):
                        payload[2 * n + rank] = st.prev_step_s
                delay_s = st.pending_delay_s
                st.pending_delay_s = 0.0
                if sampled:
                    if st.open_step is not None:
                        # Two arrivals before one exit: two shards of this process
                        # measure this collective, or one site name is traced twice.
                        self._errlog.warning(
                            f"{site.name}:overlap",
                            "jaxpace: two measured arrivals at %s overlap on one rank (%d); "
                            "pass the mesh as `Pacer(mesh=...)` (or use `jax.set_mesh`) and "
                            "give collectives traced from one line in a loop distinct `site=`.",
                            site.name,
                            rank,
                        )
                    st.open_step = step
            delay_s = _clamp_delay(delay_s, self._policy.max_delay_s)
            slept = interruptible_sleep(delay_s, self._stop)
            if sampled:
                with st.lock:
                    st.recorder.arrive(step, t, int(slept * 1e9))
                    st.last_arrive_ns = t
            # Flag for the post-callback: 1 + step when sampled, 0 to skip.
            return payload, np.int32((step + 1) if sampled else 0)
        except Exception as e:  # noqa: BLE001 - callbacks must never raise
            self._count_error(site, "pre", e)
            return np.zeros_like(payload), np.int32(0)

    def _post(
        self, site: _Site, rank: int, flag: int, reduced: np.ndarray | None, scale: float
    ) -> None:
        """Post-collective callback body: close the record, run the policy."""
        try:
            t = _now_ns(self.clock)
            if flag <= 0:
                return
            if t is None:
                st = site.rank(rank)
                with st.lock:  # untimed: pace nothing from it
                    st.prev_wait_s = math.nan
                    st.prev_step_s = math.nan
                    st.pending_delay_s = 0.0
                return
            step = int(flag) - 1
            n = site.num_slots
            vec = (
                None
                if reduced is None
                else np.asarray(reduced, dtype=np.float64).reshape(-1) * scale
            )
            if self._fault_hook is not None:
                self._fault_hook("post", site.name, rank, step)
            st = site.rank(rank)
            with st.lock:
                st.open_step = None
                timing = st.recorder.done(step, t, st.engaged)
                wait_ns, delay_ns = timing if timing is not None else (None, 0)
                st.prev_wait_s = wait_ns / 1e9 if wait_ns is not None else math.nan
                if st.last_done_ns is not None and t > st.last_done_ns:
                    st.prev_step_s = (t - st.last_done_ns) / 1e9
                else:
                    st.prev_step_s = math.nan
                st.last_done_ns = t
                if wait_ns is not None:
                    st.steps += 1
                    st.wait_sum_ns += wait_ns
                    if delay_ns > 0:
                        st.steps_paced += 1
                        st.total_delay_ns += delay_ns
                if vec is None:
                    # No exchange: only this rank's own view (fixed / measure-only).
                    self._decide(st, rank, np.full(n, np.nan), st.prev_step_s)
                else:
                    # In-band vector of everyone's previous waits.
                    waits = _policy.sanitize_seconds(vec[:n])
                    present = vec[n : 2 * n] > 0.5
                    waits[~present] = np.nan
                    if np.isfinite(waits).any():
                        earliness = waits - np.nanmin(waits)
                        steps_s = _policy.sanitize_seconds(vec[2 * n :])
                        steps_s[~present | (steps_s <= 0)] = np.nan
                        step_time = (
                            float(np.nanmedian(steps_s)) if np.isfinite(steps_s).any() else math.nan
                        )
                        self._decide(st, rank, earliness, step_time)
                        self._note_backoff(site, st)
                        st.early_hist[st.early_n % len(st.early_hist)] = earliness
                        st.early_n += 1
            if self._sinks:
                self._emit(
                    {
                        "site": site.name,
                        "step": step,
                        "rank": rank,
                        "wait_s": (wait_ns or 0) / 1e9,
                        "delay_s": delay_ns / 1e9,
                        "engaged": st.engaged,
                    }
                )
        except Exception as e:  # noqa: BLE001 - callbacks must never raise
            self._count_error(site, "post", e)

    def _decide(self, st: _RankState, rank: int, earliness: np.ndarray, step_time_s: float) -> None:
        """Runs the policy on one observation and stores this rank's next delay (lock held)."""
        obs = _policy.Observation(earliness_s=earliness, step_time_s=step_time_s)
        delays, st.policy_state = self._policy.update(obs, st.policy_state)
        delays = np.asarray(delays, dtype=np.float64).reshape(-1)
        st.pending_delay_s = _clamp_delay(
            delays[rank] if rank < len(delays) else 0.0, self._policy.max_delay_s
        )
        st.engaged = bool(getattr(st.policy_state, "engaged", False))

    def _note_backoff(self, site: _Site, st: _RankState) -> None:
        """Logs (once per episode) that the policy refused to chase a skew."""
        backed_off = bool(getattr(st.policy_state, "backed_off", False))
        if backed_off and not st.backed_off:
            log.warning(
                "jaxpace: at %s the arrival spread (%.3f s) is far beyond max_delay_s=%g; "
                "pacing backs off instead of chasing it. Fix the straggler at its source "
                "(see `jaxpace report`).",
                site.name,
                float(getattr(st.policy_state, "spread_s", math.nan)),
                self._policy.max_delay_s,
            )
        st.backed_off = backed_off

    def _count_error(self, site: _Site, where: str, e: Exception) -> None:
        try:
            with site.lock:
                site.errors += 1
            self._errlog.warning(
                f"{site.name}:{where}",
                "jaxpace: %s-collective callback at %s raised %r; using no delay "
                "(the step and its result are unaffected).",
                where,
                site.name,
                e,
            )
        except Exception:  # noqa: BLE001
            pass

    # ------------------------------------------------------------------ sinks

    def _emit(self, summary: dict[str, Any]) -> None:
        if self._sink_queue is None:
            with self._lock:
                if self._sink_queue is None:
                    self._sink_queue = queue.Queue(maxsize=10_000)
                    self._sink_thread = threading.Thread(
                        target=self._sink_loop, name="jaxpace-sinks", daemon=True
                    )
                    self._sink_thread.start()
        try:
            self._sink_queue.put_nowait(summary)
        except queue.Full:
            self.sink_dropped += 1

    def _sink_loop(self) -> None:
        q = self._sink_queue
        while True:
            item = q.get()
            if item is None:
                return
            for sink in self._sinks:
                try:
                    sink(item)
                except Exception as e:  # noqa: BLE001
                    self.sink_errors += 1
                    self._errlog.warning("sink", "jaxpace: metrics sink %r raised %r", sink, e)
            q.task_done()

    def flush(self, timeout_s: float = 5.0) -> None:
        """Waits (bounded) until queued sink summaries are delivered."""
        q = self._sink_queue
        if q is None:
            return
        deadline = time.monotonic() + timeout_s
        while q.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Releases any pacing sleep now and makes later sleeps zero."""
        self._stop.set()
        if self._sink_queue is not None:
            self.flush(1.0)
            self._sink_queue.put(None)

    def release(self) -> None:
        """Ends any pacing sleep in progress (SIGTERM does this too)."""
        self._stop.set()

    # ------------------------------------------------------------------ results

    def stats(self) -> dict[str, SiteStats]:
        """Per-site summary of this process's measurements and pacing.

        Returns:
          `{site: SiteStats}`; see `SiteStats` for the fields.
        """
        out: dict[str, SiteStats] = {}
        for name, reason in sorted(self._unmeasured.items()):
            out[name] = SiteStats(site=name, measured=False, unmeasured_reason=reason, ranks=[])
        for name, site in sorted(self._sites.items()):
            ranks = sorted(site.ranks)
            s = SiteStats(
                site=name,
                measured=True,
                unmeasured_reason=None,
                ranks=ranks,
                errors=site.errors,
                layout=site.layout,
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
                    ps = st.policy_state
                    s.backed_off = s.backed_off or bool(getattr(ps, "backed_off", False))
                    if isinstance(ps, _policy.AdaptiveState) and ps.ab_count.sum() > 0:
                        cnt = np.maximum(ps.ab_count, 1)
                        s.ab_effect = {
                            "unpaced_step_s": float(ps.ab_sum_s[0] / cnt[0]),
                            "paced_step_s": float(ps.ab_sum_s[1] / cnt[1]),
                            "rejected": bool(ps.ab_rejected),
                        }
            if waits:
                s.wait_mean_s = float(np.mean(waits))
            if hists:
                h = np.concatenate(hists)
                with np.errstate(all="ignore"):
                    import warnings

                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", RuntimeWarning)
                        s.earliness_mean_s = np.nanmean(h, axis=0).tolist()
                        s.earliness_p50_s = np.nanquantile(h, 0.5, axis=0).tolist()
                        s.earliness_p99_s = np.nanquantile(h, 0.99, axis=0).tolist()
            out[name] = s
        return out

    def records(self) -> list[dict[str, Any]]:
        """This process's finished records as dicts (the JSONL format, docs/records.md)."""
        import jax

        proc = jax.process_index()
        out: list[dict[str, Any]] = [self._header()]
        for name, site in sorted(self._sites.items()):
            for r in sorted(site.ranks):
                st = site.ranks[r]
                with st.lock:
                    rows = st.recorder.completed()
                for row in rows:
                    out.append(
                        {
                            "type": "step",
                            "site": name,
                            "step": int(row["step"]),
                            "rank": int(r),
                            "process": proc,
                            "device": None,
                            "arrive_ns": int(row["arrive_ns"]),
                            "done_ns": int(row["done_ns"]),
                            "wait_ns": int(row["done_ns"] - row["arrive_ns"]),
                            "delay_ns": int(row["delay_ns"]),
                            "engaged": bool(row["engaged"]),
                        }
                    )
        return out

    def _header(self) -> dict[str, Any]:
        import jax

        from jaxpace import __version__

        return {
            "type": "header",
            "format": 1,
            "run_id": self.run_id or "local",
            "process_index": jax.process_index(),
            "process_count": jax.process_count(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "granularity": self._config.granularity,
            "jaxpace_version": __version__,
            "policy": self._policy.name,
            "local_devices": [d.id for d in jax.local_devices()],
            "topology": {"rank_groups": self._rank_groups()},
        }

    def _rank_groups(self) -> dict[str, dict[str, str]]:
        """Group labels of this process's ranks: its host, plus any the user gave."""
        import jax

        if self._config.granularity == "process":
            mine = {jax.process_index()}
        else:
            mine = {r for site in self._sites.values() for r in site.ranks}
        host = socket.gethostname()
        groups: dict[str, dict[str, str]] = {"host": {str(r): host for r in sorted(mine)}}
        for kind, mapping in (self.rank_groups or {}).items():
            groups[str(kind)] = {str(r): str(v) for r, v in mapping.items()}
        return groups

    def export(self, path: str | os.PathLike) -> str:
        """Writes this process's records as JSONL (docs/records.md) and returns the path.

        If `path` is a directory, writes `records-p{process_index}.jsonl` in it.
        """
        import jax

        p = os.fspath(path)
        if os.path.isdir(p):
            p = os.path.join(p, f"records-p{jax.process_index()}.jsonl")
        d = os.path.dirname(p)
        if d:
            os.makedirs(d, exist_ok=True)
        _write_jsonl(p, self.records())
        return p

    def gather(self, timeout_s: float = 60.0) -> list[dict[str, Any]] | None:
        """Collects every process's records on process 0, at the end of a run.

        Each process publishes its records (compressed) to the `jax.distributed`
        key-value store; process 0 reads them with a bounded wait. Call it on
        every process, outside any jitted code (never from a callback).

        Args:
          timeout_s: how long process 0 waits for each other process.

        Returns:
          On process 0, all records (each process's header first, then its
          steps; a process that never published is left out and logged); on
          other processes None. Single-process: this process's records.
        """
        import jax

        recs = self.records()
        if jax.process_count() == 1:
            return recs
        client = _kv_client()
        if client is None:
            raise RuntimeError("`gather` needs `jax.distributed.initialize()` (multi-process).")
        gen = _CONSENSUS_GEN.get("gather", 0)
        _CONSENSUS_GEN["gather"] = gen + 1
        prefix = f"jaxpace/records/{self.run_id}/{gen}"
        me = jax.process_index()
        blob = zlib.compress("\n".join(json.dumps(r, separators=(",", ":")) for r in recs).encode())
        client.key_value_set_bytes(f"{prefix}/p{me}", blob)
        if me != 0:
            return None
        out = list(recs)
        for p in range(1, jax.process_count()):
            try:
                data = client.blocking_key_value_get_bytes(f"{prefix}/p{p}", int(timeout_s * 1000))
            except Exception as e:  # noqa: BLE001 - a dead peer must not hang or crash us
                log.warning(
                    "jaxpace: no records from process %d within %.0fs (%s)",
                    p,
                    timeout_s,
                    type(e).__name__,
                )
                continue
            out.extend(json.loads(line) for line in zlib.decompress(data).decode().splitlines())
        return out

    def export_all(self, directory: str | os.PathLike, timeout_s: float = 60.0) -> str | None:
        """`gather` to process 0 and write `records-p{i}.jsonl` for every process there.

        Use when processes do not share a filesystem. Returns the directory on
        process 0, None elsewhere.
        """
        recs = self.gather(timeout_s)
        if recs is None:
            return None
        d = os.fspath(directory)
        os.makedirs(d, exist_ok=True)
        by_proc: dict[int, list[dict[str, Any]]] = {}
        current = None
        for r in recs:
            if r.get("type") == "header":
                current = int(r["process_index"])
            by_proc.setdefault(current, []).append(r)
        for proc, rows in by_proc.items():
            _write_jsonl(os.path.join(d, f"records-p{proc}.jsonl"), rows)
        return d

    def write_trace(self, path: str | os.PathLike) -> str:
        """Writes a Perfetto / Chrome trace JSON of this process's records."""
        from jaxpace import report

        report.write_trace(self.records(), os.fspath(path))
        return os.fspath(path)


def _write_jsonl(path: str, records: list[dict[str, Any]]) -> None:
    """Writes records one JSON object a line, atomically (a reader never sees half a file)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for rec in records:
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------------- consensus


def _clamp_delay(delay_s: Any, max_delay_s: float) -> float:
    """`delay_s` clamped to `[0, max_delay_s]`; NaN, inf and non-numbers give 0."""
    try:
        d = float(delay_s)
    except (TypeError, ValueError):
        return 0.0
    if not math.isfinite(d):
        return 0.0
    return min(max(d, 0.0), float(max_delay_s))


def _fingerprint(pacer: Pacer) -> str:
    c = pacer.config
    desc = {
        "enabled": c.enabled,
        "host_callbacks": pacer._callbacks_ok if c.enabled else None,
        "granularity": c.granularity,
        "sample_every": c.sample_every,
        "policy": pacer.policy.name,
        "max_delay_s": pacer.policy.max_delay_s,
    }
    return json.dumps(desc, sort_keys=True)


_CONSENSUS_GEN: dict[str, int] = {}


def _kv_client():
    try:
        from jax._src import distributed

        return distributed.global_state.client
    except Exception:  # noqa: BLE001
        return None


def _consensus(pacer: Pacer) -> str:
    """Agrees on settings and a run id with every other process; returns the run id.

    Uses the `jax.distributed` key-value store at trace time (never inside a
    callback). A mismatch raises the same `ConfigMismatchError` on every process;
    a peer that never answers raises after `consensus_timeout_s`.
    """
    import jax

    nproc = jax.process_count()
    mine = _fingerprint(pacer)
    if nproc == 1:
        return uuid.uuid4().hex[:12]
    client = _kv_client()
    if client is None:
        return "multi-" + hashlib.sha1(mine.encode()).hexdigest()[:8]
    gen = _CONSENSUS_GEN.get("g", 0)
    _CONSENSUS_GEN["g"] = gen + 1
    me = jax.process_index()
    prefix = f"jaxpace/consensus/{gen}"
    if me == 0:
        client.key_value_set(f"{prefix}/run_id", uuid.uuid4().hex[:12])
    client.key_value_set(f"{prefix}/p{me}", mine)
    timeout_ms = int(pacer.config.consensus_timeout_s * 1000)
    got: dict[int, str] = {}
    try:
        for p in range(nproc):
            got[p] = client.blocking_key_value_get(f"{prefix}/p{p}", timeout_ms)
        run_id = client.blocking_key_value_get(f"{prefix}/run_id", timeout_ms)
    except Exception as e:  # noqa: BLE001
        missing = [p for p in range(nproc) if p not in got]
        raise ConfigMismatchError(
            f"jaxpace could not agree on settings with process(es) {missing} within "
            f"`consensus_timeout_s`={pacer.config.consensus_timeout_s}s ({type(e).__name__}). "
            "Every process must build its Pacer and trace the same jaxpace collectives."
        ) from None
    differ = {p: v for p, v in got.items() if v != got[0]}
    if differ:
        lines = "\n".join(f"  process {p}: {v}" for p, v in sorted(got.items()))
        raise ConfigMismatchError(
            "jaxpace settings differ between processes, so their traced programs would "
            f"differ and collectives could pair the wrong operands:\n{lines}\n"
            "Build the Pacer from the same settings (and environment) on every process."
        )
    return run_id


# ---------------------------------------------------------------------- default + signals

_DEFAULT: Pacer | None = None
_DEFAULT_LOCK = threading.Lock()
_ALL_PACERS: list[Any] = []


def default_pacer() -> Pacer:
    """Returns the process-wide default `Pacer` used by `jaxpace.psum`/`pmean`."""
    global _DEFAULT
    if _DEFAULT is None:
        with _DEFAULT_LOCK:
            if _DEFAULT is None:
                _DEFAULT = Pacer()
    return _DEFAULT


def configure(policy: _policy.PacingPolicy | None = None, **settings: Any) -> Pacer:
    """Configures the default `Pacer` (before the first traced call).

    Args:
      policy: a `PacingPolicy`.
      **settings: `PacerConfig` fields (`enabled`, `granularity`, ...) or
        `clock`, `sinks`, `mesh`.

    Returns:
      The default pacer.

    Raises:
      TracedConfigChangeError: the default pacer already traced a collective.
    """
    p = default_pacer()
    for attr in ("clock", "mesh"):
        if attr in settings:
            if p._traced:
                p.configure(enabled=p.config.enabled)  # raises the clear error
            setattr(p, attr, settings.pop(attr))
    if "sinks" in settings:
        p._sinks = list(settings.pop("sinks"))
    p.configure(policy=policy, **settings)
    return p


def _release_all() -> None:
    for ref in list(_ALL_PACERS):
        p = ref()
        if p is not None:
            p.release()


def _install_sigterm_release(pacer: Pacer) -> None:
    """Makes SIGTERM end pacing sleeps promptly, then runs the previous handler.

    While the main thread is blocked inside a compiled computation, Python-level
    signal handlers cannot run, and that computation may be waiting on our very
    sleep. So a watcher thread reads the signal wake-up fd (written by the C
    handler at once) and releases the sleeps; the Python handler then chains to
    the previous one.
    """
    import weakref

    _ALL_PACERS.append(weakref.ref(pacer))
    if threading.current_thread() is not threading.main_thread():
        return
    if getattr(_install_sigterm_release, "_installed", False):
        return
    _install_sigterm_release._installed = True  # type: ignore[attr-defined]
    try:
        prev = signal.getsignal(signal.SIGTERM)

        def handler(signum, frame):
            _release_all()
            if callable(prev):
                prev(signum, frame)
            else:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)

        if prev in (signal.SIG_DFL, None) or callable(prev):
            signal.signal(signal.SIGTERM, handler)
        r, w = socket.socketpair()
        r.setblocking(True)
        w.setblocking(False)
        old_fd = signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
        if old_fd != -1:
            # Someone (e.g. asyncio) owns the wake-up fd: give it back.
            signal.set_wakeup_fd(old_fd)
            r.close()
            w.close()
            return

        def watch() -> None:
            while True:
                try:
                    data = r.recv(64)
                except OSError:
                    return
                if not data:
                    return
                if signal.SIGTERM in data:
                    _release_all()

        def close_at_exit() -> None:
            try:
                prev_fd = signal.set_wakeup_fd(-1)
                if prev_fd not in (-1, w.fileno()):
                    signal.set_wakeup_fd(prev_fd)  # someone else's since: leave it
            except (ValueError, OSError):
                pass
            w.close()
            r.close()

        threading.Thread(target=watch, name="jaxpace-sigterm", daemon=True).start()
        atexit.register(close_at_exit)
    except (ValueError, OSError):
        pass
