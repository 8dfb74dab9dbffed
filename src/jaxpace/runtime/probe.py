"""The probe stage on the host: the clock, per-(site, rank) ring buffers of timings."""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any, Protocol

import numpy as np

# `execution` of a record whose program execution is unknown (the io_callback probes): XLA's
# run ids take any int64 value but this one in practice (JAX derives them from a 32-bit
# launch id).
from jaxpace.records.format import NO_EXECUTION

__all__ = ["NO_EXECUTION", "Clock", "RECORD_DTYPE", "RateLimitedLog", "Recorder", "Sink", "now_ns"]

log = logging.getLogger("jaxpace")


class Clock(Protocol):
    def __call__(self) -> int:
        """Returns a monotonic time in integer nanoseconds.

        Only differences of two readings on one process are meaningful; the
        default is `time.perf_counter_ns`. Tests inject fakes; readings that go
        backwards are sanitized by the caller, never trusted.
        """


class Sink(Protocol):
    def __call__(self, summary: dict[str, Any]) -> None:
        """Receives one per-step summary dict (site, step, rank, wait_s, delay_s, ...).

        Called from a background thread, never from inside a JAX callback; an
        exception is caught, counted and logged (rate-limited).
        """


RECORD_DTYPE = np.dtype(
    [
        ("step", np.int64),
        ("arrive_ns", np.int64),
        ("done_ns", np.int64),
        ("delay_ns", np.int64),
        ("engaged", np.bool_),
        ("execution", np.int64),
    ]
)


class Recorder:
    """Fixed-size ring buffer of one (site, rank)'s timings; memory never grows.

    Slot `step % capacity` holds step `step`; `done_ns == -1` marks a slot whose
    collective has not finished (or was not sampled).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = int(capacity)
        self._buf = np.zeros(self.capacity, dtype=RECORD_DTYPE)
        self._buf["step"] = -1
        self._buf["done_ns"] = -1
        self._buf["execution"] = NO_EXECUTION

    def arrive(
        self, step: int, arrive_ns: int, delay_ns: int, execution: int = NO_EXECUTION
    ) -> None:
        """Opens `step`; `execution`: XLA's run id of the program execution it ran in
        (the native probes know it; `NO_EXECUTION` when unknown)."""
        row = self._buf[step % self.capacity]
        row["step"] = step
        row["arrive_ns"] = arrive_ns
        row["done_ns"] = -1
        row["delay_ns"] = delay_ns
        row["engaged"] = False
        row["execution"] = execution

    def done(self, step: int, done_ns: int, engaged: bool) -> tuple[int, int] | None:
        """Marks `step` finished; returns `(wait_ns, delay_ns)`, or None if unknown."""
        row = self._buf[step % self.capacity]
        if int(row["step"]) != step:
            return None
        wait = done_ns - int(row["arrive_ns"])
        if wait < 0:  # a clock that went backwards: drop the record, trust nothing
            row["step"] = -1
            return None
        row["done_ns"] = done_ns
        row["engaged"] = engaged
        return wait, int(row["delay_ns"])

    def completed(self) -> np.ndarray:
        """Returns the finished rows, ordered by step."""
        rows = self._buf[(self._buf["step"] >= 0) & (self._buf["done_ns"] >= 0)]
        return np.sort(rows, order="step")


_CLOCK_MAX_NS = 2**62


def now_ns(clock: Clock) -> int | None:
    """One clock reading in integer ns, or None when it is unusable.

    NaN, inf, negative, absurdly large or non-numeric readings (and a raising
    clock) give None: the step is then simply not timed, never a delay.

    >>> now_ns(lambda: 12.9), now_ns(lambda: float("nan")), now_ns(lambda: -1)
    (12, None, None)
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


class RateLimitedLog:
    """Logs at most one message per `interval_s` per key, counting the rest."""

    def __init__(self, interval_s: float = 30.0) -> None:
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def warning(self, key: str, msg: str, *args: Any) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval_s:
                return
            self._last[key] = now
        log.warning(msg, *args)
