"""Which calls of a watched function open, fill and close a profiler window.

`Schedule` (a fixed `every`): the call count alone. `AutoSchedule` (`every="auto"`,
the default): the first window at call `FIRST_WINDOW_AT` (the count alone), each later
one at the call the deciding process announced, spaced so that a window's measured cost
is `BUDGET` of the time between windows (`spacing`).

Window `i` (i >= 1) holds calls `[i * every, i * every + window)` (0-based call
index). The first window starts at call `every`, never at call 0, so the
compilation of the first call is never inside a window. The call just before
a window blocks on its outputs (so nothing dispatched earlier runs inside the
window), and the window's last call blocks on its outputs before the trace
stops (so every execution of the window is inside it). Every process computes
the same answer from the same count: every process runs the same program.
"""

from __future__ import annotations

import dataclasses
import math

from jaxpace._validate import check_number
from jaxpace.errors import ConfigError

__all__ = [
    "BUDGET",
    "FIRST_WINDOW_AT",
    "MARGIN_S",
    "MAX_GAP_S",
    "AutoSchedule",
    "Edge",
    "Schedule",
    "next_start",
    "spacing",
]

MAX_CALLS = 1 << 62
# `every="auto"`. A window's cost (its extra time on the step's thread, and watch's CPU
# time for it on the background thread, charged as if taken from the step: the slowest
# process's, with the decision on process 0) is at most `BUDGET` of the time from one
# window's start to the next: a quarter of the 1% that watch may cost a step on average.
# The rest is for what the estimate misses: at 0.5%, the windows cost about what watch
# estimated, and the calls between them 0.1-0.6% more on 4-5 ms CPU steps, so the whole
# came to 0.65-0.95% (docs/benchmarks.md). Windows stay at most `MAX_GAP_S` apart (a
# costlier window then exceeds the budget). An announced window starts at least
# `MARGIN_S` after the announcement (non-deciding processes read it every 2 s).
FIRST_WINDOW_AT = 100
BUDGET = 0.0025
MAX_GAP_S = 600.0
MARGIN_S = 10.0


@dataclasses.dataclass(frozen=True)
class Edge:
    """What call `k` does around the step.

    Attributes:
      pre_block: block on the outputs after the call (the call before a window).
      start: start the profiler before the call (the window's first call).
      end: block on the outputs, then stop the profiler (the window's last call).
      window: the window index (>= 1) the call is in, or 0 outside windows.
    """

    pre_block: bool = False
    start: bool = False
    end: bool = False
    window: int = 0

    @property
    def busy(self) -> bool:
        """Watch does something at this call: it is in a window or blocks before one."""
        return bool(self.window or self.pre_block)


_NOTHING = Edge()


@dataclasses.dataclass(frozen=True)
class Schedule:
    """`every` calls apart, `window` calls long (`1 <= window <= every`).

    >>> s = Schedule(every=10, window=3)
    >>> [k for k in range(25) if s.edge(k) != Edge()]
    [9, 10, 11, 12, 19, 20, 21, 22]
    >>> s.edge(9).pre_block, s.edge(10).start, s.edge(12).end, s.bounds(2)
    (True, True, True, (20, 22))
    >>> [k for k in range(25) if s.edge(k).busy] == [9, 10, 11, 12, 19, 20, 21, 22]
    True
    """

    every: int
    window: int
    auto = False

    def __post_init__(self) -> None:
        check_number("every", self.every, lo=2, hi=MAX_CALLS, integer=True, error=ConfigError)
        check_number("window", self.window, lo=1, hi=MAX_CALLS, integer=True, error=ConfigError)
        if self.window > self.every:
            raise ConfigError(
                f"`window`={self.window} must be at most `every`={self.every}: a window of "
                "calls cannot be longer than the spacing of windows. Pass a smaller `window` "
                "or a larger `every`."
            )

    def edge(self, k: int) -> Edge:
        """What call `k` (0-based) does; `Edge()` (nothing) outside windows and their edges."""
        i, pos = divmod(k, self.every)
        if i >= 1 and pos < self.window:
            return Edge(start=pos == 0, end=pos == self.window - 1, window=i)
        if pos == self.every - 1:  # (with window == every this call is a window's last)
            return Edge(pre_block=True)
        return _NOTHING

    def bounds(self, window: int) -> tuple[int, int]:
        """The first and last call index of `window` (inclusive)."""
        first = window * self.every
        return first, first + self.window - 1

    def next_busy(self, k: int) -> int:
        """The first call from `k` on whose `edge` is not `Edge()` (the calls before it
        run the step untouched).

        >>> s = Schedule(every=10, window=3)
        >>> s.next_busy(0), s.next_busy(9), s.next_busy(11), s.next_busy(13)
        (9, 9, 11, 19)
        """
        i, pos = divmod(k, self.every)
        if (i >= 1 and pos < self.window) or pos == self.every - 1:
            return k
        return (i + 1) * self.every - 1


def spacing(
    cost_s: float,
    step_s: float,
    *,
    window: int,
    budget: float = BUDGET,
    max_gap_s: float = MAX_GAP_S,
) -> int:
    """Calls from one window's start to the next so that `cost_s` (a window's cost,
    seconds) is `budget` of that time at `step_s` seconds per call; at least `window + 1`
    calls (a call before each window blocks), at most `max_gap_s` of steps.

    >>> spacing(0.05, 0.005, window=5)  # 50 ms per window of 5 ms steps: 20 s apart
    4000
    >>> spacing(0.05, 1.0, window=5)  # 1 s steps: every 20 calls
    20
    """
    if not (math.isfinite(step_s) and step_s > 0):
        step_s = 1e-3
    cost_s = cost_s if math.isfinite(cost_s) and cost_s > 0 else 0.0
    want = math.ceil(cost_s / (budget * step_s)) if cost_s else 0
    most = max(window + 1, math.floor(max_gap_s / step_s))
    return int(min(max(want, window + 1), most))


def next_start(last_start: int, gap: int, calls_now: int, step_s: float) -> int:
    """The announced first call of the next window: `gap` calls after the last window's
    start, and at least `MARGIN_S` of steps (and 2 calls) after `calls_now`, the calls
    the deciding process has entered when it announces.

    >>> next_start(100, 4000, 150, 0.005)
    4100
    >>> next_start(100, 10, 150, 1.0)  # the margin: 10 s of 1 s steps
    161
    """
    if not (math.isfinite(step_s) and step_s > 0):
        step_s = 1e-3
    margin = max(2, math.ceil(MARGIN_S / step_s))
    return int(min(max(last_start + gap, calls_now + margin + 1), MAX_CALLS))


class AutoSchedule:
    """`every="auto"`: window 1 at call `first`; window `i + 1` where the deciding process
    announced it (`adopt`), on every process the call it announced.

    The step's thread reads the announcement (`adopt`, before `edge`); one that comes
    after its window's blocking call has passed is refused (that process skips the window,
    which is partial), so no process ever starts a window late. A drop-in program runs
    its measured form inside windows: its measure-only collectives add no collective, so
    a process that skipped a window still runs the same collectives as the others.

    >>> s = AutoSchedule(window=2, first=4)
    >>> [k for k in range(12) if s.edge(k) != Edge()]
    [3, 4, 5]
    >>> s.adopt(2, 9, k=6), [k for k in range(6, 12) if s.edge(k) != Edge()], s.bounds(2)
    (True, [8, 9, 10], (9, 10))
    >>> s.adopt(3, 11, k=11)  # its blocking call (10) has passed: skipped here
    False
    """

    auto = True

    def __init__(self, *, window: int, first: int = FIRST_WINDOW_AT) -> None:
        check_number("window", window, lo=1, hi=MAX_CALLS, integer=True, error=ConfigError)
        if window >= first:
            raise ConfigError(
                f"`window`={window} must be below the first window's start ({first}) with "
                '`every="auto"`. Pass a smaller `window` or an integer `every`.'
            )
        self.window = int(window)
        self.every = int(first)  # the first window's first call
        self._next = (1, int(first))
        self._starts = {1: int(first)}

    def adopt(self, window: int, start: int, *, k: int) -> bool:
        """Takes the announced `window` at call `start`, at call `k` (0-based); False when
        its blocking call `start - 1` has passed (the window is skipped on this process)."""
        if window <= self._next[0]:
            return True
        if start - 1 < k:
            return False
        self._next = (int(window), int(start))
        self._starts[int(window)] = int(start)
        if len(self._starts) > 64:
            del self._starts[min(self._starts)]
        return True

    def edge(self, k: int) -> Edge:
        """What call `k` (0-based) does."""
        window, start = self._next
        pos = k - start
        if pos < -1 or pos >= self.window:
            return _NOTHING
        if pos == -1:
            return Edge(pre_block=True)
        return Edge(start=pos == 0, end=pos == self.window - 1, window=window)

    def next_busy(self, k: int) -> int:
        """The first call from `k` on whose `edge` is not `Edge()`: `MAX_CALLS` after
        the announced window (the next one is not announced yet).

        >>> s = AutoSchedule(window=2, first=4)
        >>> s.next_busy(0), s.next_busy(4), s.next_busy(6) == MAX_CALLS
        (3, 4, True)
        """
        start = self._next[1]
        if k < start + self.window:
            return max(k, start - 1)
        return MAX_CALLS

    def bounds(self, window: int) -> tuple[int, int]:
        """The first and last call index of `window` (inclusive); (-1, -1) if never announced here."""
        first = self._starts.get(window, -1)
        return (first, first + self.window - 1) if first >= 0 else (-1, -1)
