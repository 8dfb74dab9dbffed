"""The runtime: `Pacer` (per-process state, sites, callbacks, sinks, records) and its defaults.

Modules: `config` (PacerConfig), `sites` (per-site state, SiteStats), `hooks` (what a
measured collective calls: trace hooks and callback bodies), `probe` (clock and record
ring), `delay` (clamp and sleep), `signals` (the one SIGTERM/atexit owner), `sink_thread`,
`consensus` (start-up agreement across processes), `export` (records, export, gather),
`watchdog`, `pauses`, `pacer` (the `Pacer` facade and the default).

The names below load on first use, so `jaxpace.runtime.probe` (the `Clock` and `Sink`
protocols the top-level package re-exports) does not import JAX.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jaxpace.runtime.config import Granularity, PacerConfig
    from jaxpace.runtime.pacer import Pacer, configure, default_pacer
    from jaxpace.runtime.sites import SiteStats

__all__ = ["Granularity", "Pacer", "PacerConfig", "SiteStats", "configure", "default_pacer"]

_HOMES = {
    "Granularity": "config",
    "PacerConfig": "config",
    "Pacer": "pacer",
    "configure": "pacer",
    "default_pacer": "pacer",
    "SiteStats": "sites",
}


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'jaxpace.runtime' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"jaxpace.runtime.{home}"), name)
    globals()[name] = value
    return value
