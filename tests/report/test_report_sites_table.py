"""The per-site table ("Sites in step order") in the report: JSON, HTML and the terminal.

One `stages.links.site_table` computation in `analyze`, when the records hold 2 or more
sites; the records come from `test_report_site_groups.grouped_records`.
"""

from __future__ import annotations

import json

from test_report_site_groups import AG, GROUPS_4X2, grouped_records

from jaxpace.records.reader import load_records
from jaxpace.report import analyze
from jaxpace.report.render.html import render_report_html

# The ppermute runs as one group of all ranks: they leave it together, so no rank starts the
# next step late for having left `reduce` with a slower group.
THREE = {
    "gather": {"kind": "all_gather", "groups": GROUPS_4X2},
    "reduce": {"kind": "psum", "groups": [[0, 1, 2, 3], [4, 5, 6, 7]]},
    "swap": {"kind": "ppermute", "groups": [list(range(8))], "pairs": [[0, 1], [1, 0]]},
}


def test_multi_site_table_in_json_and_html():
    rep = analyze(grouped_records(THREE, late_rank=5, late_s=0.020), site="gather")
    d = rep.to_dict()
    table = d["sites_table"]
    assert [r["site"] for r in table] == ["gather", "reduce", "swap"]  # step order
    assert [r["num_groups"] for r in table] == [4, 2, 1]
    gather = table[0]
    assert [(g["rank"], g["group"]) for g in gather["late"]] == [(5, [1, 5])]
    assert rep.culprit == 5
    assert 0.015 < gather["late"][0]["lead_s"] < 0.025
    assert gather["late"][0]["p_value"] < 1e-3
    for key in ("kind", "steps", "wait_s", "share", "order_s", "links", "slow_link"):
        assert key in gather
    assert table[2]["links"] and table[2]["kind"] == "ppermute"
    json.dumps(d)  # plain JSON
    html = render_report_html(rep)
    assert "<h2>Sites in step order" in html
    section = html.split("<h2>Sites in step order", 1)[1].split("<h2>", 1)[0]
    assert "rank 5 by" in section and "[1, 5]" in section
    assert section.count("<tr>") == 4  # header + one row per site


def test_single_site_report_has_no_sites_table():
    rep = analyze(grouped_records(AG, late_rank=5, late_s=0.020))
    assert rep.to_dict()["sites_table"] == []
    assert "Sites in step order" not in render_report_html(rep)


def test_sites_table_matches_site_table_of_the_records():
    from jaxpace.report.stages import links

    sites = {
        "gather": {"kind": "all_gather", "groups": GROUPS_4X2},
        "reduce": {"kind": "psum", "groups": [[0, 1, 2, 3], [4, 5, 6, 7]]},
    }
    recs = grouped_records(sites, late_rank=5, late_s=0.020, seed=3)
    rep = analyze(recs)
    assert rep.sites_table == tuple(links.site_table(load_records(recs)))


def test_cli_prints_the_reports_rows_and_computes_them_once(tmp_path, capsys, monkeypatch):
    import argparse

    from jaxpace.report import cli
    from jaxpace.report.stages import links

    run = tmp_path / "run"
    load_records(grouped_records(THREE, late_rank=5, late_s=0.020)).write_jsonl(run)
    calls = []
    real = links.SiteTable.rows  # (`analyze` fills `stages.SiteTable` while it reads the sites)
    monkeypatch.setattr(links.SiteTable, "rows", lambda *a, **k: calls.append(1) or real(*a, **k))
    parser = argparse.ArgumentParser()
    cli.configure_parser(parser)
    assert cli.cli_main(parser.parse_args([str(run), "--json", str(tmp_path / "r.json")])) == 0
    out = capsys.readouterr().out
    assert len(calls) == 1
    assert "First late in the step: rank 5 at `gather`" in out
    table = json.loads((tmp_path / "r.json").read_text())["sites_table"]
    assert [r["site"] for r in table] == ["gather", "reduce", "swap"]
    assert "Sites in step order" in (run / "report.html").read_text()


def test_binomial_tail_of_long_runs_does_not_overflow():
    from jaxpace.report.stages import links

    # math.comb(2000, 1000) is beyond a float: the tail is summed in logarithms.
    assert 0.0 <= links._binomial_tail(2000, 1500, 0.5) < 1e-100
    assert abs(links._binomial_tail(2000, 1000, 0.5) - 0.5089) < 1e-3
    assert links._binomial_tail(10, 10, 0.5) == 0.5**10


def test_a_lead_under_two_percent_of_the_step_is_not_called_late():
    """A rank persistently 3 ms behind is named in a 14 ms step (over `MIN_LEAD_S` and 2% of
    the step) but not in a half-second one: there it costs the step 0.6%, which is within
    how much healthy devices differ. 50 ms behind in the same long step is named."""
    from jaxpace.report.stages import links

    sites = {"gather": {"kind": "all_gather", "groups": GROUPS_4X2}}

    def named(late_s, compute_s):
        recs = grouped_records(sites, late_rank=5, late_s=late_s, compute_s=compute_s, seed=1)
        (row,) = links.site_table(load_records(recs))
        return [(g.rank, g.group) for g in row.late]

    assert named(0.003, 0.010) == [(5, (1, 5))]
    assert named(0.003, 0.5) == []
    assert named(0.050, 0.5) == [(5, (1, 5))]
