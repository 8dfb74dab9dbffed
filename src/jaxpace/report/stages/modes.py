"""Stage 4: score each failure mode (docs/diagnostics.md) and pick the primary one."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxpace.diagnosis.stats import num_text, p_text, robust_std
from jaxpace.records.reader import Records
from jaxpace.report.fleet_view import below_line
from jaxpace.report.model import (
    FAILURE_MODES,
    LIKELY_MODE,
    FailureMode,
    GroupFinding,
    IterationStats,
    Likely,
    SiteData,
)
from jaxpace.report.render.text import format_ms, ranges
from jaxpace.report.stages.culprit import CulpritRanking, late_groups, rank_evidence
from jaxpace.report.stages.steps import StepSelection, iteration_stats

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


# Spiky steps a run needs before spikes score the contention mode fully; one scores 0.
MIN_SPIKES = 3


def _over(c: CulpritRanking, i: int) -> float:
    return float(c.decision.fleet.over_others_s[i]) if c.decision is not None else math.nan


def straggler_mode(c: CulpritRanking, n: int) -> FailureMode:
    """Persistent straggler: ranks (or one process) named by the shared culprit decision.

    A rank is named when it is significantly later than the median rank
    (Holm, family-wise `ALPHA`) and an outlier of the fleet's own per-rank
    spread (see `rank_culprits`). The score is 1 - the top culprit's Holm p
    (>= 0.5 when detected); 0.4 for the slowest rank that is significant but
    within the fleet's normal spread (not detected), else 0.
    """
    R = c.last_fraction.size
    if c.culprit_indices:
        ev = [rank_evidence(c.rank_stats[i], R, n, c.fleet, _over(c, i))
              for i in c.culprit_indices[:5]]  # fmt: skip
        if len(c.culprit_indices) > 5:
            ev.append(f"... {len(c.culprit_indices) - 5} more late ranks")
        ev.append(f"noise floor {format_ms(c.noise_floor_s)}")
        top = c.rank_stats[c.culprit_indices[0]]
        p = min(top.p_adjusted, top.last_p_adjusted)
        return FailureMode("persistent_straggler", max(0.5, 1.0 - p), True, tuple(ev))
    proc = next((g for g in c.groups if g.kind == "process"), None)
    if c.culprit_index is not None and proc is not None:
        ev = (
            f"process {proc.label} (ranks {ranges(proc.ranks)}, {', '.join(proc.hosts)}) is "
            f"{format_ms(proc.excess_lateness_s)} later than the other ranks (95% CI "
            f"{format_ms(proc.ci_low_s)} to {format_ms(proc.ci_high_s)}; z = {num_text(proc.z)}, "
            f"Holm {p_text(proc.p_adjusted)})",
            f"noise floor {format_ms(c.noise_floor_s)}",
        )
        return FailureMode("persistent_straggler", max(0.5, 1.0 - proc.p_adjusted), True, ev)
    if not c.rank_stats:
        return FailureMode("persistent_straggler", 0.0, False, ("no ranks",))
    i = c.order[0]
    top = c.rank_stats[i]
    sig = min(top.p_adjusted, top.last_p_adjusted) < c.alpha
    return FailureMode(
        "persistent_straggler",
        0.4 if sig else 0.0,
        False,
        (
            f"slowest rank, {below_line(c.fleet, short=True)}: "
            + rank_evidence(top, R, n, c.fleet, _over(c, i)),
            f"a culprit needs Holm p < {c.alpha:g}, to be outside the fleet's normal "
            f"spread{c.fleet_level}, and "
            f"an excess above the noise floor {format_ms(c.noise_floor_s)}",
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
    n_perm = int(min(2000, max(200, 4_000_000 // R)))
    perms = np.argsort(rng.random((n_perm, R)), axis=1)
    null = _permuted_ssb(y[perms], codes, sizes) / sst
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


def _permuted_ssb(y: np.ndarray, codes: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """`ssb` of each row of `y` (permutations x ranks): group sums by counting, not by
    a product with the (ranks x groups) one-hot matrix (n_perm x R x G work)."""
    n, G = y.shape[0], sizes.size
    at = (np.arange(n)[:, None] * G + codes[None, :]).ravel()
    sums = np.bincount(at, weights=y.ravel(), minlength=n * G).reshape(n, G)
    return (sums**2 / sizes).sum(axis=-1) - y.sum(axis=-1) ** 2 / codes.size


def group_line(g: GroupFinding, floor_s: float, num_groups: int | None = None) -> str:
    """One line of evidence for a late group."""
    over = f" over {num_groups} groups" if num_groups else ""
    return (
        f"{g.kind} `{g.label}` (ranks {ranges(g.ranks)}) on {', '.join(g.hosts[:3])}"
        f"{', ...' if len(g.hosts) > 3 else ''} is {format_ms(g.excess_lateness_s)} later than "
        f"the other ranks (95% CI {format_ms(g.ci_low_s)} to {format_ms(g.ci_high_s)}; typical "
        f"member +{format_ms(g.typical_member_s)}; z = {num_text(g.z)}, Holm "
        f"{p_text(g.p_adjusted)}{over}; {num_text(g.fleet_sd)} robust SDs above the median "
        f"{g.kind}); noise floor {format_ms(floor_s)}"
    )


def locality_mode(
    groups: Mapping[str, Mapping[int, str]],
    data: SiteData,
    sel: StepSelection,
    noise_floor_s: float,
    findings: tuple[GroupFinding, ...] | None = None,
) -> FailureMode:
    """Locality: ranks sharing a host, NUMA node, NIC or leaf switch are late together.

    Detected when `late_groups` names a group that is not a process (a late
    process is a persistent straggler). The score is the larger of the group's
    confidence (1 - Holm p) and the share of between-rank variance its grouping
    explains (eta^2).
    """
    if findings is None:
        lat = data.lateness[sel.rows]
        step_s = iteration_stats(sel.iter_all[sel.rows]).p50_s
        findings = late_groups(data, lat, groups, noise_floor_s, step_s) if sel.n >= 2 else ()
    found = [g for g in findings if g.kind != "process"]
    lat = data.lateness[sel.rows]
    mean_lat = lat.mean(axis=0) if sel.n else np.zeros(data.ranks.size)
    scored: dict[str, tuple[float, list[str]]] = {}
    for kind, mapping in sorted(groups.items()):
        res = locality_score(kind, mapping, data, mean_lat, noise_floor_s)
        if res is not None:
            scored[kind] = res
    if found:
        g = found[0]
        eta = scored.get(g.kind, (0.0, []))
        ev = [eta[1][0] if eta[1] else f"{g.kind} groups"]
        ev += [group_line(f, noise_floor_s) for f in found[:5]]
        if len(found) > 5:
            ev.append(f"... {len(found) - 5} more late groups")
        score = max(float(eta[0]), 1.0 - g.p_adjusted, 0.5)
        return FailureMode("locality", float(min(score, 1.0)), True, tuple(ev))
    if scored:
        kind = max(scored, key=lambda k: scored[k][0])
        sc, ev = scored[kind]
        ev = [*ev, "no group is significantly late as a group (Holm-corrected over all groups)"]
        return FailureMode("locality", float(min(sc, 0.49)), False, tuple(ev))
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
    return FailureMode("locality", 0.0, False, (why,))


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
    randomness = max(float(-(p_last * np.log(p_last)).sum() / math.log(R)), 0.0) + 0.0  # no -0.0
    x = (compute / compute.mean(axis=1, keepdims=True)).ravel()
    sd = float(x.std())
    kurt = float(((x - x.mean()) ** 4).mean() / sd**4 - 3.0) if sd > 0 else 0.0
    amp_term = min(max((amp - 1.0) / 0.2, 0.0), 1.0)
    tail_term = min(max(kurt / 3.0, 0.0), 1.0)
    score = max(amp_term * randomness * (0.5 + 0.5 * tail_term), 0.0) + 0.0
    if c.culprit_index is not None:
        score *= 1.0 - c.last_fraction[c.culprit_index]
    detected = c.culprit_index is None and score >= 0.5 and amp >= 1.1
    ev = (
        f"amplification {amp:.3f}: the slowest rank's compute averages "
        f"{amp - 1:.1%} above the mean",
        f"last arriver spread over ranks: normalized entropy {randomness:.2f} "
        "(1 = uniformly random)",
        f"per-rank compute excess kurtosis {num_text(kurt)} (0 for a normal; large = heavy tail)",
    )
    return FailureMode("synchronization_amplification", float(score), bool(detected), ev)


def contention_mode(
    data: SiteData,
    sel: StepSelection,
    mean_it: float,
    expected_transfer_s: float | None,
    groups: Mapping[str, Mapping[int, str]] | None = None,
) -> FailureMode:
    """Topology contention, from the collective's own time (the transfer, ranks' waits aside).

    Three signs, each scored in [0, 1]; the mode's score is the largest:
    above the alpha-beta expectation (`clip(median / expected - 1)`); growing
    over the run (linear fit on the non-spike steps, r^2 >= 0.3,
    `clip(growth / 0.5)`); spiky (steps above `1.5 x median + 3 robust sd`
    cost at least 0.5% of the mean step and drive a share of the step-time
    variance: `clip(lost / (0.005 step)) x clip(share / 0.3)`, times
    `clip((spikes - 1) / (MIN_SPIKES - 1))`: one spike is an event, never a mode).
    """
    tr = data.transfer[sel.rows]
    tr_steps = data.steps[sel.rows].astype(float)
    it = sel.iter_all[sel.rows]
    ev_t: list[str] = []
    score_ab = score_trend = score_tail = 0.0
    cost_ab = cost_trend = cost_tail = 0.0
    if sel.n < 2:
        return FailureMode("topology_contention", 0.0, False, ("too few steps",))
    med_tr = float(np.median(tr))
    ok_it = math.isfinite(mean_it) and mean_it > 0
    mean_tr = float(tr.mean())  # the share the advice quotes too (`RankStats.transfer_s`)
    ev_t.append(
        f"transfer (last arriver's wait) median {format_ms(med_tr)}, mean "
        f"{format_ms(mean_tr)}: {mean_tr / mean_it:.0%} of the step"
        if ok_it
        else f"transfer median {format_ms(med_tr)}"
    )
    if expected_transfer_s:
        ratio = med_tr / expected_transfer_s
        score_ab = min(max(ratio - 1.0, 0.0), 1.0)
        cost_ab = max(med_tr - expected_transfer_s, 0.0)
        ev_t.append(f"{ratio:.2f}x the alpha-beta expectation {format_ms(expected_transfer_s)}")
    spike = tr > 1.5 * med_tr + 3.0 * float(robust_std(tr))
    calm = ~spike
    if calm.sum() >= 10 and np.ptp(tr_steps[calm]) > 0 and tr[calm].std() > 0:
        x, y = tr_steps[calm], tr[calm]
        slope, icpt = np.polyfit(x, y, 1)
        r = float(np.corrcoef(x, y)[0, 1])
        start = icpt + slope * x[0]
        growth = slope * float(np.ptp(x)) / start if start > 0 else 0.0
        if r * r >= 0.3:
            score_trend = min(max(growth / 0.5, 0.0), 1.0)
            cost_trend = max(float(slope * np.ptp(x)) / 2.0, 0.0)  # mean extra over the run
        ev_t.append(f"transfer changes {growth:+.0%} over the run (linear fit, r^2 = {r * r:.2f})")
    if spike.any() and ok_it:
        lost = float((tr[spike] - med_tr).sum() / sel.n)
        fin = np.isfinite(it)
        share = 0.0
        if fin.sum() > 2 and np.var(it[fin]) > 0:
            share = float(np.cov(tr[fin], it[fin])[0, 1] / np.var(it[fin], ddof=1))
        n_spikes = int(spike.sum())
        recurring = min(max((n_spikes - 1) / (MIN_SPIKES - 1), 0.0), 1.0)
        score_tail = min(max(lost / (0.005 * mean_it), 0.0), 1.0) * min(max(share / 0.3, 0.0), 1.0)
        score_tail *= recurring
        cost_tail = max(lost, 0.0)
        ev_t.append(
            f"transfer spikes on {n_spikes} of {sel.n} steps (up to {tr.max() / med_tr:.1f}x the "
            f"median): {format_ms(lost)} lost per step ({lost / mean_it:.1%}), "
            f"{min(max(share, 0.0), 1.0):.0%} of the step-time variance"
            + (
                f"; one spike (step {int(tr_steps[spike][0])}) is an event, not a recurring "
                f"pattern: the mode needs {MIN_SPIKES} spiky steps to score fully"
                if n_spikes == 1
                else ""
            )
        )
    else:
        ev_t.append("no transfer spikes (steps above 1.5x the median)")
    score = float(max(score_ab, score_trend, score_tail))
    leaves = sorted(set((groups or {}).get("leaf", {}).values()))
    if score >= 0.5 and len(leaves) > 1:
        ev_t.append(
            f"the ranks span {len(leaves)} leaf switches: collisions of flows on leaf uplinks "
            "(ECMP) are a likely cause; compare a run inside one leaf"
        )
    costs = [c for c, sc in ((cost_ab, score_ab), (cost_trend, score_trend), (cost_tail, score_tail))
             if sc > 0]  # fmt: skip
    cost = max(costs) if costs else math.nan
    return FailureMode("topology_contention", score, score >= 0.5, tuple(ev_t), cost)


def classify(
    modes: Mapping[str, FailureMode], likely: Likely | None = None
) -> tuple[tuple[FailureMode, ...], str]:
    """Adds the `balanced` verdict; returns (all modes in `FAILURE_MODES` order, primary).

    With nothing detected but a `likely` finding (a rank or process last in most steps,
    below the line this size names), the run is not balanced: the verdict is not
    detected, says so, and the primary mode is `LIKELY_MODE`.
    """
    others = [modes[k] for k in FAILURE_MODES[:-1]]
    detected = [m for m in others if m.detected]
    below = likely is not None and not detected
    if detected:
        why = "not balanced: " + ", ".join(m.name for m in detected)
    elif below:
        why = f"not balanced, though nobody is named with confidence: {likely.text}"
    else:
        why = "no failure mode stands out"
    balanced = FailureMode(
        "balanced", float(1.0 - max(m.score for m in others)), not detected and not below, (why,)
    )
    return (*others, balanced), LIKELY_MODE if below else _primary(detected)


def _primary(detected: list[FailureMode]) -> str:
    """The detected mode that costs the most where every one has a cost, else the top score.

    A straggler named with high confidence and contention can both be detected;
    the one that costs a step more is the primary mode, and the advice covers both.
    """
    if not detected:
        return "balanced"
    if len(detected) > 1 and all(math.isfinite(m.cost_s) for m in detected):
        return max(detected, key=lambda m: (m.cost_s, m.score)).name
    return max(detected, key=lambda m: m.score).name


def assess_modes(
    data: SiteData,
    sel: StepSelection,
    c: CulpritRanking,
    iteration: IterationStats,
    amp: float,
    groups: Mapping[str, Mapping[int, str]],
    expected_transfer_s: float | None,
    refused: str = "",
    *,
    straggler_cost_s: float = math.nan,
) -> tuple[tuple[FailureMode, ...], str]:
    """Every failure mode in `FAILURE_MODES` order, and the primary one.

    `refused`: why no culprit may be named here (an invariant operand,
    `stages.refuse_invariant`), which the straggler mode then says.
    `straggler_cost_s`: what fixing the culprit saves per step (`waiting_costs`).
    """
    straggler = straggler_mode(c, sel.n)
    if refused:
        straggler = FailureMode("persistent_straggler", 0.0, False, (refused,))
    elif straggler.detected:
        straggler = dataclasses.replace(straggler, cost_s=straggler_cost_s)
    modes = {
        "persistent_straggler": straggler,
        "locality": locality_mode(groups, data, sel, c.noise_floor_s, c.groups),
        "synchronization_amplification": amplification_mode(c, sel.compute, amp),
        "topology_contention": contention_mode(
            data, sel, iteration.mean_s, expected_transfer_s, groups
        ),
    }
    return classify(modes, None if refused else c.likely)
