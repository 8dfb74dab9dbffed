"""Perfetto / Chrome trace-event JSON from timing records, on a clock-free common axis.

`Pacer.write_trace` imports this module lazily; it sits below the runtime and
imports nothing of it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from jaxpace.errors import RecordsError
from jaxpace.report.model import Report, SiteData
from jaxpace.report.records import Records, load_records
from jaxpace.report.stages.site import pick_site, site_data

__all__ = ["trace_events", "write_trace"]

PHASES = ("compute", "pacing sleep", "sync wait", "transfer")
MAX_EVENTS = 400_000


def trace_events(data: SiteData, site: str, *, max_steps: int | None = None) -> dict[str, Any]:
    """Trace-event dict: one process track per rank, complete events per phase.

    Draws the first `max_steps` steps (default: enough for about `MAX_EVENTS` events).

    Alignment: step k's collective exit is placed at ``T_k``, the cumulative
    median over ranks of the step time (the first step's exit at the first
    step's median wait). Each rank's phases are laid out backwards from
    ``T_k`` with its own durations, so no raw timestamps of different clocks are
    compared. Where a rank's own step time differs from the median, its compute
    bar is clipped so that it never starts before its previous step's exit.
    """
    S, R = data.wait.shape
    if max_steps is None:
        max_steps = max(1, MAX_EVENTS // (4 * max(R, 1)))
    S = min(S, max_steps)
    wait = data.wait[:S]
    delay = np.minimum(data.delay[:S], wait)
    transfer = np.minimum(data.transfer[:S, None], wait - delay)
    sync = np.maximum(wait - delay - transfer, 0.0)
    compute = data.compute[:S]
    med_step = np.median(data.step_time[:S], axis=1)
    first = float(np.median(wait[0] + np.nan_to_num(compute[0], nan=0.0)))
    fallback = float(np.nanmedian(med_step)) if np.isfinite(med_step).any() else 0.0
    med_step = np.where(np.isfinite(med_step), med_step, fallback + np.median(wait, axis=1))
    med_step[0] = first
    t_done = np.cumsum(med_step)  # seconds on the common axis
    arrive = t_done[:, None] - wait
    prev_done = np.concatenate([[0.0], t_done[:-1]])[:, None]
    comp_start = np.where(
        np.isfinite(compute), np.maximum(arrive - np.nan_to_num(compute), prev_done), np.nan
    )

    steps = data.steps[:S].tolist()
    events = _track_names(data, site)
    spans = (comp_start, arrive, delay, sync, transfer)
    for k in range(S):
        for j in range(R):
            events += _step_events(int(data.ranks[j]), steps[k], *(a[k, j] for a in spans))
    # Shift so the earliest event starts at 0; round start and end (not start and
    # duration) and clamp each slice to the previous one's end on its track, so
    # slices of one track never overlap.
    xs = [e["ts"] for e in events if e["ph"] == "X"]
    t0 = min(xs) if xs else 0.0
    last_end: dict[int, float] = {}
    for e in events:
        if e["ph"] == "X":
            start = max(round(e["ts"] - t0, 3), last_end.get(e["pid"], -math.inf))
            end = max(round(e["ts"] + e["dur"] - t0, 3), start)
            e["ts"], e["dur"] = start, round(end - start, 3)
            last_end[e["pid"]] = start + e["dur"]
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "site": site,
            "alignment": "collective exit of each step at the cumulative median step time",
            "steps": f"{steps[0]}-{steps[-1]}" if steps else "",
        },
    }


def _track_names(data: SiteData, site: str) -> list[dict[str, Any]]:
    """Metadata events: one process track per rank, named and sorted by rank."""
    events: list[dict[str, Any]] = []
    for j in range(data.ranks.size):
        rank, host = int(data.ranks[j]), data.hosts[j]
        meta = {"ph": "M", "pid": rank, "tid": 0}
        events.append({**meta, "name": "process_name", "args": {"name": f"rank {rank} ({host})"}})
        events.append({**meta, "name": "process_sort_index", "args": {"sort_index": rank}})
        events.append({**meta, "name": "thread_name", "args": {"name": site}})
    return events


def _step_events(
    rank: int, step: int, comp_start: float, arrive: float, d: float, s: float, t: float
) -> list[dict[str, Any]]:
    """Complete events of one rank's step: compute, pacing sleep, sync wait, transfer."""
    a, d, s, t = float(arrive), float(d), float(s), float(t)
    spans = []
    if np.isfinite(comp_start):
        spans.append(("compute", float(comp_start), a - float(comp_start)))
    if d > 0:
        spans.append(("pacing sleep", a, d))
    if s > 0:
        spans.append(("sync wait", a + d, s))
    spans.append(("transfer", a + d + s, max(t, 0.0)))
    us = 1e6
    return [
        {
            "ph": "X",
            "name": name,
            "cat": "jaxpace",
            "pid": rank,
            "tid": 0,
            "ts": start * us,
            "dur": max(dur, 0.0) * us,
            "args": {"step": step},
        }
        for name, start, dur in spans
    ]


def write_trace(
    records_or_report: Report | Records | str | os.PathLike | Iterable[Mapping[str, Any]],
    path: str | os.PathLike,
    *,
    site: str | None = None,
    max_steps: int | None = None,
) -> Path:
    """Writes a Perfetto / Chrome trace-event JSON, one track per rank.

    Each rank's steps show `compute`, `pacing sleep`, `sync wait` and
    `transfer`. Clocks of different processes are never compared: every rank is
    placed on a common axis on which step k's collective exit (`done`) happens at
    the same instant for all ranks, namely the cumulative median (over ranks)
    step time; each rank's phases are laid out backwards from that instant using
    its own durations. Open it at ui.perfetto.dev or chrome://tracing.

    Args:
      records_or_report: a `Report` (uses its site) or anything `load_records` reads.
      path: output file.
      site: site to draw (records input only; default: the one with most records).
      max_steps: draw at most this many steps (the first ones). Default: as
        many as keep the trace near 400k events (all steps of small runs).

    Returns:
      The path written.
    """
    if isinstance(records_or_report, Report):
        data = records_or_report.data
        if data is None:
            raise ValueError("this `Report` has no per-step data (was it loaded from JSON?).")
        label = records_or_report.site
    else:
        recs = load_records(records_or_report)
        if len(recs) == 0:
            raise RecordsError("no step records to draw (headers only).")
        label = pick_site(recs, site)
        data, _, _ = site_data(recs, label)
    p = Path(path)
    with open(p, "w") as f:
        json.dump(trace_events(data, label, max_steps=max_steps), f, separators=(",", ":"))
    return p
