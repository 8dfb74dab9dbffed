"""The terminal summary: the rows of `tables` as plain fixed-width text.

By default a short summary (about 25 lines: the headline numbers, the top of
the ranking, the detected modes, what to do next); `verbose=True` (`jaxpace
report --verbose`) adds every table, the evidence and the notes. Nothing is cut
with an ellipsis: columns are as wide as their widest cell, and sentences wrap
at word boundaries (never inside a `command`) at the terminal's width, or at
100 columns off a terminal (piped, redirected).
"""

from __future__ import annotations

import re
import shutil
import sys
import textwrap
from typing import TYPE_CHECKING, Any

import jaxpace.report.render.tables as tables
from jaxpace.report.fleet_view import LATE_LEGEND, fleet_short

if TYPE_CHECKING:
    from jaxpace.report.model import Report

__all__ = [
    "display_name",
    "print_summary",
    "printable",
    "summary_lines",
    "summary_renderable",
    "text_table",
    "wrap_text",
]

PIPE_WIDTH = 100  # columns of text off a terminal
DEFAULT_RANKS = 3  # ranking rows in the short summary
DEFAULT_ACTIONS = 2  # "what to do next" items in the short summary
_TEXT_COLUMNS = ("host", "detected", "evidence", "waiting for", "mode")
_NBSP = "\x00"

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


def display_name(name: object) -> str:
    """A run id, site, host or mode name as printed.

    Every piece of text the summary prints goes through here (table cells and
    sentences too, since they embed names), so one change covers every name:
    control characters are shown as escapes (`printable`), and the summary
    reaches the terminal as plain text, never parsed as `rich` markup.
    """
    return printable(name)


def wrap_text(text: str, width: int, first: str = "", rest: str = "") -> list[str]:
    """`text` wrapped at `width` on word boundaries, never inside a `backticked span`."""
    text = display_name(text)
    protected = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", _NBSP), text)
    lines = textwrap.wrap(
        protected,
        width=max(width, 40),
        initial_indent=first,
        subsequent_indent=rest,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [first]
    return [ln.replace(_NBSP, " ") for ln in lines]


def text_table(rows: list[list[str]], title: str | None = None, header: bool = True) -> list[str]:
    """`rows` (header first) as fixed-width columns: text left, numbers right, nothing cut."""
    head, *body = [[display_name(c) for c in r] for r in rows]
    shown = [head, *body] if header else body
    if not shown:
        return []
    widths = [max(len(r[i]) for r in shown) for i in range(len(head))]
    left = [
        (i == 0 and col not in ("rank", "ranks")) or col in _TEXT_COLUMNS
        for i, col in enumerate(head)
    ]
    out = [title] if title else []
    for j, row in enumerate(shown):
        cells = [
            c.ljust(w) if lf else c.rjust(w) for c, w, lf in zip(row, widths, left, strict=True)
        ]
        out.append("  " + "  ".join(cells).rstrip())
        if header and j == 0:
            out.append("  " + "  ".join("-" * w for w in widths))
    return out


# Rows of the summary table that only `--verbose` prints (the default stays about 25 lines).
_VERBOSE_ONLY_ROWS = ("iteration p50 / p90 / p99",)


def _summary(report: Report, width: int, verbose: bool = True) -> list[str]:
    rows = tables.summary_rows(report)[1:]
    if not verbose:
        rows = [
            [m, fleet_short(report.fleet) if m == "fleet spread" else v]
            for m, v in rows
            if m not in _VERBOSE_ONLY_ROWS
        ]
    key = max(len(m) for m, _ in rows)
    out = []
    for metric, value in rows:
        out += wrap_text(value, width, f"  {metric.ljust(key)}  ", " " * (key + 4))
    return out


def _ranking(report: Report, n: int, verbose: bool, width: int) -> list[str]:
    title = f"Culprit ranking (after warm-up; times in ms; top {min(n, len(report.ranking))})"
    lines = text_table(tables.ranking_rows(report, n), title)
    legend = LATE_LEGEND
    if len(report.ranking) > n:
        where = "in the HTML and JSON" if verbose else "with --verbose / in the HTML"
        more = len(report.ranking) - n
        legend += f"; {more} more rank{'s' * (more > 1)} {where}"
    return lines + wrap_text(legend, width, "  ", "  ")


def _modes(report: Report, width: int, verbose: bool) -> list[str]:
    if not verbose:
        found = [
            f"{display_name(m.name)} ({m.score:.2f})"
            for m in report.failure_modes
            if m.detected and m.name != "balanced"
        ]
        text = ", ".join(found) if found else "none (balanced)"
        return wrap_text(f"primary {display_name(report.primary_mode)}; detected: {text}", width,
                     "Failure modes: ", "  ")  # fmt: skip
    out = ["Failure modes"]
    for m in report.failure_modes:
        out.append(
            f"  {display_name(m.name)}: score {m.score:.2f}{', detected' if m.detected else ''}"
        )
        for ev in m.evidence:
            out += wrap_text(ev, width, "    - ", "      ")
    return out


def _sentences(title: str, items: list[str], width: int) -> list[str]:
    out = [title]
    for s in items:
        out += wrap_text(s, width, "  - ", "    ")
    return out


def _notes(report: Report, verbose: bool) -> list[str]:
    """Every note with --verbose; by default the tagged ones (`PARTIAL:`, `NO CULPRIT:` ...)."""
    return [n for n in report.notes if verbose or re.match(r"[A-Z][A-Z ]+:", n)]


def _outlook(report: Report, width: int) -> list[str]:
    out: list[str] = []
    if tables.cost_rows(report):
        out += ["", *text_table(tables.cost_rows(report), "Cost of waiting")]
    if len(tables.host_rows(report)) > 2:
        out += ["", *text_table(tables.host_rows(report, 8), "Hosts, latest first (ms)")]
    if report.forecast is not None and tables.forecast_rows(report):
        fc = report.forecast
        out += ["", *text_table(tables.forecast_rows(report), "Amplification forecast")]
        out += wrap_text(
            f"measured {fc.measured_amplification:.3f} at {fc.measured_ranks} ranks (forecast "
            f"there {fc.forecast_at_measured:.3f}); {tables.forecast_support(report)[2]}",
            width,
            "  ",
            "  ",
        )
    if report.pacing is not None:
        out += ["", *text_table(tables.pacing_table(report.pacing), "Pacing effect")]
        if report.pacing.caveat:
            out += wrap_text(report.pacing.caveat, width, "  ", "  ")
    return out


def _actions(report: Report, verbose: bool) -> list[str]:
    """Every action with --verbose; else the primary block's first `DEFAULT_ACTIONS` and
    the first action of every other block (a named culprit is never left out)."""
    from jaxpace.report.advice import advice_blocks

    blocks = advice_blocks(report)
    if verbose:
        return [line for b in blocks for line in b]
    return blocks[0][:DEFAULT_ACTIONS] + [b[0] for b in blocks[1:]]


def summary_lines(report: Report, *, verbose: bool = False, width: int = PIPE_WIDTH) -> list[str]:
    """The summary as lines of plain text, at most `width` columns where words allow.

    >>> from jaxpace.report import analyze, synthetic_records
    >>> rep = analyze(synthetic_records(8, 60, late_rank=3, late_s=0.01, seed=1))
    >>> lines = summary_lines(rep)
    >>> len(lines) <= 30, any("rank 3 (process 3" in ln for ln in lines)
    (True, True)
    """
    out = []
    if report.partial:
        out.append("PARTIAL REPORT: input was incomplete (see notes)")
    out.append(
        f"jaxpace report: run `{display_name(report.run_id)}`, site `{display_name(report.site)}`"
    )
    out += _summary(report, width, verbose)
    out += ["", *_ranking(report, 12 if verbose else DEFAULT_RANKS, verbose, width)]
    if verbose:
        out += ["", *_sentences("Decisions (evidence, confidence)", list(report.decisions), width)]
    out += ["", *_modes(report, width, verbose)]
    if verbose:
        out += _outlook(report, width)
    notes = _notes(report, verbose)
    if notes:
        out += ["", *_sentences("Notes", notes, width)]
    out += ["", *_sentences("What to do next", _actions(report, verbose), width)]
    if not verbose:
        out.append(
            "(--verbose: every rank, the decisions' evidence, costs, forecast, pacing, notes)"
        )
    return out


def summary_renderable(report: Report, max_ranks: int = 12) -> Any:
    """The full (`verbose`) summary as a `rich` renderable (plain text, not re-wrapped)."""
    from rich.text import Text

    del max_ranks  # the verbose summary shows up to 12 ranks; the HTML/JSON hold all
    return Text("\n".join(summary_lines(report, verbose=True)), no_wrap=True, overflow="ignore")


def _terminal_width(stream: Any) -> int:
    """The terminal's width (at most 120) on a TTY, else `PIPE_WIDTH`."""
    try:
        tty = bool(stream.isatty())
    except (AttributeError, ValueError):
        tty = False
    return min(shutil.get_terminal_size((PIPE_WIDTH, 24)).columns, 120) if tty else PIPE_WIDTH


def print_summary(report: Report, console: Any = None, *, verbose: bool = False) -> None:
    """Prints the summary: to `console` (a `rich.console.Console`, at its width) or stdout.

    >>> import io
    >>> from rich.console import Console
    >>> from jaxpace.report import analyze, synthetic_records
    >>> buf = io.StringIO()
    >>> print_summary(analyze(synthetic_records(4, 20)), Console(file=buf, width=120))
    >>> "Culprit ranking" in buf.getvalue()
    True
    """
    if console is None:
        width = _terminal_width(sys.stdout)
        print("\n".join(summary_lines(report, verbose=verbose, width=width)))
        return
    text = "\n".join(summary_lines(report, verbose=verbose, width=min(console.width, 200)))
    console.print(text, markup=False, highlight=False, soft_wrap=True)
