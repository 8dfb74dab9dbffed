"""`Pacer`: one process's jaxpace runtime, composed of its config, sites, hooks, sinks and records."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from jaxpace import policy as _policy
from jaxpace.collectives import measure as _collectives
from jaxpace.errors import TracedConfigChangeError
from jaxpace.runtime import consensus, signals
from jaxpace.runtime import export as _export
from jaxpace.runtime.config import (
    Granularity,
    PacerConfig,
    Settings,
    check_policy,
    checked_settings,
)
from jaxpace.runtime.delay import register_stop
from jaxpace.runtime.hooks import Hooks
from jaxpace.runtime.inflight import DEFAULT_TIMEOUT_S, settle
from jaxpace.runtime.probe import Clock, RateLimitedLog, Sink
from jaxpace.runtime.sink_thread import SinkThread
from jaxpace.runtime.sites import Site, SiteStats, site_stats
from jaxpace.runtime.watchdog import Watchdog, WatchdogConfig

__all__ = ["CLOSE_TIMEOUT_S", "Pacer", "configure", "default_pacer"]

log = logging.getLogger("jaxpace")

CLOSE_TIMEOUT_S = 10.0  # Pacer.close(): the whole shutdown's bound, steps and sinks together


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
      stall_after_s: seconds this process may sit inside one measured
        collective (pacing sleeps excluded) before the stall watchdog names
        the processes that never arrived (docs/troubleshooting.md, "My job
        hangs"); default 300, None turns the watchdog off.
      on_stall: after the message and the stall record: `"warn"` (keep
        waiting, default), `"raise"` (`StallError` in the main thread when it
        next runs Python) or `"exit"` (exit code 75, `STALL_EXIT_CODE`).
      run_dir: directory for `stall-p{i}.json`; default `$JAXPACE_RUN_DIR`,
        else the current directory.

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
        stall_after_s: float | None = 300.0,
        on_stall: str = "warn",
        run_dir: str | os.PathLike | None = None,
    ) -> None:
        self._policy = _policy.no_pacing()
        self._config = PacerConfig()
        self.clock: Clock = time.perf_counter_ns
        self.mesh: Any = None
        self.rank_groups: dict[str, dict[int, str]] | None = None
        self._sites: dict[str, Site] = {}
        self._unmeasured: dict[str, str] = {}
        self._traced = False
        self._consensus_done = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._errlog = RateLimitedLog()
        self._sink_thread = SinkThread([], self._errlog)
        self._watchdog = Watchdog(self, WatchdogConfig())  # thread starts at the first trace
        self.run_id: str | None = None
        self.hooks: Hooks = Hooks(self)
        self._closed = False
        self.in_flight_at_close = 0
        # The one configuration path (also `configure` and `jaxpace.configure`).
        self._apply(
            checked_settings(
                self._settings(),
                check_policy(policy),
                {
                    "enabled": enabled,
                    "granularity": granularity,
                    "sample_every": sample_every,
                    "capacity": capacity,
                    "consensus_timeout_s": consensus_timeout_s,
                    "clock": clock,
                    "sinks": sinks,
                    "mesh": mesh,
                    "rank_groups": rank_groups,
                    "stall_after_s": stall_after_s,
                    "on_stall": on_stall,
                    "run_dir": run_dir,
                },
            )
        )
        register_stop(self._stop)

    # ------------------------------------------------------------------ config

    @property
    def config(self) -> PacerConfig:
        return self._config

    @property
    def policy(self) -> _policy.PacingPolicy:
        return self._policy

    @property
    def sink_dropped(self) -> int:
        """Summaries dropped because the sink queue was full."""
        return self._sink_thread.dropped

    @property
    def sink_errors(self) -> int:
        """Exceptions raised by sinks (each caught and logged, rate-limited)."""
        return self._sink_thread.errors

    @property
    def sink_disabled(self) -> int:
        """Sinks no longer called because they raised a `BaseException` that is not an
        `Exception` (`SystemExit` from `sys.exit()`, ...); each is logged, and counted in
        `sink_errors` too. The other sinks keep receiving every summary."""
        return len(self._sink_thread.disabled)

    def configure(self, *, policy: _policy.PacingPolicy | None = None, **changes: Any) -> None:
        """Changes settings; only allowed before the first traced call.

        Args:
          policy: a `PacingPolicy`, or None to keep the current one.
          **changes: `PacerConfig` fields (`enabled`, `granularity`, ...) or
            `clock`, `sinks`, `mesh`, `rank_groups`, `stall_after_s`, `on_stall`,
            `run_dir`, checked as by `Pacer(...)`.

        Raises:
          TracedConfigChangeError: a collective of this pacer was already traced.
          ConfigError: a value is invalid (nothing is changed then).
        """
        self._refuse_if_traced()
        if policy is not None:
            policy = check_policy(policy)
        self._apply(checked_settings(self._settings(), policy, changes))

    def _settings(self) -> Settings:
        return Settings(
            policy=self._policy,
            config=self._config,
            watchdog=self._watchdog.config,
            clock=self.clock,
            mesh=self.mesh,
            rank_groups=self.rank_groups,
            sinks=list(self._sink_thread.sinks),
        )

    def _apply(self, s: Settings) -> None:
        """Sets every setting at once, after `config.checked_settings` checked them all."""
        self._policy = s.policy
        self._config = s.config
        self._watchdog.config = s.watchdog
        self.clock = s.clock
        self.mesh = s.mesh
        self.rank_groups = s.rank_groups
        self._sink_thread.sinks = s.sinks

    def _refuse_if_traced(self) -> None:
        if self._traced:
            raise TracedConfigChangeError(
                "jaxpace settings cannot change after the first traced collective: jit "
                "caches the traced program, so the change would be silently ignored. "
                "Configure before the first call, or create a new `jaxpace.Pacer`."
            )

    # ------------------------------------------------- the runtime's internal interface
    #
    # What the hooks, export, in-flight settling, the watchdog and the native driver
    # (`jaxpace.runtime.*`, `jaxpace.native.driver`) read or change of a Pacer; the
    # rest of its state is its own. Package-internal: not part of the public API.

    def freeze_and_agree(self) -> None:
        """Freezes settings and agrees on them across processes (once, at first trace)."""
        self._traced = True
        if self._sink_thread.sinks:  # SIGTERM delivers their summaries (main thread only)
            signals.ensure_sigterm()
        if self._consensus_done:
            return
        with self._lock:
            if self._consensus_done:
                return
            mine = consensus.fingerprint(self.agreed_settings())
            self.run_id = consensus.agree(mine, self._config.consensus_timeout_s)
            self._consensus_done = True
            signals.register(self)  # closed at interpreter exit (after jax.distributed's init)
            if self._config.enabled:
                self._watchdog.start(self.run_id)

    @property
    def traced(self) -> bool:
        """Whether a collective of this pacer was traced (its settings are frozen)."""
        return self._traced

    @property
    def lock(self) -> threading.Lock:
        """Guards the site table and the consensus step; held briefly, never while waiting."""
        return self._lock

    @property
    def sites(self) -> Mapping[str, Site]:
        """The measured sites by name (read-only; `add_site` adds one, lock held)."""
        return MappingProxyType(self._sites)

    def add_site(self, name: str, site: Site) -> None:
        """Adds or replaces the measured site `name` (call with `lock` held)."""
        self._sites[name] = site

    def note_unmeasured(self, site: str, reason: str) -> None:
        """Records that `site` passes straight to `jax.lax`, and why (logged when new)."""
        with self._lock:
            if self._unmeasured.get(site) != reason:
                log.info("jaxpace: collective at %s is not measured: %s", site, reason)
            self._unmeasured[site] = reason

    @property
    def stop_event(self) -> threading.Event:
        """Set by `release`, `close` and SIGTERM: pending and later pacing sleeps end at once."""
        return self._stop

    @property
    def errlog(self) -> RateLimitedLog:
        """The rate-limited log for errors inside callbacks and threads."""
        return self._errlog

    @property
    def sink_thread(self) -> SinkThread:
        """The thread delivering per-step summaries to the sinks (`sinks`, `emit`)."""
        return self._sink_thread

    @property
    def watchdog(self) -> Watchdog:
        """The stall watchdog (its `config`, `running`, `stalls`)."""
        return self._watchdog

    def agreed_settings(self) -> dict[str, Any]:
        """The settings every process must share (they shape the traced program)."""
        c = self._config
        return {
            "enabled": c.enabled,
            "host_callbacks": self.hooks.callbacks_available() if c.enabled else None,
            "granularity": c.granularity,
            "sample_every": c.sample_every,
            "policy": self._policy.identity,
            "max_delay_s": self._policy.max_delay_s,
        }

    # ------------------------------------------------------------------ collectives

    def psum(self, x, axis_name, *, axis_index_groups=None, site: str | None = None):
        """`jax.lax.psum`, measured (and paced) by this pacer. See `jaxpace.psum`."""
        return _collectives.collective(self.hooks, "psum", x, axis_name, axis_index_groups, site)

    def pmean(self, x, axis_name, *, axis_index_groups=None, site: str | None = None):
        """`jax.lax.pmean`, measured (and paced) by this pacer. See `jaxpace.pmean`."""
        return _collectives.collective(self.hooks, "pmean", x, axis_name, axis_index_groups, site)

    def pmax(self, x, axis_name, *, axis_index_groups=None, site: str | None = None):
        """`jax.lax.pmax`, measured (never paced) by this pacer. See `jaxpace.pmax`."""
        return _collectives.collective(self.hooks, "pmax", x, axis_name, axis_index_groups, site)

    def pmin(self, x, axis_name, *, axis_index_groups=None, site: str | None = None):
        """`jax.lax.pmin`, measured (never paced) by this pacer. See `jaxpace.pmin`."""
        return _collectives.collective(self.hooks, "pmin", x, axis_name, axis_index_groups, site)

    def all_gather(
        self,
        x,
        axis_name,
        *,
        axis_index_groups=None,
        axis=0,
        tiled=False,
        to="varying",
        site: str | None = None,
    ):
        """`jax.lax.all_gather`, measured (never paced). See `jaxpace.all_gather`."""
        params = {"axis": axis, "tiled": tiled, "to": to}
        return _collectives.collective(
            self.hooks, "all_gather", x, axis_name, axis_index_groups, site, params
        )

    def psum_scatter(
        self,
        x,
        axis_name,
        *,
        scatter_dimension=0,
        axis_index_groups=None,
        tiled=False,
        site: str | None = None,
    ):
        """`jax.lax.psum_scatter`, measured (never paced). See `jaxpace.psum_scatter`."""
        params = {"scatter_dimension": scatter_dimension, "tiled": tiled}
        return _collectives.collective(
            self.hooks, "psum_scatter", x, axis_name, axis_index_groups, site, params
        )

    def ppermute(self, x, axis_name, perm, *, site: str | None = None):
        """`jax.lax.ppermute`, measured (never paced). See `jaxpace.ppermute`."""
        if not isinstance(perm, (list, tuple)) and hasattr(perm, "__iter__"):
            perm = list(perm)  # a `zip` or generator is read more than once here
        return _collectives.collective(
            self.hooks, "ppermute", x, axis_name, None, site, {"perm": perm}
        )

    def all_to_all(
        self,
        x,
        axis_name,
        split_axis,
        concat_axis,
        *,
        axis_index_groups=None,
        tiled=False,
        site: str | None = None,
    ):
        """`jax.lax.all_to_all`, measured (never paced). See `jaxpace.all_to_all`."""
        params = {"split_axis": split_axis, "concat_axis": concat_axis, "tiled": tiled}
        return _collectives.collective(
            self.hooks, "all_to_all", x, axis_name, axis_index_groups, site, params
        )

    # ------------------------------------------------------------------ lifecycle

    def flush(self, timeout_s: float = 5.0) -> None:
        """Waits (bounded) for this process's dispatched steps and delivers their summaries.

        At most about `timeout_s` in all; the sinks stay open (see `close`).
        """
        deadline = time.monotonic() + max(0.0, float(timeout_s))
        settle(self, timeout_s)  # also drains the native probes: their records make summaries
        self._sink_thread.flush(max(0.0, deadline - time.monotonic()))

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> int:
        """Delivers every measured step to the sinks and the records, then closes the sinks.

        In order, within about `timeout_s` seconds in all (default 10): releases
        any pacing sleep and makes later sleeps zero; waits for the steps this
        process dispatched and drains the probes, so `records()` and the sinks
        see every finished step; lets the sink thread deliver what is queued;
        calls each sink's `close()` (final file writes); stops the stall
        watchdog. Interpreter exit, an exception that ends the program and
        SIGTERM run the same close (docs/guarantees.md).

        Never blocks past the bound, even when a step never finishes or a sink
        never returns: steps still in flight then are counted (the return
        value, also `in_flight_at_close`) and logged; summaries left
        undelivered are counted in `sink_dropped` and logged. A second call
        returns at once.

        Returns:
          The number of measured steps (summed over this process's ranks) that
          had not finished when the bound ran out; 0 normally.
        """
        with self._lock:
            first = not self._closed
            self._closed = True
        if not first:
            return self.in_flight_at_close
        deadline = time.monotonic() + max(0.0, float(timeout_s))
        self._stop.set()
        if self._sites:
            self.in_flight_at_close = sum(settle(self, timeout_s).values())
        self._sink_thread.close(max(0.0, deadline - time.monotonic()))
        self._watchdog.stop(min(1.0, max(0.0, deadline - time.monotonic())))
        return self.in_flight_at_close

    def release(self) -> None:
        """Ends any pacing sleep in progress (SIGTERM does this too)."""
        self._stop.set()

    # ------------------------------------------------------------------ results

    def stats(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, SiteStats]:
        """Per-site summary of this process's measurements and pacing.

        JAX runs steps asynchronously: this first waits, at most `timeout_s`, for
        the steps this process dispatched (as `records()` and `export()` do), so
        right after a training loop it covers every step. Steps still unfinished
        then are counted in `SiteStats.in_flight` and logged.

        Returns:
          `{site: SiteStats}`; see `SiteStats` for the fields. A site is named
          `file.py:LINE:function` of the call unless `site=` names it.
        """
        in_flight = settle(self, timeout_s)
        out: dict[str, SiteStats] = {}
        for name, reason in sorted(self._unmeasured.items()):
            out[name] = SiteStats(site=name, measured=False, unmeasured_reason=reason, ranks=[])
        for name, site in sorted(self._sites.items()):
            out[name] = site_stats(site, self._policy)
            out[name].in_flight = in_flight.get(name, 0)
        return out

    def records(self) -> list[dict[str, Any]]:
        """This process's finished records as dicts (the JSONL format, docs/records.md)."""
        return _export.records(self)

    def export(
        self,
        path: str | os.PathLike,
        *,
        header_extra: dict[str, Any] | None = None,
        format: str | None = None,
    ) -> str:
        """Writes this process's records (docs/records.md) and returns the path.

        The format is Parquet (the native format), or JSONL with `format="jsonl"` or a
        path ending in `.jsonl`. If `path` is a directory, or ends in "/" (a new
        directory, created), writes `records-p{process_index}.parquet` (`.jsonl`) in it. Missing parent
        directories are created. The write is atomic (unique temporary file,
        then one rename; concurrent exports: the last wins). Only a regular
        file or a new path is replaced: a symlink, device node, FIFO, socket or
        directory at the file path raises `FileExistsError` /
        `IsADirectoryError` and is left untouched.

        `header_extra` adds JSON fields to the header line, e.g.
        `{"interleaved_phases": 3}` when this process ran 3 pacers' runs
        interleaved step by step (the report then does not take the time from
        one exit of a site to the next as this run's iteration; docs/records.md).
        """
        return _export.export(self, path, header_extra, format)

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
        return _export.gather(self, timeout_s)

    def export_all(
        self, directory: str | os.PathLike, timeout_s: float = 60.0, *, format: str = "parquet"
    ) -> str | None:
        """`gather` to process 0 and write `records-p{i}.parquet` (or, with
        `format="jsonl"`, `.jsonl`) for every process there.

        Use when processes do not share a filesystem. Returns the directory on
        process 0, None elsewhere.
        """
        return _export.export_all(self, directory, timeout_s, format)

    def write_trace(self, path: str | os.PathLike) -> str:
        """Writes a Perfetto / Chrome trace JSON of this process's records."""
        from jaxpace.records.perfetto import write_trace

        write_trace(self.records(), os.fspath(path))
        return os.fspath(path)


# ---------------------------------------------------------------------- the default pacer

_DEFAULT: Pacer | None = None
_DEFAULT_LOCK = threading.Lock()


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
        `clock`, `sinks`, `mesh`, `rank_groups`, `stall_after_s`, `on_stall`,
        `run_dir` (checked as by `Pacer(...)`).

    Returns:
      The default pacer.

    Raises:
      TracedConfigChangeError: the default pacer already traced a collective.
      ConfigError: a value is invalid (nothing is changed then).
    """
    p = default_pacer()
    p.configure(policy=policy, **settings)
    return p
