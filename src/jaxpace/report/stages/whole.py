"""Stage 1 (the default): the whole step, every collective of one program execution.

A step is one execution of the program. Each site's records number that site's own
executions (`step`), so a collective that runs k times an execution (inside a
`lax.scan` or a loop) has k times the steps of one that runs once. The sites are
folded into executions by their counts: the site with fewest steps runs once an
execution, a site with k times as many runs k times, and its j-th step belongs to
execution ``j // k`` (j counted over the site's steps in order). When a site's
count is not a whole multiple of the fewest, it is not folded (the note says so)
and its steps are taken as executions. A source that knows each record's execution
(an `execution` column, e.g. a trace's `run_id`) folds by it instead, which also
folds a program whose only collective runs several times an execution.

A rank's lateness in a step is the sum, over the step's collectives, of its
lateness within each collective's group (`site_data`). The sites are read one at a
time (`records.by_site`, the next fetched while one is worked on): the peak memory
is two sites' rows plus the (execution x rank) sums. A rank that took part in
only some of a step's collectives (records lost, or not a member) is estimated
from those it took part in: its mean lateness over them times the number of
collectives in the step, so a missing collective never makes it look less late.
Wait, delay and sync wait are summed the same way, and the transfer is the sum of
the collectives' transfers. A rank's step time is the time between the exits of
its last collective of two consecutive executions (its own clock); its compute is
that step time less its time inside the step's collectives (their summed waits, at
most the span from its first arrival to its last exit in the step, so collectives
that overlap each other count once).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxpace.errors import RecordsError
from jaxpace.records import pool
from jaxpace.records.by_site import SiteRecords, by_site
from jaxpace.records.reader import Records
from jaxpace.records.site_data import (
    fill_missing,
    first_of_each,
    grid_column,
    index_in,
    int_unique,
    site_data,
    site_evidence_grid,
)
from jaxpace.report.model import SiteData
from jaxpace.report.stages.context import run_context

__all__ = ["WHOLE_STEP", "execution_of", "refused_sites", "whole_step"]

# `RunInfo.site` of a report on the whole step.
WHOLE_STEP = "(whole step)"


def refused_sites(records: Records | SiteRecords) -> tuple[str, ...]:
    """The sites whose waits are not evidence (the headers' `invariant_over` or
    `no_culprit`): the whole step leaves them out."""
    out = []
    for site in records.sites:
        for h in records.headers:
            info = h.get("sites") if isinstance(h.get("sites"), dict) else None
            i = (info or {}).get(site)
            if isinstance(i, dict) and (i.get("invariant_over") or i.get("no_culprit")):
                out.append(site)
                break
    return tuple(out)


def execution_of(records: Records | SiteRecords) -> tuple[dict[int, np.ndarray], list[str]]:
    """Per site index, the execution of each of its steps in order (its unique steps'
    order), and the notes on how the sites were folded.

    With an `execution` column (a source that knows each record's program execution,
    e.g. a trace's `run_id`) that is the execution, numbered 0, 1, ... in order;
    else the sites are folded by their step counts (the module's docstring)."""
    run = by_site(records)
    per_site = run.site_steps()
    if run.has_execution:
        return _by_column(run, per_site)
    counts = {i: s.size for i, s in per_site.items() if s.size}
    fewest = min(counts.values())
    out: dict[int, np.ndarray] = {}
    folded, unfolded = [], []
    for i, n in counts.items():
        k = n // fewest if n % fewest == 0 else 1
        if n % fewest:
            unfolded.append(run.sites[i])
        elif k > 1:
            folded.append(f"`{run.sites[i]}` x{k}")
        out[i] = np.arange(n) // k
    notes = []
    if folded:
        notes.append(
            f"a step is one execution of the program: {', '.join(folded)} run several times "
            f"an execution (their step counts are that multiple of the fewest, {fewest}); "
            "their repeats are folded into one step."
        )
    if unfolded:
        notes.append(
            f"site(s) {', '.join(f'`{s}`' for s in unfolded)}: step counts not a multiple of "
            f"the fewest ({fewest}); their steps are taken as executions, not folded."
        )
    return out, notes


def _by_column(
    run: SiteRecords, per_site: dict[int, np.ndarray]
) -> tuple[dict[int, np.ndarray], list[str]]:
    """`execution_of` from the records' `execution` column."""
    uniq = run.executions()
    out: dict[int, np.ndarray] = {}
    folded = []
    for i, steps_u in per_site.items():
        if not steps_u.size:
            continue
        c = run.site(run.sites[i]).columns
        e = np.zeros(steps_u.size, np.int64)
        e[index_in(steps_u, c["step"])] = index_in(uniq, c["execution"])
        out[i] = e
        k = steps_u.size / max(np.unique(e).size, 1)
        if k > 1:
            folded.append(f"`{run.sites[i]}` x{k:.3g}")
    notes = []
    if folded:
        notes.append(
            f"a step is one execution of the program (the records' execution ids): "
            f"{', '.join(folded)} run several times an execution; their repeats are folded "
            "into one step."
        )
    return out, notes


def whole_step(
    records: Records | SiteRecords, visit: Callable[[str, Records, Any], None] | None = None
) -> tuple[SiteData, list[str], bool]:
    """The whole step's (execution x rank) `SiteData`; returns (data, notes, partial).

    With one site this is `site_data` of it. Raises `RecordsError` when no site has a
    step with records of two ranks. `visit(site, rows, grid)`, when given, is called with
    each site's rows as they are read, and where they sit in its (step x rank) grid (None
    when the site cannot be analyzed): the sites table's `stages.links.SiteTable.add`,
    so the run is read, and each site placed, once for both."""
    run = by_site(records)
    if len(run.sites) == 1 and (
        not run.has_execution or run.executions().size == run.site_steps()[0].size
    ):  # one site, once an execution: the site is the step
        return site_data(run.site(run.sites[0]), run.sites[0])
    gid_of, ranks, notes = _global_ranks(run)
    R = ranks.size
    exec_of, fold_notes = execution_of(run)
    notes += fold_notes
    E = max(int(e.max()) + 1 for e in exec_of.values() if e.size)
    a = _Sums.zeros(E, R)
    span = _Span(E, R)
    used, partial = _add_sites(run, exec_of, (gid_of, ranks), a, span, notes, visit)
    if not used:
        raise RecordsError(
            "no site has a step with records of two or more ranks; nothing to compare."
        )
    lat, wait, delay, sync, cnt, expected = a.lat, a.wait, a.delay, a.sync, a.cnt, a.expected
    ncoll, transfer, engaged, processes, hosts = (
        a.ncoll,
        a.transfer,
        a.engaged,
        a.processes,
        a.hosts,
    )
    keep = ncoll > 0
    lat, wait, delay, sync = _per_step(keep, cnt, ncoll, (lat, wait, delay, sync))
    if (cnt[keep] < expected[keep]).any():
        short = float(1.0 - cnt[keep].sum() / expected[keep].sum())
        notes.append(
            f"PARTIAL: {short:.2%} of the (collective, member rank) records of the whole "
            "step are missing; a rank's lateness in a step is its mean over the collectives "
            "it took part in times the step's collectives (never less late for a missing one)."
        )
        partial = True
    if (expected[keep] < ncoll[keep, None]).any():
        notes.append(
            "some ranks are not members of every collective of the step: a rank's lateness "
            "in a step is its mean over the collectives it took part in times the step's "
            "collectives, so ranks in fewer collectives compare on the same scale."
        )
    first, done, breaks = span.result(run, E)
    # Step numbers: executions in order, one number left out at a break (no step time
    # across a trace window's end).
    steps = (np.arange(E) + np.cumsum(breaks))[keep]
    first, done = first[keep], done[keep]
    step_time = np.full(done.shape, np.nan)
    step_time[1:] = done[1:] - done[:-1]
    step_time[1:][np.diff(steps) != 1] = np.nan
    # Time inside the step's collectives: their summed waits, at most the span from the
    # first arrival to the last exit (collectives that overlap each other count once).
    inside = np.fmin(wait, done - first)
    compute = step_time - inside
    arrive = done - inside
    data = SiteData(
        steps=steps,
        ranks=ranks,
        processes=processes,
        hosts=tuple(hosts),
        arrive=arrive,
        done=done,
        wait=wait,
        delay=delay,
        engaged=engaged[keep],
        compute=compute,
        step_time=step_time,
        transfer=transfer[keep],
        sync_wait=sync,
        lateness=lat,
    )
    return data, notes, partial


def _per_step(keep: np.ndarray, cnt: np.ndarray, ncoll: np.ndarray, sums) -> tuple:
    """Each (execution x rank) sum of `sums` over the executions `keep`, scaled to the
    execution's collectives (`ncoll`) from the rank's records (`cnt`), a missing cell
    filled (`fill_missing`). When every rank took part in every collective of every
    execution, each scale is exactly 1 and no cell is missing: the sums as they stand."""
    if keep.all() and (cnt == ncoll[:, None]).all():
        return tuple(sums)
    missing = (cnt == 0)[keep]
    scale = np.where(cnt > 0, ncoll[:, None] / np.maximum(cnt, 1), np.nan)[keep]
    return tuple(fill_missing(a[keep] * scale, missing) for a in sums)


@dataclasses.dataclass
class _Sums:
    """The whole step's sums over its sites, (execution x rank) or per execution."""

    lat: np.ndarray
    wait: np.ndarray
    delay: np.ndarray
    sync: np.ndarray
    cnt: np.ndarray  # records present
    expected: np.ndarray  # the sites' member ranks
    ncoll: np.ndarray  # collectives per execution
    transfer: np.ndarray
    engaged: np.ndarray
    processes: np.ndarray
    hosts: list
    # (E,): a count for every rank of an execution, added to `cnt` and `expected` when the
    # pass ends (`count_rows`): a site with every rank in every step adds one number an
    # execution, not one a cell.
    cnt_rows: np.ndarray
    expected_rows: np.ndarray

    @classmethod
    def zeros(cls, E: int, R: int) -> _Sums:
        z = lambda dtype=np.float64: np.zeros((E, R), dtype)  # noqa: E731
        # (The counts in int32, half the memory: exact, and every sum of them exact too.)
        return cls(z(), z(), z(), z(), z(np.int32), z(np.int32), np.zeros(E), np.zeros(E),
                   np.zeros(E, bool), np.full(R, -1, np.int64), ["?"] * R,
                   np.zeros(E, np.int32), np.zeros(E, np.int32))  # fmt: skip

    def count(self, acc: np.ndarray, rows: np.ndarray, e: np.ndarray, cols: np.ndarray) -> None:
        """`_add_cells(acc, e, cols, 1)`; where `cols` is every rank in order, one count per
        execution in `rows` (`cnt_rows` or `expected_rows`) instead."""
        if _every_column(acc, cols):
            np.add.at(rows, e, 1)
        else:
            _add_cells(acc, e, cols, 1)

    def count_rows(self) -> None:
        """Adds the per-execution counts to the per-cell ones (the pass has ended)."""
        for acc, rows in ((self.cnt, self.cnt_rows), (self.expected, self.expected_rows)):
            if rows.any():
                acc += rows[:, None]
            rows[:] = 0


def _add_sites(run: SiteRecords, exec_of, rank_map, a: _Sums, span: _Span, notes: list[str],
               visit=None):  # fmt: skip
    """Reads the sites one at a time: each one's arrivals and exits into `span`, and each
    one that is evidence into `a` (and every one to `visit`); returns (sites used, partial)."""
    partial, used = False, 0
    per_site = run.site_steps()
    # (Each site's rows fetched while the one before is worked on: `sites_in_order`. A
    # site's arrays are let go in `_add_site` and here before the next is fetched, so the
    # rows held are this site's and the next one's.)
    for si, (site, one) in enumerate(run.sites_in_order(run.sites)):
        u, p = _add_site(si, site, one, (exec_of, per_site), rank_map, a, span, notes, visit=visit)
        del one
        used, partial = used + u, partial | p
    a.count_rows()
    pool.release()  # (what the pool holds of the pass: not under the stages after it)
    return used, partial


def _add_site(si: int, site: str, one, folds, rank_map, a: _Sums, span: _Span, notes: list[str],
              *, visit=None) -> tuple[int, bool]:  # fmt: skip
    """`_add_sites` of site `si` (its rows `one`; `folds`: (`execution_of`'s map, each
    site's steps)): (1 when it is evidence, else 0; partial)."""
    exec_of, per_site = folds
    gid_of, ranks = rank_map
    c = one.columns
    gid = gid_of(c)
    try:
        d, site_notes, p, g = site_evidence_grid(one, site)
    except RecordsError as e:
        if si in exec_of:
            span.add(c, exec_of[si], per_site[si], index_in(ranks, gid))
        notes.append(f"`{site}` left out of the whole step: {e}")
        if visit is not None:
            visit(site, one, None)
        return 0, False
    if gid is c["rank"]:  # (global ranks: each of the site's ranks is its own id)
        cols = index_in(ranks, d.ranks)
    else:  # (each rank's id from its first row)
        local, first = first_of_each(c["rank"])
        cols = index_in(ranks, gid[first][index_in(local, d.ranks)])
    if si in exec_of and not span.add_placed(one, exec_of[si], per_site[si], g, cols):
        span.add(c, exec_of[si], per_site[si], index_in(ranks, gid))
    ctx = run_context(one, site, d)
    if ctx.invariant_over is not None or ctx.no_culprit is not None:
        why = ctx.no_culprit or f"its operand was already invariant over `{ctx.invariant_over}`"
        notes.append(f"`{site}` left out of the whole step: {why} (its waits are not evidence).")
        if visit is not None:
            visit(site, one, g)
        return 0, False
    notes.extend(n for n in site_notes if not n.startswith("PARTIAL"))
    e = exec_of[si][index_in(per_site[si], d.steps)]
    full = bool(g.present.all())
    sums = [(a.lat, d.lateness), (a.wait, d.wait), (a.sync, d.sync_wait)]
    if d.delay.any():  # (no delay at this site: its zeros add nothing)
        sums.append((a.delay, d.delay))
    for acc, x in sums:
        _add_cells(acc, e, cols, x if full else np.where(g.present, x, 0.0))
    if full:
        a.count(a.cnt, a.cnt_rows, e, cols)
    else:
        _add_cells(a.cnt, e, cols, g.present)
    a.count(a.expected, a.expected_rows, e, cols)  # the site's members
    np.add.at(a.ncoll, e, 1.0)
    np.add.at(a.transfer, e, np.nan_to_num(d.transfer))
    np.logical_or.at(a.engaged, e, d.engaged)
    a.processes[cols] = d.processes
    for j, h in zip(cols.tolist(), d.hosts, strict=True):
        a.hosts[j] = h
    if visit is not None:  # (after the sums: the site's lateness and sync wait let go)
        del d, sums, x
        visit(site, one, g)
    return 1, p


def _add_cells(acc: np.ndarray, e: np.ndarray, cols: np.ndarray, x: np.ndarray | float) -> None:
    """`np.add.at(acc, (e[:, None], cols[None, :]), x)` (`x` (E', C), or one number for
    every cell). When no execution and no column repeats, each cell gets one addition,
    the same sum by plain indexing (4x faster at 8192 ranks; whole rows when the columns
    are every rank in order)."""
    if np.unique(e).size != e.size or np.unique(cols).size != cols.size:
        np.add.at(acc, (e[:, None], cols[None, :]), x)
    elif _every_column(acc, cols):
        if e.size and e[-1] - e[0] == e.size - 1 and (np.diff(e) == 1).all():
            acc[e[0] : e[-1] + 1] += x  # (a range of rows: in place, no copy of them)
        else:
            acc[e] += x
    else:
        acc[np.ix_(e, cols)] += x


def _every_column(acc: np.ndarray, cols: np.ndarray) -> bool:
    """Whether `cols` is every column of `acc` in order (whole rows: no column index)."""
    return cols.size == acc.shape[1] and np.array_equal(cols, np.arange(cols.size))


def _global_ranks(run: SiteRecords):
    """`(gid_of, ranks, notes)`: a function giving each record of a site's columns its
    rank across the whole step, the sorted ranks, and a note when that is not `rank`.

    A site's `rank` is its position in the collective's group: global in jaxpace's
    records and traces, local to a communicator in NCCL Inspector's logs. When one
    `rank` stands for different (process, device) pairs at different sites, the ranks
    are local: the whole step numbers the (process, device) pairs in order instead."""
    keys = run.rank_keys()
    key = keys[1] * (1 << 32) + (keys[2] + 1)
    pairs = np.unique(np.stack([keys[0], key]), axis=1)
    uniq_rank = np.unique(keys[0])
    if uniq_rank.size == pairs.shape[1]:
        return (lambda c: c["rank"]), uniq_rank, []
    uniq = np.unique(key)

    def gid_of(c: dict[str, np.ndarray]) -> np.ndarray:
        dev = c["device"] if "device" in c else np.full(c["rank"].size, -1, np.int64)
        k = c["process"].astype(np.int64) * (1 << 32) + (dev.astype(np.int64) + 1)
        return np.searchsorted(uniq, k).astype(np.int64)

    return (
        gid_of,
        np.arange(uniq.size, dtype=np.int64),
        [
            "the sites number their ranks within each communicator: the whole step numbers "
            f"its {uniq.size} ranks by (process, device) in order; `site=` shows one "
            "communicator's own ranks."
        ],
    )


class _Span:
    """Each rank's first arrival and last exit in each execution, and the breaks between
    executions, accumulated a site at a time."""

    _HI, _LO = np.iinfo(np.int64).max, np.iinfo(np.int64).min

    def __init__(self, E: int, R: int) -> None:
        self.origin = np.full(R, self._HI)
        self.first = np.full((E, R), self._HI)
        self.done = np.full((E, R), self._LO)
        self.breaks = np.zeros(E, bool)

    def add(self, c: dict[str, np.ndarray], e: np.ndarray, steps_u: np.ndarray, col) -> None:
        """One site's rows: `e` the execution of each of its `steps_u`, `col` each row's
        rank column."""
        row = index_in(steps_u, c["step"])
        gap = np.flatnonzero(np.diff(steps_u) != 1) + 1  # first step after a gap
        self.breaks[e[gap]] = True
        placed = _place(row, col, steps_u.size) if row.size else None
        if placed is None:  # (a cell twice, or few cells filled: record by record)
            ex = e[row]
            np.minimum.at(self.origin, col, c["arrive_ns"])
            np.minimum.at(self.first, (ex, col), c["arrive_ns"])
            np.maximum.at(self.done, (ex, col), c["done_ns"])
            return
        at, missing, cols = placed
        arrive = _cells(c["arrive_ns"], at, missing, self._HI)
        self._add_grid(e, arrive, _cells(c["done_ns"], at, missing, self._LO), cols)

    def add_placed(self, one: Records, e: np.ndarray, steps_u: np.ndarray, g,
                   cols: np.ndarray) -> bool:  # fmt: skip
        """`add` of a site `one` its analysis placed on its (step x rank) grid `g`
        (`site_evidence_grid`'s), `cols` the grid's columns among all: the same sums
        without placing the rows again (`grid_column`: the columns as they stand when the
        rows are the cells in order). False (nothing added) when the grid is not on
        `steps_u` or its columns are not in order."""
        if not np.array_equal(g.steps_all, steps_u) or (
            cols.size > 1 and (np.diff(cols) <= 0).any()
        ):
            return False
        gap = np.flatnonzero(np.diff(steps_u) != 1) + 1  # first step after a gap
        self.breaks[e[gap]] = True
        arrive = grid_column(one, g, "arrive_ns", np.int64, self._HI)
        self._add_grid(e, arrive, grid_column(one, g, "done_ns", np.int64, self._LO), cols)
        return True

    def _add_grid(self, e, arrive, done, cols) -> None:
        """One site's arrivals and exits on an (S steps x C columns) grid, the extremes of
        int64 where a cell has no record; `cols` the grid's columns among all (distinct, in
        order)."""
        # Integer least and greatest: exact in any order, and the fill (the extreme of
        # int64) never wins over a record.
        self.origin[cols] = np.minimum(self.origin[cols], arrive.min(axis=0))
        ue, arrive, done = _by_execution(e, arrive, done)
        _merge(self.first, ue, cols, arrive, np.minimum)
        _merge(self.done, ue, cols, done, np.maximum)

    def result(self, run: SiteRecords, E: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(first arrival (E, R), last exit (E, R), breaks (E,)): seconds since each rank's
        own first arrival (NaN where it has no record); `breaks[e]`: some site's steps skip
        a number just before execution e (a trace window's end), so e does not follow
        e - 1."""
        breaks = self.breaks
        if run.has_execution:  # executions not recorded in between (a trace window's end)
            uniq = run.executions()
            breaks[1:] |= np.diff(uniq)[: E - 1] != 1
        o = self.origin[None, :]
        first_s = np.where(self.first == self._HI, np.nan, (self.first - o) / 1e9)
        done_s = np.where(self.done == self._LO, np.nan, (self.done - o) / 1e9)
        return first_s, done_s, breaks


def _place(row: np.ndarray, col: np.ndarray, S: int):
    """`(at, missing, cols)`: a site's records on an (S steps x its C columns) grid: `at`
    (S, C) the record in each cell (any where `missing`; `missing` None when every cell
    has one), `cols` (C,) the grid's columns among all. None when a cell has two records,
    or when the grid would be over 4 times the records (few cells filled)."""
    cols = int_unique(col)
    C = cols.size
    if S * C > 4 * row.size + 1024:
        return None
    flat = row * C
    flat += index_in(cols, col)
    at = np.full(S * C, -1, np.intp)
    at[flat] = np.arange(row.size)
    missing = at < 0
    n_missing = int(np.count_nonzero(missing))
    if at.size - n_missing < row.size:
        return None
    return at.reshape(S, C), missing.reshape(S, C) if n_missing else None, cols


def _cells(x: np.ndarray, at: np.ndarray, missing: np.ndarray | None, fill: int) -> np.ndarray:
    """Column `x` on `_place`'s grid, `fill` where a cell has no record."""
    out = x[at]
    if missing is not None:
        out[missing] = fill
    return out


def _by_execution(
    e: np.ndarray, least: np.ndarray, most: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(executions, least, most)`: the distinct executions `e` of the grids' rows (one per
    step), sorted, and per execution the least of `least`'s rows and the greatest of
    `most`'s (a site that runs k times an execution: k rows each)."""
    order = np.argsort(e, kind="stable")
    es = e[order]
    starts = np.flatnonzero(np.r_[True, es[1:] != es[:-1]])
    if starts.size == e.size and (order == np.arange(e.size)).all():
        return es, least, most  # (one step an execution, in order)
    if not (order == np.arange(e.size)).all():
        least, most = least[order], most[order]
    return (
        es[starts],
        np.minimum.reduceat(least, starts, axis=0),
        np.maximum.reduceat(most, starts, axis=0),
    )


def _merge(acc: np.ndarray, rows: np.ndarray, cols: np.ndarray, x: np.ndarray, op) -> None:
    """`acc[rows][:, cols] = op(that, x)`, for distinct `rows` and `cols` (whole rows, in
    place, when `cols` is every column in order)."""
    if cols.size == acc.shape[1] and cols[-1] == cols.size - 1:  # (distinct, sorted: 0..C-1)
        if rows.size and rows[-1] - rows[0] == rows.size - 1:  # (distinct, sorted: a range)
            part = acc[rows[0] : rows[-1] + 1]
            op(part, x, out=part)
        else:
            acc[rows] = op(acc[rows], x)
    else:
        idx = np.ix_(rows, cols)
        acc[idx] = op(acc[idx], x)
