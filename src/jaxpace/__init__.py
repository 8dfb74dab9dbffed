"""jaxpace: measure and pace JAX collectives across ranks, bitwise identical to `jax.lax`."""

from typing import TYPE_CHECKING

from jaxpace import errors
from jaxpace.policy.adaptive import AdaptiveConfig, AdaptiveState, adaptive
from jaxpace.policy.base import Observation, PacingPolicy, PolicyStatus
from jaxpace.policy.simple import fixed, no_pacing
from jaxpace.runtime.probe import Clock, Sink

if TYPE_CHECKING:  # loaded on first use (below): they import JAX
    from jaxpace import launch, report, sim, sinks, topology
    from jaxpace.collectives.dropins import (
        all_gather,
        all_to_all,
        pmax,
        pmean,
        pmin,
        ppermute,
        psum,
        psum_scatter,
    )
    from jaxpace.runtime import Pacer, PacerConfig, SiteStats, configure, default_pacer
    from jaxpace.runtime.pauses import expected_pause
    from jaxpace.topology import make_mesh
    from jaxpace.watch import watch

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
    "all_gather",
    "all_to_all",
    "configure",
    "default_pacer",
    "errors",
    "expected_pause",
    "fixed",
    "launch",
    "make_mesh",
    "no_pacing",
    "pmax",
    "pmean",
    "pmin",
    "ppermute",
    "psum",
    "psum_scatter",
    "report",
    "sim",
    "sinks",
    "topology",
    "watch",
]

# Names that load on first use. The collectives and the runtime import JAX (about 3 s here),
# which `jaxpace report`, `jaxpace simulate` and `jaxpace --help` never need; `report`, `sim`
# and `sinks` pull in rich/HTML code that a training process never needs.
_LAZY = {
    "all_gather": ("jaxpace.collectives.dropins", "all_gather"),
    "all_to_all": ("jaxpace.collectives.dropins", "all_to_all"),
    "pmax": ("jaxpace.collectives.dropins", "pmax"),
    "pmean": ("jaxpace.collectives.dropins", "pmean"),
    "pmin": ("jaxpace.collectives.dropins", "pmin"),
    "ppermute": ("jaxpace.collectives.dropins", "ppermute"),
    "psum": ("jaxpace.collectives.dropins", "psum"),
    "psum_scatter": ("jaxpace.collectives.dropins", "psum_scatter"),
    "Pacer": ("jaxpace.runtime", "Pacer"),
    "PacerConfig": ("jaxpace.runtime", "PacerConfig"),
    "SiteStats": ("jaxpace.runtime", "SiteStats"),
    "configure": ("jaxpace.runtime", "configure"),
    "default_pacer": ("jaxpace.runtime", "default_pacer"),
    "expected_pause": ("jaxpace.runtime.pauses", "expected_pause"),
    "make_mesh": ("jaxpace.topology", "make_mesh"),
    "launch": ("jaxpace.launch", None),
    "topology": ("jaxpace.topology", None),
    "report": ("jaxpace.report", None),
    "sim": ("jaxpace.sim", None),
    "sinks": ("jaxpace.sinks", None),
    "watch": ("jaxpace.watch", "watch"),
}


def __getattr__(name: str):
    spec = _LAZY.get(name)
    if spec is None:
        raise AttributeError(f"module 'jaxpace' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(spec[0])
    value = module if spec[1] is None else getattr(module, spec[1])
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
