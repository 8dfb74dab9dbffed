"""`SiteData`: one site's timings as dense (step x rank) arrays, the form every source becomes,
and how it is built from `Records` (`pick_site`, `site_data`, `site_groups`).

A rank missing from a step is neither late nor early there: its values are the step's
median over the ranks present (the report, the whole step and the Perfetto trace alike).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from jaxpace import _text
from jaxpace.errors import RecordsError
from jaxpace.records import pool
from jaxpace.records.int_keys import grid_axes
from jaxpace.records.int_keys import int_unique as _int_unique
from jaxpace.records.reader import Records

__all__ = [
    "SiteData",
    "group_columns",
    "pick_site",
    "rank_columns",
    "site_data",
    "site_groups",
    "site_info",
]


@dataclasses.dataclass(frozen=True)
class SiteData:
    """Dense (step x rank) arrays of one site; seconds, NaN where unknown.

    Built by `jaxpace.report.stages.site_data` from the complete steps (every
    rank reported) of one site; read by the stages, the HTML plots and the trace.
    """

    steps: np.ndarray  # (S,) step numbers, complete steps only
    ranks: np.ndarray  # (R,)
    processes: np.ndarray  # (R,) process of each rank
    hosts: tuple[str, ...]  # (R,)
    arrive: np.ndarray  # (S, R) seconds since the rank's own first arrival
    done: np.ndarray
    wait: np.ndarray
    delay: np.ndarray
    engaged: np.ndarray  # (S,) bool
    compute: np.ndarray  # (S, R)
    step_time: np.ndarray  # (S, R)
    transfer: np.ndarray  # (S,)
    sync_wait: np.ndarray  # (S, R)
    lateness: np.ndarray  # (S, R)


def _ranges(values, limit: int = 6) -> str:
    return _text.ranges(values, limit=limit)


def site_info(records: Any) -> dict[str, dict[str, Any]]:
    """`{site: what the headers say of it}` (`kind`, `groups`, `pairs`, ...): the first
    header that names the site."""
    out: dict[str, dict[str, Any]] = {}
    for h in records.headers:
        for name, info in (h.get("sites") or {}).items():
            if isinstance(info, Mapping):
                out.setdefault(str(name), dict(info))
    return out


def rank_columns(ranks: np.ndarray, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(columns of the `wanted` ranks that have records, which of `wanted` those are);
    `ranks` is sorted (the records' rank columns)."""
    if ranks.size == 0:
        return np.zeros(0, np.intp), np.zeros(wanted.size, bool)
    idx = np.searchsorted(ranks, wanted).clip(0, ranks.size - 1)
    ok = ranks[idx] == wanted
    return idx[ok], ok


def group_columns(groups, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`(cols, gid)`: the columns of the ranks `groups` lists that have records, in the
    groups' order, and the index of each one's group."""
    flat = np.fromiter((int(r) for g in groups for r in g), np.int64)
    gid = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
    cols, ok = rank_columns(ranks, flat)
    return cols, gid[ok]


def pick_site(recs: Any, site: str | None) -> str:
    """`site` if the records (`Records` or `records.by_site.SiteRecords`) have it (else a
    clear error); without one, the busiest site (`analyze` itself defaults to the whole
    step: `stages.whole`)."""
    if site is None:
        counts = (
            np.bincount(recs.columns["site"], minlength=len(recs.sites))
            if isinstance(recs, Records)
            else recs.counts()
        )
        return recs.sites[int(np.argmax(counts))]
    if site not in recs.sites:
        raise RecordsError(
            f"site `{site}` is not in the records; available sites: "
            f"{', '.join(f'`{s}`' for s in recs.sites)}."
        )
    return site


class _Grid(NamedTuple):
    """Where each record of one site sits in the (step x rank) grid."""

    at: np.ndarray | None  # (S * R,) the row (of the records' columns) in each cell; -1:
    # none. None when `in_order` (the row of cell i is i).
    full: bool  # every cell has a record
    steps_all: np.ndarray  # (S,) every step seen
    ranks: np.ndarray  # (R,)
    complete: np.ndarray  # (S,) the steps used: two or more ranks reported them
    present: np.ndarray  # (S', R) which rank reported each used step
    # The rows are the cells in order, every cell one (`at` is 0, 1, ...): a column is its
    # grid as it stands (`records.parquet_reader` reads a site's rows onto its grid).
    in_order: bool = False
    # The columns `site_data_grid` placed for every step, for `stages.links` (None before).
    wait_s: np.ndarray | None = None  # (S, R) seconds, NaN where missing
    process: np.ndarray | None = None  # (S, R) -1 where missing


# A rank missing from more than this share of the used steps is named in the notes.
_MOSTLY_MISSING = 0.5


def _grid(records: Records, site: str, notes: list[str]) -> _Grid:
    """Places the site's records on the grid; raises on duplicates or when no step has
    records of two ranks.

    Partial steps are used: each step compares the ranks present in it. The notes
    say how much is missing, and name a rank missing from most steps.
    """
    c = records.columns
    sel = c["site"] == records.sites.index(site)
    rows = None if sel.all() else np.flatnonzero(sel)  # (one site: no copy)
    step, rank = (c["step"], c["rank"]) if rows is None else (c["step"][rows], c["rank"][rows])
    axes = grid_axes(step, rank) if rows is None else None
    if axes is not None:
        # (every cell once, in order: each column is its grid, nothing to place or gather;
        # nothing missing, so no coverage note)
        S, R = axes[0].size, axes[1].size
        return _Grid(None, True, *axes, np.ones(S, bool), np.ones((S, R), bool),
                     in_order=True)  # fmt: skip
    ranks = _int_unique(rank)
    steps_all = _int_unique(step)
    R, S = ranks.size, steps_all.size
    flat = _index_in(steps_all, step) * R
    flat += _index_in(ranks, rank)
    # Each cell's row: a gather per column (`_dense`) instead of a scatter, and the
    # duplicate check (a cell written twice holds fewer rows than there are records).
    at = np.full(S * R, -1, np.intp)
    at[flat] = np.arange(step.size) if rows is None else rows
    filled = at >= 0
    n_filled = int(np.count_nonzero(filled))
    if n_filled < step.size:
        counts = np.bincount(flat, minlength=S * R)
        dup = np.flatnonzero(counts > 1)
        s_dup, r_dup = divmod(int(dup[0]), R)
        raise RecordsError(
            f"site `{site}`: {dup.size} duplicate records, e.g. step {int(steps_all[s_dup])} "
            f"of rank {int(ranks[r_dup])} appears {int(counts[dup[0]])} times. Each (site, "
            "step, rank) must appear once; did two files come from the same process?"
        )
    present = filled.reshape(S, R)
    n_present = present.sum(axis=1)
    used = n_present >= min(2, R)  # (a one-rank run: its steps, nothing to compare)
    if not used.any():
        raise RecordsError(
            f"site `{site}` has no step with records of two or more ranks (ranks "
            f"{_ranges(ranks)}, {S} steps); nothing to compare. Point the report at the "
            "whole run (every process's file)."
        )
    notes.extend(_coverage_notes(site, steps_all, ranks, present, used))
    return _Grid(at, n_filled == S * R, steps_all, ranks, used, present[used])


def _coverage_notes(
    site: str, steps: np.ndarray, ranks: np.ndarray, present: np.ndarray, used: np.ndarray
) -> list[str]:
    """`PARTIAL:` notes on what is missing at `site`: steps with fewer than two ranks
    (not used), records missing in the used steps, ranks missing from most steps."""
    notes = []
    R = ranks.size
    if not used.all():
        notes.append(
            f"PARTIAL: {int((~used).sum())} of {steps.size} steps of `{site}` have records of "
            f"fewer than two ranks (steps {_ranges(steps[~used])}; not compared)."
        )
    p = present[used]
    n = p.sum(axis=1)
    missing = int(p.size - n.sum())
    if missing:
        short = int((n < R).sum())
        lost = p.shape[0] - p.sum(axis=0)
        top = np.argsort(-lost, kind="stable")[:3]
        most = ", ".join(f"rank {int(ranks[j])}: {int(lost[j])}" for j in top if lost[j] > 0)
        notes.append(
            f"PARTIAL: {missing} of {p.size} (step, rank) records of `{site}` are missing "
            f"({missing / p.size:.2%}); {short} of {n.size} steps lack some ranks. Each step "
            f"compares the ranks present in it ({int(n.min())} to {int(n.max())} of {R}, "
            f"median {int(np.median(n))}); a rank missing from a step is neither late nor "
            f"early there (its lateness there is the step's median). Most missing: {most}."
        )
        share = 1.0 - p.mean(axis=0)
        mostly = np.flatnonzero(share > _MOSTLY_MISSING)
        if mostly.size:
            shown = ", ".join(
                f"{int(ranks[j])} ({share[j]:.0%})" for j in mostly[np.argsort(-share[mostly])][:10]
            )
            more = f", and {mostly.size - 10} more" if mostly.size > 10 else ""
            notes.append(
                f"PARTIAL: rank(s) missing from most steps of `{site}`: {shown}{more} of "
                "the steps missing; what the report says of them rests on few steps."
            )
    return notes


def first_of_each(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(a, return_index=True)` of an integer array (its distinct values, sorted, and
    where each first occurs), without a sort when their range is small (a site's ranks:
    about 16 ms against 68 ms for 2M rows)."""
    a = np.asarray(a)
    if a.size == 0 or int(a.max()) - int(a.min()) > 4 * a.size + 1024:
        return np.unique(a, return_index=True)
    lo = int(a.min())
    first = np.full(int(a.max()) - lo + 1, a.size, np.intp)
    np.minimum.at(first, a - lo, np.arange(a.size))
    seen = np.flatnonzero(first < a.size)
    return (seen + lo).astype(a.dtype, copy=False), first[seen]


def _index_in(uniq: np.ndarray, a: np.ndarray) -> np.ndarray:
    """`np.searchsorted(uniq, a)` for `a` drawn from the sorted `uniq`; by a lookup
    table when their range is small (as `_int_unique`), by a subtraction when `uniq` is
    every integer of its range (`a` itself when that starts at 0: read it, never write)."""
    if a.size == 0 or int(uniq[-1]) - int(uniq[0]) > 4 * a.size + 1024:
        return np.searchsorted(uniq, a)
    lo = int(uniq[0])
    if int(uniq[-1]) - lo == uniq.size - 1:  # (distinct and sorted: lo, lo + 1, ...)
        return (a - lo if lo else a).astype(np.intp, copy=False)
    lut = np.zeros(int(uniq[-1]) - int(uniq[0]) + 1, dtype=np.intp)
    lut[uniq - uniq[0]] = np.arange(uniq.size)
    return lut[a - uniq[0]]


def grid_column(
    records: Records, g: _Grid, col: str, dtype: type = np.int64, fill: Any = 0
) -> np.ndarray:
    """Column `col` of the site as an (every step x rank) array, `fill` where missing
    (read-only when it is the column itself: `g.in_order`)."""
    if g.in_order:
        x = records.columns[col].reshape(g.steps_all.size, g.ranks.size)
        if x.dtype == np.dtype(dtype):  # (a view of the records' column: never written through)
            x.flags.writeable = False
            return x
        a = pool.empty(x.shape, dtype)
        np.copyto(a, x)
        return a
    a = records.columns[col][g.at]  # (a missing cell's -1 picks the last row: filled below)
    a = a.astype(dtype, copy=False)
    if not g.full:
        a[g.at < 0] = fill
    return a.reshape(g.steps_all.size, g.ranks.size)


def _seconds(records: Records, g: _Grid, col: str) -> np.ndarray:
    """`grid_column(..., np.float64, nan) / 1e9` of an integer nanosecond column, in one
    pass fewer (the division converts each integer to float as `astype` does)."""
    x = records.columns[col]
    if x.size and not x.any():  # (a column of zeros, no delay: the same grid, no gather)
        a = np.zeros(g.steps_all.size * g.ranks.size)
    elif g.in_order:
        a = np.divide(x, 1e9, out=pool.empty(x.size))
    else:
        a = x[g.at] / 1e9
    if not g.full:
        a[g.at < 0] = np.nan
    return a.reshape(g.steps_all.size, g.ranks.size)


def _dense(
    records: Records, g: _Grid, col: str, dtype: type = np.int64, fill: Any = 0
) -> np.ndarray:
    """Column `col` of the site as a (used steps x rank) array, `fill` where missing."""
    return _used(g, grid_column(records, g, col, dtype, fill))


def _used(g: _Grid, a: np.ndarray) -> np.ndarray:
    """The rows of the used steps of an (every step x rank) array (itself when all are)."""
    return a if g.complete.all() else a[g.complete]


def _fill_missing(a: np.ndarray, missing: np.ndarray) -> np.ndarray:
    """`a` with its `missing` cells set to their step's median over the ranks present (a
    rank missing from a step is neither late nor early there); rows with no value stay NaN."""
    if not missing.any():
        return a
    a = np.where(missing, np.nan, a)
    rows = np.flatnonzero(missing.any(axis=1) & ~np.isnan(a).all(axis=1))
    if rows.size:
        med = np.nanmedian(a[rows], axis=1)
        part = a[rows]
        a[rows] = np.where(np.isnan(part), med[:, None], part)
    return a


def _own_clock(records: Records, g: _Grid, missing: np.ndarray) -> tuple[np.ndarray, ...]:
    """(arrive, done) in seconds since each rank's own first arrival, NaN where missing
    (int64 until each rank's origin is subtracted: only differences on one clock matter)."""
    arrive_i, done_i = _dense(records, g, "arrive_ns"), _dense(records, g, "done_ns")
    if not missing.any():  # (the same numbers, without the masks)
        origin_ns = arrive_i.min(axis=0, keepdims=True)
        return (arrive_i - origin_ns) / 1e9, (done_i - origin_ns) / 1e9
    origin_ns = np.where(missing, np.iinfo(np.int64).max, arrive_i).min(axis=0, keepdims=True)
    arrive = np.where(missing, np.nan, (arrive_i - origin_ns) / 1e9)
    return arrive, np.where(missing, np.nan, (done_i - origin_ns) / 1e9)


def site_data(records: Records, site: str) -> tuple[SiteData, list[str], bool]:
    """Dense arrays of one site's steps with two or more ranks; returns (data, notes, partial).

    All times are durations on one rank's own clock (each rank's origin is its
    own first arrival), so clock offsets between processes never matter. Each step
    compares the ranks present in it: the lateness, transfer and sync wait of a step
    come from those ranks only, and at a step a rank is missing from, its values are
    the step's median over the ranks present (neither late nor early there).
    """
    return site_data_grid(records, site)[:3]


class SiteEvidence(NamedTuple):
    """What the whole step reads of one site (`site_evidence_grid`): `SiteData` less the
    times on each rank's own clock (`arrive`, `done`, `compute`, `step_time`), which the
    whole step takes from every site's rows together (`stages.whole`)."""

    steps: np.ndarray
    ranks: np.ndarray
    processes: np.ndarray
    hosts: tuple[str, ...]
    wait: np.ndarray
    delay: np.ndarray
    engaged: np.ndarray
    transfer: np.ndarray
    sync_wait: np.ndarray
    lateness: np.ndarray


def site_data_grid(records: Records, site: str) -> tuple[SiteData, list[str], bool, _Grid]:
    """`site_data`, and where each record sits in the site's (step x rank) grid (`_Grid`),
    for the stages that place the same records again (`stages.whole`, `stages.links`)."""
    ev, notes, partial, g = site_evidence_grid(records, site)
    missing = ~g.present
    arrive, done = _own_clock(records, g, missing)
    consecutive = _consecutive(records, ev.steps)
    compute = np.full(arrive.shape, np.nan)
    step_time = np.full(arrive.shape, np.nan)
    np.subtract(arrive[1:], done[:-1], out=compute[1:])
    np.subtract(done[1:], done[:-1], out=step_time[1:])
    compute[~consecutive] = np.nan
    step_time[~consecutive] = np.nan
    if missing.any():
        # Compute and step time need the step before too; a step whose every value is
        # unknown (not consecutive) stays unknown.
        lost = missing.copy()
        lost[1:] |= missing[:-1]
        compute = _fill_missing(compute, lost & ~np.isnan(compute).all(axis=1, keepdims=True))
        step_time = _fill_missing(step_time, lost & ~np.isnan(step_time).all(axis=1, keepdims=True))
    data = SiteData(**ev._asdict(), arrive=arrive, done=done, compute=compute, step_time=step_time)
    return data, notes, partial, g


def _phases(records: Records) -> int:
    return max((int(h.get("interleaved_phases", 1)) for h in records.headers), default=1)


def _consecutive(records: Records, steps: np.ndarray) -> np.ndarray:
    """Which steps follow the step before (compute and step time need it): none of the runs
    interleaved step by step (`interleaved_phases`)."""
    consecutive = np.zeros(steps.size, bool)
    consecutive[1:] = np.diff(steps) == 1
    if _phases(records) > 1:
        consecutive[:] = False
    return consecutive


def _step_notes(records: Records, steps: np.ndarray) -> list[str]:
    """What the site's steps allow of compute and step time: interleaved runs, or steps
    not consecutive (sampled records)."""
    phases = _phases(records)
    if phases > 1:
        # One exit of the site to the next spans the other runs' steps too.
        return [
            f"INTERLEAVED: these records come from one of {phases} runs interleaved step "
            "by step in the same processes (header `interleaved_phases`), so the time from "
            "one exit of the collective to the next spans the other runs' steps too. "
            "Iteration and compute times are not measured from these records; waits, "
            "delays and the ranking are. Time each run's own step in the program."
        ]
    if steps.size > 1 and not (np.diff(steps) == 1).any():
        return [
            "steps are not consecutive (sampled records?): compute and step time need "
            "consecutive steps, so only wait-based statistics are available."
        ]
    return []


def site_evidence_grid(records: Records, site: str) -> tuple[SiteEvidence, list[str], bool, _Grid]:
    """`site_data_grid` less the times on each rank's own clock (`SiteEvidence`): what the
    whole step reads of each site, the same values and notes."""
    notes: list[str] = []
    g = _grid(records, site, notes)
    missing = ~g.present
    partial = bool(not g.complete.all() or missing.any())
    wait_all = _seconds(records, g, "wait_ns")
    wait, delay = _used(g, wait_all), _used(g, _seconds(records, g, "delay_ns"))
    engaged = (
        _dense(records, g, "engaged", bool).any(axis=1)
        if records.columns["engaged"].any()
        else np.zeros(int(g.complete.sum()), bool)  # (no rank engaged: no gather)
    )
    steps = g.steps_all[g.complete]
    notes.extend(_step_notes(records, steps))
    # Time in the collective before it could finish; its minimum is the transfer,
    # and each rank's earliness beyond that minimum is its sync wait.
    if records.columns["delay_ns"].any():
        entered = wait - delay
        np.maximum(entered, 0.0, out=entered)
    else:  # (no delay: the same values, without reading a grid of zeros)
        entered = np.maximum(wait, 0.0, out=pool.empty(wait.shape))
    codes = site_groups(records, site, g.ranks)
    if codes is None:
        # The sync wait is `earliness(entered)`: every value is finite and >= 0 (NaN where
        # a record is missing: left out of the least), so the difference from the least.
        some = missing.any()
        most = (np.nanmax if some else np.max)(wait, axis=1, keepdims=True)
        lateness = np.subtract(most, wait, out=pool.empty(wait.shape))
        transfer = (np.nanmin if some else np.min)(entered, axis=1)
        sync_wait = np.subtract(entered, transfer[:, None], out=entered)  # (entered: done)
    else:
        lateness, transfer, sync_wait = _within_groups(wait, entered, codes)
        notes.append(_groups_note(site, codes))
    if missing.any():
        lateness, sync_wait, wait, delay = (
            _fill_missing(a, missing) for a in (lateness, sync_wait, wait, delay)
        )
    # Each rank's process: from any of its records.
    proc_all = grid_column(records, g, "process", np.int64, -1)
    processes = _used(g, proc_all).max(axis=0)
    host_of_proc = {int(h["process_index"]): str(h.get("host", "?")) for h in records.headers}
    ev = SiteEvidence(
        steps=steps,
        ranks=g.ranks,
        processes=processes,
        hosts=tuple(host_of_proc.get(int(p), "?") for p in processes.tolist()),
        wait=wait,
        delay=delay,
        engaged=engaged,
        transfer=transfer,
        sync_wait=sync_wait,
        lateness=lateness,
    )
    return ev, notes, partial, g._replace(wait_s=wait_all, process=proc_all)


def site_groups(records: Records, site: str, ranks: np.ndarray) -> np.ndarray | None:
    """Each of `ranks`' group at `site` (R,) from the headers' `sites[site]["groups"]`,
    or None when the site runs as one group (no groups in the headers, or one).

    A listed rank without records is ignored; ranks in no group form one more group
    together (as all ranks do without groups); a rank listed twice counts in its first.
    """
    listed = site_info(records).get(site, {}).get("groups")
    if not listed:
        return None
    cols, gid = group_columns(listed, ranks)
    idx, first = np.unique(cols, return_index=True)  # a rank's first listing
    codes = np.full(ranks.size, len(listed), np.int64)
    codes[idx] = gid[first]
    _, codes = np.unique(codes, return_inverse=True)  # the groups with ranks, 0..G-1
    return codes.reshape(-1) if codes.max(initial=0) > 0 else None


def _within_groups(
    wait: np.ndarray, entered: np.ndarray, codes: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lateness (S, R), transfer (S,), sync wait (S, R)), each rank against its own group.

    Lateness is ``max_j wait_j - wait_i`` over i's group, and the sync wait the rank's time
    in the collective beyond its group's least; a step's transfer is the median over groups
    of each group's least time in the collective (the typical group's collective: the
    groups run the same collective on different data, at the same time).
    """
    order = np.argsort(codes, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(codes[order]) != 0])
    # fmax/fmin: a missing rank (NaN) is left out of its group's extreme.
    gmax = np.fmax.reduceat(wait[:, order], starts, axis=1)
    gmin = np.fmin.reduceat(entered[:, order], starts, axis=1)
    lateness = gmax[:, codes] - wait
    transfer = np.median(gmin, axis=1) if not np.isnan(gmin).any() else _nanmedian_rows(gmin)
    return lateness, transfer, entered - gmin[:, codes]


def _nanmedian_rows(a: np.ndarray) -> np.ndarray:
    """Median of each row over its non-NaN values (NaN for a row without any), warning-free."""
    out = np.full(a.shape[0], np.nan)
    ok = ~np.isnan(a).all(axis=1)
    if ok.any():
        out[ok] = np.nanmedian(a[ok], axis=1)
    return out


def _groups_note(site: str, codes: np.ndarray) -> str:
    sizes = np.bincount(codes)
    n = str(int(sizes[0])) if (sizes == sizes[0]).all() else f"{sizes.min()} to {sizes.max()}"
    return (
        f"`{site}` runs as {sizes.size} groups (the records' header): ranks of different "
        f"groups never wait for each other; lateness is measured within each group of {n} "
        "ranks (and the sync wait against the group's last rank in), and a step's transfer "
        "is the median over groups of each group's least time in the collective."
    )


# The grid helpers `stages.whole` shares (the whole step places each site's records
# the same way).
fill_missing = _fill_missing
index_in = _index_in
int_unique = _int_unique
