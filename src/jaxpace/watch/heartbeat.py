"""Hang naming: who has not entered the step the others have, and for how long.

Each process publishes how many calls of the watched function it has entered,
how long ago it entered the last one (its own clock), and its announced pause,
at a bounded rate. The deciding process keeps, on its own clock (durations
only), since when others have been ahead of each process: from the moment it
first sees a process with a higher count, less that process's published age.
A process is named when others have been ahead of it, with its own count
unchanged, for `stall_after_s`, it is past its first calls (compilation), and
it is not inside `jaxpace.expected_pause` (or a known host phase) within its
bound, nor inside another call that compiles (`compile_calls`). (Measured from when its own count last changed instead, a process
waiting in a collective for a third one was named the moment a peer moved on
first, before its own heartbeat caught up.) Pure: no store calls, no JAX.
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
        self._seen: dict[int, int] = {}  # process -> calls entered, as last seen
        self._behind: dict[int, float] = {}  # process -> since when others are ahead of it
        self._named: set[tuple[int, int]] = set()
        self._pauses = pauses.Tracker()
        # Calls that compile (besides the first ones): a process inside one is not named
        # (watch: a program with jaxpace drop-ins compiles its measured form at the first
        # window's first call).
        self.compile_calls: frozenset[int] = frozenset()

    def observe(self, beats: Mapping[int, Mapping[str, Any] | None], now: float) -> list[dict]:
        """The stalls newly seen at `now` (each named once per process and count)."""
        calls: dict[int, int] = {}
        ages: dict[int, float] = {}
        for p, b in beats.items():
            c = (b or {}).get("calls")
            if isinstance(c, int) and not isinstance(c, bool) and c >= 0:
                calls[p] = c
                ages[p] = _age((b or {}).get("age_s"))
                if self._seen.get(p) != c:  # it moved: not behind any more (yet)
                    self._seen[p] = c
                    self._behind.pop(p, None)
        if len(calls) < 2:
            return []
        top = max(calls.values())
        out = []
        for p, c in sorted(calls.items()):
            if c >= top:
                self._behind.pop(p, None)
                continue
            ahead = sorted(q for q, cq in calls.items() if cq > c)
            if p not in self._behind:  # since the latest of them entered its current call
                self._behind[p] = now - min(ages[q] for q in ahead)
            if c < WARMUP_CALLS or (c - 1) in self.compile_calls or (p, c) in self._named:
                continue
            stalled_s = now - self._behind[p]
            if stalled_s < self.stall_after_s:
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
                    "stalled_s": round(stalled_s, 3),
                    "ahead": ahead,
                    "overrun": self._pauses.overrun([p], peers, now),
                }
            )
        return out


def _age(v: Any) -> float:
    """A published age in [0, MAX_AGE_S] seconds; 0 for anything else (untrusted)."""
    if not isinstance(v, int | float) or isinstance(v, bool) or v != v:
        return 0.0
    return min(max(float(v), 0.0), MAX_AGE_S)


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
