"""`jaxpace.report.render.summary` says what the terminal summary holds; `terminal` lays it
out with `rich` (tables, wrapping) exactly as the fixed-width text it replaced."""

from __future__ import annotations

import ast
from pathlib import Path

from jaxpace.report import Report, analyze, synthetic_records
from jaxpace.report.render import summary, terminal


def _report():
    return analyze(synthetic_records(8, 60, late_rank=3, late_s=0.01, seed=1))


def test_tables_keep_their_fixed_width_layout():
    rows = [["rank", "host", "excess", "95% CI"], ["3 *", "node-3", "10.1", "[9.98, 10.2]"],
            ["12", "n", "-0.5", "[-1, 0]"]]  # fmt: skip
    assert terminal.text_table(rows, "Ranking") == [
        "Ranking",
        "  rank  host    excess        95% CI",
        "  ----  ------  ------  ------------",
        "   3 *  node-3    10.1  [9.98, 10.2]",
        "    12  n         -0.5       [-1, 0]",
    ]


def test_wrapping_keeps_words_and_commands_whole():
    text = "run `nvidia-smi -q -d CLOCK` then " + "x" * 70 + " and stop"
    lines = terminal.wrap_text(text, 40, "  - ", "    ")
    assert lines == ["  - run `nvidia-smi -q -d CLOCK` then", "    " + "x" * 70, "    and stop"]
    assert terminal.wrap_text("a b", 40, "Failure modes: ", "  ") == ["Failure modes: a b"]
    # A private-use character in a name is the name's own, never taken for a joined space.
    pua = "site\ue000x `cmd \ue000 arg`"
    assert terminal.wrap_text(pua, 40) == [pua]


def test_summary_renderable_shows_the_ranks_it_is_asked_for():
    from rich.console import Console

    rep = _report()
    for n in (2, 5):
        text = terminal.summary_renderable(rep, max_ranks=n).plain
        assert f"top {n})" in text
        table = next(b for b in summary.summary_blocks(rep, verbose=True, max_ranks=n)
                     if isinstance(b, summary.Table))  # fmt: skip
        assert len(table.rows) == n + 1
    Console(width=100).print(terminal.summary_renderable(rep))  # a renderable rich prints


def test_summary_blocks_are_what_summary_lines_print():
    rep = _report()
    blocks = summary.summary_blocks(rep, verbose=True)
    lines = terminal.summary_lines(rep, verbose=True)
    titles = [b.title for b in blocks if isinstance(b, (summary.Table, summary.Items)) and b.title]
    assert titles and all(t in lines for t in titles)
    assert "Decisions (evidence, confidence)" in titles and "What to do next" in titles


def test_the_model_imports_nothing_of_render_and_has_no_summary_table():
    tree = ast.parse(Path(summary.__file__).parents[1].joinpath("model.py").read_text())
    mods = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    mods += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in mods if m and m.startswith("jaxpace.report")], mods
    assert not hasattr(Report, "summary_table")


def test_the_terminal_takes_the_summary_from_one_owner():
    """`terminal` renders blocks; it reads nothing of the report's tables itself."""
    tree = ast.parse(Path(terminal.__file__).read_text())
    mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "jaxpace.report.render.summary" in mods
    assert not {m for m in mods if m and m.endswith((".tables", ".fleet_view", ".advice"))}
