"""The records format (docs/records.md): one home for its version, file names, dicts and writers.

The runtime writes records with these functions, the report reads them, and
the simulator and the synthetic generator produce them, so all four agree.
The native format is Parquet (one file per process and export, the header in
the file's key-value metadata); JSONL is the interchange format. pyarrow is
imported only when a Parquet file is written or read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxpace.records import file_summary
from jaxpace.records.safe_io import check_replaceable, make_dirs, write_atomic

__all__ = [
    "DEFAULT_FORMAT",
    "FORMATS",
    "FORMAT_VERSION",
    "HEADER_KEY",
    "INT_STEP_FIELDS",
    "NO_EXECUTION",
    "JSONL_GLOB",
    "PARQUET_GLOB",
    "REQUIRED_STEP_FIELDS",
    "RECORDS_GLOB",
    "check_format",
    "check_replaceable",
    "has_records",
    "header_record",
    "make_dirs",
    "records_files",
    "records_filename",
    "jsonl_step_lines",
    "step_columns",
    "step_record",
    "write_columns",
    "write_jsonl",
    "write_parquet",
    "write_records",
]

FORMAT_VERSION = 1

# Integer fields of a step record; with `site` and `engaged` they are required.
INT_STEP_FIELDS = ("step", "rank", "process", "arrive_ns", "done_ns", "wait_ns", "delay_ns")
REQUIRED_STEP_FIELDS = ("site", *INT_STEP_FIELDS, "engaged")
JSONL_GLOB = "*.jsonl"
PARQUET_GLOB = "*.parquet"
RECORDS_GLOB = JSONL_GLOB  # (the JSONL files; `records_files` lists both formats)
FORMATS = ("parquet", "jsonl")
DEFAULT_FORMAT = "parquet"
# The key of the Parquet file's key-value metadata that holds the header (JSON).
HEADER_KEY = b"jaxpace.header"
# Step columns of a Parquet records file and their Arrow types (`site` is a dictionary
# of strings, `device` may be null); `docs/records.md` lists them.
PARQUET_INT_COLUMNS = (*INT_STEP_FIELDS, "device")
# The optional `execution` column: XLA's run id of the program execution a record ran in
# (docs/records.md); in columns, this value where it is unknown (null in a file).
NO_EXECUTION = int(np.iinfo(np.int64).min)


def check_format(format: str) -> str:
    """`format` if it is one of `FORMATS`, else a `ValueError` listing them."""
    if format not in FORMATS:
        raise ValueError(
            f"records `format` must be one of {', '.join(repr(f) for f in FORMATS)}, got "
            f"{format!r}. Parquet is the native format; JSONL is for other tools."
        )
    return format


def records_filename(process_index: int, format: str = DEFAULT_FORMAT) -> str:
    """`records-p{process_index}.parquet` (or `.jsonl`), the file one process writes."""
    return f"records-p{int(process_index)}.{check_format(format)}"


def records_files(directory: str | os.PathLike) -> list[Path]:
    """The records files of a run directory, both formats, sorted by name."""
    d = Path(directory)
    return sorted([*d.glob(PARQUET_GLOB), *d.glob(JSONL_GLOB)])


def has_records(directory: str | os.PathLike) -> bool:
    """Whether `directory` holds a records file of either format."""
    d = Path(directory)
    return any(d.glob(PARQUET_GLOB)) or any(d.glob(JSONL_GLOB))


def header_record(
    *,
    run_id: str,
    process_index: int,
    process_count: int,
    host: str,
    pid: int,
    granularity: str,
    jaxpace_version: str,
    policy: str,
    local_devices: list[int],
    rank_groups: Mapping[str, Mapping[Any, Any]] | None,
    **extra: Any,
) -> dict[str, Any]:
    """The first line of every records file (docs/records.md, "header")."""
    topology = None
    if rank_groups is not None:
        topology = {
            "rank_groups": {
                str(kind): {str(r): str(v) for r, v in mapping.items()}
                for kind, mapping in rank_groups.items()
            }
        }
    return {
        "type": "header",
        "format": FORMAT_VERSION,
        "run_id": run_id,
        "process_index": int(process_index),
        "process_count": int(process_count),
        "host": str(host),
        "pid": int(pid),
        "granularity": granularity,
        "jaxpace_version": jaxpace_version,
        "policy": policy,
        "local_devices": list(local_devices),
        "topology": topology,
        **extra,
    }


def step_record(
    *,
    site: str,
    step: int,
    rank: int,
    process: int,
    arrive_ns: int,
    done_ns: int,
    delay_ns: int,
    engaged: bool,
    device: int | None = None,
    wait_ns: int | None = None,
    execution: int | None = None,
) -> dict[str, Any]:
    """One measured collective call of one rank (docs/records.md, "step").

    `wait_ns` defaults to `done_ns - arrive_ns`; pass it to write back a
    record read from a file unchanged. `execution` (the program execution's id) is
    written only when known.
    """
    rec = {
        "type": "step",
        "site": site,
        "step": int(step),
        "rank": int(rank),
        "process": int(process),
        "device": device,
        "arrive_ns": int(arrive_ns),
        "done_ns": int(done_ns),
        "wait_ns": int(done_ns) - int(arrive_ns) if wait_ns is None else int(wait_ns),
        "delay_ns": int(delay_ns),
        "engaged": bool(engaged),
    }
    if execution is not None:
        rec["execution"] = int(execution)
    return rec


def write_jsonl(path: str | os.PathLike, records: Iterable[Mapping[str, Any]]) -> str:
    """Writes records one JSON object a line, atomically; returns the path.

    Through `safe_io.write_atomic`, the one atomic writer: a uniquely named
    temporary file beside `path`, then one rename (a reader never sees half a
    file, concurrent writers never share a temporary name, a failed write
    leaves the earlier file whole). Missing parent directories are created.
    Only a regular file (or nothing) at `path` is replaced: a symlink,
    directory, device node, FIFO or socket there raises
    `FileExistsError`/`IsADirectoryError` and is left as it was.
    """
    p = os.fspath(path)
    _check_file_path(p)

    def fill(f) -> None:
        for rec in records:
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")

    return write_atomic(p, fill, what="records", make_parents=True)


def _check_file_path(p: str) -> None:
    if p.endswith(os.sep) or (os.altsep and p.endswith(os.altsep)):
        raise IsADirectoryError(
            f"records path {p!r} names a directory; pass a file path such as "
            f"{os.path.join(p, records_filename(0))!r}."
        )


def step_columns(
    steps: Iterable[Mapping[str, Any]],
) -> tuple[dict[str, np.ndarray], list[str]]:
    """Step dicts (`step_record`'s) as columns: ints, `engaged`, `site` an index into
    the returned site names, `device` -1 where null, `execution` (when some record has
    one) `NO_EXECUTION` where absent."""
    keys = (*INT_STEP_FIELDS, "site", "engaged", "device", "execution")
    lists: dict[str, list] = {k: [] for k in keys}
    sites: dict[str, int] = {}
    for rec in steps:
        for k in INT_STEP_FIELDS:
            lists[k].append(rec[k])
        lists["site"].append(sites.setdefault(rec["site"], len(sites)))
        lists["engaged"].append(bool(rec["engaged"]))
        dev = rec.get("device")
        lists["device"].append(-1 if dev is None else int(dev))
        ex = rec.get("execution")
        lists["execution"].append(NO_EXECUTION if ex is None else int(ex))
    if all(e == NO_EXECUTION for e in lists["execution"]):
        del lists["execution"]
    cols = {k: np.asarray(v, dtype=bool if k == "engaged" else np.int64) for k, v in lists.items()}
    return cols, list(sites)


def write_parquet(
    path: str | os.PathLike,
    header: Mapping[str, Any],
    columns: Mapping[str, np.ndarray],
    sites: Sequence[str],
) -> str:
    """Writes one process's records as a Parquet file, atomically; returns the path.

    `columns` holds `site` (index into `sites`), the integer fields of a step
    record, `engaged` (bool), `device` (-1: null) and optionally `execution`
    (`NO_EXECUTION`: null); `header` (`header_record`'s
    dict) goes into the file's key-value metadata under `HEADER_KEY`. The file is
    written to a temporary name beside `path` and renamed, as `write_jsonl`: a
    Parquet file is readable only once its footer is written, so a process
    killed while writing leaves no file (or the earlier one) at `path`.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = os.fspath(path)
    _check_file_path(p)
    n = int(np.asarray(columns["step"]).shape[0])
    site_idx = np.asarray(columns["site"], dtype=np.int32)
    arrays = {
        "site": pa.DictionaryArray.from_arrays(
            pa.array(site_idx, pa.int32()), pa.array(list(sites), pa.string())
        ),
    }
    for k in INT_STEP_FIELDS:
        arrays[k] = pa.array(np.asarray(columns[k], dtype=np.int64), pa.int64())
    dev = np.asarray(columns.get("device", np.full(n, -1)), dtype=np.int64)
    arrays["device"] = pa.array(dev, pa.int64(), mask=dev < 0)
    arrays["engaged"] = pa.array(np.asarray(columns["engaged"], dtype=bool), pa.bool_())
    if "execution" in columns:
        ex = np.asarray(columns["execution"], dtype=np.int64)
        arrays["execution"] = pa.array(ex, pa.int64(), mask=ex == NO_EXECUTION)
    meta = {
        HEADER_KEY: json.dumps(dict(header), separators=(",", ":")).encode(),
        b"jaxpace.format": str(FORMAT_VERSION).encode(),
    }
    # What the report would otherwise scan every row for (`records.file_summary`): in the
    # footer's key-value metadata alone, not also in the Arrow schema's copy of it (which
    # would double it in every footer the report keeps).
    summary = {file_summary.SUMMARY_KEY: file_summary.of_columns(columns, sites)}
    late = hasattr(pq.ParquetWriter, "add_key_value_metadata")  # (not in older pyarrow)
    if not late:
        meta.update(summary)
    table = pa.table(arrays).replace_schema_metadata(meta)
    check_replaceable(p, "records")  # before the work of encoding
    buf = pa.BufferOutputStream()
    if np.any(site_idx[1:] < site_idx[:-1]):  # (rows not yet grouped by site)
        table = table.take(pa.array(_site_order(site_idx)))
    # Integers delta-encoded (timestamps and steps advance by small steps within a site):
    # 9.6 bytes a row where the default dictionary encoding took 21.5 at one site to a row
    # group (8 ranks x 32 sites x 4096 steps of export rows), and faster to write. LZ4
    # (LZ4_RAW) rather than zstd: as small on delta-packed integers (9.68 against 9.67
    # bytes a row), faster to write, and half the cost of reading a small row group
    # (zstd's per-chunk start-up was half of a site's read over 1024 files).
    ints = [k for k in (*INT_STEP_FIELDS, "device", "execution") if k in arrays]
    with pq.ParquetWriter(
        buf,
        table.schema,
        compression="lz4",
        use_dictionary=["site"],
        column_encoding=dict.fromkeys(ints, "DELTA_BINARY_PACKED"),
    ) as writer:
        for start, stop in site_row_groups(site_idx):
            writer.write_table(
                table.slice(start, stop - start), row_group_size=max(stop - start, 1)
            )
        if late:
            writer.add_key_value_metadata(summary)
    return write_atomic(p, buf.getvalue().to_pybytes(), what="records", make_parents=True)


# The most rows of one row group (a site with more gets several, each of that site alone).
ROW_GROUP_ROWS = 1 << 20


def _site_order(site_idx: np.ndarray) -> np.ndarray:
    """The rows grouped by site (in `sites` order), each site's rows in their own order."""
    return np.argsort(site_idx, kind="stable")


def site_row_groups(site_idx: np.ndarray) -> list[tuple[int, int]]:
    """`(start, stop)` of each row group `write_parquet` writes, over the rows grouped by
    site (`_site_order`): one site's rows alone in each, at most `ROW_GROUP_ROWS`, so
    that a reader asking for one site (`WHERE site = ?`) skips the others' row groups by
    their statistics (docs/records.md, "Parquet")."""
    n = int(site_idx.size)
    if n == 0:
        return [(0, 0)]
    ordered = np.sort(site_idx, kind="stable")
    cuts = [0, *(np.flatnonzero(ordered[1:] != ordered[:-1]) + 1).tolist(), n]
    out = []
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        out += [(s, min(s + ROW_GROUP_ROWS, b)) for s in range(a, b, ROW_GROUP_ROWS)]
    return out


def jsonl_step_lines(columns: Mapping[str, np.ndarray], sites: Sequence[str]) -> str:
    """The JSONL text of step columns (as `write_parquet` takes them), one line each,
    byte for byte what `json.dumps(step_record(...), separators=(",", ":"))` writes.

    One `%`-format per line over columns turned into Python lists at once: about
    4x faster than a dict per line (measured on 500k records).
    """
    n = int(np.asarray(columns["step"]).shape[0])
    if n == 0:
        return ""
    names = np.array([json.dumps(s) for s in sites], dtype=object)
    keys = ("step", "rank", "process", "arrive_ns", "done_ns", "wait_ns", "delay_ns")
    cols = [np.asarray(columns[k], dtype=np.int64).tolist() for k in keys]
    dev = np.asarray(columns.get("device", np.full(n, -1)), dtype=np.int64)
    dev_s = np.where(dev < 0, "null", dev.astype(str)).tolist()
    eng = np.where(np.asarray(columns["engaged"], dtype=bool), "true", "false").tolist()
    site = names[np.asarray(columns["site"], dtype=np.int64)].tolist()
    fmt = (
        '{"type":"step","site":%s,"step":%d,"rank":%d,"process":%d,"device":%s,'
        '"arrive_ns":%d,"done_ns":%d,"wait_ns":%d,"delay_ns":%d,"engaged":%s}\n'
    )
    step, rank, proc, arr, done, wait, delay = cols
    rows = zip(site, step, rank, proc, dev_s, arr, done, wait, delay, eng, strict=True)
    if "execution" not in columns:
        return "".join([fmt % row for row in rows])
    # `step_record`'s key order: `execution` last, only where known.
    ex = np.asarray(columns["execution"], dtype=np.int64)
    tail = np.where(ex == NO_EXECUTION, "}", "," + '"execution":' + ex.astype(str) + "}").tolist()
    return "".join([(fmt % row)[:-2] + t + "\n" for row, t in zip(rows, tail, strict=True)])


def write_columns(
    path: str | os.PathLike,
    header: Mapping[str, Any],
    columns: Mapping[str, np.ndarray],
    sites: Sequence[str],
    format: str = DEFAULT_FORMAT,
) -> str:
    """One process's header and step columns to `path` in `format`, atomically."""
    if check_format(format) == "parquet":
        return write_parquet(path, header, columns, sites)
    p = os.fspath(path)
    _check_file_path(p)
    head = json.dumps(dict(header), separators=(",", ":")) + "\n"
    return write_atomic(
        p, head + jsonl_step_lines(columns, sites), what="records", make_parents=True
    )


def write_records(
    path: str | os.PathLike, records: Iterable[Mapping[str, Any]], format: str = DEFAULT_FORMAT
) -> str:
    """One process's records (its header dict, then step dicts) to `path` in `format`."""
    if check_format(format) == "jsonl":
        return write_jsonl(path, records)
    recs = list(records)
    headers = [r for r in recs if r.get("type") == "header"]
    if len(headers) != 1:
        raise ValueError(
            f"a Parquet records file holds one process's records with one header; got "
            f"{len(headers)} headers. Write one file per process."
        )
    cols, sites = step_columns(r for r in recs if r.get("type") != "header")
    return write_parquet(path, headers[0], cols, sites)
