"""Nothing lost at shutdown: every traced pacer is closed at interpreter exit and on SIGTERM.

`Pacer.close()` waits (bounded) for the steps this process dispatched, hands
every finished record to the sinks, then closes the sinks. This module makes
the two shutdowns the user does not write themselves do the same:

- interpreter exit (a normal end, `sys.exit`, or an exception that ends the
  training loop): an `atexit` hook closes every pacer that traced a collective.
  It is registered at the first trace, after `jax.distributed.initialize`
  registered its own shutdown, so it runs before JAX's (atexit runs
  last-registered first).
- SIGTERM: a handler, installed at the first trace from the main thread,
  releases pacing sleeps, closes every pacer (the default action then kills
  the process, as it would have) or, when the program has its own SIGTERM
  handler, delivers what is pending without closing (the program goes on and
  may keep training) and then calls that handler. Python runs the handler on
  the main thread; on jax 0.10.2 (CPU) it also ran while the main thread waited
  in `np.asarray` for a computation that never ends: `close` then waits its
  bound and delivers every finished step.

Process-wide state: a weak set of traced pacers, and two once-only hooks.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import weakref
from typing import Any

from jaxpace.runtime.delay import release_all

__all__ = ["ensure_sigterm_delivery", "register"]

log = logging.getLogger("jaxpace")

_PACERS: weakref.WeakSet = weakref.WeakSet()
_LOCK = threading.Lock()
_atexit_registered = False
_sigterm_installed = False


def register(pacer: Any) -> None:
    """Closes `pacer` at interpreter exit (weakly held; call at its first trace)."""
    global _atexit_registered
    with _LOCK:
        _PACERS.add(pacer)
        if not _atexit_registered:
            atexit.register(close_all)
            _atexit_registered = True


def close_all() -> None:
    """Closes every registered pacer (each bounded by its own `close`); never raises."""
    for p in list(_PACERS):
        try:
            p.close()
        except Exception as e:  # noqa: BLE001 - never fail an exit
            log.warning("jaxpace: closing a pacer at exit raised %r", e)


def _flush_all() -> None:
    for p in list(_PACERS):
        try:
            p.flush()
        except Exception as e:  # noqa: BLE001
            log.warning("jaxpace: flushing a pacer on SIGTERM raised %r", e)


def ensure_sigterm_delivery() -> bool:
    """Installs the SIGTERM handler (once, main thread only; a SIG_IGN is left alone).

    Returns:
      Whether it is installed (False from another thread: a later call from the
      main thread installs it).
    """
    global _sigterm_installed
    if _sigterm_installed:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    with _LOCK:
        if _sigterm_installed:
            return True
        _sigterm_installed = True
        try:
            prev = signal.getsignal(signal.SIGTERM)
            if prev is signal.SIG_IGN:
                return True
            signal.signal(signal.SIGTERM, _handler(prev))
        except (ValueError, OSError):  # not the main interpreter, or no signals here
            pass
    return True


def _handler(prev: Any):
    def on_sigterm(signum, frame):
        release_all()
        if callable(prev):
            _flush_all()  # the program handles SIGTERM itself and may go on
            prev(signum, frame)
            return
        close_all()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    return on_sigterm
