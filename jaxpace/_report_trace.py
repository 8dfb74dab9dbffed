"""Perfetto / Chrome trace-event JSON from timing records, on a clock-free common axis."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from jaxpace.report import _SiteData

__all__ = ["trace_events"]

PHASES = ("compute", "pacing sleep", "sync wait", "transfer")
MAX_EVENTS = 400_000


def trace_events(data: _SiteData, site: str, *, max_steps: int | None = None) -> dict[str, Any]:
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

    us = 1e6
    events: list[dict[str, Any]] = []
    for j in range(R):
        rank, host = int(data.ranks[j]), data.hosts[j]
        events.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": rank,
                "tid": 0,
                "args": {"name": f"rank {rank} ({host})"},
            }
        )
        events.append(
            {
                "ph": "M",
                "name": "process_sort_index",
                "pid": rank,
                "tid": 0,
                "args": {"sort_index": rank},
            }
        )
        events.append(
            {"ph": "M", "name": "thread_name", "pid": rank, "tid": 0, "args": {"name": site}}
        )
    steps = data.steps[:S].tolist()
    for k in range(S):
        for j in range(R):
            rank = int(data.ranks[j])
            a = float(arrive[k, j])
            spans = []
            if np.isfinite(comp_start[k, j]):
                spans.append(("compute", float(comp_start[k, j]), a - float(comp_start[k, j])))
            d, s, t = float(delay[k, j]), float(sync[k, j]), float(transfer[k, j])
            if d > 0:
                spans.append(("pacing sleep", a, d))
            if s > 0:
                spans.append(("sync wait", a + d, s))
            spans.append(("transfer", a + d + s, max(t, 0.0)))
            for name, start, dur in spans:
                events.append(
                    {
                        "ph": "X",
                        "name": name,
                        "cat": "jaxpace",
                        "pid": rank,
                        "tid": 0,
                        "ts": round(start * us, 3),
                        "dur": round(max(dur, 0.0) * us, 3),
                        "args": {"step": steps[k]},
                    }
                )
    # Shift so the earliest event starts at 0.
    xs = [e["ts"] for e in events if e["ph"] == "X"]
    t0 = min(xs) if xs else 0.0
    for e in events:
        if e["ph"] == "X":
            e["ts"] = round(e["ts"] - t0, 3)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "site": site,
            "alignment": "collective exit of each step at the cumulative median step time",
            "steps": f"{steps[0]}-{steps[-1]}" if steps else "",
        },
    }
