"""Every site of a run: where the step's collective time goes, and who is late within a group.

A collective over some mesh axes runs as independent groups (an all-gather over `data` on a
(`data`, `model`) mesh is one group per `model` position), and `ppermute` is point to point:
ranks of different groups never wait for each other, so comparing their waits says nothing
about who was late. The records' header says, per site, which ranks run together
(`sites`: groups, and ppermute's (source, destination) pairs, docs/records.md); this stage
compares arrivals only within a group (the clock-free rule: within one collective, the rank
that spent the least time inside it arrived last) and names, per site:

- the latest rank of each group, when it is the latest in so many of the analyzed steps
  that chance (each of the group's ranks equally likely to be the latest) gives that
  count with probability below `ALPHA` (a binomial test), and the others lead it by a
  median above `MIN_LEAD_S` and above `REL_LEAD` of the site's step period (a test made
  for groups as small as two; the fleet-wide culprit test of `stages.culprit` compares a
  rank with the spread of many). A rank that is persistently a millisecond behind in a
  half-second step is real but costs the step under 1%: healthy devices differ by that
  much, and the table does not call it late;
- for `ppermute`, each pair's median wait of the destination (what it waited for its
  source, or the link), and the slowest pair when it stands out from the others.

Sites are listed in step order (the median, over ranks and steps, of each site's arrival
after its process's first arrival of that step: one process's own clock, so clock-free), so the
first site where a rank is late is where its lateness enters the step; later sites inherit it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from jaxpace.records import pool
from jaxpace.records.by_site import SiteRecords, by_site
from jaxpace.records.reader import Records
from jaxpace.records.site_data import (
    grid_column,
    group_columns,
    index_in,
    int_unique,
    rank_columns,
    site_info,
)
from jaxpace.report.model import GroupLate, LinkWait, SiteRow
from jaxpace.report.render.text import format_ms

__all__ = [
    "GroupLate",
    "LinkWait",
    "SiteRow",
    "SiteTable",
    "format_site_table",
    "group_columns",
    "late_text",
    "rank_columns",
    "site_info",
    "site_table",
    "site_table_notes",
]

ALPHA = 1e-3  # per site and group, as `stages.culprit`'s culprit test
MIN_LEAD_S = 1e-3
REL_LEAD = 0.02  # of the site's median step period: below it a lead is the fleet's own spread


def _grid(recs: Records, k: int, warmup_steps: int, placed=None) -> tuple[np.ndarray, ...]:
    """`(steps, ranks, wait[S, R], arrive_ns[S, R], process[S, R])` of site `k`: its steps
    with two or more ranks after the first `warmup_steps` (at most a quarter of them).

    As in the site's own analysis (`stages.site_data`), a rank missing from a step is
    neither late nor early there: its wait is the step's median over the ranks present;
    its arrival is NaN and its process -1 (left out of the step order). `placed`: the
    site's (step x rank) grid as its own analysis placed `recs` (`site_data_grid`'s, of
    records of this site alone), not placed again."""
    c = recs.columns
    sel = c["site"] == k
    c = (
        c
        if sel.all()
        else {x: c[x][sel] for x in ("step", "rank", "wait_ns", "arrive_ns", "process")}
    )
    if placed is not None:  # (its analysis placed the waits and processes too)
        steps, ranks, wait, proc = placed.steps_all, placed.ranks, placed.wait_s, placed.process
        arrive = grid_column(recs, placed, "arrive_ns", np.float64, np.nan)
    else:
        steps, ranks = int_unique(c["step"]), int_unique(c["rank"])
        flat = index_in(steps, c["step"]) * ranks.size + index_in(ranks, c["rank"])
        wait = np.full((steps.size, ranks.size), np.nan)
        arrive = np.full((steps.size, ranks.size), np.nan)
        proc = np.full((steps.size, ranks.size), -1, np.int64)
        wait.reshape(-1)[flat] = c["wait_ns"] / 1e9
        arrive.reshape(-1)[flat] = c["arrive_ns"]
        proc.reshape(-1)[flat] = c["process"]
    if placed is not None:  # (the steps with two or more ranks: the analysis' own)
        keep = placed.complete.copy()
    else:
        keep = (~np.isnan(wait)).sum(axis=1) >= min(2, ranks.size)
    keep[: min(warmup_steps, steps.size // 4, keep.size)] = False
    rows = np.flatnonzero(keep)
    if rows.size and rows[-1] - rows[0] == rows.size - 1:  # (a run of steps: views)
        keep = slice(int(rows[0]), int(rows[-1]) + 1)
    wait = wait[keep]
    missing = np.isnan(wait)
    if missing.any():
        med = np.nanmedian(wait, axis=1)
        wait = np.where(missing, med[:, None], wait)
    return steps[keep], ranks, wait, arrive[keep], proc[keep]


def _period_s(steps: np.ndarray, arrive_ns: np.ndarray) -> float:
    """The site's median step period in seconds: per rank, its arrival's advance per step
    between consecutive analyzed steps (its own clock), the median over ranks and steps."""
    if steps.size < 2:
        return math.nan
    per_step = np.subtract(  # (`np.diff`, into the pool's memory)
        arrive_ns[1:], arrive_ns[:-1], out=pool.empty((steps.size - 1, arrive_ns.shape[1]))
    )
    gaps = np.diff(steps)
    if (gaps != 1).any():  # (x / 1 is x: divided only where steps were skipped)
        per_step /= gaps[:, None]
    per_step /= 1e9
    # (`> 0` is False for NaN, a missing rank's; an arrival is never infinite)
    keep = per_step > 0
    per_step = per_step.reshape(-1) if keep.all() else per_step[keep]
    return _median(per_step) if per_step.size else math.nan


# A median over at least this many values is found by `_median`'s band (else `np.median`).
_BAND_MEDIAN_MIN = 1 << 16


def _median(x: np.ndarray) -> float:
    """`float(np.median(x))`, the same value (a zero's sign aside: the callers' values are
    never -0.0), of a large array in about a quarter of the time (8.2M values: 23 ms).

    The middle values lie, with overwhelming probability, within a narrow band of a sorted
    sample of `x` (64k values, a band of four standard deviations of the sample's middle
    rank each side); one pass counts the values below it and keeps the few within it,
    and those are partitioned; a band of one value (ties at the middle, as clocks of coarse
    resolution give) is the median when its count spans the middle. Where the band misses
    the middle, or `x` holds NaN (a value neither below, within nor above the band),
    `np.median` decides. `x` may be reordered (as with `overwrite_input`)."""
    n = x.size
    if n < _BAND_MEDIAN_MIN:
        return float(np.median(x, overwrite_input=True))
    k0, k1 = (n - 1) // 2, n // 2
    sample = np.sort(x[:: n // (_BAND_MEDIAN_MIN // 2)])
    m = sample.size
    d = 2 * math.isqrt(m) + 2  # (4 standard deviations of a binomial(m, 1/2) rank: 2 sqrt(m))
    lo, hi = sample[max(m // 2 - d, 0)], sample[min(m // 2 + d, m - 1)]
    below = int(np.count_nonzero(x < lo))
    if lo == hi:  # (the band one value, tied: its count decides, no copy of the band)
        upto = int(np.count_nonzero(x <= hi))
        if below <= k0 and k1 < upto and upto + int(np.count_nonzero(x > hi)) == n:
            return float(lo)
    band = x[(x >= lo) & (x <= hi)]
    above = int(np.count_nonzero(x > hi))
    if below + band.size + above != n or not below <= k0 or not k1 < below + band.size:
        return float(np.median(x, overwrite_input=True))
    band.partition((k0 - below, k1 - below))
    # (np.median's own last step: the mean of the middle one or two)
    return float(np.mean(band[k0 - below : k1 - below + 1]))


def _late_in_groups(
    wait: np.ndarray,
    ranks: np.ndarray,
    groups: tuple[tuple[int, ...], ...],
    min_lead_s: float = MIN_LEAD_S,
) -> tuple[GroupLate, ...]:
    """The named latest rank of each group (`_late_of_size`), in the groups' order."""
    cols, gid = group_columns(groups, ranks)
    sizes = np.bincount(gid, minlength=len(groups))
    found: list[tuple[int, GroupLate]] = []
    if wait.shape[0] == 0:
        return ()
    for m in np.unique(sizes[sizes >= 2]).tolist():
        which = np.flatnonzero(sizes == m)
        members = cols[np.isin(gid, which)].reshape(which.size, m)  # gid is sorted
        late = _late_of_size(wait, ranks, members, min_lead_s)
        found += zip(which.tolist(), late, strict=True)
    return tuple(x for _, x in sorted(found, key=lambda t: t[0]) if x is not None)


def _late_of_size(
    wait: np.ndarray, ranks: np.ndarray, members: np.ndarray, min_lead_s: float = MIN_LEAD_S
) -> list:
    """Per group (one row of `members`: G groups x m columns), its `GroupLate` or None.

    The rank latest in most steps (least time inside: arrived last); its lead is the median
    over the group's other ranks of their wait minus its wait, its median over steps must
    exceed `min_lead_s` and its count of latest steps be unlikely by chance (`ALPHA`).
    """
    G, m = members.shape
    n = wait.shape[0]
    if members.size == wait.shape[1] and (members.reshape(-1) == np.arange(members.size)).all():
        w = wait.reshape(n, G, m)  # (every rank, in order: no copy)
    else:
        w = wait[:, members]  # (n, G, m)
    latest = np.argmin(w, axis=2)
    # How often each member is the latest: (G, m), a count per (group, member).
    counts = np.bincount((latest + m * np.arange(G)).reshape(-1), minlength=G * m).reshape(G, m)
    j = np.argmax(counts, axis=1)
    g = np.arange(G)
    wj = w[:, g, j]
    others = pool.empty(w.shape)
    np.copyto(others, w)
    others[:, g, j] = np.inf
    lo, hi = (m - 2) // 2, (m - 1) // 2
    # The m - 1 others' middle two (the median), in place: the upper by a partition at
    # it, the lower (when m - 1 is even) the greatest before it. (One partition: NumPy's
    # with two places takes several times as long, 94 ms against 12 ms at 995 x 8192.)
    others.partition(hi, axis=2)
    upper = others[:, :, hi]
    lower = upper if lo == hi else others[:, :, :hi].max(axis=2)
    lead = (lower + upper) / 2 - wj
    med = np.median(lead, axis=0)
    out: list[GroupLate | None] = [None] * G
    for i in np.flatnonzero(med > min_lead_s).tolist():
        k = int(counts[i, j[i]])
        p = _binomial_tail(n, k, 1.0 / m)
        if p < ALPHA:
            group = tuple(int(r) for r in ranks[members[i]])
            out[i] = GroupLate(group[j[i]], group, float(med[i]), k / n, p)
    return out


def _binomial_tail(n: int, k: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): how often a rank is the latest by chance."""
    try:
        return float(sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1)))
    except OverflowError:  # n beyond about a thousand: the same sum in logarithms
        lc = math.lgamma(n + 1)
        terms = (
            lc - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p)
            + (n - i) * math.log1p(-p)
            for i in range(k, n + 1)
        )  # fmt: skip
        return float(sum(math.exp(t) for t in terms))


def _links(wait: np.ndarray, ranks: np.ndarray, pairs) -> tuple[list[LinkWait], LinkWait | None]:
    pairs = np.asarray(pairs or [], np.int64).reshape(-1, 2)
    cols, ok = rank_columns(ranks, pairs[:, 1])
    med = np.median(wait[:, cols], axis=0) if wait.shape[0] else np.full(cols.size, np.nan)
    out = [
        LinkWait(int(s), int(d), float(w))
        for (s, d), w in zip(pairs[ok].tolist(), med.tolist(), strict=True)
    ]
    if len(out) < 2:
        return out, None
    worst = max(out, key=lambda lw: lw.wait_s)
    rest = np.median([lw.wait_s for lw in out if lw is not worst])
    slow = worst if worst.wait_s > max(MIN_LEAD_S, 3 * rest) else None
    return out, slow


class _StepOrder:
    """Per site, the median (seconds) over its ranks and steps of its arrival after its
    process's first arrival of that step at any site (keyed by process: one clock; ranks of
    different sites may be different devices). The first arrivals are asked of the records
    first (`SiteRecords.first_arrivals` over each site's analyzed steps, as `_grid` picks
    them), so each site is read once."""

    _last_table: tuple[np.ndarray, int, np.ndarray] | None = None  # (`_table`'s)

    def __init__(self, run: SiteRecords, warmup_steps: int) -> None:
        kept = {}
        for i, (steps, n, ranks) in run.step_ranks().items():
            keep = n >= min(2, ranks)
            keep[: min(warmup_steps, steps.size // 4, keep.size)] = False
            kept[i] = steps[keep]
        self.keys, self.first = run.first_arrivals(kept)

    def order(self, g: tuple[np.ndarray, ...]) -> float:
        ok = g[4] >= 0  # (a rank missing from a step: left out)
        if not ok.any():
            return math.nan
        every = bool(ok.all())
        if every and (diff := self._after_first_by_process(g[0], g[3], g[4])) is not None:
            return _median(diff.reshape(-1)) / 1e9
        first = self._first_of(g[0], g[4], every)
        if first is not None:
            diff = np.subtract(g[3], first, out=first)  # (`first` is new: reordered below)
            return _median(diff.reshape(-1) if every else diff[ok]) / 1e9
        key = np.broadcast_to(g[0][:, None], g[4].shape)[ok].astype(np.int64) * (1 << 32)
        first = self.first[np.searchsorted(self.keys, key + g[4][ok])]
        return float(np.median(g[3][ok] - first)) / 1e9

    def _table(self, steps: np.ndarray, P: int, cells: int) -> np.ndarray | None:
        """The first arrival of each (step, process < P), (S, P), NaN where none; the last
        one kept (the sites of a run mostly share their analyzed steps). Read-only. None
        when the processes are too many for a table beside a site of `cells` cells."""
        if steps.size * P > 4 * cells + 1024:
            return None
        last = self._last_table
        if last is not None and last[1] == P and np.array_equal(last[0], steps):
            return last[2]
        kstep, kproc = self.keys >> 32, self.keys & ((1 << 32) - 1)
        row = np.searchsorted(steps, kstep).clip(0, max(steps.size - 1, 0))
        mine = (steps[row] == kstep) & (kproc < P)
        table = np.full((steps.size, P), np.nan)
        table[row[mine], kproc[mine]] = self.first[mine]
        table.flags.writeable = False
        self._last_table = (steps.copy(), P, table)
        return table

    def _after_first_by_process(self, steps, arrive, proc) -> np.ndarray | None:
        """`arrive` minus its (step, process)'s first arrival, every cell present, when each
        rank is in one process and each process's ranks are adjacent, as many of them each
        (a job's layout): each step's row a (process x its ranks) block, minus the
        process's first arrival broadcast over its ranks (no gather of a first per cell).
        None otherwise, or where a (step, process) has no first arrival (as `_first_of`)."""
        of_rank = proc[0]
        if not (proc == of_rank).all():
            return None
        R = of_rank.size
        m = int(np.argmax(of_rank != of_rank[0])) or R  # (the first process's ranks)
        if R % m or not (of_rank.reshape(-1, m) == of_rank[::m, None]).all():
            return None
        table = self._table(steps, int(of_rank.max()) + 1, proc.size)
        if table is None:
            return None
        firsts = table[:, of_rank[::m]]  # (S, R // m)
        if np.isnan(firsts).any():
            return None
        out = pool.empty(arrive.shape).reshape(steps.size, -1, m)
        return np.subtract(arrive.reshape(out.shape), firsts[:, :, None], out=out)

    def _first_of(self, steps: np.ndarray, proc: np.ndarray, every: bool) -> np.ndarray | None:
        """The first arrival of each cell's (step, process), (S, R), by a (step x process)
        table of `first` (a lookup per cell instead of a search in `keys`); None when the
        processes are too many for a table or a cell's key is not in `keys` (the caller
        searches then, as it always did). `every`: no cell is missing (no process -1)."""
        table = self._table(steps, int(proc.max()) + 1, proc.size)
        if table is None:
            return None
        of_rank = proc.max(axis=0)
        same = proc == of_rank
        if same.all() if every else (same | (proc < 0)).all():  # (a rank in one process)
            out = np.take(table, of_rank, axis=1, out=pool.empty(proc.shape), mode="clip")
        else:
            out = table[np.arange(steps.size)[:, None], proc]  # (-1: the last column)
        return out if not np.isnan(out if every else out[proc >= 0]).any() else None


def _min_lead(steps: np.ndarray, arrive_ns: np.ndarray) -> float:
    """The lead a site's latest rank must exceed: `MIN_LEAD_S`, or `REL_LEAD` of the step."""
    period = _period_s(steps, arrive_ns)
    return max(MIN_LEAD_S, REL_LEAD * period) if math.isfinite(period) else MIN_LEAD_S


class SiteTable:
    """`site_table` built a site at a time: `add` each site's rows as they are read (the
    whole step's pass over the sites, `stages.whole.whole_step(visit=...)`), then `rows`
    reads the sites not added, so a run is read once for both."""

    def __init__(self, recs: Records | SiteRecords, warmup_steps: int = 5) -> None:
        self.run = by_site(recs)
        self.warmup_steps = warmup_steps
        self.info = site_info(self.run)
        self.step_order = _StepOrder(self.run, warmup_steps)
        self.done: dict[str, SiteRow] = {}

    def add(self, name: str, one: Records, placed=None) -> None:
        """Site `name`'s row from its records `one` (`SiteRecords.site(name)`); `placed`:
        where they sit in the site's grid, when its analysis placed them (`_grid`)."""
        steps, ranks, wait, arrive, proc = _grid(one, 0, self.warmup_steps, placed)
        mean = float(np.median(wait.mean(axis=1))) if wait.size else math.nan
        meta = self.info.get(name, {})
        groups = tuple(tuple(int(r) for r in g) for g in meta.get("groups") or [ranks.tolist()])
        links, slow = _links(wait, ranks, meta.get("pairs"))
        self.done[name] = SiteRow(
            site=name,
            kind=meta.get("kind"),
            groups=groups,
            steps=int(steps.size),
            wait_s=mean,
            share=math.nan,
            order_s=self.step_order.order((steps, ranks, wait, arrive, proc)),
            late=_late_in_groups(wait, ranks, groups, _min_lead(steps, arrive)),
            links=tuple(links),
            slow_link=slow,
        )

    def rows(self) -> list[SiteRow]:
        """Every site's row (the sites not added read now), in step order."""
        for name in self.run.sites:
            if name not in self.done:
                self.add(name, self.run.site(name))
        rows = [self.done[name] for name in self.run.sites]
        total = float(np.nansum([r.wait_s for r in rows]))
        rows = [
            dataclasses.replace(r, share=r.wait_s / total if total > 0 else math.nan) for r in rows
        ]
        return sorted(rows, key=lambda r: (math.isnan(r.order_s), r.order_s))


def site_table(recs: Records | SiteRecords, warmup_steps: int = 5) -> list[SiteRow]:
    """One `SiteRow` per site of `recs`, in step order (see the module docstring).

    Vectorized over steps, ranks and groups (a few array passes per site), so it scales
    with the records, not with a Python loop over them; the sites are read one at a time
    (`records.by_site`), once each (`SiteTable`: also while the whole step reads them).

    Args:
      recs: the run's records (`jaxpace.report.load_records`), or `SiteRecords`.
      warmup_steps: steps skipped at the start of each site (at most a quarter of them).

    Returns:
      The rows, earliest site in the step first.
    """
    return SiteTable(recs, warmup_steps).rows()


def late_text(
    row: SiteRow, members: Callable[[Sequence[int]], str] = lambda g: str(list(g))
) -> str:
    """Who is late at `row`'s site: the latest rank of each group (its members as
    `members` writes them; default every rank), then ppermute's slow pair."""
    late = ", ".join(
        f"rank {g.rank} by {format_ms(g.lead_s)} in {members(g.group)}" for g in row.late
    )
    if row.slow_link is not None:
        lw = row.slow_link
        late = (late + "; " if late else "") + (
            f"slow pair {lw.source}->{lw.destination}: waits {format_ms(lw.wait_s)}"
        )
    return late or "-"


def site_table_notes(rows: list[SiteRow]) -> list[str]:
    """The lines under the table: groups are compared within, and the first late site."""
    lines = []
    if rows and all(math.isnan(r.order_s) for r in rows):
        lines.append("No arrival times in these records: the sites are in the records' order.")
    if any(len(r.groups) > 1 for r in rows):
        lines.append(
            "Ranks of different groups never wait for each other: this table, and the "
            "culprit ranking of a site with groups, compare arrivals within each group."
        )
    first = next((r for r in rows if r.late or r.slow_link), None)
    if first is not None:
        who = (
            f"rank {first.late[0].rank}"
            if first.late
            else f"the pair {first.slow_link.source}->{first.slow_link.destination}"
        )
        lines.append(
            f"First late in the step: {who} at `{first.site}` ({first.kind}); sites after it "
            "can inherit that lateness through the collectives between them."
        )
    return lines


def format_site_table(rows: list[SiteRow]) -> str:
    """The rows as plain text: one line per site, then who is late where."""
    lines = [
        "Sites, in step order (waits: median over steps of the mean over ranks)",
        f"{'site':<16} {'collective':<13} {'groups':>6} {'wait':>9} {'share':>6}  latest in group",
    ]
    for r in rows:
        lines.append(
            f"{r.site:<16} {r.kind or '?':<13} {len(r.groups):>6} "
            f"{format_ms(r.wait_s):>9} {r.share:>6.0%}  {late_text(r)}"
        )
    return "\n".join(lines + site_table_notes(rows))
