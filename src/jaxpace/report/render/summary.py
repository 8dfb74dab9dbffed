"""What the terminal summary says, section by section: the one owner of its content.

`summary_blocks` builds the whole summary from a `Report` (from the rows of
`tables`, which the HTML renders too) as a list of blocks; `terminal` lays
them out with `rich` and knows nothing of the report. By default a short summary
(about 25 lines: the headline numbers, the top of the ranking, the detected
modes, what to do next); `verbose=True` adds every table, the evidence and the notes.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING

import jaxpace.report.render.tables as tables
from jaxpace.report.fleet_view import LATE_LEGEND, fleet_short
from jaxpace.report.model import LIKELY_MODE, likely_subject

if TYPE_CHECKING:
    from jaxpace.report.model import Report

__all__ = [
    "DEFAULT_ACTIONS",
    "DEFAULT_RANKS",
    "VERBOSE_RANKS",
    "Block",
    "Items",
    "Line",
    "Pairs",
    "Prose",
    "Table",
    "headline",
    "summary_blocks",
]

DEFAULT_RANKS = 3  # ranking rows in the short summary
VERBOSE_RANKS = 12  # ranking rows with --verbose (the HTML and JSON hold all)
DEFAULT_ACTIONS = 2  # "what to do next" items in the short summary
# Rows of the summary table that only `--verbose` prints (the default stays about 25 lines).
_VERBOSE_ONLY_ROWS = ("iteration p50 / p90 / p99",)


@dataclasses.dataclass(frozen=True)
class Line:
    """One line as it is, never wrapped (a heading, or empty: a gap between sections)."""

    text: str = ""


@dataclasses.dataclass(frozen=True)
class Pairs:
    """Name and value per row: the names in one column, each value wrapped beside its name."""

    rows: tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True)
class Table:
    """A titled table, header row first; cells are never wrapped or cut."""

    title: str
    rows: tuple[tuple[str, ...], ...]


@dataclasses.dataclass(frozen=True)
class Prose:
    """A paragraph, wrapped and indented by `indent` columns, after `lead` (if any)."""

    text: str
    lead: str = ""
    indent: int = 2


@dataclasses.dataclass(frozen=True)
class Items:
    """A bulleted list under `title` (none: no title line), each item wrapped after its bullet."""

    title: str | None
    items: tuple[str, ...]
    indent: int = 2


Block = Line | Pairs | Table | Prose | Items


def _table(title: str, rows: list[list[str]]) -> Table:
    return Table(title, tuple(tuple(r) for r in rows))


def _headline(report: Report, verbose: bool) -> Pairs:
    rows = tables.summary_rows(report)[1:]
    if not verbose:
        rows = [
            [m, fleet_short(report.fleet) if m == "fleet spread" else v]
            for m, v in rows
            if m not in _VERBOSE_ONLY_ROWS
        ]
    return Pairs(tuple((m, v) for m, v in rows))


def _ranking(report: Report, n: int, verbose: bool) -> list[Block]:
    title = f"Culprit ranking (after warm-up; times in ms; top {min(n, len(report.ranking))})"
    legend = LATE_LEGEND
    if len(report.ranking) > n:
        where = "in the HTML and JSON" if verbose else "with --verbose / in the HTML"
        more = len(report.ranking) - n
        legend += f"; {more} more rank{'s' * (more > 1)} {where}"
    return [_table(title, tables.ranking_rows(report.findings, n)), Prose(legend)]


def _modes(report: Report, verbose: bool) -> list[Block]:
    if not verbose:
        found = [
            f"{m.name} ({m.score:.2f})"
            for m in report.failure_modes
            if m.detected and m.name != "balanced"
        ]
        likely = getattr(report, "likely", None)
        if found:
            text = ", ".join(found)
        elif report.primary_mode == LIKELY_MODE and likely is not None:
            who = likely_subject(likely)
            text = f"none named with confidence; {who} likely, below the line (not balanced)"
        else:
            text = "none (balanced)"
        return [Prose(f"primary {report.primary_mode}; detected: {text}", lead="Failure modes: ")]
    out: list[Block] = [Line("Failure modes")]
    for m in report.failure_modes:
        out.append(Line(f"  {m.name}: score {m.score:.2f}{', detected' if m.detected else ''}"))
        if m.evidence:
            out.append(Items(None, tuple(_once(e, report.decisions) for e in m.evidence), indent=4))
    return out


def _once(evidence: str, decisions: tuple[str, ...]) -> str:
    """A mode's evidence, or a pointer to the decision that already says it (each sentence once)."""
    return "as in Decisions above" if any(evidence in d for d in decisions) else evidence


def _outlook(report: Report) -> list[Block]:
    """Verbose only: the cost of waiting, hosts, the forecast and the pacing effect."""
    out: list[Block] = []
    costs = tables.cost_rows(report.findings, report.context.hours_unit)
    if costs:
        out += [Line(), _table("Cost of waiting", costs)]
    if len(tables.host_rows(report.findings)) > 2:
        out += [Line(), _table("Hosts, latest first (ms)", tables.host_rows(report.findings, 8))]
    if report.forecast is not None and tables.forecast_rows(report):
        fc = report.forecast
        out += [Line(), _table("Amplification forecast", tables.forecast_rows(report))]
        out.append(
            Prose(
                f"measured {fc.measured_amplification:.3f} at {fc.measured_ranks} ranks (forecast "
                f"there {fc.forecast_at_measured:.3f}); {tables.forecast_support(report)[2]}"
            )
        )
    if report.pacing is not None:
        out += [Line(), _table("Pacing effect", tables.pacing_table(report.pacing))]
        if report.pacing.caveat:
            out.append(Prose(report.pacing.caveat))
    return out


def _notes(report: Report, verbose: bool) -> tuple[str, ...]:
    """Every note with --verbose; by default the tagged ones (`PARTIAL:`, `NO CULPRIT:` ...)."""
    from jaxpace.report.advice import scope_notes

    tagged = tuple(n for n in report.notes if verbose or re.match(r"[A-Z][A-Z ]+:", n))
    return tagged + scope_notes(report)


def _actions(report: Report, verbose: bool) -> tuple[str, ...]:
    """Every action with --verbose; else the primary block's first `DEFAULT_ACTIONS` and
    the first action of every other block (a named culprit is never left out)."""
    from jaxpace.report.advice import advice_blocks

    blocks = advice_blocks(report)
    if verbose:
        return tuple(line for b in blocks for line in b)
    return tuple(blocks[0][:DEFAULT_ACTIONS] + [b[0] for b in blocks[1:]])


def headline(report: Report) -> str:
    """The report's answer in one sentence, the first thing a reader sees: its first
    decision (the culprit, group or mode, its evidence and what it costs), or why none.

    >>> from jaxpace.report import analyze, synthetic_records
    >>> rep = analyze(synthetic_records(8, 60, late_rank=3, late_s=0.01, seed=1))
    >>> headline(rep).split(" is ")[0]
    'Straggler: rank 3 (node-3)'
    """
    if report.decisions:
        return report.decisions[0]
    return "No decision: the input held no step every rank reported (see the notes)."


def summary_blocks(
    report: Report, *, verbose: bool = False, max_ranks: int | None = None
) -> list[Block]:
    """The summary of `report`, top to bottom; `max_ranks` ranking rows (default 3, or 12
    with `verbose`).

    >>> from jaxpace.report import analyze, synthetic_records
    >>> rep = analyze(synthetic_records(8, 60, late_rank=3, late_s=0.01, seed=1))
    >>> [type(b).__name__ for b in summary_blocks(rep)][:4]
    ['Line', 'Pairs', 'Line', 'Table']
    """
    n = max_ranks if max_ranks is not None else VERBOSE_RANKS if verbose else DEFAULT_RANKS
    out: list[Block] = []
    if report.partial:
        out.append(Line("PARTIAL REPORT: input was incomplete (see notes)"))
    out.append(Line(f"jaxpace report: run `{report.run_id}`, site `{report.site}`"))
    out.append(_headline(report, verbose))
    out += [Line(), *_ranking(report, n, verbose)]
    if verbose:
        out += [Line(), Items("Decisions (evidence, confidence)", tuple(report.decisions))]
    out += [Line(), *_modes(report, verbose)]
    if verbose:
        out += _outlook(report)
    notes = _notes(report, verbose)
    if notes:
        out += [Line(), Items("Notes", notes)]
    out += [Line(), Items("What to do next", _actions(report, verbose))]
    if not verbose:
        out.append(
            Line("(--verbose: every rank, the decisions' evidence, costs, forecast, pacing, notes)")
        )
    return out
