"""Stage 3: rank the ranks by culpability; name persistent culprits and late groups.

Who is a culprit is decided in one place, `jaxpace.diagnosis.culprit.decide`, which the
runtime's live view (`Pacer.stats()`, the Prometheus sink) calls too: a rank
is named only when its lateness is significant against per-step noise *and*
it is an outlier of the fleet's own per-rank spread (healthy devices differ
persistently by a few percent), at a family-wise error `ALPHA` that holds at
every rank count, *and*, in a run of fewer than 60 analyzed steps, it is late by
more than the noise floor in every third of them (a short run's multi-step
episode is not persistence). How often it arrives last does not decide alone: among
thousands of ranks, the per-step maximum of the others' jitter beats a modest
but persistent lead most of the time. Groups of ranks (host, NUMA, NIC, leaf
switch, process) are tested the same way on their members' mean lateness
against the other ranks', and against the spread of the groups of their kind;
a group is *late* when both tests pass (and test 3 in a short run), its
typical member (not one culprit
inside it) is above the noise floor, and then its late members are explained
by the group.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

from jaxpace.diagnosis.culprit import (
    ALPHA,
    SMALL_JOB_STEP_FRACTION,
    Decision,
    _last_arrival_p,  # noqa: F401  (tests reach it here)
    decide,
    fleet_test,
    noise_floor,
    short_run_consistent,
)
from jaxpace.diagnosis.stats import (
    batch_means_se,
    col_mean,
    holm,
    median_of_others,
    num_text,
    p_text,
    robust_std,
    t95,
    t_sf,
)
from jaxpace.report.model import (
    FleetSpread,
    GroupFinding,
    IterationStats,
    RankStats,
    SiteData,
    SlowRank,
)
from jaxpace.report.render.text import format_ms, ranges
from jaxpace.report.stages.steps import StepSelection

__all__ = [
    "ALPHA",
    "CulpritRanking",
    "fleet_summary",
    "fleet_text",
    "late_groups",
    "noise_floor",
    "rank_culprits",
    "rank_evidence",
]


@dataclasses.dataclass(frozen=True)
class CulpritRanking:
    """Who arrives late, by how much, and whether a rank, process or group is to blame.

    Indices (`order`, `culprit_index`, `culprit_indices`) are positions in `SiteData.ranks`.
    """

    rank_stats: tuple[RankStats, ...]
    ranking: tuple[int, ...]  # rank ids, most culpable first
    order: tuple[int, ...]  # the same as indices
    last_fraction: np.ndarray  # (R,)
    late: np.ndarray  # (R,) bool: the decision (both tests, above the noise floor)
    noise_floor_s: float
    culprit_index: int | None
    culprit: int | None
    culprit_process: int | None
    notes: tuple[str, ...]
    culprit_indices: tuple[int, ...] = ()  # every individual culprit, latest first
    groups: tuple[GroupFinding, ...] = ()  # late groups (any kind), most significant first
    excess: np.ndarray | None = None  # (n, R) per-step excess lateness of the analyzed steps
    fleet: FleetSpread | None = None  # the fleet's per-rank spread, slowest ranks
    decision: Decision | None = None  # the shared decision's arrays

    @property
    def culprits(self) -> tuple[int, ...]:
        """Rank ids of every individual culprit, latest first."""
        return tuple(self.rank_stats[i].rank for i in self.culprit_indices)


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
    lat = data.lateness[rows]
    dec = decide(lat, iteration.p50_s)
    last_fraction = dec.last_counts / max(n, 1)
    late, d, floor = dec.late, dec.d, dec.floor_s
    order = sorted(range(R), key=lambda i: (not late[i], -d[i], int(data.ranks[i])))
    found = late_groups(data, lat, groups or {}, floor, iteration.p50_s) if n >= 2 else ()
    explained = np.zeros(R, bool)
    for g in found:
        explained[np.isin(data.ranks, g.ranks)] = True
    individual = [i for i in dec.culprits if not explained[i]]
    rank_stats = _rank_stats(data, sel, lat, dec)
    culprit_i = individual[0] if individual else None
    culprit_process = int(data.processes[culprit_i]) if culprit_i is not None else None
    notes: list[str] = []
    if culprit_i is None:
        proc = next((g for g in found if g.kind == "process"), None)
        if proc is not None:
            members = np.flatnonzero(np.isin(data.ranks, proc.ranks))
            culprit_i = int(members[np.argmax(d[members])])
            culprit_process = int(proc.label)
            pl = float(np.isin(dec.last, members).mean()) if n else 0.0
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
        excess=dec.excess,
        fleet=fleet_summary(data, sel, dec, iteration),
        decision=dec,
    )


def _saving_s(compute: np.ndarray, transfer: np.ndarray, idx: np.ndarray) -> float:
    """Mean step time saved if the ranks `idx` computed at the per-step median.

    The model of `stages.waiting_costs`: step = ``max_i(compute_i) + transfer``.
    """
    R = compute.shape[1]
    keep = np.ones(R, bool)
    keep[idx] = False
    med = np.median(compute, axis=1)
    rest = compute[:, keep].max(axis=1) if keep.any() else np.full(med.shape, -np.inf)
    model = float((compute.max(axis=1) + transfer).mean())
    return max(model - float((np.maximum(rest, med) + transfer).mean()), 0.0)


def fleet_summary(
    data: SiteData, sel: StepSelection, dec: Decision, iteration: IterationStats, top: int = 5
) -> FleetSpread | None:
    """The fleet's per-rank spread and its `top` slowest ranks, named or not."""
    R = data.ranks.size
    if dec.n == 0 or R == 0:
        return None
    mean_lat = data.lateness[sel.rows].mean(axis=0)
    q50, q90, q99 = (float(x) for x in np.quantile(mean_lat, [0.5, 0.9, 0.99]))
    comp = sel.compute
    ok = comp.size and R >= 2 and math.isfinite(iteration.mean_s) and iteration.mean_s > 0
    tr = data.transfer[sel.rows][sel.compute_rows] if ok else None
    slow = []
    for i in np.argsort(-dec.d, kind="stable")[: min(top, R)]:
        if dec.d[i] <= 0:  # at or below the median rank: not slow
            break
        saving = _saving_s(comp, tr, np.array([i])) if ok else math.nan
        slow.append(
            SlowRank(
                rank=int(data.ranks[i]),
                host=data.hosts[i],
                excess_lateness_s=float(dec.d[i]),
                fleet_sd=float(dec.fleet.distance[i]),
                named=bool(dec.late[i]),
                within_spread=not bool(dec.fleet.outlier[i]),
                saving_s=saving,
                saving_fraction=saving / iteration.mean_s if ok else math.nan,
            )
        )
    return FleetSpread(
        rule=dec.fleet.rule,
        num_ranks=int(R),
        step_s=float(iteration.p50_s),
        median_s=q50,
        p90_s=q90,
        p99_s=q99,
        spread_s=float(dec.fleet.spread_s),
        threshold=float(dec.fleet.threshold),
        slowest=tuple(slow),
    )


def _rank_stats(
    data: SiteData, sel: StepSelection, lat: np.ndarray, dec: Decision
) -> tuple[RankStats, ...]:
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
            last_fraction=float(dec.last_counts[i] / max(n, 1)),
            mean_lateness_s=float(mean_lat[i]),
            excess_lateness_s=float(dec.d[i]),
            ci_low_s=float(dec.ci_low[i]),
            ci_high_s=float(dec.ci_high[i]),
            compute_s=float(mean_compute[i]),
            delay_s=float(mean_delay[i]),
            sync_wait_s=float(mean_sync[i]),
            transfer_s=mean_transfer,
            late=bool(dec.late[i]),
            z=float(dec.z[i]),
            p_adjusted=float(dec.p_adjusted[i]),
            fleet_sd=float(dec.fleet.distance[i]),
            last_p_adjusted=float(dec.last_p_adjusted[i]),
            last_count=int(dec.last_counts[i]),
            top1_count=int(dec.top_counts[i]),
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
    step_s: float = math.nan,
) -> tuple[GroupFinding, ...]:
    """Groups whose ranks are late together, most significant first (see the module docstring).

    Per grouping kind and group g, per step: the mean lateness of g's members
    minus that of the other ranks (`lateness`: analyzed steps x ranks). Its
    mean over steps is tested with a batch-means t statistic, Holm-corrected
    over every group of every kind (test 1). Test 2: the group's mean
    lateness is an outlier of the spread of the groups of its kind
    (`jaxpace.diagnosis.culprit.fleet_test`, at `ALPHA` over the number of kinds; with
    fewer than 16 groups, the small-job rule: the staged test against the
    groups below, or later than the other groups' median by 10% of the
    median step `step_s` over the square root of the group's size). Test 3, in a run
    under 60 steps: its mean lateness over the other ranks is above `floor` in every
    block of consecutive steps (`jaxpace.diagnosis.culprit.short_run_consistent`). A group
    passing all three is late when its median
    member is later than the median non-member by more than `floor` and more
    than half its members are.
    """
    n, R = lateness.shape
    parts = _partitions(data, groups)
    cands: list[tuple] = []
    p_all: list[float] = []
    m_rank = lateness.mean(axis=0)
    total = lateness.sum(axis=1, keepdims=True)
    # Healthy ranks differ persistently too (static speed spread): a group mean of k
    # such ranks varies by tau^2 / k around the others' mean, on top of step noise.
    # tau is estimated inside the groups of each kind, so late groups do not inflate it.
    se_rank, _ = batch_means_se(lateness)
    med_se2 = float(np.median(se_rank**2)) if np.isfinite(se_rank).all() else 0.0
    for kind, names, codes in parts:
        G = names.size
        sizes = np.bincount(codes, minlength=G)
        outlier, dist = _group_outliers(codes, m_rank, sizes, step_s, ALPHA / len(parts))
        order = np.argsort(codes, kind="stable")
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        sums = np.add.reduceat(lateness[:, order], starts, axis=1)  # (n, G)
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
        steady = short_run_consistent(diff, floor, centre=False)  # test 3 (short runs)
        for g in np.flatnonzero((eff > floor) & (p < ALPHA) & outlier & steady):
            members = codes == g
            if members.all():
                continue
            ref = np.median(m_rank[~members])
            typical = float(np.median(m_rank[members]) - ref)
            share = float(np.mean(m_rank[members] - ref > floor))
            members = (members, members & (m_rank - ref > floor))
            cands.append(
                (base + int(g), kind, str(names[g]), members, float(eff[g]), float(se[g]),
                 typical, share, float(dist[g]), t95(df))
            )  # fmt: skip
    if not cands:
        return ()
    p_adj = holm(np.array(p_all))
    out = []
    for i, kind, label, (members, late_m), eff, se, typical, share, dist, tcrit in cands:
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
                ci_low_s=eff - tcrit * se,
                ci_high_s=eff + tcrit * se,
                z=eff / se if se > 0 else math.inf,
                p_adjusted=float(p_adj[i]),
                late_ranks=tuple(int(r) for r in data.ranks[late_m]),
                fleet_sd=dist,
            )
        )
    out = _nested(out)
    out.sort(key=lambda g: (g.p_adjusted, -g.excess_lateness_s))
    return tuple(out)


def _group_outliers(
    codes: np.ndarray, m_rank: np.ndarray, sizes: np.ndarray, step_s: float, alpha: float
) -> tuple[np.ndarray, np.ndarray]:
    """Test 2 for the groups of one kind: (outlier per group, distance in robust SDs).

    A group is an outlier of the spread of its kind's group means, and stays one
    without its latest member: one straggler does not make its NIC pair late.
    """
    G = sizes.size
    sums = np.bincount(codes, m_rank, G)
    latest = np.full(G, -np.inf)
    np.maximum.at(latest, codes, m_rank)
    without = np.where(sizes > 1, (sums - latest) / np.maximum(sizes - 1, 1), sums)
    # A group of one rank is that rank: its mean excess is already its lateness over the others.
    mean = sums / sizes
    over = np.where(sizes == 1, mean, mean - median_of_others(mean[None, :])[0]) if G > 1 else None
    fleet = fleet_test(mean, step_s, alpha, over_s=over, sizes=sizes)
    over_w = (
        np.where(sizes == 1, without, without - median_of_others(without[None, :])[0])
        if G > 1
        else None
    )
    rest = fleet_test(without, step_s, alpha, over_s=over_w, sizes=sizes)  # the group's share
    return fleet.outlier & rest.outlier, fleet.distance


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


def fleet_text(rs: RankStats | GroupFinding, fleet: FleetSpread | None, over_s: float) -> str:
    """Test 2's evidence: how far outside the fleet's spread a rank (or group) sits."""
    if fleet is None:
        return ""
    if fleet.rule == "small job":
        step = fleet.step_s
        share = f" ({over_s / step:.0%} of the step)" if math.isfinite(step) and step > 0 else ""
        loo = (
            f"{num_text(rs.fleet_sd)} SDs of the ranks below it (named beyond {num_text(fleet.threshold)} "
            "or "
            if math.isfinite(fleet.threshold)
            else "(named beyond "
        )
        return (
            f"{format_ms(over_s)}{share} later than the others' median, {loo}"
            f"{SMALL_JOB_STEP_FRACTION:.0%} of the step: a small job)"
        )
    return (
        f"{num_text(rs.fleet_sd)} robust SDs above the fleet's median (named beyond "
        f"{num_text(fleet.threshold)})"
    )


def rank_evidence(rs: RankStats, R: int, n: int, fleet: FleetSpread | None, over_s: float) -> str:
    """One rank's evidence: test 1 (z, p and interval of one test), test 2, last arrivals."""
    text = (
        f"rank {rs.rank} ({rs.host}) is {format_ms(rs.excess_lateness_s)} later than the median "
        f"rank (95% CI {format_ms(rs.ci_low_s)} to {format_ms(rs.ci_high_s)}; z = "
        f"{num_text(rs.z)}, Holm {p_text(rs.p_adjusted)} over {R} ranks)"
    )
    ft = fleet_text(rs, fleet, over_s)
    if ft:
        text += f", {ft}"
    text += f"; last in {rs.last_fraction:.0%} of {n} steps"
    if rs.last_p_adjusted < ALPHA <= rs.p_adjusted:
        text += f" against {1 / max(R, 1):.0%} by chance (Holm {p_text(rs.last_p_adjusted)})"
    return text
