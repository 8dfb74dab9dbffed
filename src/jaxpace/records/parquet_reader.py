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
from typing import Any, NamedTuple

from jaxpace.errors import RecordsError
from jaxpace.records.format import HEADER_KEY, INT_STEP_FIELDS
from jaxpace.records.pool import empty

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


# The most footer bytes (serialized) `RowGroupReader` keeps parsed: parsed, a footer takes
# about 7 times its serialized size (1024 files of 32 row groups: 47 MB serialized, about
# 350 MB held; at this limit about 0.45 GB); a larger run is read by the engine's queries.
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
    0.13 s from LZ4 files). It reads in the calling thread: the report's pass over the
    sites reads the next site in a background thread while it works on this one
    (`records.by_site`), and two reading threads there took more CPU for the same wall
    time.

    The rows come in one of two orders, the same rows either way:

    - *on the site's grid* (`_Cells`): sorted by (step, rank), when the footers' statistics
      bound every file's steps and ranks and the (step x rank) grid they span holds at
      most four cells a row. Each file's rows are written straight into their cells
      (a file's rows of a step and its ranks in order are one block of the grid), so the
      report, which works on that grid, finds them in place instead of gathering each
      column from every file (`records.site_data._grid`). A cell written twice (a
      row twice in a file another tool wrote) leaves the grid: the rows are read again in
      the files' order, where the report names the duplicates;
    - *in the files' order*, each file in its own order (the query's order), otherwise.

    Args:
      files: the run's files (in the engine's order).
      metas: each file's parsed footer (`pyarrow.parquet.FileMetaData`).
      groups: per file, `{site: [its row groups]}`.
      names: the columns every file has.
      bounds: per file, `{site: (least step, greatest step, least rank, greatest rank)}`
        from its statistics (None where unknown; no `bounds`: the files' order always).
    """

    def __init__(self, files, metas, groups, names, bounds=None) -> None:
        self.files, self.metas, self.groups = list(files), list(metas), list(groups)
        self.names = set(names)
        self.bounds = list(bounds) if bounds is not None else [{} for _ in self.files]
        self._job: _GridRead | None = None  # (the grid read under way, for `help`)
        # (each column's leaf position, the files sharing one layout: `_table`'s)
        self._leaves = _leaf_columns(self.metas[0]) if self.metas else None

    def read(self, site: str, columns) -> dict[str, Any]:
        """`columns` (of `records.engine.STEP_COLUMNS`) of `site`'s rows as NumPy arrays,
        int64 (`device` -1 where null) and `engaged` bool; on the site's grid where the
        class docstring says, else in the files' order. A site with every cell of its grid
        comes as a `LaidOut`, its `step` and `rank` written by `LaidOut.lay_out`.

        The files' rows are copied into their place in arrays sized from the footers
        and then let go (in the files' order `_BATCH` files at a time): the memory is the
        site's arrays and one batch's rows."""
        import numpy as np

        sizes = [
            sum(self.metas[i].row_group(g).num_rows for g in self.groups[i].get(site, ()))
            for i in range(len(self.files))
        ]
        cells = _Cells.of(site, sizes, self.bounds)
        if cells is not None:
            got = self._read_cells(site, columns, sizes, cells)
            if got is not None:
                return got
        at = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        out = self._empty(columns, int(at[-1]))
        self._read(site, [k for k in columns if k in self.names], at, out)
        return out

    def _empty(self, columns, rows: int) -> dict[str, Any]:
        """The output arrays (`device` is the one optional column: -1 where no file has
        it, as the query's)."""
        import numpy as np

        return {
            k: np.full(rows, -1, np.int64)
            if k not in self.names
            else empty(rows, bool if k == "engaged" else np.int64)
            for k in columns
        }

    def _table(self, i: int, site: str, asked: list[str], rows: int):
        """File `i`'s rows of `site` (its row groups of it), checked against the footer.

        Read through pyarrow's own reader (`pyarrow._parquet.ParquetReader`, what
        `ParquetFile` wraps) with the columns by position: `ParquetFile` resolves the
        path's filesystem and maps the schema's names on every open, 13% of the reading
        thread's CPU at 262M rows (one open per file and site). A pyarrow without that
        reader, or with another signature, is read through `ParquetFile`."""
        leaves, table = self._leaves, None
        if leaves is not None and _reader_class() is not None and all(k in leaves for k in asked):
            table = self._fast_table(i, site, [leaves[k] for k in asked])
        if table is None:
            import pyarrow.parquet as pq

            pf = pq.ParquetFile(self.files[i], metadata=self.metas[i], pre_buffer=False)
            try:
                table = pf.read_row_groups(self.groups[i][site], columns=asked, use_threads=False)
            finally:
                pf.close()
        if table.num_rows != rows:
            raise OSError(f"{self.files[i]}: {table.num_rows} rows where its footer said {rows}")
        return table

    def _fast_table(self, i: int, site: str, columns: list[int]):
        """`_table`'s read through pyarrow's reader; None (and `ParquetFile` from then on)
        where that reader's interface is not the one known here."""
        global _FAST_READER
        reader = _reader_class()()
        try:
            reader.open(self.files[i], metadata=self.metas[i], pre_buffer=False)
            try:
                return reader.read_row_groups(
                    self.groups[i][site], column_indices=columns, use_threads=False
                )
            finally:
                reader.close()
        except TypeError:
            _FAST_READER = None
            return None

    def _read(self, site: str, asked: list[str], at, out) -> None:
        """The files' rows of `site` into `out` at their offsets `at`, `_BATCH` files'
        tables at a time (one copy per column of a batch, not of each file)."""
        import pyarrow as pa

        batch: list = []
        first, n = 0, len(self.files)
        for i in range(n):
            if self.groups[i].get(site):
                batch.append(self._table(i, site, asked, int(at[i + 1] - at[i])))
            if len(batch) == _BATCH or i == n - 1:
                if batch:
                    lo, hi = int(at[first]), int(at[i + 1])
                    both = pa.concat_tables(batch)
                    for k in asked:
                        out[k][lo:hi] = _numpy(both.column(k))
                batch, first = [], i + 1

    def _read_cells(self, site: str, columns, sizes: list[int], cells: _Cells):
        """The rows of `site` placed on its grid `cells` (the class docstring); None when a
        cell is written twice, or a file's rows stray outside its statistics. Another
        thread may read some of the files meanwhile (`help`)."""
        import numpy as np

        job = _GridRead(self, site, [k for k in columns if k in self.names], sizes, cells)
        self._job = job
        try:
            job.work()
        finally:
            self._job = None
        job.wait()
        if job.error is not None:
            raise job.error
        rows = sum(sizes)
        if job.stray or int(np.count_nonzero(job.present)) != rows:
            return None  # (a cell twice: in the files' order, where the report names it)
        return cells.columns(columns, job.grid, job.present, rows)

    def help(self) -> None:
        """Reads, in the calling thread, files of the site another thread is placing on its
        grid (`read`), until none is left; nothing when no such read is under way. The pass
        over the sites calls it while it waits for the site read ahead (`records.by_site`),
        so both threads read then: the reading thread alone is the pass's longer one
        (0.5-0.7 s a site at 262M rows against 0.4-0.5 s for the report's work on it)."""
        job = self._job
        if job is not None:
            job.work()


class _GridRead:
    """One site's files placed on its grid (`RowGroupReader._read_cells`), by one or more
    threads: each calls `work`, which takes the files a few at a time (`_FILES_A_TURN`,
    neighbours on the grid) from a shared iterator, so each file is read once, into its own
    cells. The reading thread then `wait`s for the others to finish their turn. A file
    whose rows stray outside the grid stops the read (`stray`); an error in any thread is
    raised by the reading thread (`error`), as if it had read that file itself.

    A file's block is a few ranks of every step: a short piece of each of the grid's
    rows (8 ranks: 64 bytes a row, 64 KB apart at 8192 ranks), each on a page of its own.
    Copying such pieces is bound by the page lookups, not by the bytes (0.5-0.9 s a site
    at 262M rows for three columns, in the files' order of names). So the files are
    taken in the order of their ranks, and a turn's neighbouring blocks are joined
    (`np.concatenate`, small) and copied as one: 0.12-0.14 s."""

    def __init__(self, reader: RowGroupReader, site: str, asked, sizes, cells) -> None:
        import threading

        import numpy as np

        self.reader, self.site, self.sizes, self.cells = reader, site, sizes, cells
        self.values = [k for k in asked if k not in ("step", "rank")]
        self.grid = {
            k: empty(cells.size, bool if k == "engaged" else np.int64) for k in self.values
        }
        self.present = np.zeros((cells.steps, cells.ranks), bool)
        files = sorted(
            (i for i, n in enumerate(sizes) if n), key=lambda i: _by_rank(reader, i, site)
        )
        self.todo = iter(
            [files[j : j + _FILES_A_TURN] for j in range(0, len(files), _FILES_A_TURN)]
        )
        self.stray = False
        self.error: BaseException | None = None
        self._busy = 0
        self._done = threading.Condition()

    def work(self) -> None:
        with self._done:
            self._busy += 1
        try:
            for turn in self.todo:  # (shared: another thread's loop takes the next turn)
                if self.stray or self.error is not None:
                    break
                if not self._place(turn):
                    self.stray = True
        except Exception as e:  # (raised by the reading thread, from `wait`'s caller)
            self.error = self.error or e
        finally:
            with self._done:
                self._busy -= 1
                self._done.notify_all()

    def wait(self) -> None:
        """Until no thread is in a turn."""
        with self._done:
            self._done.wait_for(lambda: self._busy == 0)

    def _place(self, files: list[int]) -> bool:
        """The files' rows into their cells; False when one lies outside the grid."""
        import numpy as np

        values, present, grid = self.values, self.present, self.grid
        blocks = []  # ((rows, columns), table) of the files in the writer's order
        for i in files:
            table = self.reader._table(i, self.site, ["step", "rank", *values], self.sizes[i])
            step, rank = _numpy(table.column("step")), _numpy(table.column("rank"))
            block = self.cells.block(step, rank, self.reader.bounds[i][self.site])
            if block is not None:  # (a step and its ranks a row of the block)
                blocks.append((block, table))
                continue
            flat = self.cells.flat(step, rank)
            if flat is None:
                return False
            present.reshape(-1)[flat] = True
            for k in values:
                grid[k][flat] = _numpy(table.column(k))
        for run in _neighbours(blocks):
            (rows, first), _ = run[0]
            cols = slice(first.start, run[-1][0][1].stop)
            present[rows, cols] = True
            for k in values:
                parts = [_numpy(t.column(k)).reshape(-1, b[1].stop - b[1].start) for b, t in run]
                grid[k].reshape(present.shape)[rows, cols] = (
                    parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
                )
        return True


# pyarrow's Parquet reader class (`ParquetFile`'s own; `_reader_class`): False until
# looked for, None where it is absent or its interface is not the one known here.
_FAST_READER: Any = False


def _reader_class() -> Any:
    """pyarrow's `ParquetReader` (`_FAST_READER`), looked for once."""
    global _FAST_READER
    if _FAST_READER is False:
        try:
            from pyarrow._parquet import ParquetReader
        except ImportError:
            ParquetReader = None
        names = ("open", "read_row_groups", "close")
        ok = ParquetReader is not None and all(
            callable(getattr(ParquetReader, k, None)) for k in names
        )
        _FAST_READER = ParquetReader if ok else None
    return _FAST_READER


def _leaf_columns(meta: Any) -> dict[str, int] | None:
    """Each column's position among a file's leaf columns (what pyarrow's reader asks);
    None when a column is nested (its leaves are not its fields)."""
    schema = meta.schema
    paths = [schema.column(j).path for j in range(len(schema))]
    if any("." in x for x in paths) or len(paths) != len(schema.to_arrow_schema()):
        return None
    return {x: j for j, x in enumerate(paths)}


# Files a thread reads at a time in `_GridRead` (their blocks joined where neighbours).
_FILES_A_TURN = 8


def _by_rank(reader: RowGroupReader, i: int, site: str) -> tuple[int, int]:
    """File `i`'s place on `site`'s grid: its least rank, then its least step."""
    b = reader.bounds[i][site]
    return b[2], b[0]


def _neighbours(blocks: list) -> list[list]:
    """`blocks` ((rows, columns), table) in runs of the same rows and adjacent columns,
    each run one block of the grid."""
    runs: list[list] = []
    for b in blocks:
        last = runs[-1][-1][0] if runs else None
        if last is not None and last[0] == b[0][0] and last[1].stop == b[0][1].start:
            runs[-1].append(b)
        else:
            runs.append([b])
    return runs


class _Cells(NamedTuple):
    """A site's (step x rank) grid: steps `step0`, `step0 + 1`, ... (`steps` of them) by ranks
    `rank0`, ... (`ranks`), which `RowGroupReader` places the site's rows on."""

    step0: int
    steps: int
    rank0: int
    ranks: int

    @property
    def size(self) -> int:
        return self.steps * self.ranks

    @classmethod
    def of(cls, site: str, sizes: list[int], bounds: list[dict]) -> _Cells | None:
        """The grid the files' statistics span for `site`; None when a file with its rows
        has no statistics of them, or the grid would hold over four cells a row."""
        spans = [bounds[i].get(site) for i, n in enumerate(sizes) if n]
        if not spans or any(b is None for b in spans):
            return None
        s0, s1 = min(b[0] for b in spans), max(b[1] for b in spans)
        r0, r1 = min(b[2] for b in spans), max(b[3] for b in spans)
        grid = cls(s0, s1 - s0 + 1, r0, r1 - r0 + 1)
        return grid if grid.size <= 4 * sum(sizes) + 1024 else None

    def block(self, step, rank, bound) -> tuple[slice, slice] | None:
        """Where a file's rows go when they are every (step, rank) of its statistics'
        `bound`, step by step and each step's ranks in order (the writer's order): the
        grid's (rows, columns) slices; else None."""
        import numpy as np

        s_lo, s_hi, r_lo, r_hi = bound
        shape = (s_hi - s_lo + 1, r_hi - r_lo + 1)
        if step.size != shape[0] * shape[1]:
            return None
        if not (
            (step.reshape(shape) == np.arange(s_lo, s_hi + 1)[:, None]).all()
            and (rank.reshape(shape) == np.arange(r_lo, r_hi + 1)).all()
        ):
            return None
        return (
            slice(s_lo - self.step0, s_hi - self.step0 + 1),
            slice(r_lo - self.rank0, r_hi - self.rank0 + 1),
        )

    def flat(self, step, rank):
        """Each row's cell (flat index), or None when one is outside the grid."""
        import numpy as np

        s = step.astype(np.int64) - self.step0
        r = rank.astype(np.int64) - self.rank0
        if s.size and (
            s.min() < 0 or s.max() >= self.steps or r.min() < 0 or r.max() >= self.ranks
        ):
            return None
        s *= self.ranks
        s += r
        return s

    def columns(self, columns, grid: dict, present, rows: int):
        """The output: every column in (step, rank) order, the cells with a row (a `LaidOut`
        when every cell has one)."""
        import numpy as np

        if rows == self.size:
            return LaidOut(self, list(columns), grid)
        keep = np.flatnonzero(present)
        step, rank = np.divmod(keep.astype(np.int64, copy=False), self.ranks)
        step += self.step0
        rank += self.rank0
        have = {"step": step, "rank": rank, **{k: v[keep] for k, v in grid.items()}}
        return _asked(columns, have, rows)

    def axes_columns(self) -> tuple[Any, Any]:
        """The `step` and `rank` columns of every cell in order."""
        import numpy as np

        step, rank = empty(self.size, np.int64), empty(self.size, np.int64)
        step.reshape(self.steps, -1)[:] = np.arange(self.step0, self.step0 + self.steps)[:, None]
        rank.reshape(self.steps, -1)[:] = np.arange(self.rank0, self.rank0 + self.ranks)
        return step, rank


class LaidOut(dict):
    """A site's columns read onto its grid, every cell a row, `step` and `rank` not written
    yet (`lay_out` writes them; the engine then fills each rank's process and device from
    `cells`' ranks, `records.engine.Engine.finish`). The pass over the sites reads a site
    ahead in another thread (`records.by_site`) and finishes it where it takes the site,
    so the site read ahead holds only what the files gave (three columns of seven at 262M
    rows)."""

    def __init__(self, cells: _Cells, columns: list[str], grid: dict) -> None:
        super().__init__(grid)
        self.cells, self.columns = cells, columns
        self.fill: Any = None  # (set by the engine: its fill of the left-out columns)

    def lay_out(self) -> dict[str, Any]:
        """The columns, `step` and `rank` written, in the order asked."""
        step, rank = self.cells.axes_columns()
        return _asked(self.columns, {**self, "step": step, "rank": rank}, self.cells.size)


def _asked(columns, have: dict, rows: int) -> dict[str, Any]:
    """`columns` in order from `have`; a column no file has -1 (as the query's)."""
    import numpy as np

    return {k: have[k] if k in have else np.full(rows, -1, np.int64) for k in columns}


def _numpy(col) -> Any:
    """A pyarrow column as NumPy (an integer column's nulls -1: `device`'s; one chunk
    without a copy)."""
    import pyarrow as pa

    if col.null_count and pa.types.is_integer(col.type):
        col = col.fill_null(-1)
    if col.num_chunks == 1:
        return col.chunk(0).to_numpy(zero_copy_only=False)
    return col.to_numpy()
