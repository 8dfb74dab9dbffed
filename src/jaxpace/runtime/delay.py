"""The delay stage: clamp a policy's delay, sleep it interruptibly, release it on SIGTERM.

Process-wide state here is explicit and bounded: a weak set of the stop
events of live pacers (pruned automatically when a pacer is collected). This
module installs no signal handler and no `atexit` hook: `jaxpace.runtime.signals`
owns both, calls `release_all` first on SIGTERM, and starts the wake-up fd
watcher here (`start_release_watcher`) at the first trace of a pacer that can
sleep or has sinks, never from a constructor.
"""

from __future__ import annotations

import math
import signal
import socket
import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = [
    "clamp_delay",
    "interruptible_sleep",
    "register_stop",
    "release_all",
    "start_release_watcher",
]

_STOPS: weakref.WeakSet = weakref.WeakSet()


def clamp_delay(delay_s: Any, max_delay_s: float) -> float:
    """`delay_s` clamped to `[0, max_delay_s]`; NaN, inf and non-numbers give 0.

    >>> clamp_delay(float("nan"), 0.25), clamp_delay(9.0, 0.25), clamp_delay(-1, 0.25)
    (0.0, 0.25, 0.0)
    """
    try:
        d = float(delay_s)
    except (TypeError, ValueError):
        return 0.0
    if not math.isfinite(d):
        return 0.0
    return min(max(d, 0.0), float(max_delay_s))


def interruptible_sleep(delay_s: float, stop: threading.Event) -> float:
    """Sleeps up to `delay_s` seconds, returning early when `stop` is set.

    NaN, inf and negative delays sleep zero (`time.sleep(nan)` would raise).
    `Event.wait` releases the GIL, so other callbacks keep running.

    Returns:
      The delay actually requested after sanitizing, in seconds.
    """
    if not isinstance(delay_s, (int, float)) or not math.isfinite(delay_s) or delay_s <= 0:
        return 0.0
    if stop.is_set():
        return 0.0
    stop.wait(delay_s)
    return float(delay_s)


def register_stop(stop: threading.Event) -> None:
    """Adds a pacer's stop event to those SIGTERM sets (weakly held)."""
    _STOPS.add(stop)


def release_all() -> None:
    """Sets every live pacer's stop event: ends their sleeps now."""
    for ev in list(_STOPS):
        ev.set()


def start_release_watcher(on_sigterm: Callable[[], None]) -> Callable[[], None] | None:
    """Starts the thread that releases every sleep as soon as SIGTERM arrives.

    While the main thread is blocked inside a compiled computation, Python-level
    signal handlers cannot run, and that computation may be waiting on our very
    sleep. So a watcher thread reads the signal wake-up fd (written by Python's
    C-level handler at once, whichever Python handler is installed) and releases
    the sleeps, then calls `on_sigterm` on that thread. `jaxpace.runtime.signals`
    starts it (once, from the main thread, with its SIGTERM handler) and calls
    the returned function at exit; this module installs no handler.

    Returns:
      The function that stops watching (restoring the wake-up fd), or None when
      someone else (e.g. asyncio) owns the wake-up fd: it is left to them.
    """
    r, w = socket.socketpair()
    r.setblocking(True)
    w.setblocking(False)
    old_fd = signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
    if old_fd != -1:
        # Someone (e.g. asyncio) owns the wake-up fd: give it back.
        signal.set_wakeup_fd(old_fd)
        r.close()
        w.close()
        return None

    def watch() -> None:
        while True:
            try:
                data = r.recv(64)
            except OSError:
                return
            if not data:
                return
            if signal.SIGTERM in data:
                release_all()
                try:
                    on_sigterm()
                except Exception:  # noqa: BLE001 - the watcher must keep watching
                    pass

    def close() -> None:
        try:
            prev_fd = signal.set_wakeup_fd(-1)
            if prev_fd not in (-1, w.fileno()):
                signal.set_wakeup_fd(prev_fd)  # someone else's since: leave it
        except (ValueError, OSError):
            pass
        w.close()
        r.close()

    threading.Thread(target=watch, name="jaxpace-sigterm", daemon=True).start()
    return close
