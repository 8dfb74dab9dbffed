"""Reading one Parquet records file (docs/records.md, "Parquet") into the records reader.

The header comes from the file's key-value metadata, the step columns are
checked (types, nulls, the int64 range, negative durations) and appended as
arrays; a file without its footer (a process killed while writing) is skipped
and noted. pyarrow is imported here only, when a Parquet file is read.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from jaxpace.errors import RecordsError
from jaxpace.records.format import HEADER_KEY, INT_STEP_FIELDS, NO_EXECUTION
from jaxpace.records.safe_io import open_regular

__all__ = ["is_parquet", "read_parquet"]


def is_parquet(path: Path) -> bool:
    """Whether `path` is a Parquet file: by its first 4 bytes (`PAR1`), so a file's
    name never decides how it is read (a special file is refused when read)."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            return path.suffix == ".parquet"
        with open(path, "rb") as f:
            return f.read(4) == b"PAR1"
    except OSError:
        return path.suffix == ".parquet"


def read_parquet(builder: Any, path: Path) -> None:
    """One Parquet records file into `builder`: its header from the metadata, its
    columns checked (types, nulls, negative durations) and appended at once."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    builder.sources.append(str(path))
    where = f"{path}"
    with open_regular(path, "records file") as f:
        try:
            pf = pq.ParquetFile(f)
            table = pf.read()
        except (pa.ArrowException, OSError, ValueError) as e:
            builder.partial = True
            builder.notes.append(
                f"PARTIAL: skipped {path}: not a complete Parquet file ({str(e)[:120]}); "
                "a process killed while writing it leaves no footer. The other files are "
                "read."
            )
            return
    builder.expected_rows = max(builder.expected_rows, builder.rows + table.num_rows)
    builder.add_header(_header(table, where), f"{where}:header")
    names = set(table.column_names)
    missing = [k for k in ("site", *INT_STEP_FIELDS, "engaged") if k not in names]
    if missing:
        raise RecordsError(
            f"{where}: Parquet records lack the column(s) "
            f"{', '.join(f'`{k}`' for k in missing)}; expected the columns of docs/records.md."
        )
    n = table.num_rows
    cols = _int_columns(table, names, where)
    site = table.column("site").combine_chunks()
    if pa.types.is_dictionary(site.type):
        names_arr = site.dictionary.to_pylist()
        idx = site.indices.to_numpy(zero_copy_only=False)
    elif pa.types.is_string(site.type) or pa.types.is_large_string(site.type):
        enc = site.dictionary_encode()
        names_arr, idx = enc.dictionary.to_pylist(), enc.indices.to_numpy(zero_copy_only=False)
    else:
        raise RecordsError(f"{where}: column `site` has type {site.type}, expected strings.")
    if site.null_count:
        raise RecordsError(f"{where}: column `site` has {site.null_count} null values.")
    remap = np.array(
        [builder.site_index.setdefault(s, len(builder.site_index)) for s in names_arr], np.int64
    )
    cols["site"] = remap[idx] if remap.size else np.zeros(0, np.int64)
    huge = np.zeros(n, bool)
    for k in INT_STEP_FIELDS:
        huge |= cols[k] == np.iinfo(np.int64).min  # (the rest of int64 is inside the bound)
    if huge.any():
        builder.huge += int(huge.sum())
        if builder.huge_first is None:
            builder.huge_first = f"{where}: row {int(np.flatnonzero(huge)[0])}"
        cols = {k: v[~huge] for k, v in cols.items()}
    bad = (cols["wait_ns"] < 0) | (cols["delay_ns"] < 0)
    if bad.any():
        builder.negative += int(bad.sum())
        if builder.negative_first is None:
            builder.negative_first = f"{where}: row {int(np.flatnonzero(bad)[0])}"
        cols = {k: v[~bad] for k, v in cols.items()}
    builder.add_columns(cols)


def _header(table: Any, where: str) -> dict[str, Any]:
    """The header in a Parquet file's key-value metadata (`HEADER_KEY`), checked."""
    meta = table.schema.metadata or {}
    if HEADER_KEY not in meta:
        raise RecordsError(
            f"{where}: Parquet file without a jaxpace header (metadata key "
            f"`{HEADER_KEY.decode()}`); expected a file written by `Pacer.export` "
            "(docs/records.md). Point at the run's own files."
        )
    try:
        header = json.loads(meta[HEADER_KEY])
    except ValueError as e:
        raise RecordsError(f"{where}: header metadata is not valid JSON ({e}).") from None
    if not isinstance(header, Mapping) or header.get("type") != "header":
        raise RecordsError(f'{where}: header metadata is not a header (`"type": "header"`).')
    return header


def _int_columns(table: Any, names: set[str], where: str) -> dict[str, np.ndarray]:
    """The integer columns and `engaged` as NumPy, checked (types, nulls, int64 range)."""
    import pyarrow as pa

    n = table.num_rows
    cols: dict[str, np.ndarray] = {}
    for k in (*INT_STEP_FIELDS, "device", "engaged"):
        if k not in names:  # `device` is optional
            cols[k] = np.full(n, -1, np.int64)
            continue
        col = table.column(k)
        want = pa.bool_() if k == "engaged" else pa.int64()
        if col.type != want and not (k != "engaged" and pa.types.is_integer(col.type)):
            raise RecordsError(
                f"{where}: column `{k}` has type {col.type}, expected {want} (docs/records.md)."
            )
        if k != "device" and col.null_count:
            raise RecordsError(f"{where}: column `{k}` has {col.null_count} null values.")
        if k == "device":
            col = col.fill_null(-1)
        if k != "engaged" and col.type != pa.int64():
            try:  # (a uint64 beyond int64 is refused, never wrapped)
                col = col.cast(pa.int64(), safe=True)
            except pa.ArrowInvalid:
                raise RecordsError(
                    f"{where}: column `{k}` ({col.type}) holds values beyond int64."
                ) from None
        cols[k] = col.to_numpy().astype(bool if k == "engaged" else np.int64, copy=False)
    if "execution" in names:  # optional, null where unknown (docs/records.md)
        col = table.column("execution")
        if not pa.types.is_integer(col.type):
            raise RecordsError(
                f"{where}: column `execution` has type {col.type}, expected int64 "
                "(docs/records.md)."
            )
        try:
            col = col.cast(pa.int64(), safe=True)
        except pa.ArrowInvalid:
            raise RecordsError(f"{where}: column `execution` holds values beyond int64.") from None
        cols["execution"] = col.fill_null(NO_EXECUTION).to_numpy().astype(np.int64, copy=False)
    return cols
