"""Stage 4: score each failure mode (docs/diagnostics.md) and pick the primary one."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxpace.report.model import FAILURE_MODES, FailureMode, IterationStats, SiteData
from jaxpace.report.records import Records
from jaxpace.report.stages.culprit import CulpritRanking
from jaxpace.report.stages.steps import StepSelection
from jaxpace.report.text import format_ms, ranges

__all__ = [
    "amplification_mode",
    "assess_modes",
    "classify",
    "contention_mode",
    "locality_mode",
    "locality_score",
    "normalize_groups",
    "straggler_mode",
]


def straggler_mode(c: CulpritRanking, n: int) -> FailureMode:
    """Persistent straggler: one rank last in >= 50% of steps and significantly late."""
    if c.culprit_index is not None:
        rs = c.rank_stats[c.culprit_index]
        ev = (
            f"rank {rs.rank} ({rs.host}) arrived last in {rs.last_fraction:.0%} of {n} steps",
            f"excess lateness {format_ms(rs.excess_lateness_s)} (95% CI "
            f"{format_ms(rs.ci_low_s)} to {format_ms(rs.ci_high_s)}); noise floor "
            f"{format_ms(c.noise_floor_s)}",
        )
        score = float(max(c.last_fraction[c.culprit_index], 0.5))
        return FailureMode("persistent_straggler", score, True, ev)
    R = c.last_fraction.size
    lf_late = [c.last_fraction[i] for i in range(R) if c.late[i]]
    return FailureMode(
        "persistent_straggler",
        float(max(lf_late, default=0.0)) * 0.5,
        False,
        (
            f"most frequent last arriver: rank {c.ranking[0]} in "
            f"{c.last_fraction[c.order[0]]:.0%} of {n} steps (uniform: {1 / max(R, 1):.0%}); "
            f"needs >= 50% and a significant excess lateness above {format_ms(c.noise_floor_s)}",
        ),
    )


def normalize_groups(
    topology_groups: Mapping[str, Any] | None, records: Records, data: SiteData
) -> dict[str, dict[int, str]]:
    """`{kind: {rank: label}}` from the argument (nested or flat) or the headers, plus hosts."""
    groups: dict[str, dict[int, str]] = {}
    if topology_groups:
        first = next(iter(topology_groups.values()))
        if isinstance(first, Mapping):
            for kind, m in topology_groups.items():
                groups[str(kind)] = {int(r): str(g) for r, g in m.items()}
        else:
            groups["group"] = {int(r): str(g) for r, g in topology_groups.items()}
    else:
        groups = records.rank_groups()
    if "host" not in groups and len(set(data.hosts)) > 1:
        groups["host"] = {int(r): h for r, h in zip(data.ranks, data.hosts, strict=True)}
    return groups


def locality_score(
    kind: str,
    mapping: Mapping[int, str],
    data: SiteData,
    mean_lat: np.ndarray,
    noise_floor_s: float,
) -> tuple[float, list[str]] | None:
    """(score, evidence) of one grouping (ANOVA eta^2 + permutation test), or None.

    None when the grouping cannot be tested: one group, one rank per group, or
    groups equal to processes (that is a persistent straggler, not locality).
    """
    labels = [mapping.get(int(r)) for r in data.ranks]
    if any(lbl is None for lbl in labels):
        missing = [int(r) for r, lbl in zip(data.ranks, labels, strict=True) if lbl is None]
        return 0.0, [f"{kind}: no group label for ranks {ranges(missing)}; not tested"]
    names, codes = np.unique(np.array(labels, dtype=object).astype(str), return_inverse=True)
    G, R = names.size, codes.size
    sizes = np.bincount(codes, minlength=G)
    if G < 2 or sizes.max() < 2:
        return None
    by_proc = {int(p): set(np.flatnonzero(data.processes == p)) for p in np.unique(data.processes)}
    by_group = [set(np.flatnonzero(codes == g)) for g in range(G)]
    if all(grp in by_proc.values() for grp in by_group):
        return None
    onehot = np.zeros((R, G))
    onehot[np.arange(R), codes] = 1.0

    def ssb(y: np.ndarray) -> np.ndarray:
        sums = y @ onehot
        return (sums**2 / sizes).sum(axis=-1) - y.sum(axis=-1) ** 2 / R

    y = mean_lat
    sst = float(((y - y.mean()) ** 2).sum())
    if sst <= 0:
        return 0.0, [f"{kind}: all ranks equally late; nothing to explain"]
    eta2 = float(ssb(y) / sst)
    rng = np.random.default_rng(0)
    perms = np.argsort(rng.random((2000, R)), axis=1)
    null = ssb(y[perms]) / sst
    p_value = float((1 + np.count_nonzero(null >= eta2 - 1e-12)) / (1 + null.size))
    gmeans = (y @ onehot) / sizes
    diff = float(gmeans.max() - gmeans.min())
    significant = p_value < 0.05 and diff > noise_floor_s
    worst = int(np.argmax(gmeans))
    evidence = [
        f"{kind} groups explain {eta2:.0%} of the between-rank variance of mean lateness "
        f"(one-way ANOVA eta^2; permutation p = {p_value:.3f})",
        f"{kind} `{names[worst]}` (ranks {ranges(np.sort(data.ranks[codes == worst]))}) is "
        f"{format_ms(diff)} later than the earliest group; noise floor {format_ms(noise_floor_s)}",
    ]
    return (eta2 if significant else 0.0), evidence


def locality_mode(
    groups: Mapping[str, Mapping[int, str]],
    data: SiteData,
    sel: StepSelection,
    noise_floor_s: float,
) -> FailureMode:
    """Locality: the best-scoring testable grouping of ranks explains their lateness."""
    lat = data.lateness[sel.rows]
    mean_lat = lat.mean(axis=0) if sel.n else np.zeros(data.ranks.size)
    best: tuple[float, list[str]] = (0.0, [])
    tested = []
    for kind, mapping in sorted(groups.items()):
        res = locality_score(kind, mapping, data, mean_lat, noise_floor_s)
        if res is None:
            continue
        tested.append(kind)
        if res[0] > best[0] or not best[1]:
            best = res
    if not tested:
        if groups:
            why = (
                f"rank groups ({', '.join(sorted(groups))}) cannot separate ranks here: one "
                "group, one rank per group, or groups equal to processes"
            )
        else:
            why = (
                "no rank groups to test (pass `topology_groups=` or record "
                "`topology.rank_groups` in the headers)"
            )
        best = (0.0, [why])
    return FailureMode("locality", float(best[0]), best[0] >= 0.5, tuple(best[1]))


def amplification_mode(c: CulpritRanking, compute: np.ndarray, amp: float) -> FailureMode:
    """Synchronization amplification: random last arrivers and a heavy compute tail."""
    R = c.last_fraction.size
    if R < 2 or not compute.size:
        return FailureMode(
            "synchronization_amplification",
            0.0,
            False,
            ("needs >= 2 ranks and consecutive steps",),
        )
    p_last = c.last_fraction[c.last_fraction > 0]
    randomness = max(float(-(p_last * np.log(p_last)).sum() / math.log(R)), 0.0)
    x = (compute / compute.mean(axis=1, keepdims=True)).ravel()
    sd = float(x.std())
    kurt = float(((x - x.mean()) ** 4).mean() / sd**4 - 3.0) if sd > 0 else 0.0
    amp_term = min(max((amp - 1.0) / 0.2, 0.0), 1.0)
    tail_term = min(max(kurt / 3.0, 0.0), 1.0)
    score = max(amp_term * randomness * (0.5 + 0.5 * tail_term), 0.0)
    if c.culprit_index is not None:
        score *= 1.0 - c.last_fraction[c.culprit_index]
    detected = c.culprit_index is None and score >= 0.5 and amp >= 1.1
    ev = (
        f"amplification {amp:.3f}: the slowest rank's compute averages "
        f"{amp - 1:.1%} above the mean",
        f"last arriver spread over ranks: normalized entropy {randomness:.2f} "
        "(1 = uniformly random)",
        f"per-rank compute excess kurtosis {kurt:.1f} (0 for a normal; large = heavy tail)",
    )
    return FailureMode("synchronization_amplification", float(score), bool(detected), ev)


def contention_mode(
    data: SiteData, sel: StepSelection, mean_it: float, expected_transfer_s: float | None
) -> FailureMode:
    """Topology contention: transfer above the alpha-beta expectation, or growing."""
    tr = data.transfer[sel.rows]
    tr_steps = data.steps[sel.rows]
    ev_t: list[str] = []
    score_ab = score_trend = 0.0
    if sel.n >= 2:
        med_tr = float(np.median(tr))
        ev_t.append(
            f"transfer (last arriver's wait) median {format_ms(med_tr)}, "
            f"{med_tr / mean_it:.0%} of the step"
            if math.isfinite(mean_it) and mean_it > 0
            else f"transfer median {format_ms(med_tr)}"
        )
        if expected_transfer_s:
            ratio = med_tr / expected_transfer_s
            score_ab = min(max(ratio - 1.0, 0.0), 1.0)
            ev_t.append(f"{ratio:.2f}x the alpha-beta expectation {format_ms(expected_transfer_s)}")
        if sel.n >= 10 and np.ptp(tr_steps) > 0 and tr.std() > 0:
            slope, icpt = np.polyfit(tr_steps.astype(float), tr, 1)
            r = float(np.corrcoef(tr_steps, tr)[0, 1])
            start = icpt + slope * tr_steps[0]
            growth = slope * float(np.ptp(tr_steps)) / start if start > 0 else 0.0
            if r * r >= 0.3:
                score_trend = min(max(growth / 0.5, 0.0), 1.0)
            ev_t.append(
                f"transfer changes {growth:+.0%} over the run (linear fit, r^2 = {r * r:.2f})"
            )
    else:
        ev_t.append("too few steps")
    score = float(max(score_ab, score_trend))
    return FailureMode("topology_contention", score, score >= 0.5, tuple(ev_t))


def classify(modes: Mapping[str, FailureMode]) -> tuple[tuple[FailureMode, ...], str]:
    """Adds the `balanced` verdict; returns (all modes in `FAILURE_MODES` order, primary)."""
    others = [modes[k] for k in FAILURE_MODES[:-1]]
    any_detected = any(m.detected for m in others)
    balanced = FailureMode(
        "balanced",
        float(1.0 - max(m.score for m in others)),
        not any_detected,
        (
            "no failure mode stands out"
            if not any_detected
            else "not balanced: " + ", ".join(m.name for m in others if m.detected),
        ),
    )
    detected = [m for m in others if m.detected]
    primary = max(detected, key=lambda m: m.score).name if detected else "balanced"
    return (*others, balanced), primary


def assess_modes(
    data: SiteData,
    sel: StepSelection,
    c: CulpritRanking,
    iteration: IterationStats,
    amp: float,
    groups: Mapping[str, Mapping[int, str]],
    expected_transfer_s: float | None,
) -> tuple[tuple[FailureMode, ...], str]:
    """Every failure mode in `FAILURE_MODES` order, and the primary one."""
    modes = {
        "persistent_straggler": straggler_mode(c, sel.n),
        "locality": locality_mode(groups, data, sel, c.noise_floor_s),
        "synchronization_amplification": amplification_mode(c, sel.compute, amp),
        "topology_contention": contention_mode(data, sel, iteration.mean_s, expected_transfer_s),
    }
    return classify(modes)
