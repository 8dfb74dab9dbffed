"""The report's tables as plain text rows, built once; `summary` (the terminal) and `html`
render them.

Each function returns a list of rows (lists of strings), header row first, and takes
the part of the report it reads (`Findings`, `PacingEffect`, ...), or the whole
`Report` where a table draws on several parts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from jaxpace.report.fleet_view import fleet_line
from jaxpace.report.reach import SAMPLES_PER_RANK, forecast_support
from jaxpace.report.render.text import format_ms, ranges
from jaxpace.report.stages.links import late_text

if TYPE_CHECKING:
    from jaxpace.report.model import Findings, PacingEffect, Report, SiteRow

__all__ = [
    "SAMPLES_PER_RANK",
    "failure_mode_rows",
    "forecast_rows",
    "forecast_support",
    "next_steps_rows",
    "decision_rows",
    "cost_rows",
    "host_rows",
    "pacing_table",
    "ranking_rows",
    "groups_text",
    "shorten",
    "site_notes",
    "site_rows",
    "summary_rows",
]


def summary_rows(report: Report) -> list[list[str]]:
    """The headline numbers: ranks, steps, iteration time, amplification, culprit, what-if."""
    it = report.iteration
    culprit = "none (no persistent straggler)"
    if report.context.invariant_over:
        culprit = "none named: the operand was already invariant (see NO CULPRIT)"
    group = getattr(report, "culprit_group", None)
    likely = getattr(report, "likely", None)
    if report.culprit is not None:
        rs = report.rank_stats(report.culprit)
        culprit = (
            f"rank {rs.rank} (process {rs.process}, {rs.host}): "
            f"+{format_ms(rs.excess_lateness_s)} late, last in {rs.last_fraction:.0%} of steps"
        )
    elif group is not None:
        culprit = (
            f"{group.kind} {group.label} (ranks {ranges(group.ranks)}): "
            f"+{format_ms(group.excess_lateness_s)} late"
        )
    elif likely is not None:
        culprit = f"none named with confidence; {likely.text}"
    rows = [
        ["metric", "value"],
        ["source", report.source],
        ["ranks / processes", f"{report.num_ranks} / {report.num_processes}"],
        [
            "steps (all / warm-up / analyzed)",
            f"{report.num_steps} / {report.warmup_steps} / {report.analyzed_steps}",
        ],
        ["iteration mean (CV)", f"{format_ms(it.mean_s)} ({it.cv:.3f})"],
        [
            "iteration p50 / p90 / p99",
            f"{format_ms(it.p50_s)} / {format_ms(it.p90_s)} / {format_ms(it.p99_s)}",
        ],
        ["synchronization amplification", f"{report.amplification:.3f}"],
        ["primary failure mode", report.primary_mode],
        ["culprit", culprit],
        ["fleet spread", fleet_line(report.fleet, rule=False)],
    ]
    if len(report.culprits) > 1:
        rows.append(
            [
                "other culprits",
                ", ".join(map(str, report.culprits[1:6]))
                + (f" (+{len(report.culprits) - 6} more)" if len(report.culprits) > 6 else ""),
            ]
        )
    if report.late_groups:
        rows.append(
            ["late groups", "; ".join(f"{g.kind} {g.label}" for g in report.late_groups[:5])]
        )
    if report.what_if is not None and report.culprit is not None:  # nothing to speed up else
        w = report.what_if
        rows.append(
            [
                f"if {w.target or f'rank {w.rank}'} ran like the median",
                f"{format_ms(w.what_if_step_s)} per step ({w.saving_fraction:.1%} faster)",
            ]
        )
    return rows


def ranking_rows(findings: Findings, max_ranks: int) -> list[list[str]]:
    """The first `max_ranks` ranks of the culprit ranking; times in ms, `*` marks late ranks."""
    by_rank = {r.rank: r for r in findings.ranks}
    rows = [["rank", "host", "last", "excess", "95% CI", "compute", "sync wait", "delay"]]
    for rank in findings.ranking[:max_ranks]:
        r = by_rank[rank]
        rows.append(
            [
                f"{r.rank}{' *' if r.late else ''}",
                r.host,
                f"{r.last_fraction:.0%}",
                format_ms(r.excess_lateness_s, unit=False),
                f"[{format_ms(r.ci_low_s, unit=False)}, {format_ms(r.ci_high_s, unit=False)}]",
                format_ms(r.compute_s, unit=False),
                format_ms(r.sync_wait_s, unit=False),
                format_ms(r.delay_s, unit=False),
            ]
        )
    return rows


def failure_mode_rows(findings: Findings) -> list[list[str]]:
    """One row per failure mode; evidence items are separated by newlines."""
    rows = [["mode", "score", "detected", "evidence"]]
    for m in findings.failure_modes:
        rows.append([m.name, f"{m.score:.2f}", "yes" if m.detected else "", "\n".join(m.evidence)])
    return rows


def forecast_rows(report: Report) -> list[list[str]]:
    """Forecast amplification per supported rank count; empty when there is none."""
    fc = report.forecast
    if fc is None:
        return []
    top, lognormal, _ = forecast_support(report)
    rows = [["ranks", "empirical"] + (["lognormal"] if lognormal else [])]
    for n, a, b in zip(fc.ranks, fc.amplification, fc.lognormal_amplification, strict=True):
        if n <= top:
            rows.append([str(n), f"{a:.3f}"] + ([f"{b:.3f}"] if lognormal else []))
    return rows if len(rows) > 1 else []


def next_steps_rows(report: Report) -> list[list[str]]:
    """ "What to do next", one action per row (jaxpace.report.advice)."""
    from jaxpace.report.advice import next_steps

    return [["what to do next"]] + [[line] for line in next_steps(report)]


def pacing_table(p: PacingEffect) -> list[list[str]]:
    """The pacing-effect table as text rows (header first), for terminal and HTML."""
    return [
        ["", "steps", "step time", "CV", "sync wait", "delay"],
        [
            "not engaged" if p.comparable else "not engaged (warm-up)",
            str(p.unengaged_steps),
            format_ms(p.unengaged_step_s),
            f"{p.unengaged_cv:.3f}",
            format_ms(p.unengaged_sync_wait_s),
            format_ms(p.unengaged_delay_s),
        ],
        [
            "engaged",
            str(p.engaged_steps),
            format_ms(p.engaged_step_s),
            f"{p.engaged_cv:.3f}",
            format_ms(p.engaged_sync_wait_s),
            format_ms(p.engaged_delay_s),
        ],
    ]


def decision_rows(findings: Findings) -> list[list[str]]:
    """The report's decisions, one per row, each with its evidence and confidence."""
    return [["decision (evidence, confidence)"]] + [[d] for d in findings.decisions]


def cost_rows(findings: Findings, hours_unit: str) -> list[list[str]]:
    """Device-hours (`hours_unit`: GPU-h on GPUs) spent waiting for each culprit / late
    group, or []."""
    if not findings.costs:
        return []
    unit = hours_unit
    rows = [["waiting for", "ranks", "saved per step", "step faster", f"{unit} per 1,000 steps"]]
    for w in findings.costs:
        rows.append(
            [
                w.target,
                str(len(w.ranks)),
                format_ms(w.saving_s),
                f"{w.saving_fraction:.1%}",
                f"{w.gpu_hours_per_1000_steps:.3g}",
            ]
        )
    return rows


def host_rows(findings: Findings, max_hosts: int = 16) -> list[list[str]]:
    """Per host, latest first: ranks, late ranks, mean and max excess lateness (ms).

    Empty with a single host. At thousands of ranks this is the readable view.
    """
    by_host: dict[str, list] = {}
    for r in findings.ranks:
        by_host.setdefault(r.host, []).append(r)
    if len(by_host) < 2:
        return []
    stats = []
    for host, rs in by_host.items():
        ex = [r.excess_lateness_s for r in rs]
        stats.append((sum(ex) / len(ex), max(ex), sum(r.late for r in rs), len(rs), host))
    stats.sort(key=lambda t: (-t[0], t[4]))
    rows = [["host", "ranks", "late", "mean excess", "max excess"]]
    for mean, mx, late, n, host in stats[:max_hosts]:
        rows.append(
            [host, str(n), str(late), format_ms(mean, unit=False), format_ms(mx, unit=False)]
        )
    if len(stats) > max_hosts:
        rows.append([f"... {len(stats) - max_hosts} more hosts", "", "", "", ""])
    return rows


def site_rows(sites_table: Sequence[SiteRow], *, verbose: bool = True) -> list[list[str]]:
    """`Report.sites_table` (2 or more sites): one row per site in step order; no rows for
    one site. `verbose` (the HTML, `--verbose`): full site names and every group's
    members; else names shortened to `SITE_NAME_WIDTH` and groups summarized."""
    if not sites_table:
        return []
    rows = [["site", "collective", "groups", "wait", "share", "latest in group"]]
    for r in sites_table:
        share = f"{r.share:.0%}" if r.share == r.share else "n/a"
        rows.append(
            [
                r.site if verbose else shorten(r.site, SITE_NAME_WIDTH),
                r.kind or "unknown",
                str(len(r.groups)) if verbose else groups_text(r.groups),
                format_ms(r.wait_s),
                share,
                late_text(r) if verbose else _late_short(r),
            ]
        )
    return rows


# Characters of a site name the terminal's sites table shows (the full name: --verbose).
SITE_NAME_WIDTH = 40


def shorten(name: str, width: int) -> str:
    """`name` cut in the middle to `width` characters (the file and the op stay readable).

    >>> shorten("jit_train_step/all-reduce.17", 20)
    'jit_trai...reduce.17'
    """
    if len(name) <= width:
        return name
    head = (width - 3) // 2
    return name[:head] + "..." + name[len(name) - (width - 3 - head) :]


def groups_text(groups: Sequence[Sequence[int]]) -> str:
    """The groups of a site in a few words: "1 group of 8", "64 groups of 8", "3 groups of 2-4".

    >>> groups_text([(0, 1), (2, 3)]), groups_text([(0, 1, 2)]), groups_text([(0,), (1, 2)])
    ('2 groups of 2', '1 group of 3', '2 groups of 1-2')
    """
    if not groups:
        return "-"
    sizes = sorted({len(g) for g in groups})
    size = str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
    return f"{len(groups)} group{'s' * (len(groups) > 1)} of {size}"


def _late_short(row: SiteRow) -> str:
    """`late_text` with each group's members as ranges (a few runs), not every rank."""
    return late_text(row, members=lambda g: f"ranks {ranges(sorted(g), limit=3)}")


def site_notes(sites_table: Sequence[SiteRow]) -> list[str]:
    """`stages.links.site_table_notes`, a site without a known collective said in words."""
    from jaxpace.report.stages.links import site_table_notes

    return site_table_notes(
        [dataclasses.replace(r, kind=r.kind or "kind unknown") for r in sites_table]
    )
