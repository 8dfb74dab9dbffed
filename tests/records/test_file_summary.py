"""Issue 46: a native file carries its own summary, and a run read in place reads each
site's row groups by number; both give what the engine's scans and queries give.

The summary merged from the files' metadata equals the GROUPING SETS scan's on runs
with lost lines, gaps in the steps, sites missing from some files, a (step, process)
in two files and null devices; a file without one, with one that disagrees with its
footer (rows changed by another tool, metadata kept) or with a malformed one is
scanned instead. A site's rows read from its row groups equal the query's, in the
same order, for int32 columns and null devices too; a file replaced after the run
was opened is named; footers too large to keep leave each site to a query.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import multi_site_run

from jaxpace.errors import RecordsError
from jaxpace.records import file_summary, parquet_reader
from jaxpace.records.by_site import open_run
from jaxpace.records.engine import STEP_COLUMNS, Engine
from jaxpace.report import analyze


def _run(sites: int = 3, loss: float = 0.0, gaps: bool = False, seed: int = 4):
    """16 ranks (4 to a process) over `sites` sites; `loss` of the lines dropped at random;
    `gaps`: every fifth step missing (sampled records) and the last site only in
    processes 0 and 1."""
    run = multi_site_run(16, 30, sites, seed=seed, loss=loss)
    if not gaps:
        return run
    c = run.columns
    keep = (c["step"] % 5 != 4) & ((c["site"] != sites - 1) | (c["process"] < 2))
    return dataclasses.replace(run, columns={k: v[keep] for k, v in c.items()})


def _both(d) -> tuple:
    """(the summary from the files' metadata, the scan's) of the run in `d`."""
    with Engine() as e:
        e.load(d)
        merged = e._footers.summaries is not None
        a = e.summary()
        if merged:  # (merged once, the files' own let go)
            assert isinstance(e._footers.summaries, file_summary.Merged)
            e._summary = None
            _assert_same(e.summary(), a)
        e._summary, e._footers = None, e._footers._replace(summaries=None)
        b = e.summary()
    return merged, a, b


def _assert_same(a, b) -> None:
    np.testing.assert_array_equal(a.rank_keys, b.rank_keys)
    assert list(a.step_ranks) == list(b.step_ranks)
    for site, (steps, n, ranks) in a.step_ranks.items():
        s2, n2, r2 = b.step_ranks[site]
        np.testing.assert_array_equal(steps, s2)
        np.testing.assert_array_equal(n, n2)
        assert ranks == r2
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.first, b.first)


@pytest.mark.parametrize(
    ("loss", "gaps", "devices"),
    [(0.0, False, True), (0.05, False, True), (0.02, True, False), (0.0, True, True)],
)
def test_the_files_summary_is_the_scans(tmp_path, loss, gaps, devices):
    run = _run(loss=loss, gaps=gaps)
    if not devices:  # (null devices: read as -1)
        run = dataclasses.replace(run, columns={**run.columns, "device": np.full(len(run), -1)})
    run.write_parquet(tmp_path)
    merged, a, b = _both(tmp_path)
    assert merged
    _assert_same(a, b)
    assert a.step_ranks and a.keys.size


def test_a_step_of_one_process_in_two_files_keeps_its_least_first_arrival(tmp_path):
    """Two exports of one process (another run folder's file copied in): rows per step
    add up, the first arrival is the least of the two files'."""
    run = _run()
    run.write_parquet(tmp_path / "a")
    later = dataclasses.replace(
        run, columns={**run.columns, "arrive_ns": run.columns["arrive_ns"] - 7}
    )
    later.write_parquet(tmp_path / "b")
    shutil.copy(tmp_path / "b" / "records-p1.parquet", tmp_path / "a" / "records-p1b.parquet")
    merged, a, b = _both(tmp_path / "a")
    assert merged
    _assert_same(a, b)
    site = run.sites[0]
    assert a.step_ranks[site][1].max() > 4  # (process 1's 4 ranks counted twice)


def _rewrite(f, table, metadata) -> None:
    pq.write_table(table.replace_schema_metadata(metadata), f, row_group_size=10**9)


def test_a_file_without_a_summary_or_with_a_wrong_one_is_scanned(tmp_path):
    run = _run()
    base = tmp_path / "base"
    run.write_parquet(base)
    cases = {}
    f = "records-p2.parquet"
    for name in ("none", "malformed", "rows_changed", "values_changed"):
        d = tmp_path / name
        shutil.copytree(base, d)
        pf = pq.ParquetFile(d / f)
        meta = {k: v for k, v in pf.metadata.metadata.items() if k != b"ARROW:schema"}
        # One site to a row group, as the writer lays it out.
        tables = [pf.read_row_group(g) for g in range(pf.num_row_groups)]
        if name == "none":
            del meta[file_summary.SUMMARY_KEY]
        elif name == "malformed":
            meta[file_summary.SUMMARY_KEY] = b'{"v": 1, "rows": "x"}'
        elif name == "rows_changed":  # (another tool dropped rows, the metadata kept)
            tables = [t.slice(0, t.num_rows - 3) for t in tables]
        else:  # (a rank renumbered, the counts the same)
            t0 = tables[0]
            tables[0] = t0.set_column(
                t0.schema.get_field_index("rank"), "rank", pc.add(t0["rank"], 100)
            )
        with pq.ParquetWriter(d / f, tables[0].schema.with_metadata(meta)) as w:
            for t in tables:
                w.write_table(t.replace_schema_metadata(meta))
        cases[name] = d
    for name, d in cases.items():
        merged, a, b = _both(d)
        assert not merged, name
        _assert_same(a, b)


def test_parse_refuses_what_is_not_a_summary():
    good = file_summary.of_columns(
        {k: np.asarray(v) for k, v in _run(sites=1).columns.items()}, ["s"]
    )
    assert file_summary.parse(good) is not None
    doc = json.loads(good)
    for bad in (
        b"",
        b"not json",
        b"[1, 2]",
        json.dumps({**doc, "v": 2}).encode(),
        json.dumps({**doc, "first": [[0, [[0, 3]], 5, [1]]]}).encode(),  # (3 steps, 2 values)
        json.dumps({**doc, "sites": {"s": {"steps": [[0, 0, 4]], "ranks": [[0, 0, 0]]}}}).encode(),
    ):
        assert file_summary.parse(bad) is None, bad


def _queried(d, site):
    """`site`'s columns as the engine's query gives them (no row-group reads)."""
    with Engine() as e:
        e.load(d)
        assert e._direct is not None
        e._direct = None
        return e.site_columns(site)


@pytest.mark.parametrize("variant", ["native", "int32", "null_devices", "delays", "gaps"])
def test_a_sites_row_groups_read_directly_are_the_querys_rows_on_the_grid(
    tmp_path, monkeypatch, variant
):
    """`gaps`: the last site in two of the four files only, and two files to a batch (so
    a batch ends on files without the site)."""
    run = _run(loss=0.03, gaps=variant == "gaps")
    if variant == "gaps":
        monkeypatch.setattr(parquet_reader, "_BATCH", 2)
    cols = dict(run.columns)
    if variant == "null_devices":
        cols["device"] = np.where(cols["rank"] % 3 == 0, -1, cols["device"])
    if variant == "delays":
        cols["delay_ns"] = np.where(cols["step"] % 4 == 0, 500, 0)
        cols["engaged"] = cols["step"] > 10
    dataclasses.replace(run, columns=cols).write_parquet(tmp_path)
    if variant == "int32":  # (another writer's narrower integers, one layout)
        for f in sorted(tmp_path.iterdir()):
            pf = pq.ParquetFile(f)
            meta = pf.schema_arrow.metadata
            tables = []
            for g in range(pf.num_row_groups):
                t = pf.read_row_group(g)
                for k in ("step", "rank", "process"):
                    t = t.set_column(t.schema.get_field_index(k), k, t[k].cast(pa.int32()))
                tables.append(t)
            with pq.ParquetWriter(f, tables[0].schema.with_metadata(meta)) as w:
                for t in tables:
                    w.write_table(t)
    with open_run(tmp_path) as disk:
        assert disk.engine._direct is not None
        for site in run.sites:
            got = disk.engine.site_columns(site)
            want = _queried(tmp_path, site)
            assert list(got) == list(want) == list(STEP_COLUMNS)
            # The same rows, on the site's grid: sorted by (step, rank), each cell once.
            key = got["step"] * (1 << 20) + got["rank"]
            assert (np.diff(key) > 0).all(), site
            order = np.lexsort((want["rank"], want["step"]))
            for k in got:
                assert got[k].dtype == want[k].dtype, k
                np.testing.assert_array_equal(got[k], want[k][order], err_msg=f"{site} {k}")


def test_a_file_replaced_after_the_run_was_opened_is_named(tmp_path):
    run = _run()
    run.write_parquet(tmp_path)
    target = tmp_path / "records-p1.parquet"
    with open_run(tmp_path) as disk:
        assert disk.engine._direct is not None
        shutil.copy2(target, tmp_path / "new.tmp")
        os.replace(tmp_path / "new.tmp", target)
        with pytest.raises(RecordsError, match="records-p1.parquet.*changed or was removed"):
            disk.site(disk.sites[0])
        target.unlink()
        with pytest.raises(RecordsError, match="records-p1.parquet.*changed or was removed"):
            disk.site(disk.sites[1])


def test_footers_too_large_to_keep_leave_each_site_to_a_query(tmp_path, monkeypatch):
    run = _run()
    run.write_parquet(tmp_path)
    want = analyze(tmp_path)
    monkeypatch.setattr(parquet_reader, "FOOTER_BYTES_KEPT", 100)
    with open_run(tmp_path) as disk:
        assert disk.engine._direct is None and disk.engine.in_place
    got = analyze(tmp_path)
    assert got.culprit == want.culprit == 5
    np.testing.assert_array_equal(got.data.lateness, want.data.lateness)


def test_the_report_is_the_same_with_and_without_the_summaries_and_row_group_reads(
    tmp_path, monkeypatch
):
    run = _run(loss=0.02, gaps=True)
    run.write_parquet(tmp_path)
    fast = analyze(tmp_path)
    monkeypatch.setattr(parquet_reader, "FOOTER_BYTES_KEPT", 0)
    monkeypatch.setattr(file_summary, "parse", lambda raw: None)
    slow = analyze(tmp_path)
    assert fast.culprit == slow.culprit == 5
    assert fast.to_json() == slow.to_json()
    for k in ("lateness", "wait", "sync_wait", "compute", "step_time"):
        np.testing.assert_array_equal(getattr(fast.data, k), getattr(slow.data, k), err_msg=k)


def test_without_add_key_value_metadata_the_summary_goes_in_the_schemas_metadata(
    tmp_path, monkeypatch
):
    """An older pyarrow's writer has no `add_key_value_metadata`: the summary is written
    with the header (in the schema's metadata, which the footer carries too) and used."""
    monkeypatch.delattr(pq.ParquetWriter, "add_key_value_metadata")
    run = _run(loss=0.02)
    run.write_parquet(tmp_path)
    f = sorted(tmp_path.iterdir())[0]
    assert file_summary.SUMMARY_KEY in pq.ParquetFile(f).schema_arrow.metadata
    merged, a, b = _both(tmp_path)
    assert merged
    _assert_same(a, b)
