"""Issue 46: the reduction as SQL on DuckDB (`jaxpace.records.engine`) and `jaxpace convert`.

The engine reads Parquet, JSONL (every value checked, bad ones counted and
located, never a failed query) and Inspector logs alike; its reduction agrees
with the report's own arrays and is the same from JSONL and from Parquet.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re

import numpy as np
import pytest
from conftest import multi_site_run

from jaxpace import cli
from jaxpace.errors import RecordsError
from jaxpace.records.engine import Engine
from jaxpace.records.reader import load_records
from jaxpace.records.site_data import site_data
from jaxpace.records.sources.synthetic import write_inspector_logs, write_xprof_traces
from jaxpace.records.synthetic import synthetic_run, synthetic_step_records
from jaxpace.report import analyze


@pytest.fixture(scope="module")
def run():
    return synthetic_run(64, 40, late_rank=9, late_s=0.003, seed=1, ranks_per_process=4)


def _reduce(path):
    from jaxpace.records.sources import detect, load

    with Engine() as e:  # (other sources through their readers)
        scan = e.open_steps(path if detect(path) == "records" else load(path).records)
        return scan, e.reduce()


def test_the_engine_is_bounded_and_never_downloads():
    with Engine(threads=1, memory_limit="256MB") as e:
        got = dict(
            e.con.execute(
                "SELECT name, value FROM duckdb_settings() WHERE name IN ('threads', "
                "'memory_limit', 'autoinstall_known_extensions', 'autoload_known_extensions', "
                "'temp_directory')"
            ).fetchall()
        )
        tmp = e.temp_directory
    assert got["threads"] == "1" and got["memory_limit"].startswith("244")  # 256 MB in MiB
    assert got["autoinstall_known_extensions"] == "false"
    assert got["autoload_known_extensions"] == "false" and got["temp_directory"] == tmp


def test_the_spill_is_capped_at_half_the_free_space_and_a_run_past_it_fails_clearly(tmp_path):
    import shutil

    from jaxpace.errors import RecordsError
    from jaxpace.records.by_site import open_run

    with Engine() as e:  # the default cap: half the spill directory's free space
        cap = e.con.execute(
            "SELECT value FROM duckdb_settings() WHERE name = 'max_temp_directory_size'"
        ).fetchone()[0]
        free = shutil.disk_usage(e.temp_directory).free
    assert "90%" not in cap  # (DuckDB's own default: 90% of the disk's free space)
    num, unit = cap.split()
    got = float(num) * {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}[unit]
    assert 0.4 * free < got < 0.6 * free
    # A run that needs more spill than its cap: a RecordsError that says where and how to
    # fix it, never a full disk or a traceback from DuckDB.
    # (Files of an older layout, two sites in one row group: read into the engine's table,
    # which spills; a run laid out one site to a row group is read in place, no spill.)
    run = synthetic_run(64, 2000, seed=0, ranks_per_process=8)
    two = {**run.columns, "site": run.columns["step"] % 2}
    dataclasses.replace(run, sites=("a", "b"), columns=two).write_parquet(tmp_path / "run")
    one_row_group_each(tmp_path / "run")
    with pytest.raises(RecordsError, match=r"capped at 2\.0 MiB: .*TMPDIR"):
        open_run(tmp_path / "run", memory_limit="8MB", max_temp_bytes=2 << 20)


def test_the_reduction_is_the_same_from_jsonl_and_parquet_and_agrees_with_the_report(tmp_path, run):
    run.write_jsonl(tmp_path / "js")
    run.write_parquet(tmp_path / "pq")
    (sa, a), (sb, b) = _reduce(tmp_path / "js"), _reduce(tmp_path / "pq")
    assert sa.rows == sb.rows == len(run) and not sa.notes()
    for part in ("steps", "lateness", "ranks"):
        x, y = getattr(a, part), getattr(b, part)
        assert x.keys() == y.keys()
        for k in x:
            assert np.array_equal(x[k], y[k]), (part, k)
    # The per-rank mean lateness is the report's own (`SiteData.lateness`), in ns.
    data, _, _ = site_data(run, run.sites[0])
    np.testing.assert_allclose(a.ranks["mean_lateness_ns"], data.lateness.mean(axis=0) * 1e9)
    assert int(a.ranks["rank"][np.argmax(a.ranks["mean_excess_ns"])]) == 9
    assert (a.steps["ranks"] == 64).all()


def test_jsonl_bad_values_are_counted_and_located_never_a_failed_query(tmp_path, run):
    """DuckDB's strict reader fails the query at `Infinity` or a cut line, and with
    `ignore_errors` makes NULLs silently; the engine reads such files the careful way,
    each value checked (an integer beyond int64 counted on its own)."""
    run.write_jsonl(tmp_path)
    f = tmp_path / "records-p3.jsonl"
    lines = f.read_text().splitlines(keepends=True)
    lines[4] = lines[4].replace('"wait_ns":', '"wait_ns":Infinity,"was":')
    lines[5] = lines[5].replace('"step":', '"step":1e400,"was":')
    lines[6] = lines[6].replace('"rank":', f'"rank":{2**63},"was":')
    lines[7] = "not json\n"
    f.write_text("".join(lines) + '{"type":"step","site":"tr')  # cut short
    scan, red = _reduce(tmp_path)
    assert scan.bad == 3 and scan.huge == 1 and scan.rows == len(run) - 4
    assert [e.split(": ")[0] for e in scan.bad_examples] == [f"{f}:{i}" for i in (5, 6, 8)]
    assert scan.drops.huge_first == f"{f}:7"
    assert scan.cut == (f"{f}:{len(lines) + 1}",)
    notes = " ".join(scan.notes())
    assert "3 step line(s) with a bad value dropped" in notes and "cut short" in notes
    assert "skipped 1 step record(s) with an integer beyond the int64 range" in notes
    # Steps that lost a rank compare the ranks present (how many, stated per step).
    assert int((64 - red.steps["ranks"]).sum()) == 4 and red.steps["ranks"].max() == 64


def test_inspector_logs_and_traces_reduce_through_the_same_sql(tmp_path):
    write_inspector_logs(tmp_path / "insp", 8, 30, late_ranks=[6], late_us=1500.0, seed=2)
    write_xprof_traces(tmp_path / "xp", 2, 4, 20, late_ranks=[5], late_us=1500.0)
    for d, rows, late in (("insp", 8 * 30, 6), ("xp", 8 * 20, 5)):
        scan, red = _reduce(tmp_path / d)
        assert scan.rows == rows
        assert int(red.ranks["rank"][np.argmax(red.ranks["mean_excess_ns"])]) == late


def test_convert_any_source_to_parquet_reads_back_the_same(tmp_path, run, capsys):
    run.write_jsonl(tmp_path / "js")
    write_inspector_logs(tmp_path / "insp", 8, 30, late_ranks=[3], late_us=1500.0, seed=1)
    for src in ("js", "insp"):
        out = tmp_path / f"{src}-pq"
        assert cli.main(["convert", str(tmp_path / src), str(out), "--progress"]) == 0
        assert "converting" in capsys.readouterr().err or src == "insp"
        assert all(p.suffix == ".parquet" for p in out.iterdir())
        a, b = analyze(tmp_path / src), analyze(out)
        assert (a.culprit, a.source, a.analyzed_steps, a.notes) == (
            b.culprit,
            b.source,
            b.analyzed_steps,
            b.notes,
        )
    a, b = load_records(tmp_path / "js"), load_records(tmp_path / "js-pq")
    assert all(np.array_equal(a.columns[k], b.columns[k]) for k in a.columns)
    # Bad input: a clear one-line error, rc 2.
    assert cli.main(["convert", str(tmp_path / "nowhere"), str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli.main(["convert", str(tmp_path / "js"), str(tmp_path / "js")]) == 2
    assert "is the input directory" in capsys.readouterr().err


def test_convert_writes_the_same_files_with_or_without_pyarrows_parser(tmp_path, monkeypatch):
    """`jaxpace convert` reads a clean one-process JSONL file with pyarrow's parser
    (`convert._convert_clean`) and writes what `load_records(f).write_parquet` writes:
    the same bytes, file for file. A file it cannot take (a bad line, execution ids)
    goes through `load_records`."""
    import pyarrow.parquet as pq

    from jaxpace.records import convert as _convert

    recs = load_records(
        synthetic_step_records(8, 30, 3, late_s={5: 0.004}, ranks_per_process=2, seed=4)
    )
    recs.write_jsonl(tmp_path / "js")
    bad = tmp_path / "js" / "records-p2.jsonl"
    lines = bad.read_bytes().splitlines(keepends=True)
    bad.write_bytes(
        b"".join([*lines[:4], lines[4].replace(b'"step":', b'"step":1.5,"x":'), *lines[5:]])
    )
    fast = []
    clean = _convert._convert_clean
    monkeypatch.setattr(_convert, "_convert_clean", lambda f, d: fast.append(f.name) or clean(f, d))
    assert cli.main(["convert", str(tmp_path / "js"), str(tmp_path / "a")]) == 0
    assert sorted(fast) == sorted(f.name for f in (tmp_path / "js").iterdir())
    monkeypatch.setattr(_convert, "_convert_clean", lambda f, d: None)  # every file the old way
    assert cli.main(["convert", str(tmp_path / "js"), str(tmp_path / "b")]) == 0
    names = sorted(f.name for f in (tmp_path / "a").iterdir())
    assert names == sorted(f.name for f in (tmp_path / "b").iterdir()) and len(names) == 4
    for n in names:
        a, b = pq.read_table(tmp_path / "a" / n), pq.read_table(tmp_path / "b" / n)
        assert a.equals(b) and a.schema.metadata == b.schema.metadata, n
    assert clean(bad, tmp_path / "c") is None  # (its bad line: the careful reader's)


def test_a_partial_run_converts_and_keeps_its_loss(tmp_path, run):
    keep = np.random.default_rng(0).random(len(run)) >= 0.02
    dataclasses.replace(run, columns={k: v[keep] for k, v in run.columns.items()}).write_jsonl(
        tmp_path / "js"
    )
    assert cli.main(["convert", str(tmp_path / "js"), str(tmp_path / "pq")]) == 0
    rep = analyze(tmp_path / "pq")
    assert rep.culprit == 9 and rep.partial
    assert any("(step, rank) records" in n for n in rep.notes)


def one_row_group_each(run_dir):
    """Rewrites each Parquet file of `run_dir` as jaxpace wrote them before site row groups:
    every site's rows in one row group (its header metadata kept)."""
    import pyarrow.parquet as pq

    for f in sorted(run_dir.glob("*.parquet")):
        table = pq.read_table(f)
        pq.write_table(table, f, compression="zstd", row_group_size=1 << 20)
        assert pq.ParquetFile(f).metadata.num_row_groups == 1


def _multi_site_run(sites=3):
    run = multi_site_run(16, 24, sites, shift_ns=0)
    n = len(run) // sites
    # Sites interleaved row by row (as a ring of several sites may be): the writer groups them.
    order = np.arange(n * sites).reshape(sites, n).T.ravel()
    return dataclasses.replace(run, columns={k: v[order] for k, v in run.columns.items()})


def test_the_native_parquet_layout_is_one_site_to_a_row_group(tmp_path):
    import pyarrow.parquet as pq

    run = _multi_site_run()
    run.write_parquet(tmp_path / "run")
    for f in sorted((tmp_path / "run").glob("*.parquet")):
        meta = pq.ParquetFile(f).metadata
        col = meta.schema.names.index("site")
        got = [meta.row_group(i).column(col).statistics for i in range(meta.num_row_groups)]
        assert [s.min for s in got] == [s.max for s in got] == list(run.sites)
        assert sum(meta.row_group(i).num_rows for i in range(meta.num_row_groups)) == len(run) // (
            16 // 4
        )
    # Each site's rows keep their own order (a stable grouping).
    back = load_records(tmp_path / "run")
    for i in range(len(run.sites)):
        mine = run.columns["process"] == 0
        want = run.columns["arrive_ns"][mine & (run.columns["site"] == i)]
        got_i = back.sites.index(run.sites[i])
        sel = (back.columns["process"] == 0) & (back.columns["site"] == got_i)
        assert np.array_equal(back.columns["arrive_ns"][sel], want)


def test_a_site_grouped_parquet_run_is_read_in_place_and_reports_the_same(tmp_path):
    """The natively written run is read from its files (`steps` a view: no table, no sort);
    the same files in the older layout (one row group of every site) go through the table;
    the JSONL run is read in place too, from the Parquet files the engine writes of it
    (`records.jsonl_arrow`); all give the same report."""
    from jaxpace.records.by_site import open_run

    run = _multi_site_run()
    run.write_parquet(tmp_path / "native")
    run.write_parquet(tmp_path / "older")
    one_row_group_each(tmp_path / "older")
    run.write_jsonl(tmp_path / "js")
    paths = {}
    for name in ("native", "older", "js"):
        with open_run(tmp_path / name) as recs:
            tables = {
                r[0]
                for r in recs.engine.con.execute(
                    "SELECT table_name FROM duckdb_tables()"
                ).fetchall()
            }
            paths[name] = (recs.engine.in_place, "steps" in tables)
    assert paths == {"native": (True, False), "older": (False, True), "js": (True, False)}
    reps = {name: _as_json(analyze(tmp_path / name).to_dict(), tmp_path / name) for name in paths}
    assert reps["native"] == reps["js"] and reps["older"] == reps["js"]
    assert json.loads(reps["js"])["culprit"] == 5


@pytest.mark.parametrize("how", ["replaced", "removed"])
def test_a_file_changed_while_a_run_is_read_in_place_is_named_not_mixed_in(tmp_path, how):
    """A run read in place is read from its files during the report: a file replaced
    (a live job's export, its atomic rename) or removed (watch dropping an old window)
    between two sites' reads is named, instead of mixing two exports in one report or
    DuckDB's bare IO error."""
    from jaxpace.records.by_site import open_run

    run = _multi_site_run()
    run.write_parquet(tmp_path / "native")
    victim = sorted((tmp_path / "native").glob("*.parquet"))[1]
    with open_run(tmp_path / "native") as recs:
        assert recs.engine.in_place
        first, second = recs.sites[:2]
        recs.site(first)
        if how == "replaced":
            tmp = victim.with_name(victim.name + ".tmp")
            tmp.write_bytes(victim.read_bytes())
            os.replace(tmp, victim)  # same bytes, another file
        else:
            victim.unlink()
        with pytest.raises(RecordsError, match=r"changed or was removed while the report"):
            recs.site(second)


def test_an_engine_that_read_a_run_in_place_then_reads_a_table_stops_watching_the_files(
    tmp_path,
):
    # The files of a run read in place are checked after each query; once the same engine
    # holds other records in its table, those files are no longer what it reads.
    run = _multi_site_run()
    run.write_parquet(tmp_path / "native")
    with Engine() as e:
        e.load(tmp_path / "native")
        assert e.in_place
        e.open_records(run)
        for f in (tmp_path / "native").glob("*.parquet"):
            f.unlink()
        assert e.site_columns(run.sites[0])["step"].size > 0


def _as_json(d: dict, run_dir) -> str:
    """`Report.to_dict()` as JSON, the run's directory and file names left out."""
    text = json.dumps(d, sort_keys=True, default=str).replace(str(run_dir), "<run>")
    return re.sub(r"records-p(\d+)\.(jsonl|parquet)", r"records-p\1", text)


def test_a_bad_row_read_in_place_is_dropped_and_noted_as_from_the_table(tmp_path):
    """A negative wait and a rank outside the run, in natively laid out files: dropped,
    counted and located as when the files go through the table."""
    from jaxpace.records.by_site import open_run

    run = _multi_site_run()
    cols = {k: v.copy() for k, v in run.columns.items()}
    cols["wait_ns"][7] = -5
    cols["rank"][11] = 999
    bad = dataclasses.replace(run, columns=cols)
    bad.write_parquet(tmp_path / "native")
    bad.write_parquet(tmp_path / "older")
    one_row_group_each(tmp_path / "older")
    got = {}
    for name in ("native", "older"):
        rep = analyze(tmp_path / name)
        assert rep.culprit == 5 and rep.partial
        got[name] = [n.replace(str(tmp_path / name), "<run>") for n in rep.notes]
        with open_run(tmp_path / name) as recs:
            assert recs.engine.in_place == (name == "native")
            assert len(recs.without_foreign_ranks()) == len(run) - 2
    assert got["native"] == got["older"]
    assert any("negative" in n for n in got["native"]), got["native"]
    assert any("outside the run's ranks" in n for n in got["native"]), got["native"]


def test_a_process_file_without_steps_keeps_the_run_read_in_place(tmp_path):
    """A process that recorded no step writes a file of one empty row group: the rest of
    the run is still read in place."""
    from jaxpace.records.by_site import open_run
    from jaxpace.records.format import records_filename, write_parquet

    run = _multi_site_run()
    run.write_parquet(tmp_path / "run")
    [head] = [h for h in run.headers if h["process_index"] == 3]
    empty = {k: np.zeros(0, v.dtype) for k, v in run.columns.items()}
    write_parquet(tmp_path / "run" / records_filename(3), head, empty, [])
    with open_run(tmp_path / "run") as recs:
        assert recs.engine.in_place
        assert len(recs) == int((run.columns["process"] != 3).sum())


@pytest.mark.parametrize("where", ["parquet", "jsonl-and-parquet"])
def test_first_arrivals_of_ranges_of_steps_are_those_of_the_join(tmp_path, monkeypatch, where):
    """Kept steps that are a range of consecutive steps (one for every site, one per site)
    are kept by a filter instead of a join: the same keys and first arrivals; steps with a
    gap, and a site without kept steps, as before."""
    from jaxpace.records import engine as eng

    recs = load_records(synthetic_step_records(8, 30, 3, ranks_per_process=2, seed=2))
    d = tmp_path / "run"
    recs.write_parquet(d)
    if where == "jsonl-and-parquet":  # (read into the table, not in place)
        recs.write_jsonl(tmp_path / "js")
        (d / "records-p0.parquet").unlink()
        os.replace(tmp_path / "js" / "records-p0.jsonl", d / "records-p0.jsonl")
    a, b, c = recs.sites
    r = np.arange
    cases = [
        {a: r(5, 30), b: r(5, 30), c: r(5, 30)},  # (one range for every site)
        {a: r(5, 30), b: r(7, 20), c: r(5, 30)},  # (a range each)
        {a: r(5, 30), b: np.array([5, 6, 9]), c: r(5, 30)},  # (a gap: the join)
        {a: r(5, 30), b: r(0), c: r(3, 10)},  # (a site without kept steps)
        {a: r(0), b: r(0), c: r(0)},
    ]
    with Engine() as e:
        e.load(d)
        for kept in cases:
            where_sql = eng._kept_ranges(kept, {a, b, c})
            assert (where_sql is None) == (kept is cases[2])
            got = e.first_arrivals(kept)
            with monkeypatch.context() as m:
                m.setattr(eng, "_kept_ranges", lambda *_: None)
                want = e.first_arrivals(kept)
            assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
            assert (got[0].size > 0) == any(len(v) for v in kept.values())
