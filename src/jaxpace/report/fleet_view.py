"""The fleet as rows for `terminal` and `html`: per-rank spread, slowest ranks, arrived-last counts.

Healthy devices of one kind run persistently a few percent apart; these rows
show that spread whether or not anyone is named, so a reader sees how far the
slowest rank sits from it (`Report.fleet`, `jaxpace.diagnosis.culprit`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from jaxpace.diagnosis.culprit import SMALL_JOB_STEP_FRACTION
from jaxpace.diagnosis.stats import num_text
from jaxpace.report.render.text import format_ms

if TYPE_CHECKING:
    from jaxpace.report.model import FleetSpread, Report

__all__ = [
    "LATE_LEGEND",
    "arrived_last_rows",
    "below_line",
    "fleet_line",
    "fleet_sections",
    "slowest_rows",
]

# What the ranking's star means: exactly the ranks the decision names (`RankStats.late`).
LATE_LEGEND = (
    "* = named: later than the median rank against per-step noise, outside the fleet's normal "
    "spread, and above the noise floor"
)


def _pct(x: float, step: float) -> str:
    return f" ({x / step:.1%})" if math.isfinite(step) and step > 0 else ""


def below_line(fleet: FleetSpread | None, *, short: bool = False) -> str:
    """Why a slow rank is not named, in the words of the rule that decided it.

    On a fleet the rule is the fleet's spread; on a small job it is a line (SDs of the
    ranks below, or a share of the step) that a rank many SDs out can still be under,
    so "within normal spread" would contradict the SDs printed beside it.
    """
    if fleet is None or fleet.rule == "fleet spread":
        return "within normal spread" if short else "within the fleet's normal spread"
    sds = f"{num_text(fleet.threshold)} SDs or " if math.isfinite(fleet.threshold) else ""
    return f"below the line this job's size names ({sds}{SMALL_JOB_STEP_FRACTION:.0%} of the step)"


def fleet_line(fleet: FleetSpread | None, rule: bool = True) -> str:
    """One line: the per-rank spread (median, p90, p99, robust SD), and where a culprit starts."""
    if fleet is None:
        return "n/a"
    st = fleet.step_s
    how = (
        f"named beyond {num_text(fleet.threshold)} robust SDs at {fleet.num_ranks} ranks"
        if fleet.rule == "fleet spread"
        else f"small job: named beyond {SMALL_JOB_STEP_FRACTION:.0%} of the step"
        + (
            f" or {num_text(fleet.threshold)} SDs of the ranks below"
            if math.isfinite(fleet.threshold)
            else ""
        )
    )
    text = (
        f"per-rank mean lateness median {format_ms(fleet.median_s)}{_pct(fleet.median_s, st)}, "
        f"p90 {format_ms(fleet.p90_s)}{_pct(fleet.p90_s, st)}, p99 {format_ms(fleet.p99_s)}"
        f"{_pct(fleet.p99_s, st)}; robust SD {format_ms(fleet.spread_s)}"
    )
    return f"{text}{_pct(fleet.spread_s, st)}; {how}" if rule else text


def fleet_short(fleet: FleetSpread | None) -> str:
    """The spread in a few words: median and p99 of per-rank mean lateness, robust SD."""
    if fleet is None:
        return "n/a"
    return (
        f"median {format_ms(fleet.median_s)}, p99 {format_ms(fleet.p99_s)}"
        f"{_pct(fleet.p99_s, fleet.step_s)}; robust SD {format_ms(fleet.spread_s)}"
    )


def slowest_rows(report: Report) -> list[list[str]]:
    """The slowest ranks, named or "slowest, within normal spread" (on a small job: below
    its line, `below_line`), and what waiting costs."""
    rows = [
        ["rank", "host", "later than median", "SDs above the fleet", "verdict", "cost of waiting"]
    ]
    fleet = report.fleet
    if fleet is None:
        return rows
    for s in fleet.slowest:
        verdict = (
            "culprit"
            if s.named
            else f"slowest, {below_line(fleet, short=True)}"
            if s.within_spread
            else "outside the spread, not significant"
        )
        cost = (
            f"{format_ms(s.saving_s)} a step ({s.saving_fraction:.1%})"
            if math.isfinite(s.saving_s)
            else "n/a"
        )
        rows.append(
            [
                str(s.rank),
                s.host,
                format_ms(s.excess_lateness_s),
                num_text(s.fleet_sd),
                verdict,
                cost,
            ]
        )
    return rows


def arrived_last_rows(report: Report, max_ranks: int = 16) -> list[list[str]]:
    """Per rank, how often it arrived last and among the latest 1%, most often last first."""
    n = max(report.analyzed_steps, 1)
    top = max(1, math.ceil(report.num_ranks / 100))
    rows = [["rank", "host", "arrived last", f"among the latest 1% ({top} of {report.num_ranks})"]]
    order = sorted(report.ranks, key=lambda r: (-r.last_count, -r.top1_count, r.rank))
    for r in order[:max_ranks]:
        rows.append(
            [
                str(r.rank),
                r.host,
                f"{r.last_count} ({r.last_count / n:.0%})",
                f"{r.top1_count} ({r.top1_count / n:.0%})",
            ]
        )
    return rows


def fleet_sections(report: Report) -> list[tuple[str, list[list[str]]]]:
    """(title, rows) of the fleet's tables, for the HTML page."""
    if report.fleet is None:
        return []
    spread = [["fleet", "value"], ["per-rank spread", fleet_line(report.fleet)]]
    return [
        ("Fleet: per-rank speed spread", spread),
        ("Slowest ranks (robust SDs of the fleet's spread)", slowest_rows(report)),
        (f"Arrived last, over {report.analyzed_steps} analyzed steps", arrived_last_rows(report)),
    ]
