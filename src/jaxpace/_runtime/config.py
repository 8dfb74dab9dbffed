"""`PacerConfig`: the settings that shape the traced program, validated once."""

from __future__ import annotations

import dataclasses
from typing import Literal

from jaxpace._validate import check_bool, check_choice, check_number

__all__ = ["Granularity", "PacerConfig"]

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
