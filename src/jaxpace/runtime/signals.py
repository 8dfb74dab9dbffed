"""Nothing lost at shutdown: the one owner of jaxpace's SIGTERM handler and `atexit` hook.

No other module of the library installs a SIGTERM handler or registers an
`atexit` hook (the launcher, `jaxpace.launch`, is a separate parent process
and keeps its own); `tests/test_architecture.py` checks it. The pacing sleeps
(`jaxpace.runtime.delay`), the pacers' sinks and the stall watchdogs all go
through here, so one signal runs one sequence, in this order: release the
pacing sleeps, deliver what was measured to the sinks, close.

- interpreter exit (a normal end, `sys.exit`, or an exception that ends the
  training loop): one `atexit` hook stops the stall watchdogs (their key-value
  calls must be over before Python finalizes), closes every pacer that traced a
  collective, then closes the SIGTERM wake-up watcher. It is registered at the
  first trace, after `import jax` registered JAX's own shutdown (which also
  shuts `jax.distributed` down), so it runs before it (atexit runs
  last-registered first).
- SIGTERM: a handler, installed at the first trace of a pacer that can sleep or
  has sinks, from the main thread. It releases pacing sleeps, then:
  - when the program has its own SIGTERM handler (a Python one installed before
    jaxpace's, or a native one such as the preemption notifier that
    `jax.distributed.initialize()` installs and `signal.getsignal` cannot see),
    it delivers what is pending without closing (the program goes on: it may
    keep training, or save a preemption checkpoint) and then calls that
    handler, once;
  - otherwise it closes every pacer, and the default action then kills the
    process, as it would have.
  A SIGTERM handler in place is left alone when it ignores the signal
  (`SIG_IGN`), or when it is a native one that takes `SA_SIGINFO` arguments
  (jaxpace cannot call it faithfully): jaxpace then delivers at exit only, as
  it does when native code installs a handler after jaxpace's (replacing it).
  Observed on jax 0.10.2 (CPU, 2 processes): after `jax.distributed.initialize()`
  `signal.getsignal(SIGTERM)` is `SIG_DFL` while `sigaction` shows XLA's
  handler; chained to, it logs "SIGTERM caught", the process lives on and both
  processes reach the same `reached_preemption_sync_point`.
  Python runs the handler on the main thread; on jax 0.10.2 (CPU) it also ran
  while the main thread waited in `np.asarray` for a computation that never
  ends: `close` then waits its bound and delivers every finished step.
  While the main thread is blocked in a compiled computation that may be
  waiting on a pacing sleep, the delay stage's watcher thread (woken through
  the signal wake-up fd) releases the sleeps at once. When a Python handler
  installed after jaxpace's replaced it, that thread also delivers what is
  pending (the program's handler runs, once, as Python calls it).

Process-wide state: weak sets of traced pacers and of running watchdogs, the
handler chained to, and once-only flags.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import signal
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from jaxpace.runtime import delay

__all__ = ["close_all", "ensure_sigterm", "register", "stop_at_exit"]

log = logging.getLogger("jaxpace")

_PACERS: weakref.WeakSet = weakref.WeakSet()
_WATCHDOGS: weakref.WeakSet = weakref.WeakSet()  # objects with `stop_at_exit()`
_LOCK = threading.Lock()
_DELIVERING = threading.Lock()  # held by the watcher thread's delivery, and by the exit hook
WATCHER_DELIVERY_WAIT_S = 15.0  # at exit, the most it waits for the watcher's delivery
_atexit_registered = False
_sigterm_tried = False
_close_watcher: Callable[[], None] | None = None
_handler: Callable | None = None  # jaxpace's SIGTERM handler, once installed
_prev: Callable | None = None  # the program's own handler it chains to (None: the default)


# ------------------------------------------------------------------ interpreter exit


def register(pacer: Any) -> None:
    """Closes `pacer` at interpreter exit (weakly held; call at its first trace)."""
    with _LOCK:
        _PACERS.add(pacer)
        _register_atexit()


def stop_at_exit(watchdog: Any) -> None:
    """Calls `watchdog.stop_at_exit()` at interpreter exit, before the pacers close (weakly held)."""
    with _LOCK:
        _WATCHDOGS.add(watchdog)
        _register_atexit()


def _register_atexit() -> None:  # with _LOCK held
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(_at_exit)
        _atexit_registered = True


def _at_exit() -> None:
    # A delivery the watcher thread started ends first (bounded), and none starts after:
    # a daemon thread inside a jaxlib call when Python finalizes aborts the process.
    _DELIVERING.acquire(timeout=WATCHER_DELIVERY_WAIT_S)
    for w in list(_WATCHDOGS):
        try:
            w.stop_at_exit()
        except Exception:  # noqa: BLE001 - never fail an exit
            pass
    close_all()
    closer = _close_watcher
    if closer is not None:
        try:
            closer()
        except Exception:  # noqa: BLE001
            pass


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


# ------------------------------------------------------------------ SIGTERM


def ensure_sigterm() -> bool:
    """Installs the SIGTERM handler and the sleep-release watcher (once, main thread only).

    Called at the first trace of a pacer that can sleep or has sinks, never by a
    constructor.

    Returns:
      Whether the attempt was made (False from another thread: a later call from
      the main thread makes it).
    """
    global _sigterm_tried
    if _sigterm_tried:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    with _LOCK:
        if _sigterm_tried:
            return True
        _sigterm_tried = True
        try:
            _install()
        except (ValueError, OSError):  # not the main interpreter, or no signals here
            pass
    return True


def _install() -> None:  # with _LOCK held
    global _handler, _prev, _close_watcher
    native = _native_handler()  # what the kernel will run now: (address, flags), or None
    if native is not None and native[0] == int(signal.SIG_IGN):
        return
    if native is None and signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        return
    if native is not None and native[0] != int(signal.SIG_DFL) and native[1] & _SA_SIGINFO:
        log.info("jaxpace: a native SIGTERM handler takes siginfo; jaxpace delivers at exit only")
        return
    py_now = signal.getsignal(signal.SIGTERM)
    foreign = native is not None and native[0] != int(signal.SIG_DFL)
    # Known before the swap, so a SIGTERM arriving during it is chained right.
    if foreign and not callable(py_now):
        # A native handler Python did not install (jax.distributed's preemption
        # notifier): signal.getsignal reports it as SIG_DFL.
        _prev = _NativeHandler(native[0])
    elif callable(py_now):
        _prev = py_now
    signal.signal(signal.SIGTERM, _on_sigterm)
    _handler = _on_sigterm
    ours = _native_handler()  # Python's own C-level handler
    if foreign and callable(py_now) and ours is not None and native[0] != ours[0]:
        # A native handler installed after the program's Python one: only it ran.
        _prev = _NativeHandler(native[0])
    _register_atexit()  # ensure_sigterm holds _LOCK
    _close_watcher = delay.start_release_watcher(_on_wakeup)


def _on_sigterm(signum: int, frame: Any) -> None:
    delay.release_all()
    prev = _prev
    if prev is not None:
        _flush_all()  # the program handles SIGTERM itself and may go on
        prev(signum, frame)
        return
    close_all()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _on_wakeup() -> None:
    """The watcher thread saw SIGTERM (after releasing the sleeps)."""
    if _handler is not None and signal.getsignal(signal.SIGTERM) is not _handler:
        # A Python handler installed after jaxpace's runs instead of it: deliver from here.
        with _DELIVERING:
            _flush_all()


# ------------------------------------------------------------------ native handlers

_SA_SIGINFO = 4  # Linux, every architecture


class _SigAction(ctypes.Structure):
    """glibc's `struct sigaction` on Linux (x86_64, aarch64)."""

    _fields_ = [
        ("handler", ctypes.c_void_p),
        ("mask", ctypes.c_ulong * (1024 // (8 * ctypes.sizeof(ctypes.c_ulong)))),
        ("flags", ctypes.c_int),
        ("restorer", ctypes.c_void_p),
    ]


def _native_handler() -> tuple[int, int] | None:
    """The SIGTERM handler the kernel runs now, as `(address, sa_flags)`; None where unknown.

    `signal.getsignal` reports only what Python installed: a handler installed by
    native code (XLA's preemption notifier) shows as `SIG_DFL` there.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        act = _SigAction()
        if libc.sigaction(int(signal.SIGTERM), None, ctypes.byref(act)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return int(act.handler or 0), int(act.flags)


class _NativeHandler:
    """Calls a native `void handler(int)` (installed without `SA_SIGINFO`) from Python."""

    def __init__(self, address: int) -> None:
        self.address = address
        self._fn = ctypes.CFUNCTYPE(None, ctypes.c_int)(address)

    def __call__(self, signum: int, frame: Any) -> None:
        self._fn(int(signum))

    def __repr__(self) -> str:
        return f"<native SIGTERM handler at {self.address:#x}>"
