"""jaxpace's events in `jax.monitoring`, under `/jaxpace/...`: what JAX and Orbax listeners see.

Event names (the contract; docs/api.md lists them with their metadata):

- `/jaxpace/collective/wait_duration_secs` (duration, seconds): the time a rank
  spent inside a measured collective, once per measured step and rank;
  metadata `site` (str), `rank` (int), `step` (int).
- `/jaxpace/collective/delay_duration_secs` (duration, seconds): the pacing
  sleep before it (0.0 when none); same metadata.
- `/jaxpace/culprit/changed` (event): the rank that arrives last on average
  over the last 64 exchanged steps changed; metadata `site`, `culprit` (int,
  the new one) and `previous` (int, -1 the first time). Needs an exchanging
  policy (`jp.adaptive`).
- `/jaxpace/culprit/rank` (scalar): the new culprit, at each change; `site`.

They are recorded by the `jaxpace.sinks.jax_monitoring()` sink, on the pacer's
sink thread (never inside a JAX callback): off unless that sink is added.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CULPRIT_CHANGED",
    "CULPRIT_RANK",
    "DELAY_DURATION",
    "WAIT_DURATION",
    "record_culprit_change",
    "record_step",
]

WAIT_DURATION = "/jaxpace/collective/wait_duration_secs"
DELAY_DURATION = "/jaxpace/collective/delay_duration_secs"
CULPRIT_CHANGED = "/jaxpace/culprit/changed"
CULPRIT_RANK = "/jaxpace/culprit/rank"


def record_step(summary: dict[str, Any]) -> None:
    """Records one measured step of one rank (a sink summary) as two durations."""
    import jax

    meta = {"site": str(summary["site"]), "rank": int(summary["rank"])}
    meta["step"] = int(summary.get("step", -1))
    jax.monitoring.record_event_duration_secs(WAIT_DURATION, float(summary["wait_s"]), **meta)
    jax.monitoring.record_event_duration_secs(
        DELAY_DURATION, float(summary.get("delay_s", 0.0)), **meta
    )


def record_culprit_change(site: str, culprit: int, previous: int) -> None:
    """Records that the culprit of `site` changed from `previous` (-1: none yet) to `culprit`."""
    import jax

    jax.monitoring.record_event(
        CULPRIT_CHANGED, site=str(site), culprit=int(culprit), previous=int(previous)
    )
    jax.monitoring.record_scalar(CULPRIT_RANK, int(culprit), site=str(site))
