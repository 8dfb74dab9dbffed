"""jaxpace: measure and pace JAX collectives across ranks, bitwise identical to `jax.lax`."""

from jaxpace import errors, launch, topology
from jaxpace._dropins import pmean, psum
from jaxpace._policy import (
    AdaptiveConfig,
    AdaptiveState,
    Observation,
    PacingPolicy,
    PolicyStatus,
    adaptive,
    fixed,
    no_pacing,
)
from jaxpace._probe import Clock, Sink
from jaxpace._runtime import Pacer, PacerConfig, SiteStats, configure, default_pacer
from jaxpace.topology import make_mesh

__version__ = "0.1.0"

__all__ = [
    "AdaptiveConfig",
    "AdaptiveState",
    "Clock",
    "Observation",
    "Pacer",
    "PacerConfig",
    "PacingPolicy",
    "PolicyStatus",
    "Sink",
    "SiteStats",
    "adaptive",
    "configure",
    "default_pacer",
    "errors",
    "fixed",
    "launch",
    "make_mesh",
    "no_pacing",
    "pmean",
    "psum",
    "report",
    "sim",
    "sinks",
    "topology",
]


def __getattr__(name: str):
    # `report` and `sim` load on first use: they pull in rich/HTML code that a
    # training process never needs.
    if name in ("report", "sim", "sinks"):
        import importlib

        return importlib.import_module(f"jaxpace.{name}")
    raise AttributeError(f"module 'jaxpace' has no attribute {name!r}")
