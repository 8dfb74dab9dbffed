"""The runtime: `Pacer` (per-process state, sites, callbacks, sinks, records) and its defaults.

Modules: `config` (PacerConfig), `sites` (per-site state, SiteStats),
`hooks` (what a measured collective calls: trace hooks and callback bodies),
`sinks` (the sink thread), `consensus` (start-up agreement across processes),
`export` (records, export, gather), `pacer` (the `Pacer` facade and the default).
"""

from jaxpace._runtime.config import Granularity, PacerConfig
from jaxpace._runtime.pacer import Pacer, configure, default_pacer
from jaxpace._runtime.sites import SiteStats

__all__ = ["Granularity", "Pacer", "PacerConfig", "SiteStats", "configure", "default_pacer"]
