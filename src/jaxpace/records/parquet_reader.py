"""What a Parquet records file is (docs/records.md, "Parquet"): known by its first bytes, its
header in the file's key-value metadata, its columns' types.

The engine (`jaxpace.records.engine`) reads the rows; these checks run on each file's
footer first. pyarrow is imported only when a Parquet file is read.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jaxpace.errors import RecordsError
from jaxpace.records.format import HEADER_KEY, INT_STEP_FIELDS

__all__ = ["FOOTER_BYTES_KEPT", "RowGroupReader", "check_schema", "header_of", "is_parquet"]


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


def header_of(schema: Any, where: str) -> dict[str, Any]:
    """The header in a Parquet file's key-value metadata (`HEADER_KEY`), checked."""
    meta = schema.metadata or {}
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


def check_schema(schema: Any, where: str) -> None:
    """Refuses a Parquet records file whose columns are missing or of the wrong type
    (the integers any integer type, `engaged` bool, `site` strings; `device` optional)."""
    import pyarrow as pa

    names = set(schema.names)
    missing = [k for k in ("site", *INT_STEP_FIELDS, "engaged") if k not in names]
    if missing:
        raise RecordsError(
            f"{where}: Parquet records lack the column(s) "
            f"{', '.join(f'`{k}`' for k in missing)}; expected the columns of docs/records.md."
        )
    for k in (*INT_STEP_FIELDS, "device", "engaged"):
        if k not in names:
            continue
        t = schema.field(k).type
        want = pa.bool_() if k == "engaged" else pa.int64()
        if t != want and not (k != "engaged" and pa.types.is_integer(t)):
            raise RecordsError(
                f"{where}: column `{k}` has type {t}, expected {want} (docs/records.md)."
            )
    t = schema.field("site").type
    if pa.types.is_dictionary(t):
        t = t.value_type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
        raise RecordsError(f"{where}: column `site` has type {t}, expected strings.")


# The most footer bytes (serialized) `RowGroupReader` keeps parsed: about 150 MB of
# memory held for 1024 files of 16-32 row groups (17-35 MB serialized); a larger run
# is read by the engine's queries instead.
FOOTER_BYTES_KEPT = 64 << 20
# Files whose tables `RowGroupReader` gathers before copying their columns out.
_BATCH = 64


class RowGroupReader:
    """One site's rows of a run read in place, read from its row groups directly.

    A native file holds each site's rows in row groups of their own
    (`records.format.write_parquet`), and its footer, parsed when the run was opened,
    says which. A DuckDB query for one site (`WHERE site = ?` over every file) costs
    about 0.5 ms of CPU per file whatever it returns, most of it the filter over every
    row group; reading the site's row groups by number with the footers kept costs
    about half (2M rows from 1024 files: 0.27 s of CPU against 0.54 s from zstd files,
    0.13 s from LZ4 files). The files are read in their order, each in its own order:
    the rows the query returns, in the same order. It reads in the calling thread: the
    report's pass over the sites reads the next site in a background thread while it
    works on this one (`records.by_site`), and two reading threads there took more CPU
    for the same wall time.

    Args:
      files: the run's files (in the engine's order).
      metas: each file's parsed footer (`pyarrow.parquet.FileMetaData`).
      groups: per file, `{site: [its row groups]}`.
      names: the columns every file has.
    """

    def __init__(self, files, metas, groups, names) -> None:
        self.files, self.metas, self.groups = list(files), list(metas), list(groups)
        self.names = set(names)

    def read(self, site: str, columns) -> dict[str, Any]:
        """`columns` (of `records.engine.STEP_COLUMNS`) of `site`'s rows as NumPy arrays,
        int64 (`device` -1 where null) and `engaged` bool.

        The files' rows are copied into their place in arrays sized from the footers,
        `_BATCH` files at a time, and then let go: the memory is the site's arrays and
        one batch's rows."""
        import numpy as np

        sizes = [
            sum(self.metas[i].row_group(g).num_rows for g in self.groups[i].get(site, ()))
            for i in range(len(self.files))
        ]
        at = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        rows = int(at[-1])
        # (`device` is the one optional column: -1 where no file has it, as the query's.)
        out = {
            k: np.full(rows, -1, np.int64)
            if k not in self.names
            else np.empty(rows, bool if k == "engaged" else np.int64)
            for k in columns
        }
        self._read(site, [k for k in columns if k in self.names], at, out)
        return out

    def _read(self, site: str, asked: list[str], at, out) -> None:
        """The files' rows of `site` into `out` at their offsets `at`, `_BATCH` files'
        tables at a time (one copy per column of a batch, not of each file)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        batch: list = []
        first, n = 0, len(self.files)
        for i in range(n):
            g = self.groups[i].get(site)
            if g:
                pf = pq.ParquetFile(self.files[i], metadata=self.metas[i], pre_buffer=False)
                try:
                    table = pf.read_row_groups(g, columns=asked, use_threads=False)
                finally:
                    pf.close()
                if table.num_rows != at[i + 1] - at[i]:
                    raise OSError(
                        f"{self.files[i]}: {table.num_rows} rows where its footer said "
                        f"{at[i + 1] - at[i]}"
                    )
                batch.append(table)
            if len(batch) == _BATCH or i == n - 1:
                if batch:
                    lo, hi = int(at[first]), int(at[i + 1])
                    both = pa.concat_tables(batch)
                    for k in asked:
                        col = both.column(k)
                        if k == "device" and col.null_count:
                            col = col.fill_null(-1)
                        out[k][lo:hi] = col.to_numpy()
                batch, first = [], i + 1
