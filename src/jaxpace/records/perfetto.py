"""Perfetto / Chrome trace-event JSON from timing records, on a clock-free common axis.

An on-disk format jaxpace writes: `Pacer.write_trace` (the runtime) and the report
(`jaxpace.report.render.trace`, which also takes a `Report`) both write it from here, so
neither imports the other.
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
from jaxpace.records.reader import Records, load_records
from jaxpace.records.safe_io import write_atomic
from jaxpace.records.site_data import SiteData, pick_site, site_data

__all__ = ["trace_events", "trace_json", "write_site_trace", "write_trace"]

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
    steps, spans = _layout(data, max_steps)
    cols = _slices_vectorized(data.ranks, np.asarray(steps, dtype=np.int64), *spans)
    if cols is None:  # times that are not finite: one event at a time
        slices = []
        for k in range(len(steps)):
            for j in range(data.ranks.size):
                slices += _step_events(int(data.ranks[j]), steps[k], *(a[k, j] for a in spans))
        _align(slices)
    else:
        slices = [
            {
                "ph": "X",
                "name": PHASES[p],
                "cat": "jaxpace",
                "pid": r,
                "tid": 0,
                "ts": t,
                "dur": d,
                "args": {"step": k},
            }
            for p, r, k, t, d in zip(*cols, strict=True)
        ]
    return {
        "traceEvents": _track_names(data, site) + slices,
        "displayTimeUnit": "ms",
        "otherData": _other_data(site, steps),
    }


def trace_json(data: SiteData, site: str, *, max_steps: int | None = None) -> str:
    """`json.dumps(trace_events(...), separators=(",", ":"))`, the same text, formatted
    a column at a time (no dict per event; several times faster at 400k events)."""
    steps, spans = _layout(data, max_steps)
    cols = _slices_vectorized(data.ranks, np.asarray(steps, dtype=np.int64), *spans)
    if cols is None:
        return json.dumps(trace_events(data, site, max_steps=max_steps), separators=(",", ":"))
    names = [json.dumps(p) for p in PHASES]
    # `%r` of a float is its `repr`, as `json` writes a finite float; ints as `%d`.
    fmt = (
        '{"ph":"X","name":%s,"cat":"jaxpace","pid":%d,"tid":0,"ts":%r,"dur":%r,"args":{"step":%d}}'
    )
    items = [json.dumps(e, separators=(",", ":")) for e in _track_names(data, site)]
    items += [fmt % (names[p], r, t, d, k) for p, r, k, t, d in zip(*cols, strict=True)]
    other = json.dumps(_other_data(site, steps), separators=(",", ":"))
    return (
        '{"traceEvents":[' + ",".join(items) + '],"displayTimeUnit":"ms","otherData":' + other + "}"
    )


def _layout(data: SiteData, max_steps: int | None) -> tuple[list[int], tuple[np.ndarray, ...]]:
    """(steps drawn, (compute start, arrive, delay, sync, transfer) per step x rank)."""
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
    return data.steps[:S].tolist(), (comp_start, arrive, delay, sync, transfer)


def _other_data(site: str, steps: list[int]) -> dict[str, Any]:
    return {
        "site": site,
        "alignment": "collective exit of each step at the cumulative median step time",
        "steps": f"{steps[0]}-{steps[-1]}" if steps else "",
    }


def _align(events: list[dict[str, Any]]) -> None:
    """Shifts the slices so the earliest starts at 0; rounds start and end (not start
    and duration) and clamps each slice to the previous one's end on its track, so
    slices of one track never overlap. In place."""
    t0 = min((e["ts"] for e in events), default=0.0)
    last_end: dict[int, float] = {}
    for e in events:
        start = max(round(e["ts"] - t0, 3), last_end.get(e["pid"], -math.inf))
        end = max(round(e["ts"] + e["dur"] - t0, 3), start)
        e["ts"], e["dur"] = start, round(end - start, 3)
        last_end[e["pid"]] = start + e["dur"]


def _slices_vectorized(
    ranks: np.ndarray,
    steps: np.ndarray,
    comp_start: np.ndarray,
    arrive: np.ndarray,
    d: np.ndarray,
    s: np.ndarray,
    t: np.ndarray,
) -> tuple[list, list, list, list, list] | None:
    """`_step_events` of every (step, rank), then `_align`, with NumPy: the same
    slices and numbers (Python's `round` and `max` reproduced exactly) as columns
    (phase index, pid, step, ts, dur), or None when a time is not finite (then
    the per-event path runs)."""
    us = 1e6
    with np.errstate(invalid="ignore", over="ignore"):  # (not finite: see below)
        a_d = arrive + d
        # (steps, ranks, phase): compute, pacing sleep, sync wait, transfer.
        start = np.stack([comp_start, arrive, a_d, a_d + s], axis=-1)
        dur = np.stack([arrive - comp_start, d, s, _max0(t)], axis=-1)
        present = np.stack([np.isfinite(comp_start), d > 0, s > 0, np.ones_like(d, bool)], -1)
        ts, du = start * us, _max0(dur) * us
        end = ts + du
    if not (np.isfinite(ts[present]).all() and np.isfinite(end[present]).all()):
        return None
    # Per track (rank), its slices in time order: (ranks, steps, phase).
    by_track = present.transpose(1, 0, 2)
    ts_t, du_t = ts.transpose(1, 0, 2)[by_track], du.transpose(1, 0, 2)[by_track]
    if not ts_t.size:
        return [], [], [], [], []
    t0 = ts_t.min()
    r_start = _round3(ts_t - t0)
    r_end = _round3(ts_t + du_t - t0)
    track = np.repeat(np.arange(ranks.size), by_track.sum(axis=(1, 2)))
    first = np.ones(track.size, bool)
    first[1:] = track[1:] != track[:-1]
    out_start, out_dur = _clamp(r_start, r_end, first)
    # Back to the events' order: step, rank, phase.
    order = np.zeros(present.shape, np.int64).transpose(1, 0, 2)
    order[by_track] = np.arange(track.size)
    pick = order.transpose(1, 0, 2)[present]
    phase = np.broadcast_to(np.arange(4), present.shape)[present].tolist()
    pid = np.broadcast_to(ranks[None, :, None], present.shape)[present].tolist()
    step = np.broadcast_to(steps[:, None, None], present.shape)[present].tolist()
    return phase, pid, step, out_start[pick].tolist(), out_dur[pick].tolist()


def _clamp(
    r_start: np.ndarray, r_end: np.ndarray, first: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """`_align`'s clamp over each track's slices (`first`: a track's first slice).

    Sequentially: start = max(r_start, previous end), end = max(r_end, start),
    dur = round(end - start, 3), previous end = start + dur. Solved in waves: all
    slices first, then only those whose previous slice moved, until none moves;
    then every slice satisfies the recurrence, whose solution is unique.
    """
    n = r_start.size
    start = r_start.copy()
    dur = _round3(np.where(start > r_end, start, r_end) - start)
    todo = np.flatnonzero(~first)  # slices whose previous end may move them
    while todo.size:
        prev_end = start[todo - 1] + dur[todo - 1]
        new = np.where(prev_end > r_start[todo], prev_end, r_start[todo])
        moved = new != start[todo]
        todo, new = todo[moved], new[moved]
        start[todo] = new
        dur[todo] = _round3(np.where(new > r_end[todo], new, r_end[todo]) - new)
        todo = todo + 1  # their successors, on the same track
        todo = todo[(todo < n)]
        todo = todo[~first[todo]]
    return start, dur


def _max0(x: np.ndarray) -> np.ndarray:
    """Python's `max(x, 0.0)` elementwise (NaN and -0.0 kept as `max` keeps them)."""
    return np.where(0.0 > x, 0.0, x)


def _round3(x_in: np.ndarray) -> np.ndarray:
    """Python's `round(v, 3)` for each `v` (finite), bit for bit.

    `round` rounds the exact value of `v * 1000` half to even, then takes the
    double nearest to that integer / 1000, which `k / 1000.0` is. The product is
    not exact in floating point, so its exact error (Dekker's two-product; 1000
    needs no split) decides which side of the half it lies. Beyond 2**40 (not a
    trace time) `round` itself runs.
    """
    large = ~(np.abs(x_in) < 2.0**40)
    x = np.where(large, 0.0, x_in)
    y = x * 1000.0
    c = 134217729.0 * x  # 2**27 + 1: splits x into two 26-bit halves
    hi = c - (c - x)
    err = (hi * 1000.0 - y) + (x - hi) * 1000.0  # x * 1000 == y + err exactly
    f = np.floor(y)
    side = (y - (f + 0.5)) + err  # the sign of (x * 1000 - (f + 0.5)), exactly
    odd = (f.astype(np.int64) & 1).astype(bool)
    k = np.where(side > 0, f + 1.0, np.where(side < 0, f, f + odd))  # a tie: to even
    out = k / 1000.0
    for i in np.flatnonzero(large).tolist():
        out[i] = round(float(x_in[i]), 3)
    return out


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
    records: Records | str | os.PathLike | Iterable[Mapping[str, Any]],
    path: str | os.PathLike,
    *,
    site: str | None = None,
    max_steps: int | None = None,
) -> Path:
    """Writes a Perfetto / Chrome trace-event JSON of `records`, one track per rank.

    Each rank's steps show `compute`, `pacing sleep`, `sync wait` and
    `transfer`. Clocks of different processes are never compared: every rank is
    placed on a common axis on which step k's collective exit (`done`) happens at
    the same instant for all ranks, namely the cumulative median (over ranks)
    step time; each rank's phases are laid out backwards from that instant using
    its own durations. Open it at ui.perfetto.dev or chrome://tracing.

    Args:
      records: anything `load_records` reads.
      path: output file.
      site: site to draw (default: the one with most records).
      max_steps: draw at most this many steps (the first ones). Default: as
        many as keep the trace near 400k events (all steps of small runs).

    Returns:
      The path written.
    """
    recs = load_records(records)
    if len(recs) == 0:
        raise RecordsError("no step records to draw (headers only).")
    label = pick_site(recs, site)
    data, _, _ = site_data(recs, label)
    return write_site_trace(data, label, path, max_steps=max_steps)


def write_site_trace(
    data: SiteData, label: str, path: str | os.PathLike, *, max_steps: int | None = None
) -> Path:
    """Writes the trace of one `SiteData` (see `write_trace`) atomically; returns the path."""
    p = Path(path)
    text = trace_json(data, label, max_steps=max_steps)  # = json.dump(trace_events(...))
    write_atomic(p, text, what="Perfetto trace")
    return p
