"""Issue 46: a site's rows on disk are fetched without the columns the run already says,
and the next site is fetched ahead while the caller works, giving the same rows.

A site's columns from the engine equal those of the same run in memory (same names in
the same order, dtypes and values) when no row has a delay, when some rows have a delay
or are engaged, and when a rank's rows come from two processes; the columns left out of
the query are the ones the run says, whether it is read in place or into the table. A fetch ahead that fails raises the same
`RecordsError` where the caller takes that site; `close` with a fetch in flight
returns and leaves no thread, as does a pass given up part way.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import threading

import numpy as np
import pytest
from conftest import multi_site_run

from jaxpace.errors import RecordsError
from jaxpace.records.by_site import by_site, open_run
from jaxpace.records.engine import STEP_COLUMNS, Engine
from jaxpace.records.parquet_reader import RowGroupReader
from jaxpace.records.reader import load_records

_THREAD = "jaxpace-site-fetch"


def _run(sites: int = 3, used: bool = False, moved: bool = False):
    """16 ranks (4 to a process) over `sites` sites; `used`: rank 5 delayed every third step
    and every rank engaged from step 10; `moved`: rank 3's rows from step 12 on recorded by
    process 1 (its file), so rank 3 has two (process, device) pairs."""
    run = multi_site_run(16, 24, sites, shift_ns=0)
    cols = dict(run.columns)
    if used:
        cols["delay_ns"] = np.where((cols["rank"] == 5) & (cols["step"] % 3 == 0), 1000, 0)
        cols["engaged"] = cols["step"] >= 10
    if moved:
        cols["process"] = np.where((cols["rank"] == 3) & (cols["step"] >= 12), 1, cols["process"])
    return dataclasses.replace(run, columns=cols)


def _sorted(cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    order = np.lexsort([cols[k] for k in reversed(STEP_COLUMNS)])
    return {k: v[order] for k, v in cols.items()}


def _fetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(_THREAD)]


@pytest.mark.parametrize(
    ("used", "moved", "left_out"),
    [
        (False, False, {"delay_ns", "engaged", "process", "device"}),
        (True, False, {"process", "device"}),
        (False, True, {"delay_ns", "engaged"}),
        (True, True, set()),
    ],
)
@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "mixed"])
def test_a_sites_columns_on_disk_are_those_in_memory_whatever_is_left_out_of_the_query(
    tmp_path, monkeypatch, fmt, used, moved, left_out
):
    """Parquet and JSONL alone are read in place (the zero columns known from the row
    groups' statistics), Parquet and JSONL mixed into the table (known from a query)."""
    run = _run(used=used, moved=moved)
    d = tmp_path / fmt
    getattr(run, f"write_{'parquet' if fmt == 'mixed' else fmt}")(d)
    if fmt == "mixed":  # (process 0's file as JSONL)
        run.write_jsonl(tmp_path / "js")
        (d / "records-p0.parquet").unlink()
        shutil.copy(tmp_path / "js" / "records-p0.jsonl", d)
    asked: list[str] = []
    read: list[tuple[str, ...]] = []
    arrays, rows_of = Engine._arrays, RowGroupReader.read

    def spied(self, sql, params=None, on=None):
        asked.append(sql)
        return arrays(self, sql, params, on)

    def spied_read(self, site, columns):
        read.append(tuple(columns))
        return rows_of(self, site, columns)

    monkeypatch.setattr(Engine, "_arrays", spied)
    monkeypatch.setattr(RowGroupReader, "read", spied_read)
    mem = by_site(load_records(d))
    with open_run(d) as disk:
        assert disk.engine.in_place == (fmt != "mixed")
        assert len(disk) == len(mem) == len(run)
        passes = [dict(disk.sites_in_order(disk.sites)), {s: disk.site(s) for s in disk.sites}]
        for got in passes:
            assert list(got) == list(mem.sites) == list(run.sites)
            for name, one in got.items():
                a, b = one.columns, mem.site(name).columns
                assert list(a) == [*STEP_COLUMNS, "site"]  # (the order it always had)
                assert set(a) == set(b)
                a, b = _sorted(a), _sorted(b)
                for k in a:
                    assert a[k].dtype == b[k].dtype, k
                    np.testing.assert_array_equal(a[k], b[k], err_msg=f"{name} {k}")
    site_queries = [q for q in asked if "WHERE site = $1" in q]
    # (A run read in place reads each site's row groups by number; the table is queried.)
    fetches = (
        [set(c) for c in read]
        if fmt != "mixed"
        else [set(q.split("SELECT ", 1)[1].split(" FROM ", 1)[0].split(", ")) for q in site_queries]
    )
    assert len(fetches) == 2 * len(run.sites)
    assert not (site_queries if fmt != "mixed" else read)
    for fetched in fetches:
        assert fetched == set(STEP_COLUMNS) - left_out


def test_a_fetch_ahead_that_fails_raises_the_same_records_error_where_the_site_is_taken(
    tmp_path, monkeypatch
):
    d = tmp_path / "pq"
    _run().write_parquet(d)
    target = d / "records-p1.parquet"
    site_columns = Engine.site_columns
    fetched_in: list[threading.Thread] = []

    def replaced_first(self, site, on=None):
        if on is not None:  # (a fetch ahead: the first site's, then the second's)
            fetched_in.append(threading.current_thread())
            if len(fetched_in) == 2:  # (a live job re-exports a file just then)
                shutil.copy2(target, d / "new.tmp")
                os.replace(d / "new.tmp", target)
        return site_columns(self, site, on)

    monkeypatch.setattr(Engine, "site_columns", replaced_first)
    with open_run(d) as disk:
        passing = disk.sites_in_order(disk.sites)
        first, _ = next(passing)  # (read in the thread; the next site's fetch starts there)
        assert first == disk.sites[0]
        with pytest.raises(RecordsError, match="changed or was removed") as ahead:
            next(passing)
        assert fetched_in and fetched_in[0] is not threading.main_thread()
        assert not _fetch_threads()
        with pytest.raises(RecordsError) as here:
            disk.site(disk.sites[1])
        assert str(ahead.value) == str(here.value)


def test_close_with_a_fetch_in_flight_returns_and_leaves_no_thread(tmp_path, monkeypatch):
    d = tmp_path / "pq"
    _run().write_parquet(d)
    site_columns = Engine.site_columns
    started = threading.Event()
    ahead: list[str] = []

    def slow(self, site, on=None):
        if on is not None:
            ahead.append(site)
        if len(ahead) == 2 and on is not None:  # (the second site's: runs for minutes)
            started.set()
            on.execute("SELECT sum(x * x) FROM range(100000000000) t(x)").fetchall()
        return site_columns(self, site, on)

    monkeypatch.setattr(Engine, "site_columns", slow)
    disk = open_run(d)
    passing = disk.sites_in_order(disk.sites)
    next(passing)
    assert started.wait(120)  # (the thread runs its query: no hang if it never does)
    disk.close()
    assert not _fetch_threads()
    with pytest.raises(RecordsError, match="closed while its sites were being read"):
        next(passing)


def test_a_pass_given_up_part_way_leaves_no_thread_and_the_run_reads_on(tmp_path):
    d = tmp_path / "pq"
    run = _run()
    run.write_parquet(d)
    with open_run(d) as disk:
        passing = disk.sites_in_order(disk.sites)
        name, _ = next(passing)
        passing.close()  # (as a loop left by `break` or an error)
        assert name == disk.sites[0] and not _fetch_threads()
        sizes = [len(one) for _, one in disk.sites_in_order(disk.sites)]
        assert sizes == [len(run) // 3] * 3
        assert disk.largest_fetch == disk.engine.largest_fetch == len(run) // 3
        assert not _fetch_threads()


def test_the_scan_for_dropped_rows_runs_only_where_the_statistics_allow_one(tmp_path, monkeypatch):
    """A natively written run whose row-group statistics show no null, no huge value and
    no negative wait or delay is not scanned for rows to drop; a negative wait, or a file
    without the statistics of a column, is scanned (and the bad row dropped)."""
    import pyarrow.parquet as pq

    scans: list[str] = []
    drop = Engine._drop_parquet_rows

    def counted(self, drops):
        scans.append("scan")
        return drop(self, drops)

    monkeypatch.setattr(Engine, "_drop_parquet_rows", counted)
    run = _run()
    cols = {k: v.copy() for k, v in run.columns.items()}
    cols["wait_ns"][7] = -5
    run.write_parquet(tmp_path / "clean")
    dataclasses.replace(run, columns=cols).write_parquet(tmp_path / "negative")
    run.write_parquet(tmp_path / "unstated")
    f = tmp_path / "unstated" / "records-p0.parquet"
    table = pq.read_table(f)
    stated = [c for c in table.column_names if c != "wait_ns"]
    pq.write_table(table, f, row_group_size=table.num_rows // 3, write_statistics=stated)
    for name, scanned, rows in (
        ("clean", 0, len(run)),
        ("negative", 1, len(run) - 1),
        ("unstated", 1, len(run)),
    ):
        scans.clear()
        with open_run(tmp_path / name) as disk:
            assert disk.engine.in_place, name
            assert len(disk) == rows and len(scans) == scanned, name


def test_a_run_of_parquet_and_jsonl_files_together_keeps_every_row(tmp_path):
    """The JSONL fast path's check of its files (one header each) once looked at every
    file's rows in the table: the Parquet files' rows, with no header row, were deleted
    without a note (288 of 1152 rows kept here)."""
    run = _run()
    d = tmp_path / "mixed"
    run.write_parquet(d)
    run.write_jsonl(tmp_path / "js")
    (d / "records-p0.parquet").unlink()
    shutil.copy(tmp_path / "js" / "records-p0.jsonl", d)
    recs = load_records(d)
    assert len(recs) == len(run) and not recs.partial
    with open_run(d) as disk:
        assert len(disk) == len(run)
        assert sorted(np.unique(disk.rank_keys()[1]).tolist()) == [0, 1, 2, 3]


@pytest.mark.parametrize("moved", [False, True])
@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_the_one_scan_summary_is_what_the_three_queries_it_replaced_give(tmp_path, fmt, moved):
    """`Engine.summary` (one GROUPING SETS scan) gives each site's steps, rows per step and
    ranks, the (rank, process, device) triples and each (step, process)'s first arrival
    exactly as the separate queries did, with rows lost and a rank in two processes; the
    first arrivals of one range of steps come from it, those of other kept steps from a
    query, and both agree with the query over the rows."""
    run = _run(moved=moved)
    keep = np.random.default_rng(3).random(len(run)) > 0.05
    run = dataclasses.replace(run, columns={k: v[keep] for k, v in run.columns.items()})
    getattr(run, f"write_{fmt}")(tmp_path / "run")
    with open_run(tmp_path / "run") as disk:
        e = disk.engine
        s = e.summary()
        got = e._arrays("SELECT DISTINCT rank, process, device FROM steps")
        want = np.unique(np.stack([got["rank"], got["process"], got["device"]]), axis=1)
        assert np.array_equal(s.rank_keys, want)
        for name in disk.sites:
            q = e._arrays(
                "SELECT step, count(*) AS n, count(DISTINCT rank) AS r FROM steps "
                "WHERE site = $1 GROUP BY step ORDER BY step",
                [name],
            )
            ranks = e.con.execute(
                "SELECT count(DISTINCT rank) FROM steps WHERE site = $1", [name]
            ).fetchone()[0]
            steps, n, r = s.step_ranks[name]
            assert np.array_equal(steps, q["step"]) and np.array_equal(n, q["n"])
            assert r == ranks
        for kept in (
            {name: np.arange(4, 20) for name in disk.sites},  # one range: from the summary
            {name: np.arange(4, 20, 2) for name in disk.sites},  # not a range: a query
        ):
            keys, first = e.first_arrivals(kept)
            steps = sorted(set(np.concatenate(list(kept.values())).tolist()))
            q = e._arrays(
                "SELECT step * 4294967296 + process AS key, min(arrive_ns) AS first FROM steps "
                f"WHERE step IN ({', '.join(map(str, steps))}) GROUP BY key ORDER BY key"
            )
            assert np.array_equal(keys, q["key"]) and np.array_equal(first, q["first"])


class _Asked:
    """The engine's connection, recording each statement it is asked."""

    def __init__(self, con):
        self.con, self.sql = con, []

    def execute(self, sql, *a, **k):
        self.sql.append(sql)
        return self.con.execute(sql, *a, **k)

    def __getattr__(self, name):
        return getattr(self.con, name)


def test_a_native_run_is_not_scanned_for_foreign_ranks_or_executions_its_files_rule_out(
    tmp_path,
):
    """Read in place, a run whose files' statistics put every rank inside the run and
    whose files have no `execution` column is not scanned for either; a rank outside the
    run still is, and is dropped."""
    run = _run()
    run.write_parquet(tmp_path / "clean")
    cols = {k: v.copy() for k, v in run.columns.items()}
    cols["rank"][11] = 999
    dataclasses.replace(run, columns=cols).write_parquet(tmp_path / "foreign")
    for name, rows in (("clean", len(run)), ("foreign", len(run) - 1)):
        with open_run(tmp_path / name) as disk:
            assert disk.engine.in_place
            asked = disk.engine.con = _Asked(disk.engine.con)
            assert disk.engine.number_executions() == (0, None)
            assert len(disk.without_foreign_ranks()) == rows, name
            if name == "clean":
                assert not [q for q in asked.sql if "FROM steps" in q], asked.sql
            else:
                assert any("WHERE rank < 0 OR rank >= 16" in q for q in asked.sql), asked.sql
