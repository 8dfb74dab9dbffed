"""A `Pacer`'s settings: `PacerConfig`, `WatchdogConfig`, and the one path that checks them all."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Literal

from jaxpace import policy as _policy
from jaxpace._validate import (
    check_bool,
    check_callable,
    check_callables,
    check_choice,
    check_number,
    check_rank_groups,
)
from jaxpace.errors import ConfigError
from jaxpace.runtime.probe import Clock, Sink

__all__ = [
    "ON_STALL",
    "RUN_DIR_ENV",
    "Granularity",
    "PacerConfig",
    "Settings",
    "WatchdogConfig",
    "check_policy",
    "checked_settings",
]

ON_STALL = ("warn", "raise", "exit")
RUN_DIR_ENV = "JAXPACE_RUN_DIR"

Granularity = Literal["process", "device"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PacerConfig:
    """Settings that shape the traced program; fixed before the first trace.

    Attributes:
      enabled: False makes every jaxpace collective the plain `jax.lax` one.
      granularity: `"process"` measures once per process (one leader shard, the
        cheap default); `"device"` measures every shard.
      sample_every: measure every k-th step of a site (1 = every step).
      capacity: ring-buffer slots per site and rank (memory is fixed).
      consensus_timeout_s: how long start-up waits for the other processes'
        settings before failing with a clear error.
    """

    enabled: bool = True
    granularity: Granularity = "process"
    sample_every: int = 1
    capacity: int = 4096
    consensus_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        check_bool("enabled", self.enabled)
        check_choice("granularity", self.granularity, ("process", "device"))
        check_number("sample_every", self.sample_every, lo=1, hi=10**6, integer=True)
        check_number("capacity", self.capacity, lo=2, hi=10**7, integer=True)
        check_number(
            "consensus_timeout_s", self.consensus_timeout_s, lo=0.0, hi=3600.0, lo_open=True
        )


@dataclasses.dataclass(frozen=True)
class WatchdogConfig:
    """Watchdog settings (`Pacer(stall_after_s=..., on_stall=..., run_dir=...)`).

    Attributes:
      stall_after_s: seconds this process may sit inside one measured
        collective (after any pacing sleep) before it declares a stall; None
        turns the watchdog off.
      on_stall: `"warn"` (print and keep waiting), `"raise"` (raise
        `StallError` in the main thread) or `"exit"` (exit with code 75).
      run_dir: where `stall-p{i}.json` goes; default `$JAXPACE_RUN_DIR`, else
        the current directory.
    """

    stall_after_s: float | None = 300.0
    on_stall: str = "warn"
    run_dir: str | None = None

    def __post_init__(self) -> None:
        if self.stall_after_s is not None:
            check_number("stall_after_s", self.stall_after_s, lo=0.0, hi=7 * 86400.0, lo_open=True)
        check_choice("on_stall", self.on_stall, ON_STALL)
        if self.run_dir is not None and not isinstance(self.run_dir, (str, os.PathLike)):
            raise ConfigError(
                f"`run_dir` must be a directory path (str or os.PathLike) or None, got "
                f"{self.run_dir!r} of type {type(self.run_dir).__name__}. Pass where stall "
                f"records go, or leave it out (then ${RUN_DIR_ENV}, else the current directory)."
            )

    def directory(self) -> str:
        d = self.run_dir if self.run_dir is not None else os.environ.get(RUN_DIR_ENV) or "."
        return os.fspath(d)


# ---------------------------------------------------------------------- the one settings check


def check_policy(policy: Any) -> _policy.PacingPolicy:
    if policy is None:
        return _policy.no_pacing()
    if not isinstance(policy, _policy.PacingPolicy):
        raise ConfigError(
            f"`policy` must be a jaxpace PacingPolicy (jp.no_pacing(), jp.fixed(...), "
            f"jp.adaptive(...)), got {type(policy).__name__}."
        )
    return policy


def _check_clock(clock: Any) -> None:
    check_callable(
        "clock",
        clock,
        allow_none=True,
        fix="Pass a function returning monotonic nanoseconds, e.g. `time.perf_counter_ns`, "
        "or None for that default.",
    )


def _check_sinks(sinks: Any) -> list[Sink]:
    return check_callables(
        "sinks",
        sinks,
        fix="Pass a list of functions, each taking one summary dict, e.g. `sinks=[print]`.",
    )


def _check_mesh(mesh: Any) -> None:
    import jax

    if mesh is None or isinstance(mesh, jax.sharding.Mesh):
        return
    # Mesh-like objects (what the runtime reads: `axis_names` and an array of `devices`
    # with one dimension per axis) pass too; tests use them to fake a process layout.
    names, devices = getattr(mesh, "axis_names", None), getattr(mesh, "devices", None)
    if not (
        isinstance(names, tuple)
        and all(isinstance(n, str) for n in names)
        and getattr(devices, "ndim", None) == len(names)
    ):
        shown = repr(mesh)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise ConfigError(
            f"`mesh` must be a jax.sharding.Mesh or None, got {shown} of type "
            f"{type(mesh).__name__}. Pass the concrete mesh your shard_map uses "
            "(e.g. `jax.make_mesh(...)`), or leave it out."
        )


_WATCHDOG_SETTINGS = ("stall_after_s", "on_stall", "run_dir")
_OTHER_SETTINGS = ("clock", "sinks", "mesh", "rank_groups") + _WATCHDOG_SETTINGS


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every setting of a `Pacer`, checked (what `Pacer._apply` sets)."""

    policy: _policy.PacingPolicy
    config: PacerConfig
    watchdog: WatchdogConfig
    clock: Clock
    mesh: Any
    rank_groups: dict[str, dict[int, str]] | None
    sinks: list[Sink]


def checked_settings(
    current: Settings, policy: _policy.PacingPolicy | None, changes: dict[str, Any]
) -> Settings:
    """`current` with `changes` (and `policy` unless None), every value checked.

    The one path by which settings are set: `Pacer(...)`, `Pacer.configure` and
    `jaxpace.configure`. Changes nothing; raises `ConfigError` on the first bad value.
    """
    changes = dict(changes)
    config_fields = {f.name for f in dataclasses.fields(PacerConfig)}
    bad = sorted(set(changes) - config_fields - set(_OTHER_SETTINGS))
    if bad:
        valid = sorted(config_fields | set(_OTHER_SETTINGS))
        raise ConfigError(f"unknown setting(s) {bad}; valid: {valid}.")
    watchdog = {k: changes.pop(k) for k in _WATCHDOG_SETTINGS if k in changes}
    watchdog_config = dataclasses.replace(current.watchdog, **watchdog)
    clock, mesh, rank_groups, sinks = (
        current.clock,
        current.mesh,
        current.rank_groups,
        current.sinks,
    )
    if "clock" in changes:
        clock = changes.pop("clock")
        _check_clock(clock)
        clock = clock if clock is not None else time.perf_counter_ns
    if "mesh" in changes:
        mesh = changes.pop("mesh")
        _check_mesh(mesh)
    if "sinks" in changes:
        sinks = _check_sinks(changes.pop("sinks"))
    if "rank_groups" in changes:
        rank_groups = check_rank_groups("rank_groups", changes.pop("rank_groups"))
    config = dataclasses.replace(current.config, **changes) if changes else current.config
    return Settings(
        policy=policy if policy is not None else current.policy,
        config=config,
        watchdog=watchdog_config,
        clock=clock,
        mesh=mesh,
        rank_groups=rank_groups,
        sinks=sinks,
    )
