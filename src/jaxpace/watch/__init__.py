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
    every: int = DEFAULT_EVERY,
    window: int = DEFAULT_WINDOW,
    stall_after_s: float | None = None,
    on_stall: str | Callable = "log",
    sinks: Iterable[Callable] = (),
    out: str | os.PathLike | None = None,
) -> Watched:
    """Watches a step function live: which process is late, which one hangs.

    Every process must wrap the same function the same way and call it the
    same number of times (it runs the same program on every process). Calls
    `every`, `2 * every`, ... open a `jax.profiler` window of `window` calls on
    every process; the call before a window and the window's last call block
    on their outputs (`jax.block_until_ready`), so every process's window holds
    the same executions. All other calls run `fn` untouched. A background
    thread turns the window's trace into a compact summary and publishes it
    (the job's coordination service under `jax.distributed`, else `out=`);
    process 0 decides (the report's analysis, windows pooled until it names
    someone), logs one line per window, calls the `sinks` and writes
    `out/verdict.json`.

    Args:
      fn: the step: a `jax.jit` function, a plain function, a train step.
      every: calls between window starts (>= 2); the first window starts at call
        `every`, after the first call's compilation.
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
