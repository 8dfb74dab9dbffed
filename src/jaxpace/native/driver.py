"""Runs the policy on native records, off the hot path: one background thread per process.

The native handlers push one finished record per (site, rank, step) into their site's ring.
This thread blocks in `wait_records` (without the GIL) until a site whose policy may delay now
pushes something, drains those sites (measure-only ones, and those whose policy is not
engaged, every 50 ms, in batches), hands each
record to its runtime (`Runtime.native_record`: the same bookkeeping and policy step as the
io_callback path's `done`), and stores the resulting
delay natively, where the rank's next arrival sleeps it. `sync()` drains on the caller's thread
(stats, records). When a pacer stops (close/release/SIGTERM) its sites' native sleeps end.

GPU: a measured step's records exist once the drain has read its CUDA events. When the site's
policy may delay now, the step's done probe enqueues a host function after its last copy that
only wakes this thread (no CUDA call in it), so the thread drains as soon as the GPU is there;
otherwise the step waits for the 50 ms timer like any idle site. The 20 ms bound on the wait
is only a backstop.

Lag: the io_callback path decides step k's delay inside step k's post-callback, before step
k+1 can arrive. Here the decision is made when this thread has drained step k; when it has not
yet done so by step k+1's arrival (host load), the delay lands one step later. While a site's
policy reports that it is not engaged (`PolicyStatus.engaged`, or its A/B guard rejected
pacing), its records are drained on the 50 ms timer instead of waking this thread: the
decision that engages it then lands up to 50 ms later, and a disengaged policy costs a
training step what measure-only costs. Policies without a status of their own (`fixed`,
custom ones on the default status) always wake it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxpace.native import probes as nat

__all__ = ["attach", "sync"]

log = logging.getLogger("jaxpace")


@dataclass
class _Entry:
    rt: Any  # the Runtime (Pacer.hooks)
    site: Any  # its host Site
    native_id: int
    payload_len: int
    scale: float
    stop: threading.Event | None
    lock: threading.Lock
    released: bool = False
    bufs: tuple | None = None  # reused drain buffers
    eager: bool = True  # its policy may delay now: drain as soon as records arrive
    can_delay: bool = True  # its policy has a bound > 0 (it may ever delay)
    probe: str = ""  # what stats() says about the path (plus drops, if any)
    lost: tuple = (0, 0, 0, 0, 0)  # dropped, CUDA errors, invalid, disabled, mismatched
    overlaps: int = 0
    fixed_rank: int = -1


_entries: dict[int, _Entry] = {}
_lock = threading.Lock()
_thread: threading.Thread | None = None
_BATCH = 1024  # records per drain call
_LAZY_S = 0.05  # drain period when no attached policy can delay


class _ReleaseNative(threading.Event):
    """A stop event in `jaxpace.runtime.delay`'s SIGTERM set: setting it ends every native sleep at once."""

    def set(self) -> None:
        super().set()
        nat.release_all()


_SIGTERM_EVENT = _ReleaseNative()


def attach(
    rt,
    site,
    *,
    num_slots: int,
    fixed_rank: int,
    sample_every: int,
    payload_len: int,
    scale: float,
    capacity: int,
    max_delay_s: float,
    stop: threading.Event | None,
) -> int:
    """Registers a native site for the host `site` of runtime `rt`; returns its native id.

    A site re-traced with the same layout keeps its id (its step counters continue).

    Raises:
      RuntimeError: the native site table is full (the caller falls back to io_callback).
    """
    key = (num_slots, fixed_rank, sample_every, payload_len)
    prev = getattr(site, "native", None)
    if prev is not None and prev[1] == key:
        return prev[0]
    with _lock:
        sid = nat.allocate_site_id()
        nat.register_site(
            sid,
            num_slots,
            capacity=max(int(capacity), 64),
            fixed_rank=fixed_rank,
            sample_every=sample_every,
            payload_len=payload_len,
        )
        nat.set_site_max_delay(sid, max_delay_s)  # the policy's bound, per site
        _entries[sid] = _Entry(
            rt,
            site,
            sid,
            payload_len,
            float(scale),
            stop,
            threading.Lock(),
            eager=max_delay_s > 0,
            can_delay=max_delay_s > 0,
            fixed_rank=fixed_rank,
        )
        site.native = (sid, key)
        site.flush = lambda: sync(sid)
        if max_delay_s > 0:
            from jaxpace.runtime.delay import register_stop

            register_stop(_SIGTERM_EVENT)  # weakly held; this module keeps it alive
        _start_thread()
    return sid


def _start_thread() -> None:
    global _thread
    if _thread is None or not _thread.is_alive():
        _thread = threading.Thread(target=_loop, name="jaxpace-native-drain", daemon=True)
        _thread.start()


def _loop() -> None:
    seen, lazy_at = 0, 0.0
    while True:
        try:
            entries = list(_entries.values())
            if any(e.eager for e in entries):
                # A policy may set a delay from each record: react within microseconds. Only
                # records of sites that can delay wake this wait (the handlers count them).
                seen = nat.wait_records(seen, 0.02)
            else:
                # Measure only: nothing waits on the records but stats/records/export,
                # which drain on their own thread; batch, keep the host quiet per step.
                time.sleep(_LAZY_S)
            now = time.monotonic()
            lazy_due = now - lazy_at >= _LAZY_S
            if lazy_due:
                lazy_at = now
            for e in entries:
                if e.eager or lazy_due:
                    _drain(e)
        except Exception as ex:  # noqa: BLE001 - the drain thread must survive anything
            log.warning("jaxpace: native drain thread error %r (continuing)", ex)


def _set_eager(e: _Entry, eager: bool) -> None:
    """An idle policy (not engaged) is drained on the timer: its records stop waking the
    thread, and its engagement lands up to `_LAZY_S` later; once engaged, every record wakes
    the thread again."""
    if eager != e.eager:
        e.eager = eager
        nat.set_site_wake(e.native_id, eager)


def sync(native_id: int | None = None) -> None:
    """Drains one site (or all) now, on the calling thread."""
    entries = [_entries[native_id]] if native_id in _entries else list(_entries.values())
    for e in entries:
        _drain(e)


def _drain(e: _Entry) -> None:
    with e.lock:
        if e.stop is not None and e.stop.is_set() and not e.released:
            nat.release_site(e.native_id)
            e.released = True
        if nat.pending(e.native_id) == 0:
            return  # nothing new (one wake drains every eager site: most have nothing)
        if e.bufs is None:
            e.bufs = (
                np.zeros(_BATCH, nat.NATIVE_RECORD_DTYPE),
                np.zeros((_BATCH, e.payload_len), np.float32),
            )
        drained = 0
        while True:
            recs, pays = nat.drain(e.native_id, e.payload_len, out=e.bufs)
            drained += len(recs)
            for i, r in enumerate(recs):
                reduced = pays[i] if e.payload_len > 0 else None
                rank = int(r["rank"])
                delay_s = e.rt.native_record(
                    e.site,
                    rank,
                    int(r["step"]),
                    int(r["arrive_ns"]),
                    int(r["done_ns"]),
                    int(r["delay_ns"]),
                    reduced,
                    e.scale,
                    execution=int(r["run_id"]),
                )
                if delay_s > 0 and not e.released:
                    nat.set_delay(e.native_id, rank, delay_s)
            if len(recs) < _BATCH:
                break
        if drained and e.can_delay:
            _set_eager(e, bool(e.rt.native_wants_wake(e.site)))
        _note_counters(e)


def _note_counters(e: _Entry) -> None:
    """Warns once about overlapping arrivals; puts records lost (ring overrun, CUDA errors, waits
    of another step dropped by the exchange) into what `stats()` says about the probe."""
    c = nat.counters(e.native_id)
    if c["overlaps"] > e.overlaps:
        if e.overlaps == 0:  # the io_callback path's warning, once per site
            log.warning(
                "jaxpace: two measured arrivals at %s overlap on %s; "
                "pass the mesh as `Pacer(mesh=...)` (or use `jax.set_mesh`).",
                e.site.name,
                f"rank {e.fixed_rank}" if e.fixed_rank >= 0 else "one device of this process",
            )
        e.overlaps = c["overlaps"]
    memo = getattr(e.site, "memo", None)
    lost = (
        c["dropped"],
        c["cuda_errors"],
        c["gpu_invalid"],
        c["gpu_disabled"],
        int(getattr(memo, "mismatched", 0)),
    )
    if lost != e.lost:  # never silent: stats() shows what was lost
        e.lost = lost
        base = e.site.probe.split(" [")[0] if e.site.probe else "native"
        e.site.probe = base + "".join(f" [{m}]" for m in _lost_text(*lost))


def _lost_text(dropped, cuda_errors, invalid, disabled, mismatched) -> list[str]:
    out = []
    if dropped:
        out.append(f"{dropped} records dropped: the drain fell behind the ring")
    if cuda_errors:
        out.append(
            f"{cuda_errors} CUDA calls failed, {invalid} steps not recorded"
            + (": CUDA probes disabled after repeated errors" if disabled else "")
        )
    if mismatched:
        out.append(f"{mismatched} exchanged waits of another step dropped")
    return out
