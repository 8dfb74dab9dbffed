"""The terminal summary: the rows of `tables` as `rich` tables."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import jaxpace.report.tables as tables

if TYPE_CHECKING:
    from jaxpace.report.model import Report

__all__ = ["print_summary", "printable", "summary_renderable"]

# C0/C1 controls (ESC starts terminal sequences), DEL, zero-width and
# bidirectional-override characters: never written to a terminal as they are.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def printable(text: Any, *, keep_newlines: bool = False) -> str:
    r"""`text` as a string safe to print: every control character shown as an escape.

    Names in records (sites, hosts) are data: an ESC or BEL in them is printed
    as `\x1b`/`\x07`, never sent to the terminal, and two names that differ only
    in such characters stay different. Rich markup is not interpreted either:
    the summary hands these strings to `rich` as plain `Text`.

    >>> printable("grads\x1b]0;TITLE\x07[/]")
    'grads\\x1b]0;TITLE\\x07[/]'
    >>> printable("a\nb"), printable("a\nb", keep_newlines=True)
    ('a\\nb', 'a\nb')
    """

    def esc(m: re.Match) -> str:
        c = m.group()
        if keep_newlines and c == "\n":
            return c
        return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(c) or (
            f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"
        )

    return _UNSAFE.sub(esc, str(text))


def _text(text: Any, **style: Any) -> Any:
    """`text` as a `rich` `Text`: escaped (`printable`), never parsed as markup."""
    from rich.text import Text

    return Text(printable(text, keep_newlines=True), **style)


def _rich_table(rows: list[list[str]], title: str, *, show_header: bool = True) -> Any:
    """A `rich` table of `rows` (header first); text columns left, numbers right."""
    from rich.table import Table

    header, *body = rows
    t = Table(title=_text(title), show_header=show_header)
    for i, col in enumerate(header):
        text = (i == 0 and col not in ("rank", "ranks")) or col in ("host", "detected", "evidence")
        t.add_column(_text(col), justify="left" if text else "right")
    for row in body:
        t.add_row(*(_text(cell) for cell in row))
    return t


def summary_renderable(report: Report, max_ranks: int = 12) -> Any:
    """The summary as a `rich` renderable (a group of tables and notes)."""
    from rich.console import Group

    parts: list[Any] = []
    if report.partial:
        parts.append(_text("PARTIAL REPORT: input was incomplete (see notes)", style="bold red"))
    title = f"jaxpace report: run `{report.run_id}`, site `{report.site}`"
    parts.append(_rich_table(tables.summary_rows(report), title, show_header=False))
    rt = _rich_table(
        tables.ranking_rows(report, max_ranks), "Culprit ranking (after warm-up; times in ms)"
    )
    caption = "* = significantly late (CI excludes 0, above the noise floor)"
    if len(report.ranking) > max_ranks:
        caption += f"; {len(report.ranking) - max_ranks} more ranks in the JSON/HTML report"
    rt.caption = _text(caption)
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
        st.caption = _text(
            f"measured {fc.measured_amplification:.3f} at {fc.measured_ranks} ranks "
            f"(forecast there {fc.forecast_at_measured:.3f}); {tables.forecast_support(report)[2]}"
        )
        parts.append(st)
    if report.pacing is not None:
        parts.append(_rich_table(tables.pacing_table(report.pacing), "Pacing effect"))
    if report.notes:
        parts.append(_text("Notes:\n" + "\n".join(f"- {n}" for n in report.notes)))
    parts.append(
        _text(
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
