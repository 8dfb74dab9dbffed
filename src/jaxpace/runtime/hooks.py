"""The runtime side of a measured collective: trace-time hooks and the two callback bodies.

`jaxpace.collectives.measure` talks to the runtime only through the `Runtime` protocol
(`jaxpace.collectives.measure.Runtime`); `Hooks` is the `Pacer`'s implementation, and
reads the `Pacer` only through its internal interface (`Pacer.sites`, `lock`,
...). The callback bodies (`arrive`, `done`) never raise and never
wait for another rank: they use only the in-band vector already in hand.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from jaxpace import _jax_compat
from jaxpace.collectives import exchange as _exchange
from jaxpace.policy import base as _policy
from jaxpace.runtime import signals
from jaxpace.runtime.delay import clamp_delay, interruptible_sleep
from jaxpace.runtime.probe import NO_EXECUTION, now_ns
from jaxpace.runtime.sites import RankState, Site, SiteNames

if TYPE_CHECKING:
    from jaxpace.runtime.interface import PacerState

__all__ = ["Hooks", "host_callbacks_available"]

log = logging.getLogger("jaxpace")


def host_callbacks_available() -> bool:
    """Whether JAX has a CPU backend to run host callbacks on (checked once per Pacer)."""
    try:
        import jax

        return bool(jax.local_devices(backend="cpu"))
    except Exception:  # noqa: BLE001 - e.g. JAX_PLATFORMS=cuda
        return False


class Hooks:
    """What `jaxpace.collectives.measure` may call on a `Pacer` (the `Runtime` protocol there)."""

    def __init__(self, pacer: PacerState) -> None:
        self._p = pacer
        # The pacer's stop event and sink thread live as long as it does: held here, so
        # the callbacks reach them without a property call.
        self._stop = pacer.stop_event
        self._sinks = pacer.sink_thread
        self._callbacks_ok: bool | None = None
        self.invariant_sites: dict[str, str] = {}  # site -> axis its operand was invariant over
        self._names = SiteNames()  # distinct calls sharing a site name get their own

    # ------------------------------------------------------------------ settings

    @property
    def config(self):
        return self._p.config

    @property
    def policy(self) -> _policy.PacingPolicy:
        return self._p.policy

    @property
    def mesh(self) -> Any:
        return self._p.mesh

    # ------------------------------------------------------------------ trace time

    def begin_trace(self) -> None:
        """Freezes settings and agrees on them across processes (once)."""
        self._p.freeze_and_agree()
        if self._p.policy.max_delay_s > 0:  # SIGTERM releases the sleeps (main thread only)
            signals.ensure_sigterm()

    def callbacks_available(self) -> bool:
        if self._callbacks_ok is None:
            self._callbacks_ok = host_callbacks_available()
            if not self._callbacks_ok:
                log.warning(
                    "jaxpace: JAX has no CPU backend, so host callbacks cannot run; every "
                    "jaxpace collective is the plain jax.lax one (unmeasured). Add `cpu` to "
                    "JAX_PLATFORMS (e.g. JAX_PLATFORMS=cuda,cpu) to measure."
                )
        return self._callbacks_ok

    def note_unmeasured(self, site: str, reason: str) -> None:
        self._p.note_unmeasured(site, reason)

    def note_invariant(self, site: str, axis: str) -> None:
        """Trace time: the operand at `site` was already reduced over `axis` (docs/records.md)."""
        with self._p.lock:
            self.invariant_sites[site] = axis

    def open_site(self, name: str, num_slots: int, layout: str | None) -> Site:
        from jaxpace.collectives.measure import caller_site

        p = self._p
        with p.lock:
            name, dup = self._names.resolve(name, caller_site(), _jax_compat.current_trace())
            if dup:
                log.warning(dup)
            s = p.sites.get(name)
            if s is None or s.num_slots != num_slots:
                s = Site(name, num_slots, p.config.capacity, p.policy, layout)
                p.add_site(name, s)
                if num_slots == 1 and p.config.granularity == "process":
                    log.warning(
                        "jaxpace: %s has one rank (one process, granularity='process'): "
                        "there is no other rank to compare, so the report cannot name a "
                        "straggler. Use jp.Pacer(granularity='device') (or "
                        "jp.configure(granularity='device')) to time each device, or run "
                        "several processes (jaxpace launch -n N).",
                        name,
                    )
            s.layout = layout
            return s

    # ------------------------------------------------------------------ callbacks (host)

    def arrive(self, site: Site, rank: int) -> tuple[np.ndarray, np.int32]:
        """Pre-collective callback body: record arrival, sleep the pending delay.

        Returns `(payload, step_tag)`: the exchange payload (empty without exchange)
        and `1 + step` when this step is sampled, else 0. Never raises: any
        error gives "no delay" and an all-zero payload.
        """
        p = self._p
        n = site.num_slots
        # A measure-only site (a collective the exchange cannot ride) carries no payload.
        exchange = p.policy.needs_exchange and not site.measure_only
        payload = np.zeros(_exchange.payload_size(n) if exchange else 0, dtype=np.float32)
        try:
            t = now_ns(p.clock)
            st = site.rank(rank)
            with st.lock:
                step = st.next_step
                st.next_step += 1
                sampled = step % p.config.sample_every == 0 and t is not None
                if exchange and sampled:
                    _exchange.encode(payload, n, rank, st.prev_wait_s, st.prev_step_s)
                delay_s = st.pending_delay_s
                st.pending_delay_s = 0.0
                if sampled:
                    if st.open_step is not None:
                        self._warn_overlap(site, rank)
                    st.open_step = step
            delay_s = clamp_delay(delay_s, p.policy.max_delay_s)
            slept = interruptible_sleep(delay_s, self._stop)
            if sampled:
                with st.lock:
                    st.recorder.arrive(step, t, int(slept * 1e9))
                    st.last_arrive_ns = t
                    st.wd_in = step  # for the stall watchdog: after the pacing sleep
            return payload, np.int32((step + 1) if sampled else 0)
        except Exception as e:  # noqa: BLE001 - callbacks must never raise
            self.count_error(site, "pre", e)
            return np.zeros_like(payload), np.int32(0)

    def no_arrival(self, site: Site) -> tuple[np.ndarray, np.int32]:
        """What `arrive` returns when it fails: an all-zero payload, no step (no delay)."""
        exchange = self._p.policy.needs_exchange and not site.measure_only
        n = _exchange.payload_size(site.num_slots) if exchange else 0
        return np.zeros(n, dtype=np.float32), np.int32(0)

    def _warn_overlap(self, site: Site, rank: int) -> None:
        # Two arrivals before one exit: two shards of this process measure this
        # collective, or one site name is traced twice.
        self._p.errlog.warning(
            f"{site.name}:overlap",
            "jaxpace: two measured arrivals at %s overlap on %s; "
            "pass the mesh as `Pacer(mesh=...)` (or use `jax.set_mesh`).",
            site.name,
            f"rank {rank}" if rank >= 0 else "one device of this process",
        )

    def done(
        self, site: Site, rank: int, step_tag: int, reduced: np.ndarray | None, scale: float
    ) -> None:
        """Post-collective callback body: close the record, run the policy."""
        p = self._p
        try:
            t = now_ns(p.clock)
            if step_tag <= 0:
                return
            st = site.rank(rank)
            if t is None:
                with st.lock:  # untimed: pace nothing from it
                    st.prev_wait_s = math.nan
                    st.prev_step_s = math.nan
                    st.pending_delay_s = 0.0
                return
            step = int(step_tag) - 1
            self._finish(site, st, rank, step, t, reduced, scale)
        except Exception as e:  # noqa: BLE001 - callbacks must never raise
            self.count_error(site, "post", e)

    def _finish(
        self,
        site: Site,
        st: RankState,
        rank: int,
        step: int,
        t: int,
        reduced: np.ndarray | None,
        scale: float,
    ) -> None:
        """Closes `step` at `t` and runs the policy (both probe paths)."""
        early = None  # the exchanged earliness, for sinks
        step_time = math.nan  # the exchanged median step time, for sinks
        with st.lock:
            wait_ns, delay_ns = self._close_record(st, step, t)
            st.wd_out = step  # for the stall watchdog: left the collective
            if site.measure_only:
                pass  # all_gather, ppermute, ...: recorded, never paced
            elif reduced is None:
                # No exchange: only this rank's own view (fixed / measure-only).
                self._decide(site, st, rank, np.full(site.num_slots, np.nan), st.prev_step_s, step)
            else:
                view = site.memo.decode(reduced, scale)
                if view is not None:
                    status = self._decide(site, st, rank, view.earliness_s, view.step_time_s, step)
                    self._note_backoff(site, st, status)
                    site.observe(st, step, view)  # stats(): windows, arrived-last counts
                    early, step_time = view.earliness_s, view.step_time_s
        if self._sinks.sinks:
            self._sinks.emit(
                {
                    "site": site.name,
                    "step": step,
                    "rank": rank,
                    "wait_s": (wait_ns or 0) / 1e9,
                    "delay_s": delay_ns / 1e9,
                    "engaged": st.engaged,
                    "earliness_s": None if early is None else early.tolist(),
                    "step_time_s": step_time,
                }
            )

    # ------------------------------------------------------------------ native probes

    def native_blocker(self) -> str | None:
        """Why this pacer needs the Python (io_callback) probes, or None."""
        p = self._p
        if p.clock is not time.perf_counter_ns:
            return "a custom Pacer(clock=...) is set (the native probes use the steady clock)"
        return None

    @property
    def stop_event(self):
        """Set when the pacer stops (close/release/SIGTERM): native sleeps end too."""
        return self._stop

    def native_record(
        self,
        site: Site,
        rank: int,
        step: int,
        arrive_ns: int,
        done_ns: int,
        delay_ns: int,
        reduced: np.ndarray | None,
        scale: float,
        *,
        execution: int | None = None,
    ) -> float:
        """One record finished by the native probes (drained off the hot path).

        Same bookkeeping and policy step as `done`; returns the delay (s) that the
        rank's next arrival sleeps. `execution`: XLA's run id of the program execution
        the record ran in (the records' `execution` column; None: unknown). Never raises
        (an error gives no delay).
        """
        try:
            st = site.rank(rank)
            ex = NO_EXECUTION if execution is None else int(execution)
            with st.lock:
                st.next_step = max(st.next_step, step + 1)
                st.recorder.arrive(step, arrive_ns, delay_ns, ex)
                st.last_arrive_ns = arrive_ns
            self._finish(site, st, rank, step, done_ns, reduced, scale)
            with st.lock:
                delay_s, st.pending_delay_s = st.pending_delay_s, 0.0
            return delay_s
        except Exception as e:  # noqa: BLE001 - the drain thread must never raise
            self.count_error(site, "post", e)
            return 0.0

    @staticmethod
    def _close_record(st: RankState, step: int, t: int) -> tuple[int | None, int]:
        """Marks `step` done at `t`; updates the rank's previous wait/step (lock held)."""
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
        return wait_ns, delay_ns

    def _decide(
        self,
        site: Site,
        st: RankState,
        rank: int,
        earliness: np.ndarray,
        step_time_s: float,
        step: int,
    ) -> _policy.PolicyStatus:
        """Runs the policy on one observation and stores this rank's next delay (lock held).

        The ranks of one process see the same exchanged observation each step; those whose
        policy state is the same object take the update another rank already ran on it
        (`SiteMemo.update`: policies are pure, so it is the update they would run).
        """
        policy = self._p.policy
        delays, st.policy_state, status = site.memo.update(
            policy, st.policy_state, earliness, step_time_s, step
        )
        st.pending_delay_s = clamp_delay(
            delays[rank] if rank < len(delays) else 0.0, policy.max_delay_s
        )
        st.engaged = bool(status.engaged)
        ab = status.ab_effect
        st.can_pace = st.engaged and not (ab is not None and bool(ab.get("rejected")))
        return status

    def native_wants_wake(self, site: Site) -> bool:
        """Whether the drain thread should react to each record of `site` at once: its policy
        may delay now. A policy on the default status (`fixed`, custom ones) always may."""
        if self._p.policy.status is _policy.idle_status:
            return True
        return any(st.can_pace for st in list(site.ranks.values()))

    def _note_backoff(self, site: Site, st: RankState, status: _policy.PolicyStatus) -> None:
        """Logs (once per episode) that the policy refused to chase a skew."""
        policy = self._p.policy
        if status.backed_off and not st.backed_off:
            log.warning(
                "jaxpace: at %s the arrival spread (%.3f s) is far beyond max_delay_s=%g; "
                "pacing backs off instead of chasing it. Fix the straggler at its source "
                "(see `jaxpace report`).",
                site.name,
                float(status.spread_s),
                policy.max_delay_s,
            )
        st.backed_off = bool(status.backed_off)

    def count_error(self, site: Site, where: str, e: Exception) -> None:
        """Counts an error a callback body caught at `site` and logs it (rate-limited)."""
        try:
            with site.lock:
                site.errors += 1
            self._p.errlog.warning(
                f"{site.name}:{where}",
                "jaxpace: %s-collective callback at %s raised %r; using no delay "
                "(the step and its result are unaffected).",
                where,
                site.name,
                e,
            )
        except Exception:  # noqa: BLE001
            pass
