"""Issue 46: the report reads a run one site at a time through the engine, in bounded memory.

The same run as JSONL, as Parquet and in memory gives the same `Report` (culprit,
ranking, costs, notes apart from file names); the largest read of rows is one site's
(never the whole run), whatever the number of sites; the byte parser is gone; and the
JSONL fast path hands a file it cannot read cleanly to the careful path, which drops,
counts and locates each bad line while the rest is read.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import multi_site_run

from jaxpace.records import by_site as _by_site
from jaxpace.records import engine as _engine
from jaxpace.records.reader import load_records
from jaxpace.records.synthetic import synthetic_run
from jaxpace.report import analyze


def _multi_site(num_ranks, num_steps, sites, seed=0, late_rank=5):
    """A run of `sites` sites: the synthetic run's rows repeated per site (site j's waits
    shifted by j microseconds), the late rank late everywhere."""
    return multi_site_run(num_ranks, num_steps, sites, late_rank=late_rank, seed=seed)


def _without_paths(notes, *dirs) -> list[str]:
    out = []
    for n in notes:
        for d in dirs:
            n = n.replace(str(d), "<run>")
        out.append(re.sub(r"records-p\d+\.(jsonl|parquet)", "records-p*", n))
    return out


def _same_report(a, b, *dirs) -> None:
    assert a.culprit == b.culprit and a.site == b.site
    assert a.ranking == b.ranking
    assert repr(a.costs) == repr(b.costs)  # (repr: NaN equal to NaN)
    assert a.analyzed_steps == b.analyzed_steps and a.partial == b.partial
    assert _without_paths(a.notes, *dirs) == _without_paths(b.notes, *dirs)
    assert [r.site for r in a.sites_table] == [r.site for r in b.sites_table]
    assert repr(a.sites_table) == repr(b.sites_table)
    for k in ("lateness", "wait", "compute", "sync_wait"):
        np.testing.assert_array_equal(getattr(a.data, k), getattr(b.data, k), err_msg=k)


@pytest.mark.parametrize("loss", [0.0, 0.03])
def test_the_report_is_the_same_from_jsonl_parquet_and_memory(tmp_path, loss):
    run = _multi_site(32, 40, 4)
    keep = np.random.default_rng(3).random(len(run)) >= loss
    run = dataclasses.replace(run, columns={k: v[keep] for k, v in run.columns.items()})
    run.write_jsonl(tmp_path / "js")
    run.write_parquet(tmp_path / "pq")
    a, b, m = analyze(tmp_path / "js"), analyze(tmp_path / "pq"), analyze(run)
    assert a.culprit == 5 and a.partial == (loss > 0)
    _same_report(a, b, tmp_path / "js", tmp_path / "pq")
    _same_report(a, m, tmp_path / "js")
    # `site=` reads one site the same way.
    one = run.sites[2]
    _same_report(analyze(tmp_path / "js", site=one), analyze(run, site=one), tmp_path / "js")


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_the_largest_read_is_one_sites_rows_whatever_the_number_of_sites(
    tmp_path, fmt, monkeypatch
):
    """Peak memory: the report never holds more than one site's rows (counted at the one
    place rows come from, `SiteRecords.site`), at 2 sites as at 8; it never asks the
    engine for every row."""
    seen: dict[int, list[int]] = {}
    site = _by_site.SiteRecords.site

    def counted(self, name):
        out = site(self, name)
        seen.setdefault(id(self), []).append(len(out))
        return out

    monkeypatch.setattr(_by_site.SiteRecords, "site", counted)

    def refuse(*a, **k):
        raise AssertionError("the report read every row at once")

    monkeypatch.setattr(_engine.Engine, "all_columns", refuse)
    for sites in (2, 8):
        run = _multi_site(16, 30, sites)
        d = tmp_path / f"{fmt}{sites}"
        getattr(run, f"write_{fmt}")(d)
        seen.clear()
        rep = analyze(d)
        assert rep.culprit == 5 and len(rep.sites_table) == sites
        [fetches] = seen.values()
        assert max(fetches) == len(run) // sites  # one site's rows
        assert len(fetches) >= sites


def test_the_byte_parser_is_gone_from_the_report():
    code = (
        "import importlib.util, sys\n"
        "from jaxpace.records.synthetic import synthetic_run\n"
        "import tempfile\n"
        "from jaxpace.report import analyze\n"
        "import jaxpace.report.cli\n"
        "d = tempfile.mkdtemp()\n"
        "synthetic_run(4, 20, seed=0).write_jsonl(d)\n"
        "analyze(d)\n"
        "assert importlib.util.find_spec('jaxpace.records.line_reader') is None\n"
        "print(sorted(m for m in sys.modules if m.startswith('jaxpace.records')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    mods = out.stdout
    assert "jaxpace.records.engine" in mods and "line_reader" not in mods


def _lines(path):
    return path.read_text().splitlines(keepends=True)


@pytest.mark.parametrize(
    ("name", "edit", "why"),
    [
        ("float", lambda s: s.replace('"wait_ns":', '"wait_ns":1.5,"x":', 1), "must be an integer"),
        ("exponent", lambda s: s.replace('"step":', '"step":1e3,"x":', 1), "must be an integer"),
        ("infinity", lambda s: s.replace('"delay_ns":', '"delay_ns":Infinity,"x":', 1), "got inf"),
        ("string", lambda s: s.replace('"rank":', '"rank":"3","x":', 1), "must be an integer"),
        ("bool", lambda s: s.replace('"process":', '"process":true,"x":', 1), "must be an integer"),
    ],
)
def test_a_bad_value_is_dropped_counted_and_located_never_cast(
    tmp_path, name, edit, why, monkeypatch
):
    """`read_json` would read 1.5 as 2, 1e3 as 1000, "3" as 3 and true as 1: the fast path
    flags such a file and the careful path drops the line, names it and reads the rest;
    the other files are read fast."""
    run = synthetic_run(8, 20, late_rank=3, late_s=0.004, seed=1, ranks_per_process=2)
    run.write_jsonl(tmp_path)
    f = tmp_path / "records-p1.jsonl"
    lines = _lines(f)
    lines[4] = edit(lines[4])
    f.write_text("".join(lines))
    careful = []
    read_checked = _engine.read_checked
    monkeypatch.setattr(_engine, "read_checked", lambda p: careful.append(p) or read_checked(p))
    recs = load_records(tmp_path)
    assert careful == [f]  # only the file with the bad line, the careful way
    assert len(recs) == len(run) - 1 and recs.partial
    [note] = [n for n in recs.notes if "bad value dropped" in n]
    assert f"1 step line(s) with a bad value dropped ({f}:5: " in note and why in note, note
    rep = analyze(tmp_path)
    assert rep.culprit == 3 and rep.partial and note in rep.notes


def test_a_cut_file_and_a_cut_line_among_many_files(tmp_path):
    """A file cut mid-line (a killed process) and one with a garbage line in the middle:
    the bad lines dropped, counted and located, every other line read."""
    run = synthetic_run(16, 30, late_rank=7, late_s=0.004, seed=2, ranks_per_process=2)
    run.write_jsonl(tmp_path)
    cut, mid = tmp_path / "records-p2.jsonl", tmp_path / "records-p5.jsonl"
    text = cut.read_text()
    cut.write_text(text[: text.rindex("\n", 0, len(text) - 1) + 40])  # last line cut
    lines = _lines(mid)
    lines[10] = "{not json\n"
    mid.write_text("".join(lines))
    recs = load_records(tmp_path)
    assert len(recs) == len(run) - 2 and recs.partial
    notes = " ".join(recs.notes)
    assert f"{cut}:{len(_lines(cut))}: last line is cut short" in notes
    assert f"{mid}:11: not JSON" in notes
    assert analyze(tmp_path).culprit == 7


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_the_report_reads_each_site_once(tmp_path, fmt, monkeypatch):
    """The whole step and the sites table take what they need from one pass over the
    sites (`stages.links.SiteTable`): each site's rows are asked for once per report."""
    asked: list[str] = []
    site = _by_site.SiteRecords.site

    def counted(self, name):
        asked.append(name)
        return site(self, name)

    monkeypatch.setattr(_by_site.SiteRecords, "site", counted)
    run = _multi_site(16, 30, 4)
    getattr(run, f"write_{fmt}")(tmp_path / "run")
    rep = analyze(tmp_path / "run")
    assert rep.culprit == 5 and len(rep.sites_table) == 4
    assert sorted(asked) == sorted(run.sites)
    # `site=` narrows the step to one site; the sites table still reads every site once,
    # and the one site once more (its own analysis).
    asked.clear()
    analyze(tmp_path / "run", site=run.sites[1])
    assert sorted(asked) == sorted([*run.sites, run.sites[1]])
