"""The delay stage: clamp a policy's delay, sleep it interruptibly, release it on SIGTERM.

Process-wide state here is explicit and bounded: a weak set of the stop
events of live pacers (pruned automatically when a pacer is collected) and a
once-only SIGTERM hook, installed by the first pacer that can sleep (at its
first trace, from the tracing thread), never by a constructor.
"""

from __future__ import annotations

import atexit
import math
import os
import signal
import socket
import threading
import weakref
from typing import Any

__all__ = ["clamp_delay", "ensure_sigterm_release", "interruptible_sleep", "register_stop"]

_STOPS: weakref.WeakSet = weakref.WeakSet()
_INSTALL_LOCK = threading.Lock()
_installed = False


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


def ensure_sigterm_release() -> bool:
    """Makes SIGTERM end pacing sleeps promptly, then runs the previous handler (once).

    While the main thread is blocked inside a compiled computation, Python-level
    signal handlers cannot run, and that computation may be waiting on our very
    sleep. So a watcher thread reads the signal wake-up fd (written by the C
    handler at once) and releases the sleeps; the Python handler then chains to
    the previous one. Only the main thread may install signal handlers: from
    another thread this returns False and a later call from the main thread
    installs it.

    Returns:
      Whether the hook is installed.
    """
    global _installed
    if _installed:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    with _INSTALL_LOCK:
        if _installed:
            return True
        _installed = True
        try:
            _install()
        except (ValueError, OSError):
            pass
    return True


def _install() -> None:
    prev = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame):
        release_all()
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
                release_all()

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
