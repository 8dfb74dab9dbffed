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
import stat
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_FORMAT",
    "FORMATS",
    "FORMAT_VERSION",
    "HEADER_KEY",
    "INT_STEP_FIELDS",
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
    "write_text",
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
) -> dict[str, Any]:
    """One measured collective call of one rank (docs/records.md, "step").

    `wait_ns` defaults to `done_ns - arrive_ns`; pass it to write back a
    record read from a file unchanged.
    """
    return {
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


def write_jsonl(path: str | os.PathLike, records: Iterable[Mapping[str, Any]]) -> str:
    """Writes records one JSON object a line, atomically; returns the path.

    The text goes to a uniquely named temporary file beside `path`, which then
    replaces `path` in one rename: a reader never sees half a file, and
    concurrent writers never share a temporary name (the last one wins).
    Missing parent directories are created. Only a regular file (or nothing)
    at `path` is replaced: a symlink, directory, device node, FIFO or socket
    there raises `FileExistsError`/`IsADirectoryError` and is left as it was.
    """
    p = os.fspath(path)
    _check_file_path(p)

    def write(fd: int, tmp: str) -> None:
        with os.fdopen(fd, "w") as f:
            for rec in records:
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")

    return _replace_atomically(p, write)


def _check_file_path(p: str) -> None:
    if p.endswith(os.sep) or (os.altsep and p.endswith(os.altsep)):
        raise IsADirectoryError(
            f"records path {p!r} names a directory; pass a file path such as "
            f"{os.path.join(p, records_filename(0))!r}."
        )
    check_replaceable(p)


def _replace_atomically(p: str, write: Any) -> str:
    """Calls `write(tmp)` on a fresh temporary file beside `p`, then renames it to `p`."""
    d = os.path.dirname(p) or "."
    make_dirs(d)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(p) + ".", suffix=".tmp", dir=d)
    try:
        write(fd, tmp)
        os.chmod(tmp, 0o644)
        check_replaceable(p)  # again, just before the rename
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return p


def step_columns(
    steps: Iterable[Mapping[str, Any]],
) -> tuple[dict[str, np.ndarray], list[str]]:
    """Step dicts (`step_record`'s) as columns: ints, `engaged`, `site` an index into
    the returned site names, `device` -1 where null."""
    lists: dict[str, list] = {k: [] for k in (*INT_STEP_FIELDS, "site", "engaged", "device")}
    sites: dict[str, int] = {}
    for rec in steps:
        for k in INT_STEP_FIELDS:
            lists[k].append(rec[k])
        lists["site"].append(sites.setdefault(rec["site"], len(sites)))
        lists["engaged"].append(bool(rec["engaged"]))
        dev = rec.get("device")
        lists["device"].append(-1 if dev is None else int(dev))
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
    record, `engaged` (bool) and `device` (-1: null); `header` (`header_record`'s
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
    meta = {
        HEADER_KEY: json.dumps(dict(header), separators=(",", ":")).encode(),
        b"jaxpace.format": str(FORMAT_VERSION).encode(),
    }
    table = pa.table(arrays).replace_schema_metadata(meta)

    def write(fd: int, tmp: str) -> None:
        with os.fdopen(fd, "wb") as f:
            pq.write_table(table, f, compression="zstd", row_group_size=1 << 20)

    return _replace_atomically(p, write)


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
    return "".join(
        [
            fmt % row
            for row in zip(site, step, rank, proc, dev_s, arr, done, wait, delay, eng, strict=True)
        ]
    )


def write_text(path: str | os.PathLike, text: str) -> str:
    """Writes `text` to `path` atomically (temporary file beside it, then one rename), with
    the same refusals as `write_jsonl`; the stall record is written with it."""
    p = os.fspath(path)
    _check_file_path(p)

    def write(fd: int, tmp: str) -> None:
        with os.fdopen(fd, "w") as f:
            f.write(text)

    return _replace_atomically(p, write)


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
    text = json.dumps(dict(header), separators=(",", ":")) + "\n" + jsonl_step_lines(columns, sites)

    def write(fd: int, tmp: str) -> None:
        with os.fdopen(fd, "w") as f:
            f.write(text)

    return _replace_atomically(p, write)


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


def check_replaceable(path: str) -> None:
    """Raises unless `path` is missing or a regular file (never follows a symlink)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except NotADirectoryError as e:
        raise NotADirectoryError(
            f"cannot write records to {path!r}: a parent of it is a file, not a directory. "
            "Pick another path."
        ) from e
    mode = st.st_mode
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(
            f"cannot write records to {path!r}: it is a directory. Pass a file path inside it, "
            f"e.g. {os.path.join(path, records_filename(0))!r}."
        )
    kinds = [
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISCHR, "a device node"),
        (stat.S_ISBLK, "a device node"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ]
    kind = next((k for test, k in kinds if test(mode)), "not a regular file")
    raise FileExistsError(
        f"refusing to write records over {path!r}: it is {kind}, and only a regular file "
        "(or a new path) is replaced. Pass a new file path or a directory."
    )


def make_dirs(directory: str) -> None:
    """`os.makedirs(directory, exist_ok=True)` with an error that says which part is wrong."""
    try:
        os.makedirs(directory, exist_ok=True)
    except FileExistsError as e:
        raise NotADirectoryError(
            f"cannot create directory {directory!r} for records: {directory!r} or one of its "
            "parents exists and is not a directory. Pick another path."
        ) from e
    except NotADirectoryError as e:
        raise NotADirectoryError(
            f"cannot create directory {directory!r} for records: one of its parents is a "
            "file, not a directory. Pick another path."
        ) from e
    except PermissionError as e:
        raise PermissionError(
            f"cannot create directory {directory!r} for records: permission denied. "
            "Pick a writable path."
        ) from e
