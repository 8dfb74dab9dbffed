"""A `Pacer(clock=...)` that makes ranks late by design, with no sleep and no wall clock.

Use it as the pacer's clock and its `hook` as the pacer's fault hook (the runtime calls the
hook with `("pre", site, rank, step)` just before it reads a rank's arrival time, in the
same thread). A rank's arrival at step `k` then reads `k * step_ns + late_ns(rank, k)`; a
done reading reads `k * step_ns + done_ns` (defaults `STEP_NS`, `DONE_NS`), with `k` the step every rank has reached (a done
reading comes after every rank arrived at its step and before its reader arrives at the
next), so each rank's wait is `DONE_NS - late_ns(rank, k)`, whatever the machine's load.
"""

from __future__ import annotations

import threading

STEP_NS = 10**9
DONE_NS = 5 * 10**8


class StepClock:
    def __init__(self, late_ns, *, step_ns: int = STEP_NS, done_ns: int = DONE_NS):
        self.late_ns = late_ns
        self.step_ns, self.done_ns = step_ns, done_ns
        self._local = threading.local()
        self._latest: dict[int, int] = {}
        self._lock = threading.Lock()

    def hook(self, where, site, rank, step):
        if where == "pre":
            self._local.arrival = (rank, step)

    def __call__(self) -> int:
        pending = getattr(self._local, "arrival", None)
        with self._lock:
            if pending is not None:  # the arrival the hook just announced
                self._local.arrival = None
                rank, step = pending
                self._latest[rank] = step
                return step * self.step_ns + int(self.late_ns(rank, step))
            return min(self._latest.values()) * self.step_ns + self.done_ns


def jitter_ns(rank: int, step: int, scale_ns: int = 10**6) -> int:
    """Deterministic per-(rank, step) noise in `[0, scale_ns)` (a step's ordinary spread)."""
    return (rank * 7919 + step * 104729) % 1009 * scale_ns // 1009
