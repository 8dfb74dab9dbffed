"""What a native file says of its own rows (`jaxpace.summary`), so the report asks no scan for it.

Before the report reads a run one site at a time it needs three things of every row
(`records.engine.Engine.summary`): each site's steps and its rows at each, the distinct
(rank, process, device) triples of each site, and each (step, process)'s least
`arrive_ns` over every site (the step order). Over 1024 files that is a scan of every
row: 1.8-2.2 s at 33M rows, 10-13 s at 262M. The writer has those rows in memory, so
`write_parquet` reduces them once (`of_columns`) and stores the result in the file's
key-value metadata under `SUMMARY_KEY`, as JSON; a run read in place merges its files'
summaries (`merge`) instead of scanning, when every file has one that agrees with its
footer's statistics (`check`). Anything else (a file without one, a row to drop, a
filter on the rows) asks the engine's scan, which gives the same summary.

The JSON (version 1), steps and firsts as runs of consecutive steps:

    {"v": 1, "rows": N,
     "sites": {site: {"steps": [[first step, steps, rows at each], ...],
                      "ranks": [[rank, process, device], ...]}, ...},
     "first": [[process, [[first step, steps], ...], least arrive_ns, [deltas ...]], ...]}

`first`'s values are each (step, process)'s least `arrive_ns`, the first written as is
and the others as differences from the one before (smaller text).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from jaxpace.records.int_keys import int_unique, unique_rows

__all__ = ["SUMMARY_KEY", "Merged", "check", "merge", "of_columns", "parse"]

# The key of a Parquet records file's key-value metadata that holds its summary (JSON).
SUMMARY_KEY = b"jaxpace.summary"
VERSION = 1


def _runs(steps: np.ndarray, values: np.ndarray | None = None) -> list[list[int]]:
    """Sorted distinct `steps` as runs `[first, length]` of consecutive steps (with
    `values`: `[first, length, value]`, a run also breaking where the value changes)."""
    if steps.size == 0:
        return []
    brk = np.diff(steps) != 1
    if values is not None:
        brk |= np.diff(values) != 0
    starts = np.r_[0, np.flatnonzero(brk) + 1]
    lengths = np.diff(np.r_[starts, steps.size])
    if values is None:
        return np.stack([steps[starts], lengths], axis=1).tolist()
    return np.stack([steps[starts], lengths, values[starts]], axis=1).tolist()


def _expand(runs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """`_runs`' runs back to (steps, each one's value; 0 without values)."""
    if not runs:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    r = np.asarray(runs, np.int64).reshape(len(runs), -1)
    lengths = r[:, 1]
    base = np.repeat(r[:, 0] - np.r_[0, np.cumsum(lengths)[:-1]], lengths)
    steps = base + np.arange(int(lengths.sum()), dtype=np.int64)
    vals = np.repeat(r[:, 2], lengths) if r.shape[1] > 2 else np.zeros(steps.size, np.int64)
    return steps, vals


def of_columns(columns: Mapping[str, np.ndarray], sites: Sequence[str]) -> bytes:
    """The summary (JSON bytes) of one file's step columns as `write_parquet` takes them
    (`site` an index into `sites`, `device` -1 where null)."""
    site = np.asarray(columns["site"], np.int64)
    step = np.asarray(columns["step"], np.int64)
    rank = np.asarray(columns["rank"], np.int64)
    proc = np.asarray(columns["process"], np.int64)
    arrive = np.asarray(columns["arrive_ns"], np.int64)
    n = step.size
    dev = np.asarray(columns.get("device", np.full(n, -1)), np.int64)
    dev = np.where(dev < 0, -1, dev)  # (written as null, read as -1)
    out_sites: dict[str, Any] = {}
    if n:
        # Rows per (site, step), and the distinct (site, rank, process, device): counts
        # over packed keys, no sort where the ranges are small.
        pairs, counts = _pair_counts(site, step)
        quads = unique_rows(site, rank, proc, dev)
        cut_p = np.flatnonzero(np.diff(pairs[0]) != 0) + 1
        cut_q = np.flatnonzero(np.diff(quads[0]) != 0) + 1
        for ps, cs, qs in zip(np.split(pairs, cut_p, axis=1), np.split(counts, cut_p),
                              np.split(quads, cut_q, axis=1), strict=True):  # fmt: skip
            out_sites[str(sites[int(ps[0, 0])])] = {
                "steps": _runs(ps[1], cs),
                "ranks": qs[1:].T.tolist(),
            }
    first = []
    if n:
        ps, least = _least_per(proc, step, arrive)
        pcut = np.flatnonzero(np.diff(ps[0]) != 0) + 1
        for k, vals in zip(np.split(ps, pcut, axis=1), np.split(least, pcut), strict=True):
            first.append([int(k[0, 0]), _runs(k[1]), int(vals[0]), np.diff(vals).tolist()])
    doc = {"v": VERSION, "rows": int(n), "sites": out_sites, "first": first}
    return json.dumps(doc, separators=(",", ":")).encode()


def _pair_counts(site: np.ndarray, step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`((2, K) distinct (site, step), sorted; the rows of each)`: one key per row, counted
    (`bincount`) when its range is small, else `np.unique`."""
    s0, t0 = int(site.min()), int(step.min())
    span = int(step.max()) - t0 + 1
    key = (site - s0) * span + (step - t0)
    if int(key.max()) <= 4 * key.size + 1024:
        c = np.bincount(key)
        u = np.flatnonzero(c)
        counts = c[u]
    else:
        u, counts = np.unique(key, return_counts=True)
    return np.stack([u // span + s0, u % span + t0]), counts


def _least_per(proc: np.ndarray, step: np.ndarray, arrive: np.ndarray):
    """`((2, K) distinct (process, step), sorted; the least `arrive` of each)`: on a
    (process x step) table when it is small (one process a file, its steps), else by a
    sort."""
    p0, s0 = int(proc.min()), int(step.min())
    span = int(step.max()) - s0 + 1
    cells = (int(proc.max()) - p0 + 1) * span
    if cells <= 4 * proc.size + 1024:
        flat = (proc - p0) * span + (step - s0)
        least = np.full(cells, np.iinfo(np.int64).max)
        np.minimum.at(least, flat, arrive)
        seen = np.bincount(flat, minlength=cells) > 0
        at = np.flatnonzero(seen)
        return np.stack([at // span + p0, at % span + s0]), least[at]
    order = np.lexsort((step, proc))
    p, st, a = proc[order], step[order], arrive[order]
    starts = np.r_[0, np.flatnonzero((np.diff(p) != 0) | (np.diff(st) != 0)) + 1]
    return np.stack([p[starts], st[starts]]), np.minimum.reduceat(a, starts)


class FileSummary(NamedTuple):
    """One file's summary, parsed (`parse`): the sites' runs as written (small lists,
    expanded for every file at once by `merge`), the first arrivals as arrays."""

    rows: int
    sites: dict[str, tuple[list, list]]  # site: (its steps' runs, its triples)
    first: tuple[np.ndarray, np.ndarray, np.ndarray]  # step, process, least arrive_ns


def parse(raw: bytes | None) -> FileSummary | None:
    """A file's summary from its metadata value (None: absent, not version 1, or not
    well formed: the engine scans instead)."""
    if not raw:
        return None
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict) or doc.get("v") != VERSION:
            return None
        sites = {}
        for name, x in doc["sites"].items():
            runs, triples = x["steps"], x["ranks"]
            if not runs or not triples or any(len(r) != 3 or r[1] < 1 for r in runs):
                return None
            if any(len(t) != 3 for t in triples):
                return None
            sites[str(name)] = (runs, triples)
        parts = []
        for proc, runs, first, deltas in doc["first"]:
            steps, _ = _expand(runs)
            vals = np.cumsum(np.asarray([first, *deltas], np.int64))
            if vals.size != steps.size:
                return None
            parts.append((steps, np.full(steps.size, int(proc), np.int64), vals))
        if not parts:
            return None
        first_t = tuple(np.concatenate(x) for x in zip(*parts, strict=True))
        return FileSummary(int(doc["rows"]), sites, first_t)
    except (ValueError, TypeError, KeyError, OverflowError):
        return None


def check(s: FileSummary, rows: int, stats: Mapping[str, list], row_sites: list) -> bool:
    """Whether summary `s` agrees with its file's footer: `rows` rows in all, and per site
    (`row_sites`: each row group's site and rows, in `stats`' order) its rows, and the
    least and greatest step, rank, process and device its statistics show; the least
    `arrive_ns` of all. A file whose rows another tool changed while keeping this
    metadata fails it (and is scanned)."""
    per: dict[str, list[int]] = {}
    for g, (site, n) in enumerate(row_sites):
        got = per.setdefault(site, [0])
        got[0] += n
        got.append(g)
    if s.rows != rows or set(per) != set(s.sites):
        return False
    total = 0
    for site, (runs, triples) in s.sites.items():
        n, *groups = per[site]
        in_runs = sum(r[1] * r[2] for r in runs)
        total += in_runs
        cols = list(zip(*triples, strict=True))
        want = {
            "step": (runs[0][0], runs[-1][0] + runs[-1][1] - 1),
            "rank": (min(cols[0]), max(cols[0])),
            "process": (min(cols[1]), max(cols[1])),
            "device": (min(cols[2]), max(cols[2])),
        }
        if n != in_runs:
            return False
        for k, (lo, hi) in want.items():
            st = [stats[k][g] for g in groups] if k in stats else None
            if k == "device" and (st is None or any(x is None or x.null_count for x in st)):
                continue  # (nulls read as -1: the statistics leave them out)
            if st is None or any(x is None for x in st):
                return False
            if (min(x.min for x in st), max(x.max for x in st)) != (lo, hi):
                return False
    arr = stats.get("arrive_ns")
    if total != rows or not arr or any(x is None for x in arr):
        return False
    return min(x.min for x in arr) == int(s.first[2].min())


class Merged(NamedTuple):
    """The run's summary from its files' (`merge`): what `Engine.summary` gives."""

    rank_keys: np.ndarray  # (3, K) distinct (rank, process, device), sorted
    step_ranks: dict[str, tuple[np.ndarray, np.ndarray, int]]
    keys: np.ndarray  # step * 2**32 + process, sorted
    first: np.ndarray


def merge(files: Sequence[FileSummary]) -> Merged:
    """The files' summaries as one: rows per (site, step) summed, triples united, the least
    first arrival of each (step, process)."""
    by_site: dict[str, tuple[list, list]] = {}
    for f in files:
        for site, (r, t) in f.sites.items():
            runs, triples = by_site.setdefault(site, ([], []))
            runs += r
            triples += t
    step_ranks = {}
    every = []
    for site in sorted(by_site):
        runs, triples = by_site[site]
        t = np.asarray(triples, np.int64).reshape(-1, 3).T
        step_ranks[site] = (*_rows_per_step(np.asarray(runs, np.int64).reshape(-1, 3)),
                            int(int_unique(t[0]).size))  # fmt: skip
        every.append(t)
    rank_keys = unique_rows(*(np.concatenate(every, axis=1) if every else np.zeros((3, 0))))
    step, proc, least = (
        np.concatenate([f.first[i] for f in files]) if files else np.zeros(0, np.int64)
        for i in range(3)
    )
    k = step * 4294967296 + proc
    order = np.argsort(k, kind="stable")
    k, least = k[order], least[order]
    if k.size > 1 and (np.diff(k) == 0).any():  # (a (step, process) in two files)
        starts = np.r_[0, np.flatnonzero(np.diff(k) != 0) + 1]
        k, least = k[starts], np.minimum.reduceat(least, starts)
    return Merged(rank_keys, step_ranks, k, least)


def _rows_per_step(runs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(steps, rows at each) of one site from its files' runs `[first, length, rows]`
    ((N, 3)): the runs' rows added over a range of steps (a difference array, no
    expansion) when the range is small, else expanded and summed."""
    lo = int(runs[:, 0].min())
    end = runs[:, 0] + runs[:, 1]
    span = int(end.max()) - lo
    if span > 4 * int(runs[:, 1].sum()) + 1024:  # (steps far apart)
        steps, counts = _expand(runs.tolist())
        u, inv = np.unique(steps, return_inverse=True)
        return u, np.bincount(inv.reshape(-1), weights=counts, minlength=u.size).astype(np.int64)
    d = np.zeros(span + 1, np.int64)
    np.add.at(d, runs[:, 0] - lo, runs[:, 2])
    np.add.at(d, end - lo, -runs[:, 2])
    n = np.cumsum(d[:-1])
    at = np.flatnonzero(n > 0)  # (each run's rows are one or more)
    return at + lo, n[at]
