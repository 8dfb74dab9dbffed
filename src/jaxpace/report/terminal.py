"""The terminal summary: the rows of `tables` as `rich` tables."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jaxpace.report.tables as tables
from jaxpace.report.fleet_view import LATE_LEGEND

if TYPE_CHECKING:
    from jaxpace.report.model import Report

__all__ = ["print_summary", "summary_renderable"]


def _rich_table(rows: list[list[str]], title: str, *, show_header: bool = True) -> Any:
    """A `rich` table of `rows` (header first); text columns left, numbers right."""
    from rich.table import Table

    header, *body = rows
    t = Table(title=title, show_header=show_header)
    for i, col in enumerate(header):
        text = (i == 0 and col not in ("rank", "ranks")) or col in ("host", "detected", "evidence")
        t.add_column(col, justify="left" if text else "right")
    for row in body:
        t.add_row(*row)
    return t


def summary_renderable(report: Report, max_ranks: int = 12) -> Any:
    """The summary as a `rich` renderable (a group of tables and notes)."""
    from rich.console import Group
    from rich.text import Text

    parts: list[Any] = []
    if report.partial:
        parts.append(Text("PARTIAL REPORT: input was incomplete (see notes)", style="bold red"))
    title = f"jaxpace report: run `{report.run_id}`, site `{report.site}`"
    parts.append(_rich_table(tables.summary_rows(report), title, show_header=False))
    rt = _rich_table(
        tables.ranking_rows(report, max_ranks), "Culprit ranking (after warm-up; times in ms)"
    )
    rt.caption = LATE_LEGEND
    if len(report.ranking) > max_ranks:
        rt.caption += f"; {len(report.ranking) - max_ranks} more ranks in the JSON/HTML report"
    parts.append(rt)
    parts.append(_rich_table(tables.decision_rows(report), "Decisions"))
    if tables.cost_rows(report):
        parts.append(_rich_table(tables.cost_rows(report), "Cost of waiting"))
    if len(tables.host_rows(report)) > 2 and report.num_ranks > max_ranks:
        parts.append(_rich_table(tables.host_rows(report, 8), "Hosts, latest first (ms)"))
    parts.append(_rich_table(tables.failure_mode_rows(report), "Failure modes"))
    if report.forecast is not None and tables.forecast_rows(report):
        fc = report.forecast
        st = _rich_table(tables.forecast_rows(report), "Amplification forecast (order statistics)")
        st.caption = (
            f"measured {fc.measured_amplification:.3f} at {fc.measured_ranks} ranks "
            f"(forecast there {fc.forecast_at_measured:.3f}); {tables.forecast_support(report)[2]}"
        )
        parts.append(st)
    if report.pacing is not None:
        parts.append(_rich_table(tables.pacing_table(report.pacing), "Pacing effect"))
    if report.notes:
        parts.append(Text("Notes:\n" + "\n".join(f"- {n}" for n in report.notes)))
    parts.append(
        Text(
            "What to do next:\n"
            + "\n".join(f"- {r[0]}" for r in tables.next_steps_rows(report)[1:])
        )
    )
    return Group(*parts)


def print_summary(report: Report, console: Any = None) -> None:
    """Prints the summary tables to `console` (a `rich.console.Console`; default stdout).

    >>> import io
    >>> from rich.console import Console
    >>> from jaxpace.report import analyze, synthetic_records
    >>> buf = io.StringIO()
    >>> print_summary(analyze(synthetic_records(4, 20)), Console(file=buf, width=120))
    >>> "Culprit ranking" in buf.getvalue()
    True
    """
    if console is None:
        from rich.console import Console

        console = Console()
    console.print(summary_renderable(report))
