"""JSONL records read by pyarrow's JSON parser, all or nothing: a clean file's step rows
as one Arrow table grouped by site, or None for a file the careful reader must read.

pyarrow's parser takes each field as the type docs/records.md gives it and refuses
anything else: `1.5`, `1e3`, `"3"` or `true` where an integer belongs, an integer
beyond int64, a string site that is a number, a bool that is a string, a key given
twice, a line that is not JSON (measured: each raises). What it accepts and
docs/records.md does not is checked on the table and the bytes: a site that is not
UTF-8, a null or missing field, the integer -2^63, a negative `wait_ns` or `delay_ns`,
a line whose `type` is neither `step` nor the one header, rows that are not the file's
lines one for one (a blank line, two objects on a line), a line longer than
`MAX_LINE_BYTES`. A file with any of these is not read here (None): the careful reader
(`jsonl_checked`) reads it, dropping, counting and locating each bad line, so a file
read here and one read there give the same rows. About twice as fast as DuckDB's
`read_json` with the same checks in SQL (its integer columns cast `1.5` and `"3"`
silently, so the check needs each value's JSON text).

The engine (`records.engine`) writes each table to a Parquet file of its own
temporary directory, one site to a row group, and reads the run in place from
there, as a native run (no table in memory, no sort); `jaxpace convert` writes a clean
file's table as the native records file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jaxpace.records.format import INT_STEP_FIELDS
from jaxpace.records.jsonl_checked import MAX_LINE_BYTES

__all__ = ["checked_table", "read_clean", "step_table", "to_parquet", "write_grouped"]

_INT64_MIN = -(1 << 63)
_BLOCK_BYTES = 1 << 20


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("type", pa.string()),
            ("site", pa.string()),
            *((k, pa.int64()) for k in INT_STEP_FIELDS),
            ("engaged", pa.bool_()),
            ("device", pa.int64()),
            ("execution", pa.int64()),
        ]
    )


def read_clean(path: Path) -> Any | None:
    """The step rows of the JSONL records file `path` (its first line the header) as an
    Arrow table (`site`, the integer fields, `engaged`, `device`, `execution`; grouped
    by site, each site's rows in file order), or None when any line is not a clean
    step record or the one header (the careful reader's job)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    from jaxpace.records.safe_io import open_regular

    with open_regular(path, "records file") as f:
        data = f.read()
    try:
        table = pj.read_json(
            pa.BufferReader(data),
            # (1 MiB blocks parsed 11% faster than 8 MiB; the lines' lengths are checked
            # against `MAX_LINE_BYTES` below, as the careful reader checks them.)
            read_options=pj.ReadOptions(use_threads=False, block_size=_BLOCK_BYTES),
            parse_options=pj.ParseOptions(
                explicit_schema=_schema(), unexpected_field_behavior="ignore"
            ),
        )
    except (pa.ArrowException, OSError, ValueError):
        return None
    if table.num_rows != data.count(b"\n") or _longest_line(data) > MAX_LINE_BYTES:
        return None  # (a blank line, a line holding two objects, a line too long)
    kind = table.column("type")
    step = pc.fill_null(pc.equal(kind, "step"), False)
    if table.num_rows - pc.sum(step).as_py() != 1 or kind[0].as_py() != "header":
        return None  # (a second header, another kind of line, or none)
    table = table.slice(1)
    try:
        table.column("site").validate(full=True)  # (the parser lets bytes not UTF-8 through)
    except pa.ArrowException:
        return None
    must = ("site", *INT_STEP_FIELDS, "engaged")
    if any(table.column(k).null_count for k in must) or not pc.all(step.slice(1)).as_py():
        return None
    for k in (*INT_STEP_FIELDS, "device", "execution"):
        col = table.column(k)
        if pc.min(col).as_py() == _INT64_MIN:
            return None
    if pc.min(table.column("wait_ns")).as_py() < 0 or pc.min(table.column("delay_ns")).as_py() < 0:
        return None
    return _grouped(table.drop_columns(["type"]))


def _longest_line(data: bytes) -> int:
    """The longest line of `data`, its "\n" included (0 for a file too short to hold
    a line beyond `MAX_LINE_BYTES`: no scan)."""
    if len(data) <= MAX_LINE_BYTES:
        return 0
    import numpy as np

    ends = np.flatnonzero(np.frombuffer(data, np.uint8) == 10)
    return int(np.diff(ends, prepend=-1).max(initial=len(data)))


def _grouped(table: Any) -> Any:
    """`table`'s rows grouped by site (in the order each first appears), each site's rows
    in their own order."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if table.num_rows < 2:
        return table
    sites = pc.dictionary_encode(table.column("site")).combine_chunks()
    idx = sites.indices
    runs = 1 + pc.sum(pc.not_equal(idx.slice(1), idx.slice(0, len(idx) - 1))).as_py()
    if runs == len(sites.dictionary):
        return table  # (each site's rows together already: the writers' usual layout)
    order = pc.sort_indices(pa.table({"s": idx}), sort_keys=[("s", "ascending")])
    return table.take(order)  # (sort_indices is stable)


def checked_table(cols: dict[str, Any]) -> Any:
    """The careful reader's columns (`jsonl_checked.CheckedFile.columns`) as `read_clean`'s
    table: the same columns and types, grouped by site."""
    return _grouped(step_table(cols))


def step_table(cols: dict[str, Any]) -> Any:
    """The careful reader's columns as an Arrow table of `read_clean`'s columns and types,
    in their own row order (`execution` null where a row has none)."""
    import numpy as np
    import pyarrow as pa

    from jaxpace.records.format import NO_EXECUTION

    n = int(cols["step"].shape[0])
    ex = np.asarray(cols.get("execution", np.full(n, NO_EXECUTION)), np.int64)
    return pa.table(
        {
            "site": pa.array(np.asarray(cols["site"]).tolist(), pa.string()),
            **{k: pa.array(np.asarray(cols[k], np.int64), pa.int64()) for k in INT_STEP_FIELDS},
            "engaged": pa.array(np.asarray(cols["engaged"], bool), pa.bool_()),
            "device": pa.array(np.asarray(cols["device"], np.int64), pa.int64()),
            "execution": pa.array(ex, pa.int64(), mask=ex == NO_EXECUTION),
        },
        schema=_schema().remove(0),
    )


def write_grouped(table: Any, path: Path, header_json: bytes) -> None:
    """`read_clean`'s table to the Parquet file `path`, one site to a row group (as
    `records.format.write_parquet` lays out a native file, so a query for one site
    reads its row groups alone), the header in its metadata. A temporary file of the
    engine: written once, fast (lz4), never by a user."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from jaxpace.records.format import FORMAT_VERSION, HEADER_KEY

    table = table.replace_schema_metadata(
        {HEADER_KEY: header_json, b"jaxpace.format": str(FORMAT_VERSION).encode()}
    )
    site = table.column("site")
    starts = [0]
    if table.num_rows:
        change = pc.not_equal(site.slice(1), site.slice(0, table.num_rows - 1))
        starts += [int(i) + 1 for i in pc.indices_nonzero(change).to_pylist()]
    ints = [k for k in table.schema.names if k not in ("site", "engaged")]
    with pq.ParquetWriter(
        path,
        table.schema,
        compression="none",  # (a temporary file: written fast, read once a site)
        use_dictionary=["site"],
        column_encoding=dict.fromkeys(ints, "DELTA_BINARY_PACKED"),
    ) as w:
        for a, b in zip(starts, [*starts[1:], table.num_rows], strict=True):
            if b > a:
                w.write_table(table.slice(a, b - a), row_group_size=b - a)


def to_parquet(files: list[Path], out: Path, threads: int) -> list[tuple[Path, Any, str, Any]]:
    """Each JSONL records file of `files` to a Parquet file in the directory `out`
    (`write_grouped`): clean ones through `read_clean`, the others through the careful
    reader; `threads` files at a time. Returns, in file order, `(parquet path or None
    for a file with no line, header, where the header is, the careful reader's Drops or
    None)`.

    Raises:
      RecordsError: as the careful reader (a first line that is not a header, a line
        longer than `MAX_LINE_BYTES`, a file that is not a regular file).
    """
    import json
    from concurrent.futures import ThreadPoolExecutor

    from jaxpace.records.jsonl_checked import ends_with_newline, first_line, read_checked

    def one(i: int, f: Path) -> tuple[Path | None, Any, str, Any]:
        header, where, _ = first_line(f)
        if header is None:
            return None, None, where, None
        table = read_clean(f) if ends_with_newline(f) else None
        drops = None
        if table is None:
            checked = read_checked(f)
            table, drops = checked_table(checked.columns), checked.drops
        dst = out / f"{i}.parquet"
        write_grouped(table, dst, json.dumps(header, separators=(",", ":")).encode())
        return dst, header, where, drops

    with ThreadPoolExecutor(max(int(threads), 1)) as ex:
        return list(ex.map(one, range(len(files)), files))
