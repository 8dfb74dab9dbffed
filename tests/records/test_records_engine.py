"""Issue 46: the reduction as SQL on DuckDB (`jaxpace.records.engine`) and `jaxpace convert`.

The engine reads Parquet, JSONL (every value checked, bad ones counted and
located, never a failed query) and Inspector logs alike; its reduction agrees
with the report's own arrays and is the same from JSONL and from Parquet.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from jaxpace import cli
from jaxpace.records.engine import Engine
from jaxpace.records.reader import load_records
from jaxpace.records.site_data import site_data
from jaxpace.records.sources.synthetic import write_inspector_logs, write_xprof_traces
from jaxpace.records.synthetic import synthetic_run
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
    synthetic_run(64, 2000, seed=0, ranks_per_process=8).write_parquet(tmp_path / "run")
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


def test_a_partial_run_converts_and_keeps_its_loss(tmp_path, run):
    keep = np.random.default_rng(0).random(len(run)) >= 0.02
    dataclasses.replace(run, columns={k: v[keep] for k, v in run.columns.items()}).write_jsonl(
        tmp_path / "js"
    )
    assert cli.main(["convert", str(tmp_path / "js"), str(tmp_path / "pq")]) == 0
    rep = analyze(tmp_path / "pq")
    assert rep.culprit == 9 and rep.partial
    assert any("(step, rank) records" in n for n in rep.notes)
