"""Stage 3: rank the ranks by culpability; name persistent culprits and late groups.

Who is a culprit, a rank or a group, is decided in one place, `jaxpace.diagnosis.culprit`
(`decide` for ranks, `decide_groups` for groups, on the same three tests); the
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
typical member (not one culprit inside it) is above the noise floor, and then
its late members are explained by the group.
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
    decide_groups,
    group_partitions,
    noise_floor,
)
from jaxpace.diagnosis.stats import col_mean, num_text, p_text
from jaxpace.report.model import (
    FleetSpread,
    GroupFinding,
    IterationStats,
    Likely,
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
    "likely_finding",
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
    likely: Likely | None = None  # below the line: last in most steps, not named
    alpha: float = ALPHA  # the family-wise level the culprits were decided at
    fleet_alpha: float | None = None  # test 2's level when stricter than `alpha`

    @property
    def fleet_level(self) -> str:
        """ " (at level L)" after "outside the fleet's spread" when test 2 ran at its own
        stricter level; "" otherwise."""
        if self.fleet_alpha is None or self.fleet_alpha == self.alpha:
            return ""
        return f" (at level {self.fleet_alpha:g})"

    @property
    def culprits(self) -> tuple[int, ...]:
        """Rank ids of every individual culprit, latest first."""
        return tuple(self.rank_stats[i].rank for i in self.culprit_indices)


def rank_culprits(
    data: SiteData,
    sel: StepSelection,
    iteration: IterationStats,
    groups: Mapping[str, Mapping[int, str]] | None = None,
    alpha: float = ALPHA,
    fleet_alpha: float | None = None,
) -> CulpritRanking:
    """Per-rank statistics, the ranking, culprits and late groups.

    Args:
      data, sel, iteration: the earlier stages' results.
      groups: `{kind: {rank: label}}` to test as groups (see `normalize_groups`);
        processes with several ranks are always tested.
      alpha: the family-wise level of naming anybody in a healthy run (ranks, and
        groups apart): `ALPHA` by default (the report and watch).
      fleet_alpha: the fleet line's (test 2's) level when stricter than `alpha`
        (watch: `WATCH_ALPHA`); None: `alpha`.
    """
    rows, n, R = sel.rows, sel.n, data.ranks.size
    lat = data.lateness[rows]
    dec = decide(lat, iteration.p50_s, alpha, fleet_alpha)
    last_fraction = dec.last_counts / max(n, 1)
    late, d, floor = dec.late, dec.d, dec.floor_s
    order = sorted(range(R), key=lambda i: (not late[i], -d[i], int(data.ranks[i])))
    step_s = iteration.p50_s
    found = (
        late_groups(data, lat, groups or {}, floor, step_s, alpha, fleet_alpha) if n >= 2 else ()
    )
    explained = np.zeros(R, bool)
    for g in found:
        explained[_explained_by(g, data, lat, step_s, alpha, fleet_alpha)] = True
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
    fleet = fleet_summary(data, sel, dec, iteration)
    likely = (
        likely_finding(data, dec, iteration, fleet, groups)
        if culprit_i is None and not found and n >= 2
        else None
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
        fleet=fleet,
        decision=dec,
        likely=likely,
        alpha=alpha,
        fleet_alpha=fleet_alpha,
    )


# A rank (or process) last in at least this share of the analyzed steps, and
# significant against per-step noise (test 1), but not named: `likely`.
LIKELY_LAST_FRACTION = 0.5


def _likely_group(
    data: SiteData, dec: Decision, groups: Mapping[str, Mapping[int, str]]
) -> tuple[str, str, np.ndarray, float] | None:
    """`(kind, label, member indices, share of steps)` of the group (host, NUMA node, NIC,
    ...) whose every member passes test 1 and that holds the last arriver in the most
    steps, at least `LIKELY_LAST_FRACTION` of them; None when no group does."""
    best = None
    for kind, labels in groups.items():
        lab = np.array([str(labels.get(int(r), "")) for r in data.ranks.tolist()], dtype=object)
        for label in sorted({x for x in lab.tolist() if x}):
            members = np.flatnonzero(lab == label)
            if not 1 < members.size < data.ranks.size:
                continue
            if not ((dec.d[members] > 0) & (dec.p_adjusted[members] < ALPHA)).all():
                continue
            last = float(np.isin(dec.last, members).mean())
            if last >= LIKELY_LAST_FRACTION and (best is None or last > best[3]):
                best = (kind, label, members, last)
    return best


def likely_finding(
    data: SiteData,
    dec: Decision,
    iteration: IterationStats,
    fleet: FleetSpread | None,
    groups: Mapping[str, Mapping[int, str]] | None = None,
) -> Likely | None:
    """The finding below the line (`Likely`), or None.

    The latest rank (largest `d`) is *likely* when test 1 passes (Holm p < `ALPHA`)
    and it (or its process) arrived last in at least `LIKELY_LAST_FRACTION` of the
    steps, but it was not named: the fleet test (what this job's size names with
    confidence) or the short-run test held it back. Its process is named instead of
    it when the process has one rank, or each of its ranks passes test 1 too. When no
    rank or process is last that often, a group of `groups` (a host, a NUMA node, ...)
    whose every member passes test 1 and that holds the last arriver in that share of
    the steps is likely instead (its latest member's figure).
    """
    if dec.n == 0 or data.ranks.size < 2:
        return None
    i = int(np.argmax(dec.d))
    if not (dec.d[i] > 0 and dec.p_adjusted[i] < ALPHA):
        return None
    proc = int(data.processes[i])
    members = np.flatnonzero(data.processes == proc)
    whole = members.size == 1 or bool((dec.p_adjusted[members] < ALPHA).all())
    last = float(np.isin(dec.last, members).mean()) if whole else float(dec.last_counts[i] / dec.n)
    kind, label = ("process", proc) if whole else ("rank", int(data.ranks[i]))
    if last < LIKELY_LAST_FRACTION:
        group = _likely_group(data, dec, groups or {})
        if group is None:
            return None
        kind, name, members, last = group
        label = f"{name} (ranks {ranges(data.ranks[members])})"
        i = int(members[np.argmax(dec.d[members])])
        proc = int(data.processes[i])
    d = float(dec.d[i])
    step = float(iteration.p50_s)
    share = d / step if math.isfinite(step) and step > 0 else math.nan
    small = fleet is not None and fleet.rule == "small job"
    threshold = SMALL_JOB_STEP_FRACTION if small else (fleet.threshold if fleet else math.nan)
    unit = "of the step" if small else "robust SDs"
    # (Against the median step, as the small-job line is: the headline's step is the mean.)
    figure = f"+{format_ms(d)}" + (
        f", {share:.0%} of the median step ({format_ms(step)})" if math.isfinite(share) else ""
    )
    if not bool(dec.fleet.outlier[i]):  # test 2 held it back: what the size names
        if small:
            below = f"below the {threshold:.0%} of the step this job's size names with confidence"
        else:
            below = (
                f"{num_text(float(dec.fleet.distance[i]))} robust SDs above the fleet's median, "
                f"below the {num_text(threshold)} this job's size names with confidence"
            )
    elif d <= dec.floor_s:
        below = f"below the noise floor {format_ms(dec.floor_s)} a culprit must exceed"
    else:  # test 3: a short run's episode
        below = "late in part of this short run only (a culprit is late in every third of it)"
    return Likely(
        kind=kind,
        label=label,
        rank=int(data.ranks[i]),
        process=proc,
        host=data.hosts[i],
        last_fraction=last,
        excess_lateness_s=d,
        step_fraction=share,
        threshold=float(threshold),
        threshold_unit=unit,
        text=f"likely: {kind} {label}, last in {last:.0%} of steps, {figure}; {below}",
    )


def _explained_by(
    g: GroupFinding,
    data: SiteData,
    lat: np.ndarray,
    step_s: float,
    alpha: float = ALPHA,
    fleet_alpha: float | None = None,
) -> np.ndarray:
    """The members of late group `g` its lateness explains: all but those late against
    the group's other members too (`decide` on the members alone), who are named alone."""
    members = np.flatnonzero(np.isin(data.ranks, g.ranks))
    if members.size < 3 or lat.shape[0] < 2:
        return members
    within = decide(lat[:, members], step_s, alpha, fleet_alpha)
    return members[~within.late]


class _Savings:
    """Mean step time saved if one rank computed at the per-step median, for rank after
    rank over the same compute (`fleet_summary`'s slowest): the per-step median, largest
    and largest without the step's argmax found once, not once a rank.

    The model of `stages.waiting_costs`: step = ``max_i(compute_i) + transfer``.
    """

    def __init__(self, compute: np.ndarray, transfer: np.ndarray) -> None:
        self.transfer = transfer
        self.med = np.median(compute, axis=1)
        self.most = compute.max(axis=1)
        self.model = float((self.most + transfer).mean())
        self.at = compute.argmax(axis=1)  # (a NaN's first place where a row has one)
        rows = np.arange(compute.shape[0])
        if compute.shape[1] >= 2:
            rest = compute.copy()
            rest[rows, self.at] = -np.inf
            self.second = rest.max(axis=1)  # (the largest of the others, NaN kept)
        else:
            self.second = np.full(self.most.shape, -np.inf)

    def saving_s(self, i: int) -> float:
        """Rank `i` at the median: the largest of the others where it is the step's
        argmax, else the step's largest (the same values as leaving its column out)."""
        rest = np.where(self.at == i, self.second, self.most)
        return max(self.model - float((np.maximum(rest, self.med) + self.transfer).mean()), 0.0)


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
    savings = _Savings(comp, tr) if ok else None
    for i in np.argsort(-dec.d, kind="stable")[: min(top, R)]:
        if dec.d[i] <= 0:  # at or below the median rank: not slow
            break
        saving = savings.saving_s(int(i)) if savings is not None else math.nan
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


def late_groups(
    data: SiteData,
    lateness: np.ndarray,
    groups: Mapping[str, Mapping[int, str]],
    floor: float,
    step_s: float = math.nan,
    alpha: float = ALPHA,
    fleet_alpha: float | None = None,
) -> tuple[GroupFinding, ...]:
    """Groups whose ranks are late together, most significant first (family-wise `alpha`).

    The decision is `jaxpace.diagnosis.culprit.decide_groups` (the three tests of
    the ranks, on each group's per-step lateness over the other ranks, against
    the groups of its kind) over the processes and `groups`
    (`group_partitions`); this names the groups' ranks and hosts.
    """
    parts = group_partitions(data.ranks, data.processes, groups)
    return tuple(
        GroupFinding(
            kind=g.kind,
            label=g.label,
            ranks=tuple(int(r) for r in data.ranks[g.members]),
            hosts=tuple(sorted({data.hosts[j] for j in g.members})),
            excess_lateness_s=g.effect_s,
            typical_member_s=g.typical_s,
            ci_low_s=g.ci_low_s,
            ci_high_s=g.ci_high_s,
            z=g.effect_s / g.se_s if g.se_s > 0 else math.inf,
            p_adjusted=g.p_adjusted,
            late_ranks=tuple(int(r) for r in data.ranks[g.late_members]),
            fleet_sd=g.fleet_sd,
        )
        for g in decide_groups(lateness, parts, floor, step_s, alpha, fleet_alpha)
    )


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
