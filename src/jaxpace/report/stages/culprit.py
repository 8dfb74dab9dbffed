"""Stage 3: rank the ranks by culpability; name persistent culprits and late groups.

A rank is a *culprit* when its excess lateness is significantly above that of
the typical rank after correcting for testing every rank (Holm, family-wise
error `ALPHA`), and above the noise floor. How often it arrives last does not
decide: among thousands of ranks, the per-step maximum of the others' jitter
beats a modest but persistent lead most of the time. Groups of ranks (host,
NUMA, NIC, leaf switch, process) are tested the same way on their members'
mean lateness against the other ranks'; a group is *late* when it is
significant, its typical member (not one culprit inside it) is above the noise
floor, and then its late members are explained by the group.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

from jaxpace.report.model import GroupFinding, IterationStats, RankStats, SiteData
from jaxpace.report.stages.stats import (
    batch_means_se,
    col_mean,
    holm,
    median_of_others,
    robust_std,
    t95,
    t_sf,
)
from jaxpace.report.stages.steps import StepSelection
from jaxpace.report.text import ranges

__all__ = ["ALPHA", "CulpritRanking", "late_groups", "noise_floor", "rank_culprits"]

# Family-wise error rate of one report: the chance, on a healthy run, that any
# rank or group is named (each family corrected by Holm's method).
ALPHA = 1e-3


@dataclasses.dataclass(frozen=True)
class CulpritRanking:
    """Who arrives late, by how much, and whether a rank, process or group is to blame.

    Indices (`order`, `culprit_index`, `culprit_indices`) are positions in `SiteData.ranks`.
    """

    rank_stats: tuple[RankStats, ...]
    ranking: tuple[int, ...]  # rank ids, most culpable first
    order: tuple[int, ...]  # the same as indices
    last_fraction: np.ndarray  # (R,)
    late: np.ndarray  # (R,) bool: significant and above the noise floor
    noise_floor_s: float
    culprit_index: int | None
    culprit: int | None
    culprit_process: int | None
    notes: tuple[str, ...]
    culprit_indices: tuple[int, ...] = ()  # every individual culprit, latest first
    groups: tuple[GroupFinding, ...] = ()  # late groups (any kind), most significant first
    excess: np.ndarray | None = None  # (n, R) per-step excess lateness of the analyzed steps

    @property
    def culprits(self) -> tuple[int, ...]:
        """Rank ids of every individual culprit, latest first."""
        return tuple(self.rank_stats[i].rank for i in self.culprit_indices)


def noise_floor(excess: np.ndarray, p50_s: float) -> float:
    """Excess lateness below this is not called late: max(20 us, 1% of p50, MAD term)."""
    terms = [20e-6]
    if math.isfinite(p50_s):
        terms.append(0.01 * p50_s)
    if excess.shape[0] > 1:
        terms.append(0.25 * float(np.median(robust_std(excess, axis=0))))
    return max(terms)


def _significance(excess: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per rank: (d, se, z, p): excess over the median rank, its error, t statistic, p-value.

    `d_i` = mean excess of rank i minus the median over ranks of the mean
    excess (so a heavy tail shared by every rank cancels). Its variance is the
    batch-means error of rank i, plus the between-rank spread that healthy
    ranks show (static speed differences; estimated robustly, so a few
    culprits do not inflate it), plus the error of the median itself.
    """
    n, R = excess.shape
    m = excess.mean(axis=0)
    d = m - np.median(m)
    se, df = batch_means_se(excess)
    if df < 1 or R < 2:
        return d, se, np.zeros(R), np.ones(R)
    se2 = se**2
    med_se2 = float(np.median(se2))
    tau2 = max(float(robust_std(d)) ** 2 - med_se2, 0.0)
    var = se2 + tau2 + 1.571 * med_se2 / R
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(var > 0, d / np.sqrt(var), np.where(d > 0, np.inf, 0.0))
    return d, np.sqrt(var), z, t_sf(z, df)


def _last_arrival_p(last: np.ndarray, R: int, n: int) -> np.ndarray:
    """Per rank, the one-sided p-value that it is last more often than chance (1/R).

    The indicator "rank i arrived last" is averaged in batches of consecutive
    steps (as for the mean excess), so an episode that keeps one rank last for
    several steps widens the error instead of faking persistence.
    """
    if n < 2 or R < 2:
        return np.ones(R)
    hits = np.zeros((n, R))
    hits[np.arange(n), last] = 1.0
    se, df = batch_means_se(hits)
    if df < 1:
        return np.ones(R)
    # A floor on the error: the binomial one of a rank last by chance.
    se = np.maximum(se, math.sqrt((1.0 / R) * (1.0 - 1.0 / R) / n))
    return t_sf((hits.mean(axis=0) - 1.0 / R) / se, df)


def rank_culprits(
    data: SiteData,
    sel: StepSelection,
    iteration: IterationStats,
    groups: Mapping[str, Mapping[int, str]] | None = None,
) -> CulpritRanking:
    """Per-rank statistics, the ranking, culprits and late groups.

    Args:
      data, sel, iteration: the earlier stages' results.
      groups: `{kind: {rank: label}}` to test as groups (see `normalize_groups`);
        processes with several ranks are always tested.
    """
    rows, n, R = sel.rows, sel.n, data.ranks.size
    wait, lat = data.wait[rows], data.lateness[rows]
    last = np.argmin(wait, axis=1) if n else np.zeros(0, int)
    last_fraction = np.bincount(last, minlength=R) / max(n, 1)
    excess = lat - median_of_others(lat) if n else np.zeros((0, R))
    ex_mean = excess.mean(axis=0) if n else np.zeros(R)
    ex_std = excess.std(axis=0, ddof=1) if n > 1 else np.zeros(R)
    half = t95(n - 1) * ex_std / math.sqrt(n) if n > 1 else np.full(R, math.inf)
    ci_low, ci_high = ex_mean - half, ex_mean + half
    floor = noise_floor(excess, iteration.p50_s) if n else 20e-6
    if n >= 2 and R >= 2:
        d, _, z, p = _significance(excess)
    else:
        d, z, p = np.zeros(R), np.zeros(R), np.ones(R)
    # Two tests, each Holm-corrected over every rank: mean excess lateness
    # (scales to thousands of ranks) and how often a rank arrives last beyond
    # the 1/R of chance (decisive at a few ranks, where heavy-tailed noise
    # inflates the mean's error but the straggler is last step after step).
    p_adj = np.minimum(holm(p), holm(_last_arrival_p(last, R, n)))
    late = (p_adj < ALPHA) & (d > floor)
    order = sorted(range(R), key=lambda i: (not late[i], -ex_mean[i], int(data.ranks[i])))
    found = late_groups(data, lat, groups or {}, floor) if n >= 2 else ()
    explained = np.zeros(R, bool)
    for g in found:
        explained[np.isin(data.ranks, g.ranks)] = True
    individual = [i for i in order if late[i] and not explained[i]]
    individual.sort(key=lambda i: (-d[i], int(data.ranks[i])))
    rank_stats = _rank_stats(
        data, sel, lat, last_fraction, ex_mean, ci_low, ci_high, late, z, p_adj
    )
    culprit_i = individual[0] if individual else None
    culprit_process = int(data.processes[culprit_i]) if culprit_i is not None else None
    notes: list[str] = []
    if culprit_i is None:
        proc = next((g for g in found if g.kind == "process"), None)
        if proc is not None:
            members = np.flatnonzero(np.isin(data.ranks, proc.ranks))
            culprit_i = int(members[np.argmax(d[members])])
            culprit_process = int(proc.label)
            pl = float(np.isin(last, members).mean()) if n else 0.0
            notes.append(
                f"process {proc.label} is last in {pl:.0%} of steps: its ranks "
                f"{ranges(data.ranks[members])} are late together."
            )
    return CulpritRanking(
        rank_stats=rank_stats,
        ranking=tuple(int(data.ranks[i]) for i in order),
        order=tuple(order),
        last_fraction=last_fraction,
        late=late,
        noise_floor_s=float(floor),
        culprit_index=culprit_i,
        culprit=int(data.ranks[culprit_i]) if culprit_i is not None else None,
        culprit_process=culprit_process,
        notes=tuple(notes),
        culprit_indices=tuple(individual),
        groups=found,
        excess=excess,
    )


def _rank_stats(data, sel, lat, last_fraction, ex_mean, ci_low, ci_high, late, z, p_adj):
    rows, n, R = sel.rows, sel.n, data.ranks.size
    mean_compute = col_mean(sel.compute, R)
    mean_delay = col_mean(data.delay[rows], R)
    mean_sync = col_mean(data.sync_wait[rows], R)
    mean_lat = col_mean(lat, R)
    mean_transfer = float(data.transfer[rows].mean()) if n else math.nan
    return tuple(
        RankStats(
            rank=int(data.ranks[i]),
            process=int(data.processes[i]),
            host=data.hosts[i],
            last_fraction=float(last_fraction[i]),
            mean_lateness_s=float(mean_lat[i]),
            excess_lateness_s=float(ex_mean[i]),
            ci_low_s=float(ci_low[i]),
            ci_high_s=float(ci_high[i]),
            compute_s=float(mean_compute[i]),
            delay_s=float(mean_delay[i]),
            sync_wait_s=float(mean_sync[i]),
            transfer_s=mean_transfer,
            late=bool(late[i]),
            z=float(z[i]),
            p_adjusted=float(p_adj[i]),
        )
        for i in range(R)
    )


def _partitions(
    data: SiteData, groups: Mapping[str, Mapping[int, str]]
) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(kind, labels, codes per rank) of each testable grouping; processes first, no duplicates."""
    out: list[tuple[str, np.ndarray, np.ndarray]] = []
    seen: list[np.ndarray] = []
    kinds: list[tuple[str, list]] = [("process", [str(int(p)) for p in data.processes])]
    for kind, mapping in sorted(groups.items()):
        labels = [mapping.get(int(r)) for r in data.ranks]
        if any(lbl is None for lbl in labels):
            continue
        kinds.append((str(kind), [str(x) for x in labels]))
    for kind, labels in kinds:
        names, codes = np.unique(np.asarray(labels, dtype=object).astype(str), return_inverse=True)
        sizes = np.bincount(codes, minlength=names.size)
        if names.size < 2 or sizes.max() < 2:
            continue
        # Canonical form of the partition: the first rank index of each rank's group.
        first = np.full(names.size, -1)
        first[codes[::-1]] = np.arange(codes.size)[::-1]
        canon = first[codes]
        if any(np.array_equal(canon, s) for s in seen):
            continue
        seen.append(canon)
        out.append((kind, names, codes))
    return out


def late_groups(
    data: SiteData,
    lateness: np.ndarray,
    groups: Mapping[str, Mapping[int, str]],
    floor: float,
) -> tuple[GroupFinding, ...]:
    """Groups whose ranks are late together, most significant first (see the module docstring).

    Per grouping kind and group g, per step: the mean lateness of g's members
    minus that of the other ranks (`lateness`: analyzed steps x ranks). Its mean over steps is tested with a
    batch-means t statistic, Holm-corrected over every group of every kind. A
    significant group is late when its median member is later than the median
    non-member by more than `floor` and more than half its members are.
    """
    excess = lateness
    n, R = excess.shape
    parts = _partitions(data, groups)
    cands: list[tuple[int, str, str, np.ndarray, float, float, float, float]] = []
    p_all: list[float] = []
    m_rank = excess.mean(axis=0)
    total = excess.sum(axis=1, keepdims=True)
    # Healthy ranks differ persistently too (static speed spread): a group mean of k
    # such ranks varies by tau^2 / k around the others' mean, on top of step noise.
    # tau is estimated inside the groups of each kind, so late groups do not inflate it.
    se_rank, _ = batch_means_se(excess)
    med_se2 = float(np.median(se_rank**2)) if np.isfinite(se_rank).all() else 0.0
    for kind, names, codes in parts:
        G = names.size
        order = np.argsort(codes, kind="stable")
        sizes = np.bincount(codes, minlength=G)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        sums = np.add.reduceat(excess[:, order], starts, axis=1)  # (n, G)
        rest = np.maximum(R - sizes, 1)
        diff = sums / sizes - (total - sums) / rest
        eff = diff.mean(axis=0)
        se, df = batch_means_se(diff)
        if df < 1:
            continue
        resid = m_rank - (np.bincount(codes, m_rank, G) / sizes)[codes]
        inflate = float(np.mean(sizes[codes] / np.maximum(sizes[codes] - 1, 1)))
        tau2 = max(float(robust_std(resid)) ** 2 * inflate - med_se2, 0.0)
        se = np.sqrt(se**2 + tau2 * (1.0 / sizes + 1.0 / rest))
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(se > 0, eff / se, np.where(eff > 0, np.inf, 0.0))
        p = t_sf(t, df)
        p_all.extend(p.tolist())  # every group of every kind counts towards the correction
        base = len(p_all) - G
        for g in np.flatnonzero((eff > floor) & (p < ALPHA)):
            members = codes == g
            if members.all():
                continue
            ref = np.median(m_rank[~members])
            typical = float(np.median(m_rank[members]) - ref)
            share = float(np.mean(m_rank[members] - ref > floor))
            members = (members, members & (m_rank - ref > floor))
            cands.append(
                (base + int(g), kind, str(names[g]), members, float(eff[g]), float(se[g]),
                 typical, share)
            )  # fmt: skip
    if not cands:
        return ()
    p_adj = holm(np.array(p_all))
    out = []
    for i, kind, label, (members, late_m), eff, se, typical, share in cands:
        if p_adj[i] >= ALPHA or typical <= floor or share <= 0.5:
            continue
        hosts = sorted({data.hosts[j] for j in np.flatnonzero(members)})
        out.append(
            GroupFinding(
                kind=kind,
                label=label,
                ranks=tuple(int(r) for r in data.ranks[members]),
                hosts=tuple(hosts),
                excess_lateness_s=eff,
                typical_member_s=typical,
                ci_low_s=eff - 1.96 * se,
                ci_high_s=eff + 1.96 * se,
                z=eff / se if se > 0 else math.inf,
                p_adjusted=float(p_adj[i]),
                late_ranks=tuple(int(r) for r in data.ranks[late_m]),
            )
        )
    out = _nested(out)
    out.sort(key=lambda g: (g.p_adjusted, -g.excess_lateness_s))
    return tuple(out)


def _nested(found: list[GroupFinding]) -> list[GroupFinding]:
    """Of two late groups where one holds the other, keeps the one that explains the lateness.

    The coarser group goes when its late members all sit in the finer one (a
    late NUMA node inside a host); the finer one goes when the coarser group has
    late members outside it too (a whole late host and its NUMA halves).
    """
    drop: set[int] = set()
    sets = [set(g.ranks) for g in found]
    for a in range(len(found)):
        for b, coarse in enumerate(found):
            if a == b or not sets[a] < sets[b]:
                continue
            if set(coarse.late_ranks) <= sets[a]:
                drop.add(b)
            else:
                drop.add(a)
    return [g for i, g in enumerate(found) if i not in drop]
