"""What the runtime's parts (hooks, export, inflight) read of a `Pacer`: one narrow Protocol.

The `Pacer` composes `Hooks`, the exporter and the in-flight wait; they reach it only through
this interface, never its private fields, so none of them imports `jaxpace.runtime.pacer`
(the facade imports them, one way).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # types only: leaf modules of the runtime, which import nothing of it
    from jaxpace.policy.base import PacingPolicy
    from jaxpace.runtime.config import PacerConfig
    from jaxpace.runtime.probe import Clock, RateLimitedLog
    from jaxpace.runtime.sink_thread import SinkThread
    from jaxpace.runtime.sites import Site

__all__ = ["PacerState"]


class PacerState(Protocol):
    """The `Pacer` as its parts see it.

    Attributes:
      config: the agreed `PacerConfig`.
      policy: the `PacingPolicy`.
      clock: the arrival clock (`Clock`: nanoseconds, durations only).
      mesh: the concrete mesh the user passed, or None.
      rank_groups: `{kind: {rank: group}}` the user passed, or None.
      run_id: this run's id once agreed at the first trace, else None.
      hooks: the `Runtime` implementation (`jaxpace.runtime.hooks.Hooks`).
    """

    clock: Clock
    mesh: Any
    rank_groups: dict[str, dict[int, str]] | None
    run_id: str | None
    hooks: Any

    @property
    def config(self) -> PacerConfig: ...

    @property
    def policy(self) -> PacingPolicy: ...

    @property
    def lock(self) -> threading.Lock: ...

    @property
    def sites(self) -> Mapping[str, Site]: ...

    @property
    def stop_event(self) -> threading.Event: ...

    @property
    def errlog(self) -> RateLimitedLog: ...

    @property
    def sink_thread(self) -> SinkThread: ...

    def add_site(self, name: str, site: Site) -> None:
        """Registers a new measured site (under `lock`)."""

    def note_unmeasured(self, site: str, reason: str) -> None:
        """Records that `site` passes straight to `jax.lax`, and why."""

    def freeze_and_agree(self) -> None:
        """Freezes the settings and agrees on them across processes (first trace only)."""
