"""Live windows for any JAX program: `jaxpace.watch(fn)` names the late process and the hung one.

- `schedule`: which calls open and close a `jax.profiler` window (the call count alone);
- `wrapper`: `Watched`, the callable `watch` returns;
- `summary`: a window's trace as a compact per-(collective, execution) summary, and
  every process's summaries as the report's `Records`;
- `exchange`: where summaries and heartbeats go (the job's coordination service, a
  shared directory, or memory);
- `decide`: the report's decision on pooled windows; the log line and the verdict;
- `heartbeat`: hang naming; `worker`: the one background thread; `store`: files under `out=`.

`jaxpace.watch` is this package, callable: `jaxpace.watch(fn, ...)` is `watch(fn, ...)`.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

from jaxpace.watch.decide import VERDICT_VERSION, WindowResult
from jaxpace.watch.wrapper import DEFAULT_EVERY, DEFAULT_WINDOW, Watched

__all__ = ["VERDICT_VERSION", "Watched", "WindowResult", "watch"]


def watch(
    fn: Callable,
    *,
    every: int | str = DEFAULT_EVERY,
    window: int = DEFAULT_WINDOW,
    stall_after_s: float | None = None,
    on_stall: str | Callable = "log",
    sinks: Iterable[Callable] = (),
    out: str | os.PathLike | None = None,
) -> Watched:
    """Watches a step function live: which process is late, which one hangs.

    Every process must wrap the same function the same way and call it the
    same number of times (it runs the same program on every process). A window
    of `window` calls runs under `jax.profiler` on every process on the same
    calls; the call before a window and the window's last call block on their
    outputs (`jax.block_until_ready`), so every process's window holds the same
    executions. All other calls run `fn` untouched. A background thread (at a
    lower CPU priority, nice 5) turns the window's trace into a compact summary and
    publishes it (the job's coordination service under `jax.distributed`, else
    `out=`); process 0 decides (the report's analysis, windows pooled until it
    names someone), logs one line per window, calls the `sinks` and writes
    `out/verdict.json`.

    Where windows go. `every="auto"` (the default): the first window at call
    100; each later one where process 0 announces it with the decision of the
    window before (every process reads it at least 10 s ahead, and blocks and
    profiles on the calls announced), so that a window's measured cost is 0.25%
    of the time between window starts: a quarter of the 1% a watched step may
    cost on average, the rest for what the estimate misses (the calls between
    windows cost 0.1-0.6% more on 4-5 ms CPU steps, docs/benchmarks.md). The cost is the
    slowest process's extra time on the step's thread plus its CPU time on
    watch's thread (charged in full, as if taken from the step; process 0's
    decision added to its own), or, when larger, what the calls after the
    window before lost while watch's thread analyzed it; the median of the last
    5 windows; windows stay
    at most 10 minutes apart. Measured on 8 CPU devices with 5 ms steps: about
    0.1-0.2 s per window, so a window every 20-40 s (docs/benchmarks.md,
    "watch"); on a 1 s step, every 20-40 calls. An integer `every` places
    windows by the call count alone: window `i` at call `i * every`.

    Args:
      fn: the step: a `jax.jit` function, a plain function, a train step.
      every: `"auto"`, or calls between window starts (>= 2; the first window
        starts at call `every`, after the first call's compilation).
      window: calls per window, in [1, every].
      stall_after_s: name a process that has not entered the step the others
        have for this long (seconds); None: no hang naming.
      on_stall: `"log"`, `"exit"` (sinks, bounded, then exit code 75) or a
        callable taking the stall dict.
      sinks: callables taking one summary dict (`jaxpace.sinks` exporters).
      out: a folder for the verdict, the stall record and the last windows'
        records as one run (`jaxpace report OUT`); with no `jax.distributed`, a
        shared folder through which processes exchange summaries.

    Returns:
      A `Watched` with `fn`'s signature; `.history()`, `.stalls()`, `.close()`.

    Raises:
      ConfigError: a bad argument, naming it.

    >>> import jax.numpy as jnp
    >>> step = watch(lambda x: x + 1, every=4, window=2)
    >>> [int(step(jnp.zeros(()))) for _ in range(3)]
    [1, 1, 1]
    >>> step.close()
    """
    return Watched(
        fn,
        every=every,
        window=window,
        stall_after_s=stall_after_s,
        on_stall=on_stall,
        sinks=sinks,
        out=out,
    )


class _CallableModule(types.ModuleType):
    """`jaxpace.watch` is both this package and the function: `import jaxpace.watch`
    binds the package where `jaxpace.watch(fn)` must still work."""

    def __call__(self, fn: Callable, **kwargs: Any) -> Watched:
        return watch(fn, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
