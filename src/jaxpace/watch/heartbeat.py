"""Hang naming: who has not entered the step the others have, and for how long.

Each process publishes how many calls of the watched function it has entered
(and its announced pause, if any) at a bounded rate; the deciding process
keeps, on its own clock (durations only), when it first saw each process at
its current count (less the age the process reports: how long ago it first
saw that count, on its own clock). A process is named when another has entered more calls,
its own count has not moved for `stall_after_s`, it is past its first calls
(compilation), and it is not inside `jaxpace.expected_pause` (or a known host
phase) within its bound. Pure: no store calls, no JAX.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxpace.runtime import pauses

__all__ = ["WARMUP_CALLS", "StallDetector", "stall_message"]

WARMUP_CALLS = 2  # a process still in its first calls (compilation) is never named
MAX_AGE_S = 3600.0  # a published age above this is clamped (untrusted)


class StallDetector:
    """Names processes that stopped entering calls while others went on.

    >>> d = StallDetector(stall_after_s=5.0)
    >>> beats = {0: {"calls": 12}, 1: {"calls": 11}}
    >>> d.observe(beats, now=0.0), d.observe(beats, now=4.0)
    ([], [])
    >>> [s["process"] for s in d.observe(beats, now=6.0)], d.observe(beats, now=9.0)
    ([1], [])
    """

    def __init__(self, stall_after_s: float) -> None:
        self.stall_after_s = float(stall_after_s)
        self._seen: dict[int, tuple[int, float]] = {}  # process -> (calls, first seen at)
        self._named: set[tuple[int, int]] = set()
        self._pauses = pauses.Tracker()

    def observe(self, beats: Mapping[int, Mapping[str, Any] | None], now: float) -> list[dict]:
        """The stalls newly seen at `now` (each named once per process and count)."""
        calls: dict[int, int] = {}
        for p, b in beats.items():
            c = (b or {}).get("calls")
            if isinstance(c, int) and not isinstance(c, bool) and c >= 0:
                calls[p] = c
                if self._seen.get(p, (None,))[0] != c:  # since: now less the age it reports
                    age = (b or {}).get("age_s", 0.0)
                    ok = isinstance(age, int | float) and not isinstance(age, bool)
                    age = min(max(float(age), 0.0), MAX_AGE_S) if ok and age == age else 0.0
                    self._seen[p] = (c, now - age)
        if len(calls) < 2:
            return []
        top = max(calls.values())
        ahead = sorted(p for p, c in calls.items() if c == top)
        out = []
        for p, c in sorted(calls.items()):
            if c >= top or c < WARMUP_CALLS or (p, c) in self._named:
                continue
            age = now - self._seen[p][1]
            if age < self.stall_after_s:
                continue
            peers = {q: dict(b or {}) for q, b in beats.items()}
            if self._pauses.excused([p], peers, now):
                continue
            self._named.add((p, c))
            out.append(
                {
                    "process": p,
                    "host": str((beats.get(p) or {}).get("host", "?")),
                    "last_step": c - 1,
                    "waiting_step": c,
                    "stalled_s": round(age, 3),
                    "ahead": ahead,
                    "overrun": self._pauses.overrun([p], peers, now),
                }
            )
        return out


def stall_message(s: Mapping[str, Any]) -> str:
    """One line naming a stalled process.

    >>> stall_message({"process": 2, "host": "h2", "last_step": 11, "waiting_step": 12,
    ...     "stalled_s": 6.2, "ahead": [0, 1, 3], "overrun": ""})
    'jaxpace watch: stall: process 2 (host h2) has not entered step 12 for 6.2 s (last step seen 11) while processes 0,1,3 have'
    """
    ahead = ",".join(map(str, s["ahead"]))
    over = f"; {s['overrun']}" if s.get("overrun") else ""
    return (
        f"jaxpace watch: stall: process {s['process']} (host {s['host']}) has not entered "
        f"step {s['waiting_step']} for {s['stalled_s']:.1f} s (last step seen "
        f"{s['last_step']}) while processes {ahead} have{over}"
    )
