"""Legitimate host pauses: the stall watchdog does not name a process that is checkpointing.

A process saving a checkpoint, evaluating or recompiling is absent from the
next collective while the others already wait in it. Two ways tell the
watchdog that such an absence is expected:

- an announced pause, `with jaxpace.expected_pause("checkpoint", max_s=120):`
  around the work: while it lasts (and at most `max_s`), the peers' watchdogs
  do not declare a stall that only waits for this process;
- a known host phase, seen without an announcement: the watchdog thread looks
  at the main thread's Python stack (at most once per publish, about once per
  second) and recognizes an Orbax checkpoint save/restore or a JAX compilation
  in progress; these excuse the process for at most `HOST_PHASE_MAX_S`.

A stall is still declared when a missing process is in no pause, or has been
in its pause longer than its bound. Process-wide state: the stack of active
announced pauses (a pause is about the process, whichever pacer runs).
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from jaxpace.errors import ConfigError

__all__ = ["HOST_PHASE_MAX_S", "Tracker", "current", "expected_pause"]

HOST_PHASE_MAX_S = 900.0  # an unannounced known host phase excuses at most this long
MAX_PAUSE_S = 7 * 86400.0
# (phase name, a piece of a frame's file path that shows it)
_HOST_PHASES = (
    ("checkpoint (orbax)", "/orbax/checkpoint/"),
    ("compile (jax)", "/jax/_src/compiler.py"),
)

_LOCK = threading.Lock()
_ACTIVE: list[tuple[str, float, float, int]] = []  # (name, max_s, started monotonic, id)
_COUNTER = [0]


@contextlib.contextmanager
def expected_pause(name: str, *, max_s: float) -> Iterator[None]:
    """Announces that this process may be absent from collectives for up to `max_s` seconds.

    Wrap work that keeps this process away from the next collective while the
    other processes wait in it (a checkpoint save, evaluation, a recompile).
    The stall watchdogs of the other processes then do not declare a stall
    that waits only for this process while the pause lasts; past `max_s` they
    do, and their message says which pause ran over. Pauses nest (the longest
    remaining bound counts). No effect on results, pacing or the traced program.

    Args:
      name: what the pause is, shown in stall messages (e.g. `"checkpoint"`).
      max_s: the longest the pause may last, in seconds, in (0, 604800].

    Raises:
      ConfigError: `name` is not a non-empty string or `max_s` is out of range.

    >>> import jaxpace as jp
    >>> with jp.expected_pause("checkpoint", max_s=120):
    ...     pass  # e.g. checkpoint_manager.save(step, args=...)
    """
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(
            f"`name` must be a non-empty string, got {name!r}. Pass what the pause is, "
            'e.g. `jp.expected_pause("checkpoint", max_s=120)`.'
        )
    if (
        isinstance(max_s, bool)
        or not isinstance(max_s, (int, float))
        or not math.isfinite(max_s)
        or not 0 < max_s <= MAX_PAUSE_S
    ):
        raise ConfigError(
            f"`max_s` must be a number of seconds in (0, {MAX_PAUSE_S:.0f}], got {max_s!r}. "
            "Pass the longest the pause may take, e.g. `max_s=120`."
        )
    with _LOCK:
        _COUNTER[0] += 1
        entry = (name, float(max_s), time.monotonic(), _COUNTER[0])
        _ACTIVE.append(entry)
    try:
        yield
    finally:
        with _LOCK:
            _ACTIVE.remove(entry)


def _host_phase() -> str | None:
    """A known host phase the main thread is in now (from its Python stack), or None."""
    main = threading.main_thread().ident
    frame = sys._current_frames().get(main) if main is not None else None
    depth = 0
    while frame is not None and depth < 200:
        path = frame.f_code.co_filename.replace("\\", "/")
        for phase, marker in _HOST_PHASES:
            if marker in path:
                return phase
        frame = frame.f_back
        depth += 1
    return None


def current(now: float | None = None) -> dict[str, Any] | None:
    """This process's pause for the watchdog's published entry: `{name, max_s, age_s}` or None.

    An announced pause wins (the one with the most time left); else a known
    host phase seen on the main thread's stack now (`announced` False).
    """
    now = time.monotonic() if now is None else now
    with _LOCK:
        active = list(_ACTIVE)
    if active:
        name, max_s, t0, n = max(active, key=lambda p: p[2] + p[1])
        return {
            "name": name,
            "max_s": max_s,
            "age_s": round(now - t0, 3),
            "announced": True,
            "id": f"{name}#{n}",
        }
    try:
        phase = _host_phase()
    except Exception:  # noqa: BLE001 - never break the watchdog
        phase = None
    if phase is None:
        return None
    return {"name": phase, "max_s": HOST_PHASE_MAX_S, "age_s": 0.0, "announced": False, "id": phase}


class Tracker:
    """A watchdog's view of its peers' pauses, timed on its own clock (durations only).

    A peer's entry says how old its pause was when it published; the first
    time this process sees that pause it fixes the pause's end on its own
    clock (`seen - age + max_s`), so a peer frozen inside a pause, whose entry
    is never refreshed, is not excused past its bound.
    """

    def __init__(self) -> None:
        self._ends: dict[tuple[int, str], float] = {}  # (process, pause id) -> end (monotonic)

    def all_excused(self, classified: tuple, peers: dict[int, dict | None], now: float) -> dict:
        """`{process: pause}` when every process this stall waits for is in a pause within its
        bound (nobody diverged), else `{}`. `classified`: the watchdog's (here, missing, diverged).
        """
        _here, missing, diverged = classified
        if not missing or diverged:
            return {}
        who = [p for p, _ in missing]
        got = self.excused(who, peers, now)
        return got if len(got) == len(who) else {}

    def excused(self, missing: list[int], peers: dict[int, dict | None], now: float):
        """`{process: pause}` for the `missing` processes in a pause within its bound."""
        for p, e in peers.items():  # a pause that ended: forget its end (ids of phases repeat)
            pause = (e or {}).get("pause")
            cur = str(pause.get("id", pause.get("name"))) if isinstance(pause, dict) else None
            for key in [k for k in self._ends if k[0] == p and k[1] != cur]:
                del self._ends[key]
        out: dict[int, dict] = {}
        for p in missing:
            pause = (peers.get(p) or {}).get("pause")
            if not isinstance(pause, dict):
                continue
            key = (p, str(pause.get("id", pause.get("name"))))
            end = self._ends.get(key)
            if end is None:
                age = pause.get("age_s") or 0.0
                end = self._ends[key] = now - float(age) + float(pause.get("max_s", 0.0))
            if now < end:
                out[p] = pause
        return out

    def overrun(self, missing: list[int], peers: dict[int, dict | None], now: float) -> str:
        """Text for the stall message: the missing processes whose pause ran over its bound."""
        parts = []
        for p in missing:
            pause = (peers.get(p) or {}).get("pause")
            if not isinstance(pause, dict):
                continue
            end = self._ends.get((p, str(pause.get("id", pause.get("name")))))
            if end is not None and now >= end:
                parts.append(
                    f"process {p} is in {'pause' if pause.get('announced') else 'host phase'} "
                    f"{pause.get('name')!r} beyond its max_s={float(pause.get('max_s', 0)):g}"
                )
        return "; ".join(parts)
