"""Stage 6: one line per decision, with its evidence and confidence, in the order to act."""

from __future__ import annotations

from collections.abc import Sequence

from jaxpace.report.model import FailureMode, PeriodicOutliers, WaitingCost
from jaxpace.report.stages.culprit import ALPHA, CulpritRanking
from jaxpace.report.text import format_ms, ranges

__all__ = ["decisions"]


def _p(p: float) -> str:
    return f"{p:.2g}" if p >= 1e-12 else "< 1e-12"


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
    out: list[str] = []
    for i in c.culprit_indices[:10]:
        rs = c.rank_stats[i]
        out.append(
            f"Straggler: rank {rs.rank} ({rs.host}, process {rs.process}) is "
            f"{format_ms(rs.excess_lateness_s)} later than a typical rank (95% CI "
            f"{format_ms(rs.ci_low_s)} to {format_ms(rs.ci_high_s)}), last to arrive in "
            f"{rs.last_fraction:.0%} of steps; confidence: z = {rs.z:.1f}, Holm p = "
            f"{_p(rs.p_adjusted)} over {R} ranks (the smaller of the lateness and "
            "last-arrival tests)." + _cost(by_name, f"rank {rs.rank}", unit)
        )
    if len(c.culprit_indices) > 10:
        out.append(f"... and {len(c.culprit_indices) - 10} more late ranks (see the ranking).")
    for g in c.groups[:10]:
        what = "Straggling process" if g.kind == "process" else "Late group"
        out.append(
            f"{what}: {g.kind} `{g.label}` (ranks {ranges(g.ranks)}; "
            f"{', '.join(g.hosts[:3])}{', ...' if len(g.hosts) > 3 else ''}) is "
            f"{format_ms(g.excess_lateness_s)} later than the other ranks, its typical member "
            f"+{format_ms(g.typical_member_s)}; confidence: z = {g.z:.1f}, Holm p = "
            f"{_p(g.p_adjusted)} over all groups." + _cost(by_name, g.name, unit)
        )
    by_mode = {m.name: m for m in modes}
    for name, label in (
        ("topology_contention", "Topology contention"),
        ("synchronization_amplification", "Synchronization amplification"),
    ):
        m = by_mode.get(name)
        if m is not None and m.detected:
            out.append(f"{label} (score {m.score:.2f}): " + "; ".join(m.evidence) + ".")
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
    if not out or primary == "balanced" and not c.culprit_indices and not c.groups:
        if c.rank_stats:
            top = c.rank_stats[c.order[0]]
            out.append(
                f"No persistent straggler: the latest rank, {top.rank}, is "
                f"{format_ms(top.excess_lateness_s)} later than a typical rank (z = {top.z:.1f}, "
                f"Holm p = {_p(top.p_adjusted)} over {R} ranks; a culprit needs p < {ALPHA:g} "
                f"and more than the noise floor {format_ms(c.noise_floor_s)}); no group is late "
                "and no failure mode stands out."
            )
    return tuple(out)
