"""Self-contained HTML report with inline SVG plots (`render.svg`; no scripts, no CDN).

The page leads with the answer: the headline (`summary.headline`), then the lateness heat
map by host and rank (`render.lateness_map`), then the step's collectives in order;
the tables and the other plots follow.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import jaxpace.report.fleet_view as fleet_view
import jaxpace.report.render.tables as tables
from jaxpace.records.safe_io import write_atomic
from jaxpace.report.advice import scope_notes
from jaxpace.report.render.lateness_map import TITLE as LATENESS_TITLE
from jaxpace.report.render.lateness_map import lateness_map
from jaxpace.report.render.summary import headline
from jaxpace.report.render.svg import CSS as PLOT_CSS
from jaxpace.report.render.svg import (
    FONT_PX,
    MB,
    ML,
    MR,
    MT,
    H,
    W,
    axes,
    label_step,
    legend,
    line_series,
    svg_open,
    ticks,
)
from jaxpace.report.render.text import format_ms

if TYPE_CHECKING:
    from jaxpace.report.model import Findings, Report

__all__ = ["PLOT_TITLES", "render_report_html", "write_html"]

PLOT_TITLES = (
    LATENESS_TITLE,
    "Phase breakdown per rank",
    "Step-time distribution",
    "Amplification forecast",
)
PHASE_COLORS = {
    "compute": "#4c78a8",
    "pacing delay": "#f58518",
    "sync wait": "#e45756",
    "transfer": "#54a24b",
}


def _analyzed(report: Report) -> np.ndarray:
    """Row indices of `report.data` that the summary's statistics use: after the warm-up
    (a prefix of the sorted steps), without periodic outliers."""
    data = report.data
    keep = np.arange(data.steps.size) >= report.warmup_steps
    if report.periodic is not None:
        keep &= ~np.isin(data.steps, report.periodic.steps)
    return np.flatnonzero(keep) if keep.any() else np.arange(data.steps.size)


def _lateness(report: Report) -> str:
    """The lateness heat map (`render.lateness_map`) of the steps after the warm-up, the
    culprits and late hosts marked, as a figure with its caption."""
    data = report.data
    rows_used = np.arange(report.warmup_steps, data.steps.size)
    if rows_used.size == 0:
        rows_used = np.arange(data.steps.size)
    hosts = [str(h) for h in data.hosts]
    groups = [g for g in report.late_groups if g.kind != "host"]
    svg, caption = lateness_map(
        data.lateness[rows_used],
        hosts,
        steps=data.steps[rows_used],
        ranks=data.ranks,
        culprit_ranks=report.culprits,
        culprit_hosts=[g.label for g in report.late_groups if g.kind == "host"],
        culprit_groups=[(f"{g.name} ({', '.join(g.hosts[:2])})", g.ranks) for g in groups],
        title=PLOT_TITLES[0],
    )
    return f"<figure>{svg}<figcaption>{escape(caption)}</figcaption></figure>"


def _phases(findings: Findings) -> str:
    title = PLOT_TITLES[1]
    ranks = findings.ranks
    R = len(ranks)
    vals = np.array(
        [[r.compute_s, r.delay_s, r.sync_wait_s, r.transfer_s] for r in ranks], dtype=float
    )
    vals = np.nan_to_num(vals) * 1e3
    labels = [str(r.rank) for r in ranks]
    if R > 64:  # bin consecutive ranks
        edges = np.linspace(0, R, 65).astype(int)
        vals = np.add.reduceat(vals, edges[:-1], axis=0) / np.diff(edges)[:, None]
        labels = [
            f"{ranks[a].rank}-{ranks[b - 1].rank}"
            for a, b in zip(edges[:-1], edges[1:], strict=True)
        ]
    n = len(labels)
    ymax = float(vals.sum(axis=1).max()) if n else 1.0
    ymax = ymax * 1.05 if ymax > 0 else 1.0
    out = svg_open(title, "rank", "mean time per step (ms)")
    ax, fx, fy = axes(0, n, 0, ymax, [], ticks(0, ymax))
    out += ax
    bw = (W - ML - MR) / max(n, 1)
    for i in range(n):
        y = 0.0
        for k, (name, fill) in enumerate(PHASE_COLORS.items()):
            v = float(vals[i, k])
            if v <= 0:
                continue
            out.append(
                f'<rect x="{fx(i) + bw * 0.1:.2f}" y="{fy(y + v):.2f}" width="{bw * 0.8:.2f}" '
                f'height="{fy(y) - fy(y + v):.2f}" fill="{fill}"><title>rank {escape(labels[i])} '
                f"{name}: {v:.3g} ms</title></rect>"
            )
            y += v
    step = label_step(labels, W - ML - MR)
    for i in range(0, n, step):
        # A wide label ("0-127") under a narrow first bar would reach under the y axis's
        # "0": keep every label's left edge right of the axis.
        x = max(fx(i) + bw / 2, ML + len(labels[i]) * FONT_PX * 0.31)
        out.append(
            f'<text x="{x:.1f}" y="{H - MB + 16}" text-anchor="middle">{escape(labels[i])}</text>'
        )
    out += legend([(c, name) for name, c in PHASE_COLORS.items()], 150)
    out.append("</svg>")
    return "\n".join(out)


def _histogram(report: Report) -> str:
    title = PLOT_TITLES[2]  # the analyzed steps, as in the summary
    data = report.data
    it = np.median(data.step_time[_analyzed(report)], axis=1) * 1e3
    it = it[np.isfinite(it)]
    out = svg_open(title, "step time (ms)", "steps")
    if it.size == 0:
        out.append(f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle">no step times</text>')
        out.append("</svg>")
        return "\n".join(out)
    lo, hi = float(it.min()), float(it.max())
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    counts, edges = np.histogram(it, bins=40, range=(lo, hi))
    cmax = float(counts.max())
    ax, fx, fy = axes(lo, hi, 0, cmax * 1.05, ticks(lo, hi), ticks(0, cmax * 1.05))
    out += ax
    for c, a, b in zip(counts, edges[:-1], edges[1:], strict=True):
        if c:
            out.append(
                f'<rect x="{fx(a):.2f}" y="{fy(c):.2f}" width="{max(fx(b) - fx(a) - 1, 0.5):.2f}" '
                f'height="{fy(0) - fy(c):.2f}" fill="#4c78a8"><title>{a:.3g}-{b:.3g} ms: '
                f"{c} steps</title></rect>"
            )
    for k, (q, name) in enumerate(((0.5, "p50"), (0.99, "p99"))):
        v = float(np.quantile(it, q))
        out.append(
            f'<line x1="{fx(v):.1f}" y1="{MT}" x2="{fx(v):.1f}" y2="{fy(0):.1f}" class="q"/>'
        )
        # Labels on their own lines, and left of the line near the right edge (never clipped).
        right = fx(v) + 90 > W - MR
        x, anchor = (fx(v) - 3, "end") if right else (fx(v) + 3, "start")
        out.append(
            f'<text x="{x:.1f}" y="{MT + 10 + 13 * k}" text-anchor="{anchor}">'
            f"{name} {v:.3g} ms</text>"
        )
    out.append("</svg>")
    return "\n".join(out)


def _forecast(report: Report) -> str:
    title = PLOT_TITLES[3]
    fc = report.forecast
    out = svg_open(title, "ranks (log scale)", "amplification E[max]/E[mean] (ratio)")
    if fc is None:
        out.append(
            f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle">not computable '
            "(needs 2+ ranks and consecutive steps)</text>"
        )
        out.append("</svg>")
        return "\n".join(out)
    top, lognormal, why = tables.forecast_support(report)
    keep = [i for i, n in enumerate(fc.ranks) if n <= top]
    if not keep:
        out.append(
            f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle">not shown (see below)</text>'
        )
        out.append("</svg>")
        return "\n".join(out)
    xs = np.log2(np.array([fc.ranks[i] for i in keep], dtype=float))
    emp = [fc.amplification[i] for i in keep]
    logn = [fc.lognormal_amplification[i] for i in keep]
    ys = np.array(emp + (logn if lognormal else []), dtype=float)
    pts = [fc.measured_amplification, fc.forecast_at_measured]
    allv = np.concatenate([ys, [p for p in pts if math.isfinite(p)]])
    y0, y1 = 1.0, max(float(allv.max()) * 1.05, 1.05)
    mx = math.log2(max(fc.measured_ranks, 1))
    x0, x1 = min(xs.min(), mx), max(xs.max(), mx)
    ax, fx, fy = axes(
        x0, x1, y0, y1, [float(x) for x in xs], ticks(y0, y1), xfmt=lambda t: str(int(2**t))
    )
    out += ax
    for series, stroke in ((emp, "#4c78a8"), (logn, "#f58518"))[: 2 if lognormal else 1]:
        pts = list(zip(xs, series, strict=True))
        out += line_series(pts, stroke, fx, fy, [f"{int(2**x)} ranks: {y:.3f}" for x, y in pts])
    if math.isfinite(fc.measured_amplification):
        out.append(
            f'<circle cx="{fx(mx):.1f}" cy="{fy(fc.measured_amplification):.1f}" r="5" '
            f'fill="#e45756"><title>measured at {fc.measured_ranks} ranks: '
            f"{fc.measured_amplification:.3f}</title></circle>"
        )
    names = (
        ("#4c78a8", "empirical (order statistics)"),
        ("#e45756", f"measured ({fc.measured_ranks} ranks)"),
    ) + ((("#f58518", f"lognormal fit (sigma {fc.sigma_log:.3g})"),) if lognormal else ())
    out += legend(names, 220)
    out.append("</svg>")  # `why` goes below the plot as a caption (html `_figure`)
    return "\n".join(out)


# Columns of prose or names: left-aligned (numbers stay right-aligned).
TEXT_COLUMNS = (
    "evidence", "detected", "host", "mode", "what to do next", "collective", "latest in group"
)  # fmt: skip


def _table(rows: list[list[str]]) -> str:
    """An HTML table of `rows` (header first); newlines in a cell become line breaks."""
    header, *body = rows
    h = "".join(f"<th>{escape(c)}</th>" for c in header)

    def cell(c: str) -> str:
        return "<br>".join(escape(part) for part in c.split("\n"))

    left = [i > 0 and col in TEXT_COLUMNS for i, col in enumerate(header)]  # 1st: by CSS
    b = "".join(
        "<tr>"
        + "".join(f"<td{' class=l' if left[i] else ''}>{cell(c)}</td>" for i, c in enumerate(r))
        + "</tr>"
        for r in body
    )
    return f"<table><thead><tr>{h}</tr></thead><tbody>{b}</tbody></table>"


CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1000px}
h1{font-size:1.2em;font-weight:normal;line-height:1.4;margin:0 0 6px}
h1 .ev{font-size:.72em;color:#666}
h2{font-size:1.15em;margin-top:1.6em}.meta{color:#555;font-size:.9em;margin:0 0 8px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;
text-align:right;font-size:.9em}th{background:#f3f3f3}td:first-child,td.l{text-align:left}
.partial{background:#fde2e2;border:2px solid #c00;padding:8px;font-weight:bold}
svg{margin:8px 0 2px;display:block;max-width:100%;height:auto}
figure{margin:0 0 12px}figcaption{font-size:.85em;color:#444;max-width:700px}
"""
CSS += PLOT_CSS + "\n"


def _headline_html(text: str) -> str:
    """The headline as the page's `h1`: its lead (`Straggler`, ...) in bold, the evidence
    in parentheses in small grey type (the claim and its cost read first)."""
    lead, sep, rest = text.partition(": ")
    if not (sep and 0 < len(lead) <= 40):
        lead, rest = "", text
    out, depth, start = [], 0, 0
    for i, ch in enumerate(rest):  # top-level parenthesized spans become `.ev`
        if ch == "(":
            if depth == 0:
                out.append(escape(rest[start:i]))
                start = i
            depth += 1
        elif ch == ")" and depth:
            depth -= 1
            if depth == 0:
                span = rest[start : i + 1]
                # A short aside ("(node-3)", "(1.64 ms)") is part of the claim.
                cls = ' class="ev"' if len(span) > 24 else ""
                out.append(f"<span{cls}>{escape(span)}</span>" if cls else escape(span))
                start = i + 1
    out.append(escape(rest[start:]))
    return (f"<strong>{escape(lead)}:</strong> " if lead else "") + "".join(out)


def _section(ident: str, title: str, body: str) -> str:
    return f'<section id="{ident}"><h2>{escape(title)}</h2>{body}</section>'


def render_report_html(report: Report, extra_sections: Sequence[tuple[str, Any]] = ()) -> str:
    """The whole HTML document for `report` (named apart from `jaxpace.sim`'s page).

    In order: the headline, the lateness heat map, the sites in step order (2 or more
    sites), then the summary and the other tables and plots. `extra_sections`:
    `(title, content)` pairs placed after the summary, where content is a table (rows,
    header first) or a list of paragraphs (strings); `jaxpace demo` adds its A/B table and
    Diagnosis here.
    """
    run = escape(str(report.run_id))
    more = len(report.decisions) - 1
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>jaxpace report: {run}</title>",
        f"<style>{CSS}</style></head><body>",
        f'<header id="answer"><h1 id="headline">{_headline_html(headline(report))}</h1>',
    ]
    if report.partial:
        parts.append(
            '<p class="partial">PARTIAL REPORT: the input was incomplete; see the notes below.</p>'
        )
    parts.append(
        f'<p class="meta">jaxpace report: run <code>{run}</code>, site '
        f"<code>{escape(report.site)}</code>; {report.num_ranks} ranks, "
        f"{report.analyzed_steps} of {report.num_steps} steps analyzed"
        + (
            f'; {more} more decision{"s" * (more > 1)} under <a href="#decisions">Decisions</a>'
            if more > 0
            else ""
        )
        + ".</p></header>"
    )
    if report.data is not None:
        parts.append(_section("lateness", "Who is late, and when", _lateness(report)))
    parts += _sites_section(report)
    parts.append(_section("summary", "Summary", _table(tables.summary_rows(report))))
    parts.append(_section("next", "What to do next", _table(tables.next_steps_rows(report))))
    parts.append(_section("decisions", "Decisions", _table(tables.decision_rows(report.findings))))
    costs = tables.cost_rows(report.findings, report.context.hours_unit)
    if costs:
        parts.append(_section("costs", "Cost of waiting", _table(costs)))
    if tables.host_rows(report.findings):
        parts.append(
            _section("hosts", "Hosts, latest first (ms)", _table(tables.host_rows(report.findings)))
        )
    for k, (title, content) in enumerate(extra_sections):
        if content and isinstance(content[0], str):
            body = "".join(f"<p>{escape(line)}</p>" for line in content)
        else:
            body = _table(content)
        parts.append(_section(f"extra-{k}", title, body))
    parts.append(
        _section("modes", "Failure modes", _table(tables.failure_mode_rows(report.findings)))
    )
    plots = []
    if report.data is not None:
        plots += [_phases(report.findings), _histogram(report)]
    why = tables.forecast_support(report)[2] if report.forecast is not None else ""
    plots.append(f"<figure>{_forecast(report)}<figcaption>{escape(why)}</figcaption></figure>")
    parts.append(_section("plots", "Plots", "\n".join(plots)))
    parts.append(
        _section(
            "ranking",
            "Culprit ranking (after warm-up; times in ms)",
            _table(tables.ranking_rows(report.findings, 64))
            + f"<p>{escape(fleet_view.LATE_LEGEND)} ({format_ms(report.noise_floor_s)}).</p>",
        )
    )
    for k, (title, rows) in enumerate(fleet_view.fleet_sections(report)):
        parts.append(_section(f"fleet-{k}", title, _table(rows)))  # spread, slowest, last
    if report.pacing is not None:
        caveat = f"<p>{escape(report.pacing.caveat)}</p>" if report.pacing.caveat else ""
        parts.append(
            _section("pacing", "Pacing effect", _table(tables.pacing_table(report.pacing)) + caveat)
        )
    notes = (*report.notes, *scope_notes(report))
    if notes:
        parts.append(
            _section(
                "notes",
                "Notes",
                "<ul>" + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ul>",
            )
        )
    parts.append("</body></html>")
    return "\n".join(parts)


def _sites_section(report: Report) -> list[str]:
    """Every site in step order (records of 2 or more sites), with who is late in a group."""
    rows = tables.site_rows(report.sites_table)
    if not rows:
        return []
    culprit = "none" if report.culprit is None else f"rank {report.culprit}"
    notes = tables.site_notes(report.sites_table) + [
        "A rank named here arrived last in its group at that site more often than chance "
        "allows: evidence of where lateness enters the step, not a verdict. The culprit is "
        f"the summary's, decided by the culprit test at `{report.site}`: {culprit}."
    ]
    return [
        _section(
            "sites",
            "Sites in step order (waits: median over steps of the mean over ranks)",
            _table(rows) + "".join(f"<p>{escape(n)}</p>" for n in notes),
        )
    ]


def write_html(
    report: Report, path: str | os.PathLike, extra_sections: Sequence[tuple[str, Any]] = ()
) -> Path:
    """Writes a self-contained HTML report (inline SVG plots, no scripts) to `path`.

    Plots: per-rank lateness heat map, phase breakdown per rank, step-time
    histogram, amplification forecast. Written atomically (`safe_io.write_atomic`):
    a failed write leaves an earlier report whole; a symlink there is refused.
    """
    p = Path(path)
    write_atomic(p, render_report_html(report, extra_sections), what="HTML report")
    return p
