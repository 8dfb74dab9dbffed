"""Issue 47: the terminal's sites table fits: groups summarized ("64 groups of 8"), long
site names shortened (whole with --verbose), no member lists of 512 ranks, no `?`/None."""

from __future__ import annotations

from jaxpace.report.model import GroupLate, SiteRow
from jaxpace.report.render.tables import site_rows
from jaxpace.report.render.terminal import site_table_lines

LONG = "jit_train_step/while/body/closed_call/transformer_block_17/all-reduce-start.42"


def _rows():
    groups = tuple(tuple(range(8 * g, 8 * g + 8)) for g in range(64))
    wide = tuple(range(512))
    late = (GroupLate(rank=77, group=wide, lead_s=0.004, latest_share=0.9, p_value=1e-9),)
    return (
        SiteRow(LONG, None, groups, 100, 0.002, 0.6, 0.001, late, (), None),
        SiteRow(
            "jit_train_step/all-gather.3",
            "all-gather",
            (wide,),
            100,
            0.001,
            0.4,
            0.002,
            (),
            (),
            None,
        ),
    )


def test_groups_are_summarized_and_names_shortened_by_default():
    lines = site_table_lines(_rows())
    text = "\n".join(lines)
    assert "64 groups of 8" in text and "1 group of 512" in text
    table = "\n".join(lines[:5])  # the title, header, rule and two rows
    assert LONG not in table and "Site names shortened" in text
    assert "None" not in text and " ? " not in text
    assert "rank 77 by 4 ms in ranks 0-511" in text
    assert max(len(ln) for ln in lines[:5]) <= 140
    assert "First late in the step: rank 77" in text and "(kind unknown)" in text


def test_verbose_and_html_rows_keep_full_names_and_members():
    text = "\n".join(site_table_lines(_rows(), verbose=True))
    assert LONG in text
    rows = site_rows(_rows())
    assert rows[1][0] == LONG and rows[1][1] == "unknown"
    assert "510, 511]" in rows[1][5]  # every member, for the HTML


def test_the_html_sites_section_has_no_none_for_a_site_of_unknown_kind():
    from jaxpace.records.reader import load_records
    from jaxpace.report import analyze, synthetic_records
    from jaxpace.report.render.html import render_report_html

    first = synthetic_records(8, 40, site="a", late_rank=3, late_s=0.004, seed=1)
    more = synthetic_records(8, 40, site="b", late_rank=3, late_s=0.004, seed=2)
    rep = analyze(load_records(first + [r for r in more if r["type"] != "header"]))
    assert rep.sites_table and all(r.kind is None for r in rep.sites_table)
    assert any(r.late for r in rep.sites_table)
    page = render_report_html(rep)
    assert "First late in the step" in page and "(None)" not in page and ">?<" not in page
