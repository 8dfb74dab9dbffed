"""jaxpace: measure and pace JAX collectives across ranks, bitwise identical to `jax.lax`."""

from jaxpace import errors
from jaxpace._collectives import pmean, psum
from jaxpace._policy import (
    AdaptiveConfig,
    AdaptiveState,
    Observation,
    PacingPolicy,
    adaptive,
    fixed,
    no_pacing,
)
from jaxpace._probe import Clock, Sink
from jaxpace._runtime import Pacer, PacerConfig, SiteStats, configure, default_pacer

__version__ = "0.1.0"

__all__ = sorted(
    [
        "AdaptiveConfig",
        "AdaptiveState",
        "Clock",
        "Observation",
        "Pacer",
        "PacerConfig",
        "PacingPolicy",
        "Sink",
        "SiteStats",
        "adaptive",
        "configure",
        "default_pacer",
        "errors",
        "fixed",
        "no_pacing",
        "pmean",
        "psum",
    ]
)
