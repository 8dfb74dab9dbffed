"""Which calls of a watched function open, fill and close a profiler window: the call count alone.

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

from jaxpace._validate import check_number
from jaxpace.errors import ConfigError

__all__ = ["Edge", "Schedule"]

MAX_CALLS = 1 << 62


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


_NOTHING = Edge()


@dataclasses.dataclass(frozen=True)
class Schedule:
    """`every` calls apart, `window` calls long (`1 <= window <= every`).

    >>> s = Schedule(every=10, window=3)
    >>> [k for k in range(25) if s.edge(k) != Edge()]
    [9, 10, 11, 12, 19, 20, 21, 22]
    >>> s.edge(9).pre_block, s.edge(10).start, s.edge(12).end, s.bounds(2)
    (True, True, True, (20, 22))
    """

    every: int
    window: int

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
