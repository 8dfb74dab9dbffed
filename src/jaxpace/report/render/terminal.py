"""The terminal summary: the blocks of `summary` laid out with `rich` as plain text.

What the summary says is `summary.summary_blocks` (a short summary by default,
every table and note with `verbose=True`, `jaxpace report --verbose`); this
module lays it out. Nothing is cut with an ellipsis: table columns
(`rich.table.Table`) are as wide as their widest cell, and sentences wrap at word
boundaries (never inside a `command`) at the terminal's width, or at 100 columns
off a terminal (piped, redirected). Every name passes `printable` first.
"""

from __future__ import annotations

import io
import re
import shutil
import sys
from typing import TYPE_CHECKING, Any

import jaxpace.report.render.tables as tables
from jaxpace.report.render.summary import (
    VERBOSE_RANKS,
    Block,
    Line,
    Pairs,
    Prose,
    Table,
    summary_blocks,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from jaxpace.report.model import Report, SiteRow

__all__ = [
    "display_name",
    "print_summary",
    "printable",
    "site_table_lines",
    "summary_lines",
    "summary_renderable",
    "text_table",
    "wrap_text",
]

PIPE_WIDTH = 100  # columns of text off a terminal
MIN_WIDTH = 40  # sentences wrap at no fewer columns
_TEXT_COLUMNS = ("host", "detected", "evidence", "waiting for", "mode")
# Stands for a space inside a `backticked span` while `rich` wraps (a printable,
# non-space character of one column, so the span is one word); a space again in the output.
# Private-use characters: the first one the text does not hold.
_JOINERS = range(0xE000, 0xF900)

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


def _console(width: int) -> Any:
    """A `rich` console that writes plain text (no colour, no markup) to a buffer."""
    from rich.console import Console

    return Console(
        file=io.StringIO(), width=width, color_system=None, force_terminal=False,
        force_jupyter=False, force_interactive=False, legacy_windows=False, markup=False,
        emoji=False, highlight=False, _environ={},
    )  # fmt: skip


def _joiner(*texts: str) -> str:
    """A private-use character none of `texts` holds (it stands for a joined space)."""
    used = set("".join(texts))
    return next(c for c in map(chr, _JOINERS) if c not in used)


def _words(text: str, join: str, wrap: bool = False) -> Any:
    """`text` escaped (`display_name`) as a `rich` Text that wraps at spaces only: spans in
    backticks stay whole (their spaces are `join` until the output), and a word longer than
    the line is kept whole (never cut); `wrap`: left to the table column that holds it (as
    wide as its longest word)."""
    from rich.text import Text

    text = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", join), display_name(text))
    return Text(text) if wrap else Text(text, overflow="ignore")


def wrap_text(text: str, width: int, first: str = "", rest: str = "") -> list[str]:
    """`text` wrapped at `width` (at least `MIN_WIDTH`) columns on word boundaries, never
    inside a `backticked span`: the first line after `first`, the others after `rest`."""
    console = _console(max(width, MIN_WIDTH))
    join = _joiner(text, first, rest)
    words = _words(text, join)
    if not words.plain:
        return [first]
    head = words.wrap(console, max(console.width - len(first), 1))[0]
    out = [first + head.plain.rstrip()]
    words = words[len(head.plain) :]  # the rest of the text wraps after `rest`
    words.plain = words.plain.lstrip()
    if words.plain:
        lines = words.wrap(console, max(console.width - len(rest), 1))
        out += [rest + ln.plain.rstrip() for ln in lines]
    return [ln.replace(join, " ") for ln in out]


def _render(renderable: Any, width: int, whole: bool = False, join: str = "") -> list[str]:
    """A `rich` table as lines of plain text at `width` columns, or wider where its words
    need it (`whole`: where its cells need it); nothing is cut or folded."""
    from rich.measure import Measurement

    console = _console(max(width, MIN_WIDTH))
    need = Measurement.get(console, console.options.update(width=1_000_000), renderable)
    console.width = max(console.width, need.maximum if whole else need.minimum)
    console.print(renderable, crop=False)
    lines = [ln.rstrip() for ln in console.file.getvalue().splitlines()]
    return [ln.replace(join, " ") for ln in lines] if join else lines


def _cell(text: str) -> Any:
    """A table cell: escaped, one line (the table is as wide as its widest cell)."""
    from rich.text import Text

    return Text(display_name(text), no_wrap=True)


def _pairs(rows: tuple[tuple[str, str], ...], width: int) -> list[str]:
    """Names in one column, each value wrapped beside its name (never inside a word); a
    row whose value holds a word too long for the width runs past it alone."""
    from rich.padding import Padding
    from rich.table import Table as RichTable

    names = [_cell(name) for name, _ in rows]
    key = max((n.cell_len for n in names), default=0)
    out = []
    for name, (_, value) in zip(names, rows, strict=True):
        grid = RichTable.grid(padding=(0, 2))
        # `min_width`: the names' column is never narrowed (rich measures text by its words).
        grid.add_column(no_wrap=True, min_width=key)
        grid.add_column(overflow="fold")  # as wide as its longest word at least: nothing folds
        join = _joiner(value, name.plain)
        grid.add_row(name, _words(value, join, wrap=True))
        out += _render(Padding(grid, (0, 0, 0, 2), expand=False), width, join=join)
    return out


def _table(rows: tuple[tuple[str, ...], ...], header: bool = True) -> Any:
    """`rows` (header first) as a `rich` table: text left, numbers right, nothing cut; a
    rule of `-` under each column's header (ASCII: piped output stays ASCII)."""
    from rich.padding import Padding
    from rich.table import Table as RichTable

    cells = [[_cell(c) for c in row] for row in (rows if header else rows[1:])]
    t = RichTable(
        box=None, show_header=header, pad_edge=False, padding=(0, 0, 0, 2), header_style=""
    )
    for i, col in enumerate(rows[0]):
        left = (i == 0 and col not in ("rank", "ranks")) or col in _TEXT_COLUMNS
        head = _cell(col).append("\n" + "-" * max(row[i].cell_len for row in cells))
        t.add_column(head, justify="left" if left else "right", no_wrap=True, overflow="fold")
    for row in cells[1 if header else 0 :]:
        t.add_row(*row)
    return Padding(t, (0, 0, 0, 2), expand=False)


def text_table(rows: list[list[str]], title: str | None = None, header: bool = True) -> list[str]:
    """`rows` (header first) as lines of a `rich` table, after `title` (if any): text left,
    numbers right, every column as wide as its widest cell (nothing cut)."""
    if len(rows) < (1 if header else 2):
        return []
    table = _render(_table(tuple(tuple(r) for r in rows), header), PIPE_WIDTH, whole=True)
    return ([display_name(title)] if title else []) + table


def _lines(block: Block, width: int) -> list[str]:
    if isinstance(block, Line):
        return [display_name(block.text)]
    if isinstance(block, Pairs):
        return _pairs(block.rows, width)
    if isinstance(block, Table):
        return text_table([list(r) for r in block.rows], block.title)
    indent = " " * block.indent
    if isinstance(block, Prose):
        return wrap_text(block.text, width, block.lead or indent, indent)
    out = [display_name(block.title)] if block.title is not None else []
    for item in block.items:
        out += wrap_text(item, width, indent + "- ", indent + "  ")
    return out


def summary_lines(report: Report, *, verbose: bool = False, width: int = PIPE_WIDTH) -> list[str]:
    """The summary as lines of plain text, at most `width` columns where words allow.

    >>> from jaxpace.report import analyze, synthetic_records
    >>> rep = analyze(synthetic_records(8, 60, late_rank=3, late_s=0.01, seed=1))
    >>> lines = summary_lines(rep)
    >>> len(lines) <= 30, any("rank 3 (process 3" in ln for ln in lines)
    (True, True)
    """
    return [ln for b in summary_blocks(report, verbose=verbose) for ln in _lines(b, width)]


def summary_renderable(report: Report, max_ranks: int = VERBOSE_RANKS) -> Any:
    """The full (`verbose`) summary with `max_ranks` ranking rows as a `rich` renderable
    (plain text at `PIPE_WIDTH` columns, not re-wrapped)."""
    from rich.text import Text

    blocks = summary_blocks(report, verbose=True, max_ranks=max_ranks)
    text = "\n".join(ln for b in blocks for ln in _lines(b, PIPE_WIDTH))
    return Text(text, no_wrap=True, overflow="ignore")


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


def site_table_lines(sites_table: Sequence[SiteRow], *, verbose: bool = False) -> list[str]:
    """The terminal's sites table (`tables.site_rows`) and its notes, as lines.

    Replaces `stages.links.format_site_table` for the terminal: that one prints every
    group's member list and full names, which at 512 ranks is 512 numbers a row.
    """
    rows = tables.site_rows(sites_table, verbose=verbose)
    if not rows:
        return []
    lines = text_table(
        rows, title="Sites, in step order (waits: median over steps of the mean over ranks)"
    )
    if not verbose and any(len(r.site) > tables.SITE_NAME_WIDTH for r in sites_table):
        lines.append("Site names shortened in the middle; --verbose shows them whole.")
    return lines + tables.site_notes(sites_table)
