"""Issue 46: a site read in place comes on its (step x rank) grid, and the report uses it as
it stands; anything the grid cannot hold is read in the files' order, as before.

`parquet_reader.RowGroupReader` places each file's rows of a site straight into their
cells (a block per file in the writer's order, cell by cell otherwise), so the site's
rows come sorted by (step, rank); `site_data._grid` then finds every cell in order and
gathers nothing. Checked here: the report on such reads equals the report on the same
records in memory, bit for bit, for whole runs, runs with lost lines and files in
another order; a cell written twice (a process's file copied in twice), a file without
statistics and a grid too sparse to hold are read in the files' order, and the
duplicate is still named.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import multi_site_run

from jaxpace.errors import RecordsError
from jaxpace.records import parquet_reader, site_data
from jaxpace.records.by_site import open_run
from jaxpace.records.int_keys import grid_axes
from jaxpace.report import analyze


def _run(loss: float = 0.0, sites: int = 2, seed: int = 3):
    """16 ranks, 4 to a process, 24 steps, `sites` sites; `loss` of the lines lost."""
    return multi_site_run(16, 24, sites, late_rank=6, late_s=0.004, seed=seed, shift_ns=2000,
                          loss=loss)  # fmt: skip


def _in_memory(run):
    """The report on the records in memory, their rows shuffled (so no site is in order
    there: the grid is placed and gathered as always)."""
    order = np.random.default_rng(1).permutation(len(run))
    return analyze(dataclasses.replace(run, columns={k: v[order] for k, v in run.columns.items()}))


def _sorted(cols) -> bool:
    key = cols["step"] * (1 << 20) + cols["rank"]
    return bool((np.diff(key) > 0).all())


def _same_report(a, b) -> None:
    assert a.culprit == b.culprit
    assert a.to_json() == b.to_json()
    for k in ("lateness", "wait", "sync_wait", "compute", "step_time", "arrive", "done"):
        np.testing.assert_array_equal(getattr(a.data, k), getattr(b.data, k), err_msg=k)
    assert [r.order_s for r in a.sites_table] == [r.order_s for r in b.sites_table]
    assert len(a.sites_table) >= 2


def _rewrite(path, shuffle: bool = False, statistics: bool = True, seed: int = 0) -> None:
    """A file of the run rewritten as another writer might: one site to a row group, its
    rows shuffled within each, or without statistics; the metadata kept."""
    pf = pq.ParquetFile(path)
    meta = pf.schema_arrow.metadata
    tables = []
    for g in range(pf.num_row_groups):
        t = pf.read_row_group(g)
        if shuffle:
            t = t.take(np.random.default_rng(seed + g).permutation(t.num_rows))
        tables.append(t)
    with pq.ParquetWriter(path, tables[0].schema.with_metadata(meta),
                          write_statistics=statistics) as w:  # fmt: skip
        for t in tables:
            w.write_table(t)


@pytest.mark.parametrize("loss", [0.0, 0.04])
def test_a_site_comes_on_its_grid_and_the_report_is_the_in_memory_one(tmp_path, loss):
    run = _run(loss)
    run.write_parquet(tmp_path)
    with open_run(tmp_path) as disk:
        for name in run.sites:
            one = disk.site(name)
            assert _sorted(one.columns)
            g = site_data._grid(one, name, [])
            # Every cell in order where nothing is lost: nothing placed, nothing gathered.
            assert g.in_order == (loss == 0.0)
    _same_report(analyze(tmp_path), _in_memory(run))


def test_files_in_another_order_are_placed_cell_by_cell(tmp_path):
    run = _run(0.04)
    run.write_parquet(tmp_path)
    for i, f in enumerate(sorted(tmp_path.glob("*.parquet"))):
        _rewrite(f, shuffle=True, seed=10 * i)
    with open_run(tmp_path) as disk:
        assert disk.engine._direct is not None
        assert all(_sorted(disk.site(name).columns) for name in run.sites)
    _same_report(analyze(tmp_path), _in_memory(run))


def test_a_file_without_statistics_leaves_the_site_in_the_files_order(tmp_path):
    run = _run()
    run.write_parquet(tmp_path)
    _rewrite(tmp_path / "records-p2.parquet", shuffle=True, statistics=False)
    with open_run(tmp_path) as disk:
        if disk.engine._direct is not None:  # (row groups read by number: files' order)
            assert not _sorted(disk.site(run.sites[0]).columns)
    _same_report(analyze(tmp_path), _in_memory(run))


def test_a_grid_too_sparse_to_hold_is_read_in_the_files_order(tmp_path):
    run = _run()
    cols = dict(run.columns)
    cols["rank"] = np.where(cols["rank"] >= 8, cols["rank"] + 10**6, cols["rank"])
    run = dataclasses.replace(run, columns=cols)
    run.write_parquet(tmp_path)
    with open_run(tmp_path) as disk:
        assert disk.engine._direct is not None
        got = disk.site(run.sites[0]).columns
        assert not _sorted(got)  # (16 ranks over a million columns: not placed)
        assert np.unique(got["rank"]).size == 16


def test_a_cell_written_twice_is_read_in_the_files_order_and_named(tmp_path):
    run = _run()
    run.write_parquet(tmp_path)
    f = tmp_path / "records-p1.parquet"
    pf = pq.ParquetFile(f)
    meta = pf.schema_arrow.metadata
    tables = [pf.read_row_group(g) for g in range(pf.num_row_groups)]
    with pq.ParquetWriter(f, tables[0].schema.with_metadata(meta)) as w:
        for t in tables:  # (each site's first row of process 1 twice)
            w.write_table(pa.concat_tables([t, t.slice(0, 1)]))
    with open_run(tmp_path) as disk:
        assert disk.engine._direct is not None
        got = disk.site(run.sites[0]).columns
        assert len(got["step"]) == len(run) // 2 + 1
        assert not _sorted(got)
    with pytest.raises(RecordsError, match="duplicate records"):
        analyze(tmp_path, site=run.sites[0])


@pytest.mark.parametrize(
    ("step", "rank", "want"),
    [
        ([0, 0, 1, 1], [3, 5, 3, 5], ([0, 1], [3, 5])),
        ([7, 7, 7], [1, 2, 4], ([7], [1, 2, 4])),
        ([2, 3, 9], [4, 4, 4], ([2, 3, 9], [4])),
        ([0, 0, 1], [3, 5, 3], None),  # (a cell missing)
        ([0, 0, 1, 1], [5, 3, 3, 5], None),  # (a step's ranks out of order)
        ([1, 1, 0, 0], [3, 5, 3, 5], None),  # (steps out of order)
        ([0, 0, 0, 0], [3, 5, 3, 5], None),  # (each cell twice)
        ([0, 0, 1, 1], [3, 3, 3, 3], None),
        ([], [], None),
    ],
)
def test_grid_axes_are_found_only_for_every_cell_once_step_by_step(step, rank, want):
    got = grid_axes(np.asarray(step, np.int64), np.asarray(rank, np.int64))
    if want is None:
        assert got is None
    else:
        assert [a.tolist() for a in got] == [list(w) for w in want]


def test_a_site_read_ahead_holds_what_the_files_gave_until_it_is_taken(tmp_path):
    """The pass over the sites reads the next one in another thread; a site with every cell
    comes from there without `step`, `rank` and the per-rank columns, written where the
    site is taken (`Engine.finish`): the same columns as a site read on its own."""
    run = _run()
    run.write_parquet(tmp_path)
    with open_run(tmp_path) as disk:
        e = disk.engine
        got = e.site_columns(run.sites[1], on=e.fetch_cursor())
        assert isinstance(got, parquet_reader.LaidOut)
        assert not {"step", "rank", "process", "device"} & set(got)
        done = e.finish(got)
        alone = e.site_columns(run.sites[1])
        assert list(done) == list(alone)
        for k in alone:
            assert done[k].dtype == alone[k].dtype, k
            np.testing.assert_array_equal(done[k], alone[k], err_msg=k)
        ahead = dict(disk.sites_in_order(disk.sites))
        for name in run.sites:
            for k, v in disk.site(name).columns.items():
                np.testing.assert_array_equal(ahead[name].columns[k], v, err_msg=k)


def _reader_and_site(disk, name):
    """The run's `RowGroupReader` and what `Engine.site_columns` asks of it."""
    from jaxpace.records.engine import STEP_COLUMNS

    e = disk.engine
    asked = [k for k in STEP_COLUMNS if k not in e._site_fill().left_out]
    return e._direct, asked


@pytest.mark.parametrize("fails", [False, True])
def test_a_site_read_by_two_threads_is_the_site_read_by_one(tmp_path, monkeypatch, fails):
    """The pass's thread helps read the site read ahead (`RowGroupReader.help`): the files
    are shared out a turn at a time, the grid is the one a single thread reads, and a
    helper's error is raised by the reading thread (`fails`)."""
    import threading

    run = _run(sites=2)
    run.write_parquet(tmp_path)
    monkeypatch.setattr(parquet_reader, "_FILES_A_TURN", 1)  # (4 files: 4 turns)
    with open_run(tmp_path) as disk:
        reader, asked = _reader_and_site(disk, run.sites[1])
        alone = reader.read(run.sites[1], asked)
        table = parquet_reader.RowGroupReader._table
        helped, readers = threading.Event(), []

        def shared(self, i, site, cols, rows):
            me = threading.current_thread()
            readers.append(me)
            if me is not threading.main_thread():  # (the reading thread waits for help)
                assert helped.wait(30)
            elif fails:
                helped.set()
                raise OSError("a file gone while the helper read it")
            try:
                return table(self, i, site, cols, rows)
            finally:
                helped.set()

        monkeypatch.setattr(parquet_reader.RowGroupReader, "_table", shared)
        out: dict = {}
        t = threading.Thread(
            target=lambda: out.update(got=_catch(reader.read, run.sites[1], asked))
        )
        t.start()
        while t.is_alive() and not readers:  # (the read is under way: its turns shared)
            t.join(0.001)
        reader.help()
        t.join(60)
        assert not t.is_alive()
        assert threading.main_thread() in readers and len(set(readers)) == 2
        if fails:
            assert isinstance(out["got"], OSError) and "helper" in str(out["got"])
            return
        got = out["got"]
        assert isinstance(got, parquet_reader.LaidOut) and isinstance(alone, parquet_reader.LaidOut)
        assert list(got) == list(alone)
        for k in alone:
            np.testing.assert_array_equal(got[k], alone[k], err_msg=k)
        assert reader._job is None
        reader.help()  # (no read under way: nothing)


def _catch(f, *a):
    try:
        return f(*a)
    except Exception as e:  # (handed to the test's thread)
        return e


@pytest.mark.parametrize("turn", [1, 2, 3, 8])
def test_neighbouring_blocks_are_joined_only_where_they_meet(tmp_path, monkeypatch, turn):
    """A turn's blocks are copied as one where they share their steps and their ranks meet;
    a file with a step fewer (its block shorter) or lost lines (cell by cell) is placed
    on its own: the grid is the same whatever the turn's size."""
    run = _run(sites=2)
    cols = dict(run.columns)
    # Process 1 (ranks 4-7) lacks the last step; a line of process 3 is lost.
    last = cols["step"].max()
    drop = ((cols["process"] == 1) & (cols["step"] == last)) | (
        np.arange(cols["step"].size) == np.flatnonzero(cols["process"] == 3)[5]
    )
    run = dataclasses.replace(run, columns={k: v[~drop] for k, v in cols.items()})
    run.write_parquet(tmp_path)
    monkeypatch.setattr(parquet_reader, "_FILES_A_TURN", turn)
    with open_run(tmp_path) as disk:
        got = [disk.site(name).columns for name in run.sites]
    want = _in_memory_sorted(run)
    for one, name in zip(got, run.sites, strict=True):
        assert _sorted(one)
        for k in ("step", "rank", "arrive_ns", "done_ns", "wait_ns", "process"):
            np.testing.assert_array_equal(one[k], want[name][k], err_msg=k)


def _in_memory_sorted(run) -> dict:
    """Each site's rows of `run` in (step, rank) order."""
    c = run.columns
    out = {}
    for j, name in enumerate(run.sites):
        sel = np.flatnonzero(c["site"] == j)
        order = sel[np.lexsort((c["rank"][sel], c["step"][sel]))]
        out[name] = {k: v[order] for k, v in c.items()}
    return out


class _OtherReader:
    """A pyarrow reader whose `open` takes other arguments (a future pyarrow's)."""

    def open(self, source):
        raise AssertionError("not reached: the signature differs")

    def read_row_groups(self, *a, **k):
        raise AssertionError("not reached")

    def close(self):
        pass


@pytest.mark.parametrize("reader", ["pyarrow's", "none", "another signature"])
def test_the_rows_are_the_same_through_pyarrows_reader_or_parquetfile(
    tmp_path, monkeypatch, reader
):
    """`RowGroupReader._table` reads through `pyarrow._parquet.ParquetReader` (columns by
    position) where it is there, else `ParquetFile` (by name): the same rows; a reader
    of another interface is left for `ParquetFile` from its first `TypeError` on."""
    run = _run(sites=2, loss=0.04)
    run.write_parquet(tmp_path)
    monkeypatch.setattr(parquet_reader, "_FAST_READER", False)
    with open_run(tmp_path) as disk:
        want = {name: disk.site(name).columns for name in run.sites}
        assert parquet_reader._FAST_READER is not None  # (this pyarrow has it)
    if reader == "none":
        monkeypatch.setattr(parquet_reader, "_FAST_READER", None)
    elif reader == "another signature":
        monkeypatch.setattr(parquet_reader, "_FAST_READER", _OtherReader)
    opened = []
    real = pq.ParquetFile

    def counted(*a, **k):  # (a site's read: the footer given; opening the run: none)
        if "metadata" in k:
            opened.append(1)
        return real(*a, **k)

    monkeypatch.setattr(pq, "ParquetFile", counted)
    with open_run(tmp_path) as disk:
        for name in run.sites:
            got = disk.site(name).columns
            assert list(got) == list(want[name])
            for k in got:
                np.testing.assert_array_equal(got[k], want[name][k], err_msg=k)
    assert bool(opened) == (reader != "pyarrow's")
    if reader == "another signature":
        assert parquet_reader._FAST_READER is None
