"""Test interface: fault injection inside the Python probes (`set_fault_hook`).

Tests inject faults (a late arrival, a hang, an exception) with a *fault hook*,
a function `hook(where, site, rank, step)` that the io_callback probes call:

- `where == "pre"`: in the pre-collective callback, before the arrival's clock
  is read (a hook that sleeps models a late arrival); `step` is the step about
  to arrive.
- `where == "post"`: in the post-collective callback of a sampled, timed step,
  after the exit's clock is read and before the record is closed.

An exception the hook raises is handled as one the callback body raised: it is
counted in `SiteStats.errors` and logged, and the step gets no delay. A pacer with
a fault hook measures with the io_callback probes (the native probes run no
Python), and `stats()[site].probe` says why.

`set_fault_hook` swaps the pacer's hooks for `FaultHooks` before the first trace;
a pacer without one runs `Hooks` itself, so the hot path has no fault-hook branch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from jaxpace.runtime.hooks import Hooks
from jaxpace.runtime.sites import RankState, Site

if TYPE_CHECKING:
    from jaxpace.runtime.pacer import Pacer

__all__ = ["FaultHook", "FaultHooks", "set_fault_hook"]

FaultHook = Callable[[str, str, int, int], None]


class FaultHooks(Hooks):
    """`Hooks` that call a fault hook inside both callback bodies (see the module docstring)."""

    def __init__(self, pacer: Pacer, hook: FaultHook) -> None:
        super().__init__(pacer)
        self.fault_hook = hook

    def arrive(self, site: Site, rank: int) -> tuple[np.ndarray, np.int32]:
        try:
            # Before the clock (read in `Hooks.arrive`): a hook that sleeps is a late arrival.
            self.fault_hook("pre", site.name, rank, site.rank(rank).next_step)
        except Exception as e:  # noqa: BLE001 - as a raising callback body: no delay
            self.count_error(site, "pre", e)
            return self.no_arrival(site)
        return super().arrive(site, rank)

    def _finish(
        self,
        site: Site,
        st: RankState,
        rank: int,
        step: int,
        t: int,
        reduced: np.ndarray | None,
        scale: float,
    ) -> None:
        # After the exit's clock (read in `Hooks.done`); an exception goes to `done`'s handler.
        self.fault_hook("post", site.name, rank, step)
        super()._finish(site, st, rank, step, t, reduced, scale)

    def native_blocker(self) -> str | None:
        return "a fault hook is installed (it runs inside the Python probes)"


def set_fault_hook(pacer: Pacer, hook: FaultHook) -> None:
    """Installs `hook` as `pacer`'s fault hook (before its first traced collective).

    Raises:
      TracedConfigChangeError: `pacer` already traced a collective (its programs
        hold the hooks they were traced with).
    """
    if isinstance(pacer.hooks, FaultHooks):
        pacer.hooks.fault_hook = hook
        return
    if pacer.traced:
        from jaxpace.errors import TracedConfigChangeError

        raise TracedConfigChangeError(
            "`set_fault_hook` must run before the pacer's first traced collective: the "
            "traced programs hold the hooks they were traced with. Install it right after "
            "`jaxpace.Pacer(...)`."
        )
    pacer.hooks = FaultHooks(pacer, hook)
