"""Stage 6: one line per decision, with its evidence and confidence, in the order to act."""

from __future__ import annotations

import math
from collections.abc import Sequence

from jaxpace.diagnosis.culprit import CONSISTENCY_MAX_STEPS
from jaxpace.diagnosis.stats import num_text, p_text
from jaxpace.report.fleet_view import below_line
from jaxpace.report.model import LIKELY_MODE, FailureMode, PeriodicOutliers, WaitingCost
from jaxpace.report.render.text import format_ms, ranges
from jaxpace.report.stages.culprit import CulpritRanking, rank_evidence

__all__ = ["decisions"]


def _cost(costs: dict[str, WaitingCost], name: str, unit: str) -> str:
    w = costs.get(name)
    if w is None:
        return ""
    return (
        f" Waiting for it costs {w.gpu_hours_per_1000_steps:.3g} {unit} per 1,000 steps; "
        f"fixed, a step would be {w.saving_fraction:.1%} faster ({format_ms(w.saving_s)})."
    )


def decisions(
    c: CulpritRanking,
    modes: Sequence[FailureMode],
    primary: str,
    costs: Sequence[WaitingCost],
    periodic: PeriodicOutliers | None,
    unit: str = "device-h",
) -> tuple[str, ...]:
    """The report's decisions as sentences: culprits, late groups, modes, or why none.

    `unit`: the waiting cost's unit on the run's platform (`RunContext.hours_unit`).
    """
    by_name = {w.target: w for w in costs}
    R = len(c.rank_stats)
    n = c.excess.shape[0] if c.excess is not None else 0
    out: list[str] = []
    for i in c.culprit_indices[:10]:
        rs = c.rank_stats[i]
        over = float(c.decision.fleet.over_others_s[i]) if c.decision is not None else math.nan
        out.append(
            f"Straggler: {rank_evidence(rs, R, n, c.fleet, over)} (process {rs.process})."
            + _cost(by_name, f"rank {rs.rank}", unit)
        )
    if len(c.culprit_indices) > 10:
        out.append(f"... and {len(c.culprit_indices) - 10} more late ranks (see the ranking).")
    for g in c.groups[:10]:
        what = "Straggling process" if g.kind == "process" else "Late group"
        out.append(
            f"{what}: {g.kind} `{g.label}` (ranks {ranges(g.ranks)}; "
            f"{', '.join(g.hosts[:3])}{', ...' if len(g.hosts) > 3 else ''}) is "
            f"{format_ms(g.excess_lateness_s)} later than the other ranks, its typical member "
            f"+{format_ms(g.typical_member_s)}; confidence: z = {num_text(g.z)}, Holm "
            f"{p_text(g.p_adjusted)} over all groups; {num_text(g.fleet_sd)} robust SDs above "
            f"the median {g.kind}." + _cost(by_name, g.name, unit)
        )
    by_mode = {m.name: m for m in modes}
    for name, label in (
        ("topology_contention", "Topology contention"),
        ("synchronization_amplification", "Synchronization amplification"),
    ):
        m = by_mode.get(name)
        if m is not None and m.detected:
            out.append(f"{label} (score {num_text(m.score, 2)}): " + "; ".join(m.evidence) + ".")
    if len(c.culprit_indices) > 1 and "all of the above" in by_name:
        w = by_name["all of the above"]
        out.append(
            f"Fixing every culprit and late group together saves {w.saving_fraction:.1%} of "
            f"the step, {w.gpu_hours_per_1000_steps:.3g} {unit} per 1,000 steps."
        )
    if periodic is not None:
        out.append(
            f"Periodic slow steps every {periodic.period} steps (+"
            f"{format_ms(periodic.mean_extra_s)}; rank {periodic.dominant_rank} last in "
            f"{periodic.dominant_fraction:.0%} of them): periodic extra work such as eval or "
            "checkpointing, not a fabric problem; excluded from the analysis."
        )
    quiet = primary in ("balanced", LIKELY_MODE)
    if not out or quiet and not c.culprit_indices and not c.groups:
        if c.rank_stats:
            out.append(_nobody(c, R, n))
    return tuple(out)


def _nobody(c: CulpritRanking, R: int, n: int) -> str:
    """Why nobody is named: the slowest rank, within the fleet's normal spread, and its cost."""
    i = c.order[0]
    top = c.rank_stats[i]
    over = float(c.decision.fleet.over_others_s[i]) if c.decision is not None else math.nan
    slow = next((s for s in (c.fleet.slowest if c.fleet else ()) if s.rank == top.rank), None)
    cost = ""
    if slow is not None and math.isfinite(slow.saving_s):
        cost = (
            f" Waiting for it costs {format_ms(slow.saving_s)} a step ({slow.saving_fraction:.1%})."
        )
    d = c.decision
    episode = d is not None and d.episode is not None and bool(d.episode[i])
    head = (
        "No persistent straggler: the slowest rank was late in part of this short run only "
        "(an episode, such as a descheduled thread, not a rank late throughout)"
        if episode
        else f"No persistent straggler: the slowest rank is {below_line(c.fleet)}"
    )
    every = (
        f" in every third of the steps (a run under {CONSISTENCY_MAX_STEPS} steps)"
        if n < CONSISTENCY_MAX_STEPS
        else ""
    )
    return (
        f"{head}: {rank_evidence(top, R, n, c.fleet, over)}. A culprit needs Holm p < "
        f"{c.alpha:g}, to be outside the fleet's spread{c.fleet_level} and more than the "
        "noise floor "
        f"{format_ms(c.noise_floor_s)}{every}; no group is late and no failure mode stands "
        "out." + cost
    )
