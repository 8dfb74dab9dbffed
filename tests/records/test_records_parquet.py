"""Issue 46: Parquet is the native records format; JSONL stays as interchange.

One file per process and export (temporary file + rename), the header in the
file's key-value metadata, typed integer columns; a folder read skips a file
without a footer and says so; the same run read from JSONL and from Parquet
gives the same records and the same report; pyarrow and DuckDB are imported
only when records are read or written.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import REPO
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxpace as jp
from jaxpace.errors import ConfigError
from jaxpace.records import format as fmt
from jaxpace.records.reader import load_records
from jaxpace.records.synthetic import synthetic_run
from jaxpace.report import analyze
from jaxpace.sim import Faults, simulate_records, write_records


def _pacer(steps: int = 4) -> jp.Pacer:
    pacer = jp.Pacer()
    mesh = jax.make_mesh((8,), ("data",))
    f = jax.jit(
        jax.shard_map(
            lambda x: pacer.psum(x, "data", site="s"), mesh=mesh, in_specs=P("data"), out_specs=P()
        )
    )
    x = jax.device_put(jnp.ones(8), NamedSharding(mesh, P("data")))
    for _ in range(steps):
        f(x).block_until_ready()
    return pacer


def test_export_writes_parquet_by_default_and_jsonl_on_request(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pacer = _pacer()
    path = pacer.export(f"{tmp_path}/run/")
    assert path.endswith("records-p0.parquet")
    table = pq.read_table(path)
    header = json.loads(table.schema.metadata[fmt.HEADER_KEY])
    assert header["type"] == "header" and header["process_index"] == 0 and "sites" in header
    for k in fmt.INT_STEP_FIELDS:
        assert table.schema.field(k).type == pa.int64(), k
    assert table.schema.field("engaged").type == pa.bool_()
    assert table.num_rows == 4
    # JSONL on request (or by the file's name), the same records.
    jpath = pacer.export(f"{tmp_path}/j/", format="jsonl")
    assert jpath.endswith("records-p0.jsonl")
    lines = [json.loads(s) for s in Path(jpath).read_text().splitlines()]
    assert lines[0]["type"] == "header" and len(lines) == 5
    a, b = load_records(path), load_records(jpath)
    for k in a.columns:
        assert np.array_equal(a.columns[k], b.columns[k]), k
    assert a.headers == b.headers
    # A format that contradicts the file name, or an unknown one, is refused.
    with pytest.raises(ConfigError, match="format='parquet'"):
        pacer.export(tmp_path / "x.jsonl", format="parquet")
    with pytest.raises(ConfigError, match="'parquet', 'jsonl'"):
        pacer.export(tmp_path / "x", format="csv")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["j", "run"]  # no temporary left


def test_a_folder_read_skips_a_parquet_file_without_its_footer(tmp_path):
    run = synthetic_run(4, 40, late_rank=2, late_s=0.01, seed=1)
    paths = run.write_parquet(tmp_path)
    assert [p.name for p in paths] == [f"records-p{i}.parquet" for i in range(4)]
    data = paths[3].read_bytes()
    paths[3].write_bytes(data[: len(data) // 2])  # killed while writing: no footer
    recs = load_records(tmp_path)
    assert recs.partial and sorted(np.unique(recs.columns["process"]).tolist()) == [0, 1, 2]
    assert any("records-p3.parquet" in n and "footer" in n for n in recs.notes), recs.notes
    rep = analyze(tmp_path)
    assert rep.partial and rep.culprit == 2


def _same_report(a, b) -> None:
    assert a.culprit == b.culprit and a.ranking == b.ranking
    assert a.analyzed_steps == b.analyzed_steps and a.primary_mode == b.primary_mode
    assert [r.excess_lateness_s for r in a.ranks] == [r.excess_lateness_s for r in b.ranks]
    assert a.notes == b.notes and a.partial == b.partial


@pytest.mark.parametrize(
    "make",
    [
        lambda: synthetic_run(8, 60, late_rank=3, late_s=0.004, seed=0),
        lambda: synthetic_run(8, 40, ranks_per_process=2, seed=5),
        lambda: (
            simulate_records(
                "pure-bsp",
                nodes=2,
                steps=40,
                seed=1,
                policy="fixed:0.001",
                faults=Faults(late_ranks=(3,), late_s=0.02),
            ).records
        ),  # fmt: skip
    ],
    ids=["synthetic", "device-granularity", "simulator"],
)
def test_the_same_run_as_jsonl_and_as_parquet_reads_and_reports_the_same(tmp_path, make):
    recs = make()
    recs.write_jsonl(tmp_path / "jsonl")
    recs.write_parquet(tmp_path / "parquet")
    a, b = load_records(tmp_path / "jsonl"), load_records(tmp_path / "parquet")
    assert a.sites == b.sites and a.headers == b.headers and a.notes == b.notes
    for k in a.columns:
        assert np.array_equal(a.columns[k], b.columns[k]), k
    _same_report(analyze(tmp_path / "jsonl"), analyze(tmp_path / "parquet"))


def test_files_whose_columns_differ_in_order_or_presence_are_read_by_name(tmp_path):
    # One writer's files are read by position (faster over many files); a folder where one
    # file has its columns in another order (another writer) or lacks `device` (older
    # records) must match columns by name, giving the same rows and report.
    import pyarrow.parquet as pq

    run = synthetic_run(4, 40, late_rank=2, late_s=0.01, seed=3)
    paths = run.write_parquet(tmp_path / "same")
    want = analyze(tmp_path / "same")
    for name, change in (
        ("reordered", lambda t: t.select(list(reversed(t.column_names)))),
        ("no-device", lambda t: t.drop_columns(["device"])),
    ):
        d = tmp_path / name
        d.mkdir()
        for p in paths:
            table = pq.read_table(p)
            if p.name == "records-p1.parquet":
                table = change(table)
            pq.write_table(table, d / p.name)
        a, b = load_records(tmp_path / "same"), load_records(d)
        for k in ("step", "rank", "process", "arrive_ns", "wait_ns"):
            assert np.array_equal(np.sort(a.columns[k]), np.sort(b.columns[k])), (name, k)
        _same_report(want, analyze(d))


def test_the_simulator_writes_through_the_one_format_module(tmp_path):
    run = simulate_records("pure-bsp", nodes=2, steps=10, seed=3, policy="fixed:0.001")
    pq_paths = write_records(run, tmp_path / "pq")
    js_paths = write_records(run, tmp_path / "js", format="jsonl")
    assert [p.suffix for p in pq_paths] == [".parquet", ".parquet"]
    # The JSONL the simulator writes is `step_record`'s, byte for byte.
    want = run.records.write_jsonl(tmp_path / "slow")
    assert [p.read_text() for p in js_paths] == [p.read_text() for p in want]
    _same_report(analyze(tmp_path / "pq"), analyze(tmp_path / "js"))


@pytest.mark.parametrize(
    "code",
    [
        "import jaxpace; jaxpace.psum; jaxpace.Pacer; jaxpace.configure",
        "import jaxpace.report",
    ],
)
def test_import_jaxpace_loads_neither_pyarrow_nor_duckdb(code):
    probe = (
        f"{code}\nimport sys\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyarrow', 'duckdb')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_protected_header_fields_cannot_change_how_own_records_are_read(tmp_path):
    """Issue 49 item 10: `header_extra={"source_label": ..., "timed": False}` made the
    report show jaxpace's own records as another source and drop compute and step time."""
    pacer = _pacer(steps=12)
    for extra in ({"source_label": "NCCL Inspector logs"}, {"timed": False}, {"source": "x"}):
        with pytest.raises(ConfigError, match="may not set `"):
            pacer.export(f"{tmp_path}/run/", header_extra=extra)
    assert not (tmp_path / "run").exists()
    # A file that says so anyway (edited, or another tool's) is still read as jaxpace's own.
    recs = load_records(pacer.export(f"{tmp_path}/run/"))
    dicts = recs.to_dicts()
    dicts[0] = {**dicts[0], "source_label": "NCCL Inspector logs", "timed": False}
    fmt.write_jsonl(tmp_path / "edited" / "records-p0.jsonl", dicts)
    rep = analyze(tmp_path / "edited", warmup_steps=0)
    assert rep.source == "jaxpace records"
    assert np.isfinite(rep.data.compute[1:]).all()  # compute and step time kept
    assert any("`source_label`, `timed` ignored" in n for n in rep.notes)


def test_jaxpace_report_prints_the_same_for_jsonl_and_parquet(tmp_path, capsys):
    from jaxpace import cli

    run = synthetic_run(8, 40, late_rank=3, late_s=0.004, seed=0)
    run.write_jsonl(tmp_path / "js")
    run.write_parquet(tmp_path / "pq")
    outs = []
    for d in ("js", "pq"):
        assert cli.main(["report", str(tmp_path / d)]) == 0
        outs.append(capsys.readouterr().out.replace(str(tmp_path / d), "RUN"))
    assert outs[0] == outs[1] and "jaxpace records" in outs[0]
    html = [(tmp_path / d / "report.html").read_text() for d in ("js", "pq")]
    assert html[0].replace(str(tmp_path / "js"), "RUN") == html[1].replace(
        str(tmp_path / "pq"), "RUN"
    )
