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

__all__ = ["check_schema", "header_of", "is_parquet"]


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
