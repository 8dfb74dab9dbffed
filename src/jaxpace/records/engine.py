"""The records' heavy work on DuckDB, out of core: a run's files read into one table, then one site at a time.

One module holds the SQL. `Engine.load` reads a run's files into the table
`steps` (held in memory up to the engine's limit, spilled to its temporary
directory beyond it), or reads it in place: a natively written Parquet run from its
files, a JSONL run alone from the Parquet files `records.jsonl_arrow` writes of it in
the temporary directory. Into the table: Parquet as is (each file's footer, header
and column types checked first; a file without its footer skipped and noted); JSONL
through `read_json` over all files at once, its values typed as JSON and checked in
SQL (an integer field must be an integer literal: DuckDB's own integer columns take
`1.5`, `1e3` and `"3"` silently), and every file it cannot read cleanly (a cut last
line, `Infinity`, a float or a string where an integer belongs, a negative duration,
a second header) read again by `jsonl_checked`, which drops, counts and locates
each bad line; NCCL Inspector logs and `jax.profiler` traces through their readers
(`open_records`). The report then reads one site at a time (`site_columns`, the
`WHERE site = ?` of `records.by_site`), plus small queries over all rows: each
site's steps, the (rank, process, device) triples, the rows per site.

The per-(site, step) reduction over ranks and the per-rank statistics are also here
as SQL (`reduce`, for `python -m benchmarks records` and for tools): the report's
stages keep their NumPy code (`records.site_data`), fed one site at a time, because
its results must stay bit for bit what they were (medians of filled-in missing ranks,
float sums in a fixed order). DuckDB runs with its threads capped, a memory limit, a
temporary directory to spill to, and never downloads an extension
(`autoinstall_known_extensions` and `autoload_known_extensions` off: object storage
needs `httpfs` installed explicitly, docs/records.md). duckdb and pyarrow are
imported here only.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from jaxpace.errors import RecordsError
from jaxpace.records import jsonl_checked, pool
from jaxpace.records.format import HEADER_KEY, INT_STEP_FIELDS, records_files
from jaxpace.records.int_keys import unique_rows
from jaxpace.records.jsonl_checked import Drops, ends_with_newline, first_line, read_checked
from jaxpace.records.parquet_reader import LaidOut
from jaxpace.records.safe_io import open_regular

__all__ = ["Engine", "Loaded", "Reduction", "Scan", "connect"]

# The columns of the table `steps`, in the order of `records.reader.Records`' columns.
STEP_COLUMNS = (*INT_STEP_FIELDS, "engaged", "device")
_TABLE_SQL = (
    "CREATE OR REPLACE TABLE steps (site VARCHAR, "
    + ", ".join(f"{k} BIGINT" for k in INT_STEP_FIELDS)
    + ", engaged BOOLEAN, device BIGINT, execution BIGINT, file UBIGINT, kind TINYINT)"
)
# The columns a site's fetch leaves out when the run says what they hold
# (`Engine.site_columns`): these two when no row has a delay or is engaged (most runs), and
# `process` and `device` when each rank has one (process, device).
ZERO_UNLESS_USED = ("delay_ns", "engaged")
PER_RANK = ("process", "device")
# `kind` of a row while loading: a step kept, a header line, or why it is dropped.
STEP, HEADER, BAD, NULLS, HUGE, NEGATIVE = 0, 1, 2, 3, 4, 5
_INT64_MIN = "-9223372036854775808"


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _sql_list(items: Sequence[str]) -> str:
    return "[" + ", ".join(_sql_str(str(x)) for x in items) + "]"


@dataclasses.dataclass(frozen=True)
class Scan:
    """What reading a run's files found besides the step rows.

    Attributes:
      files: the files read.
      rows: step rows kept.
      drops: the step lines dropped, counted and located (`jsonl_checked.Drops`).
      skipped: notes on files skipped whole (a Parquet file without its footer).
    """

    files: tuple[str, ...]
    rows: int
    drops: Drops = dataclasses.field(default_factory=Drops)
    skipped: tuple[str, ...] = ()

    @property
    def bad(self) -> int:
        """Step lines dropped for a bad value (not JSON, a missing field, a value of the
        wrong kind: `Infinity`, `1.5`, `"3"`, ...)."""
        return self.drops.bad

    @property
    def bad_examples(self) -> tuple[str, ...]:
        return tuple(self.drops.bad_examples)

    @property
    def negative(self) -> int:
        return self.drops.negative

    @property
    def huge(self) -> int:
        return self.drops.huge

    @property
    def cut(self) -> tuple[str, ...]:
        """`file:line` of each last line cut short."""
        return tuple(self.drops.cut)

    def notes(self) -> list[str]:
        """`PARTIAL:` notes for what was dropped or skipped (none when nothing was)."""
        return [*self.skipped, *self.drops.notes()]


@dataclasses.dataclass(frozen=True)
class Loaded:
    """A run's files read into the table `steps` (`Engine.load`).

    Attributes:
      headers: `(header, where)` of each file that has one, in file order.
      sites: the distinct sites, sorted.
      scan: what was dropped or skipped, and the rows kept.
    """

    headers: tuple[tuple[dict[str, Any], str], ...]
    sites: tuple[str, ...]
    scan: Scan


@dataclasses.dataclass(frozen=True)
class Reduction:
    """The reduction's small result (NumPy columns).

    Attributes:
      steps: per (site, step): `site`, `step`, `ranks` (how many ranks it compares),
        `max_wait_ns`, `transfer_ns` (least time inside the collective less its delay,
        over the ranks present), `median_lateness_ns`.
      lateness: per (step, rank), lateness summed over sites: `step`, `rank`, `lateness_ns`.
      ranks: per (site, rank): `site`, `rank`, `steps` (steps it is present in),
        `mean_lateness_ns`, `mean_excess_ns` (lateness less the step's median),
        `latest` (steps it arrived last in).
    """

    steps: dict[str, np.ndarray]
    lateness: dict[str, np.ndarray]
    ranks: dict[str, np.ndarray]


# Per (site, step) over the ranks present; then each rank's lateness at each step.
REDUCE_STEPS_SQL = """
CREATE OR REPLACE TEMP TABLE per_step AS
SELECT site, step, count(*) AS ranks, max(wait_ns) AS max_wait_ns,
       min(greatest(wait_ns - delay_ns, 0)) AS transfer_ns,
       min(wait_ns) AS min_wait_ns
FROM steps GROUP BY site, step HAVING count(*) >= 2
"""
LATENESS_SQL = """
CREATE OR REPLACE TEMP TABLE lateness AS
SELECT s.site, s.step, s.rank, p.max_wait_ns - s.wait_ns AS lateness_ns,
       s.wait_ns = p.min_wait_ns AS latest
FROM steps s JOIN per_step p USING (site, step)
"""
MEDIANS_SQL = """
CREATE OR REPLACE TEMP TABLE medians AS
SELECT site, step, median(lateness_ns) AS median_lateness_ns FROM lateness GROUP BY site, step
"""
PER_RANK_SQL = """
SELECT l.site, l.rank, count(*) AS steps, avg(l.lateness_ns) AS mean_lateness_ns,
       avg(l.lateness_ns - m.median_lateness_ns) AS mean_excess_ns,
       count(*) FILTER (WHERE l.latest) AS latest
FROM lateness l JOIN medians m USING (site, step)
GROUP BY l.site, l.rank ORDER BY l.site, l.rank
"""
STEP_RANK_SQL = """
SELECT step, rank, sum(lateness_ns) AS lateness_ns FROM lateness
GROUP BY step, rank ORDER BY step, rank
"""
STEPS_OUT_SQL = """
SELECT p.site, p.step, p.ranks, p.max_wait_ns, p.transfer_ns, m.median_lateness_ns
FROM per_step p JOIN medians m USING (site, step) ORDER BY p.site, p.step
"""


class Engine:
    """A DuckDB connection with bounded threads, memory and a spill directory.

    Its database is in memory up to `memory_limit`; beyond that DuckDB spills the
    table's blocks to the temporary directory (removed on `close`), so a run larger
    than memory is read from disk a site at a time. The spill is capped at
    `max_temp_bytes` (default: half the directory's free space when it opens, where
    DuckDB's own default is 90%): a run that needs more fails with an error naming the
    directory, and never leaves the disk full (a 262M-row run's spill passed 45 GB).

    >>> with Engine() as e:
    ...     e.con.execute("SELECT 1").fetchone()
    (1,)
    """

    def __init__(
        self,
        *,
        threads: int | None = None,
        memory_limit: str = "1GB",
        temp_directory: str | os.PathLike | None = None,
        max_temp_bytes: int | None = None,
    ) -> None:
        import duckdb

        self._own_tmp = temp_directory is None
        self.temp_directory = (
            tempfile.mkdtemp(prefix="jaxpace-duckdb-")
            if temp_directory is None
            else os.fspath(temp_directory)
        )
        self._cap_why = (
            "" if max_temp_bytes is not None else " (half its free space when it opened)"
        )
        if max_temp_bytes is None:
            max_temp_bytes = shutil.disk_usage(self.temp_directory).free // 2
        self.con = duckdb.connect(
            ":memory:",
            config={
                "threads": int(threads or min(2, os.cpu_count() or 1)),
                "memory_limit": memory_limit,
                "temp_directory": self.temp_directory,
                "max_temp_directory_size": f"{max(int(max_temp_bytes), 1 << 20)}B",
                "preserve_insertion_order": True,  # (a file's rows stay in its order)
                # Never a download at run time (an offline cluster): extensions are
                # installed explicitly and loaded by name (docs/records.md).
                "autoinstall_known_extensions": False,
                "autoload_known_extensions": False,
            },
        )
        self.con.execute("SET enable_progress_bar = false")
        # Each file's footer parsed once, not once per query: a run read in place
        # (`in_place`) is asked one query per site over all its files.
        self.con.execute("SET parquet_metadata_cache = true")
        self._path_of: dict[int, str] = {}  # `hash(path)` (the table's `file`) -> path
        self._jsonl_dirs: list[Path] = []  # JSONL runs read as Parquet (`_jsonl_in_place`)
        self.largest_fetch = 0  # the most rows one `site_columns` call returned
        self.executions_numbered = 0  # `number_executions` made `exec_map` when > 0
        # `steps` is a view over the run's Parquet files, read in place (`_load_parquet`);
        # `_kept` the conditions a row of it must meet (a step, a rank within the run).
        self.in_place = False
        self._kept: list[str] = []
        # In place: the sites the row groups' statistics name (each row group one site's),
        # so the distinct sites need no scan; None when some row is dropped (`_kept`).
        self._sites_of_row_groups: set[str] | None = None
        self._summary: _Summary | None = None  # `summary`, asked once
        # In place: the columns of `ZERO_UNLESS_USED` the row groups' statistics show zero
        # (false) in every row; None: not known without a scan (`_site_fill` asks once).
        self._zero_in_stats: set[str] | None = None
        # A run read in place: what its files' footers say of every row (`_Footers`).
        self._footers: _Footers | None = None
        self._fill: _Fill | None = None  # what `site_columns` leaves out (`_site_fill`)
        # In place: each file's identity when it was opened (`_file_identity`), checked
        # after every query (`_arrays`): the run is read from its files, not from a copy.
        self._identity: dict[str, tuple[int, int, int] | None] = {}
        # In place: each site's rows read from its row groups by number, not queried
        # (`parquet_reader.RowGroupReader`); None: queried.
        self._direct: Any = None

    def _spill_hint(self) -> str:
        cap = self.con.execute("SELECT current_setting('max_temp_directory_size')").fetchone()
        return (
            f"Its spill directory {self.temp_directory} is capped at {cap[0]}{self._cap_why}: "
            "free space there, or point TMPDIR at a larger disk."
        )

    def close(self) -> None:
        self._direct = None
        self.con.close()
        for d in self._jsonl_dirs:
            shutil.rmtree(d, ignore_errors=True)
        if self._own_tmp:
            shutil.rmtree(self.temp_directory, ignore_errors=True)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ reading

    def load(self, path: str | os.PathLike, *, file_order: bool = False) -> Loaded:
        """Reads the records files of `path` (a run directory or one file, Parquet or
        JSONL) into the table `steps`; returns their headers, sites and what was dropped.

        A run of JSONL files alone is read file by file into Parquet files of the
        engine's temporary directory (`records.jsonl_arrow`), then in place as a native
        run, each file's rows grouped by site; `file_order` keeps each file's rows in
        its own order instead (a table, as a run of both formats is read).

        Raises:
          RecordsError: a file that is not records (no header, a Parquet file without a
            jaxpace header or with a column of the wrong type, not a regular file).
        """
        import duckdb

        try:
            return self._load(Path(path), file_order)
        except duckdb.Error as e:
            raise RecordsError(
                f"the records engine (DuckDB) could not read {path}: "
                f"{str(e).splitlines()[0][:300].rstrip('.')}. {self._spill_hint()}"
            ) from None

    def _load(self, p: Path, file_order: bool = False) -> Loaded:
        files = records_files(p) if p.is_dir() else [p]
        self._new_table()
        self._hash_paths([str(f) for f in files])
        from jaxpace.records.parquet_reader import is_parquet

        parquet = [f for f in files if is_parquet(f)]
        in_parquet = set(parquet)
        jsonl = [f for f in files if f not in in_parquet]
        headers: list[tuple[dict[str, Any], str]] = []
        drops = Drops()
        skipped: list[str] = []
        if parquet:
            self._load_parquet(parquet, headers, skipped, drops, alone=not jsonl)
        if jsonl and not parquet and not file_order:
            self._jsonl_in_place(jsonl, headers, skipped, drops)
        elif jsonl:
            self._load_jsonl(jsonl, headers, drops)
        if self._footers is not None and not self._kept:
            rows = self._footers.rows  # (every row kept: the footers' counts, no scan)
        else:
            rows = self.con.execute("SELECT count(*) FROM steps").fetchone()[0]
        sites = tuple(sorted(self._sites_of_row_groups or self._distinct_sites()))
        scan = Scan(tuple(map(str, files)), int(rows), drops, tuple(skipped))
        return Loaded(tuple(headers), sites, scan)

    def _load_parquet(
        self, files, headers, skipped: list[str], drops: Drops, alone: bool = False
    ) -> None:
        """The Parquet `files` into `steps`; read in place (`steps` a view over them, no
        copy and no sort) when they are the whole run (`alone`) and each row group holds
        one site's rows (`records.format.write_parquet`'s layout), so a query for one site
        reads that site's row groups alone. The rows are scanned for the ones to drop only
        when the files' statistics do not rule them out (`_every_row_a_step`)."""
        good, names, grouped, sites, layouts = [], set(), True, set(), set()
        zero, clean, ranks, rows = set(ZERO_UNLESS_USED), True, [], 0
        summaries: list[Any] = []
        footers: list[tuple] = []  # (meta, groups, bounds) of each file, for `RowGroupReader`
        for f in files:
            head = _parquet_header(f, skipped)
            if head is not None:
                headers.append((head.header, f"{f}:header"))
                good.append(str(f))
                names |= head.names
                grouped &= head.sites is not None
                sites |= head.sites or set()
                layouts.add(head.layout)
                zero &= head.zero
                clean &= head.clean
                ranks.append(head.ranks)
                rows += head.rows
                summaries.append(head.summary)
                footers.append((head.meta, head.groups, head.bounds))
        if not good:
            return
        import duckdb

        # Files of one layout (one writer) are read by position: `union_by_name` costs a
        # third of each site's query over 1024 files.
        select = _parquet_select_sql(good, names, by_name=len(layouts) > 1)
        try:
            if alone and grouped:
                self._identity = {f: _file_identity(f) for f in good}
                self.con.execute("DROP TABLE steps")
                self.con.execute(f"CREATE VIEW steps_raw AS {select}")
                self.in_place = True
                self._kept = []  # (`_drop_parquet_rows` adds `kind = STEP` if any is not)
                self._sites_of_row_groups = sites
                self._zero_in_stats = zero
                self._footers = _Footers(
                    rows,
                    (min(r[0] for r in ranks), max(r[1] for r in ranks))
                    if None not in ranks
                    else None,
                    "execution" in names,
                    None if None in summaries else tuple(summaries),
                )
                self._define_view()
                self._direct = _row_group_reader(good, footers, names, len(layouts))
            else:
                self.con.execute(f"INSERT INTO steps {select}")
        except duckdb.OutOfMemoryException as e:
            raise RecordsError(
                f"the records engine (DuckDB) ran out of room reading the Parquet records: "
                f"{str(e).splitlines()[0][:300].rstrip('.')}. {self._spill_hint()}"
            ) from None
        except duckdb.Error as e:
            raise RecordsError(
                f"cannot read the Parquet records ({str(e).splitlines()[0][:200]}); expected "
                "the columns of docs/records.md, integers within int64."
            ) from None
        if not clean:  # (else every row is a step: no scan to find the others)
            self._drop_parquet_rows(drops)

    def _distinct_sites(self) -> list[str]:
        return [r[0] for r in self.con.execute("SELECT DISTINCT site FROM steps").fetchall()]

    def _define_view(self) -> None:
        """(Re)defines the view `steps`: the rows of `steps_raw` that meet `_kept`."""
        where = " AND ".join(f"({c})" for c in self._kept)
        if where:  # (a row dropped: its site may be gone)
            self._sites_of_row_groups = None
        self._summary = self._fill = None
        self.con.execute(
            "CREATE OR REPLACE VIEW steps AS SELECT * FROM steps_raw"
            + (f" WHERE {where}" if where else "")
        )

    def _new_table(self) -> None:
        """An empty table `steps` (in place of the view of a run read in place before)."""
        if self.in_place:
            self.con.execute("DROP VIEW steps")
            self.con.execute("DROP VIEW steps_raw")
            self.in_place, self._kept, self._identity = False, [], {}
        self._sites_of_row_groups = self._summary = self._fill = self._zero_in_stats = None
        self._footers = self._direct = None
        for d in self._jsonl_dirs:  # (a JSONL run read before: its view is gone)
            shutil.rmtree(d, ignore_errors=True)
        self._jsonl_dirs = []
        self.con.execute(_TABLE_SQL)

    def _drop_parquet_rows(self, drops: Drops) -> None:
        """Refuses null values; drops, counts and locates the rows out of range."""
        found = self.con.execute(
            f"SELECT kind, count(*), min(file) FROM {'steps_raw' if self.in_place else 'steps'} "
            f"WHERE kind > {HEADER} GROUP BY kind"
        ).fetchall()
        for kind, n, file_h in found:
            file = self._path_of[int(file_h)]
            if kind == NULLS:
                raise RecordsError(
                    f"{file}: Parquet records with null values in a step column; expected "
                    "every row to have every field of docs/records.md."
                )
            where = f"{file}: row {self._first_row(file, kind)}"
            if kind == HUGE:
                drops.huge += int(n)
                drops.huge_first = drops.huge_first or where
            elif kind == NEGATIVE:
                drops.negative += int(n)
                drops.negative_first = drops.negative_first or where
        if found and self.in_place:  # (the view keeps the steps alone)
            self._kept.append(f"kind = {STEP}")
            self._define_view()
        elif found:
            self.con.execute(f"DELETE FROM steps WHERE kind <> {STEP}")

    def _first_row(self, file: str, kind: int) -> int:
        """The first row of a Parquet `file` of the dropped `kind` (huge or negative)."""
        cond = (
            " OR ".join(f"CAST({k} AS BIGINT) = {_INT64_MIN}" for k in INT_STEP_FIELDS)
            if kind == HUGE
            else "wait_ns < 0 OR delay_ns < 0"
        )
        row = self.con.execute(
            f"SELECT min(file_row_number) FROM read_parquet(?, file_row_number = true) "
            f"WHERE {cond}",
            [file],
        ).fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def _load_jsonl(self, files: list[Path], headers, drops: Drops) -> None:
        """JSONL files into `steps`: `read_json` over every file at once (`_jsonl_fast`),
        then each file it could not read cleanly through `jsonl_checked`."""
        careful: list[Path] = []
        fast: list[Path] = []
        for f in files:
            header, where, _ = first_line(f)  # (a special file is refused here)
            if header is None:
                drops.empty.append(str(f))
                continue
            headers.append((header, where))
            (fast if ends_with_newline(f) else careful).append(f)
        careful += self._jsonl_fast(fast)
        for f in sorted(careful, key=files.index):
            checked = read_checked(f)
            drops.merge(checked.drops)
            self._insert_columns(checked.columns, str(f))

    def _jsonl_in_place(self, files: list[Path], headers, skipped: list[str], drops) -> None:
        """JSONL files alone: each to a Parquet file of the temporary directory, one site
        to a row group (`jsonl_arrow.to_parquet`), then read in place from there; the
        rows' `file` names the JSONL file. When those files cannot be written (a full
        disk, a file-size limit), the run is read into the table instead."""
        import pyarrow as pa

        from jaxpace.records.jsonl_arrow import to_parquet

        try:
            out = Path(tempfile.mkdtemp(prefix="jsonl-", dir=self.temp_directory))
            self._jsonl_dirs.append(out)
            threads = self.con.execute("SELECT current_setting('threads')").fetchone()[0]
            done = to_parquet(files, out, int(threads))
        except (OSError, pa.ArrowException):
            self._new_table()  # (removes what was written)
            return self._load_jsonl(files, headers, drops)
        temps: dict[str, str] = {}  # the Parquet file -> its JSONL file
        for f, (dst, header, where, checked) in zip(files, done, strict=True):
            if dst is None:
                drops.empty.append(str(f))
                continue
            headers.append((header, where))
            if checked is not None:
                drops.merge(checked)
            temps[str(dst)] = str(f)
        if not temps:
            return
        self._hash_paths(list(temps))
        self._path_of = {h: temps.get(t, t) for h, t in self._path_of.items()}
        self._load_parquet([Path(t) for t in temps], [], skipped, drops, alone=True)

    def _jsonl_fast(self, files: list[Path]) -> list[Path]:
        """Inserts the files `read_json` reads cleanly; returns the others."""
        import duckdb

        rest = list(files)
        refused: list[Path] = []
        tries = 0
        while rest:
            try:
                self.con.execute(_jsonl_insert_sql([str(f) for f in rest]))
                break
            except duckdb.Error as e:
                self._delete_files(rest)
                bad = _file_in_error(str(e), rest)
                tries += 1
                if bad is None or tries > 8:  # find them one file at a time
                    bad = [f for f in rest if not self._reads_cleanly(f)]
                    refused += bad
                    rest = [f for f in rest if f not in set(bad)]
                    tries = -(1 << 30)
                else:
                    refused.append(bad)
                    rest.remove(bad)
        # (These files' rows alone: a run's Parquet rows, already in the table, have no
        # header row and were all deleted here when both formats were read together.)
        paths = {str(f) for f in files}
        own = [h for h, f in self._path_of.items() if f in paths]
        flagged = {
            self._path_of[int(r[0])]
            for r in self.con.execute(
                "SELECT file FROM steps WHERE file IN (SELECT unnest($1::UBIGINT[])) "
                f"GROUP BY file HAVING count(*) FILTER (WHERE kind = {HEADER}) <> 1 "
                f"OR count(*) FILTER (WHERE kind <> {STEP} AND kind <> {HEADER}) > 0",
                [own],
            ).fetchall()
        }
        if flagged:
            self._delete_files(sorted(flagged))
        self.con.execute(f"DELETE FROM steps WHERE kind = {HEADER}")
        return refused + [f for f in files if str(f) in flagged]

    def _reads_cleanly(self, f: Path) -> bool:
        import duckdb

        try:
            self.con.execute(f"SELECT count(*) FROM ({_jsonl_select_sql([str(f)])})").fetchone()
            return True
        except duckdb.Error:
            return False

    def _hash_paths(self, paths: list[str]) -> None:
        """Remembers `hash(path)` of each path (the table's `file`: 8 bytes, not a string)."""
        for f, h in self.con.execute(
            "SELECT f, hash(f) FROM (SELECT unnest($1::VARCHAR[]) AS f)", [paths]
        ).fetchall():
            self._path_of[int(h)] = f

    def _hash_of(self, path: str) -> int:
        return next(h for h, f in self._path_of.items() if f == path)

    def _delete_files(self, files) -> None:
        paths = {str(f) for f in files}
        hashes = [h for h, f in self._path_of.items() if f in paths]
        self.con.execute("DELETE FROM steps WHERE file IN (SELECT unnest($1::UBIGINT[]))", [hashes])

    def _insert_columns(self, cols: dict[str, np.ndarray], file: str) -> None:
        import pyarrow as pa

        from jaxpace.records.jsonl_arrow import step_table

        n = int(cols["step"].shape[0])
        if not n:
            return
        table = (
            step_table(cols)
            .append_column("file", pa.array(np.full(n, self._hash_of(file), np.uint64)))
            .append_column("kind", pa.array(np.zeros(n, np.int8)))
        )
        self.con.register("checked_rows", table)
        try:
            self.con.execute("INSERT INTO steps SELECT * FROM checked_rows")
        finally:
            self.con.unregister("checked_rows")

    # ------------------------------------------------------------------ one site at a time

    def cluster_by_site(self) -> None:
        """Rewrites `steps` sorted by site, so each site's rows sit together and `WHERE
        site = ?` reads only theirs (DuckDB skips the other row groups by their min/max):
        a run larger than the memory limit is spilled, and scanning all of it for every
        site cost 10x the sort (33M rows: 5 s a site against 0.5 s; the sort 18 s). Rows
        within a site lose their file order (the per-site analysis does not depend on it).
        A run read in place (`in_place`) is already one site to a row group: nothing to do."""
        import duckdb

        if self.in_place:
            return

        try:
            self.con.execute("CREATE TABLE steps_by_site AS SELECT * FROM steps ORDER BY site")
            self.con.execute("DROP TABLE steps")
            self.con.execute("ALTER TABLE steps_by_site RENAME TO steps")
        except duckdb.Error as e:
            raise RecordsError(
                f"the records engine (DuckDB) could not sort the run by site: "
                f"{str(e).splitlines()[0][:300].rstrip('.')}. {self._spill_hint()}"
            ) from None

    def site_columns(self, site: str, on: Any = None) -> dict[str, np.ndarray]:
        """The rows of one site as NumPy columns (`STEP_COLUMNS`, and `execution` numbered
        0, 1, ... once `number_executions` has made the map), asked on the connection `on`
        (a `fetch_cursor`, in another thread) or the engine's own.

        A column the run says enough about is not fetched but filled in, the same values
        and dtype (`_Fill`): `delay_ns` and `engaged` when no row of the run has a delay or
        is engaged, `process` and `device` from `rank_keys` when each rank has one (process,
        device). A site's query over 1024 Parquet files costs per column fetched."""
        # (Another thread asks on its own connection alone: it never decides the fill,
        # and fetches every column if rows were dropped since `fetch_cursor` decided it.)
        fill = self._site_fill() if on is None else self._fill or _Fill(frozenset())
        asked = [k for k in STEP_COLUMNS if k not in fill.left_out]
        if self._direct is not None and not self._kept and not self.executions_numbered:
            got = self._read_row_groups(site, asked)
            if isinstance(got, LaidOut):  # (read ahead: `finish` lays it out where taken)
                got.fill = fill
                return got if on is not None else self.finish(got)
        elif self.executions_numbered:
            got = self._arrays(
                f"SELECT {', '.join('s.' + k for k in asked)}, m.ex AS execution "
                "FROM steps s JOIN exec_map m USING (process, execution) WHERE s.site = $1",
                [site],
                on,
            )
        else:
            got = self._arrays(f"SELECT {', '.join(asked)} FROM steps WHERE site = $1", [site], on)
        return self._filled(fill, got)

    def _filled(self, fill: _Fill, got: dict[str, np.ndarray], cells=None) -> dict[str, np.ndarray]:
        cols = fill.filled(got, cells)
        self.largest_fetch = max(self.largest_fetch, int(cols["step"].shape[0]))
        return cols

    def finish(self, got: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A site's columns fetched in another thread (`site_columns(site, on=...)`), every
        one written: a `LaidOut` site's `step` and `rank`, then the columns the fetch left
        out (in the taking thread: the site read ahead holds only what the files gave)."""
        if isinstance(got, LaidOut):
            return self._filled(got.fill, got.lay_out(), got.cells)
        return got

    def _read_row_groups(self, site: str, asked: list[str]):
        """`site_columns`' rows of a run read in place, from the row groups directly
        (`parquet_reader.RowGroupReader`: the query's rows, sorted by (step, rank) where
        they fill the site's grid)."""
        import pyarrow as pa

        try:
            got = self._direct.read(site, asked)
        except (pa.ArrowException, OSError) as e:
            self.check_unchanged()  # (a file gone or replaced: say which)
            raise RecordsError(
                f"cannot read the rows of site `{site}` from the run's Parquet files: "
                f"{str(e).splitlines()[0][:200]}"
            ) from None
        self.check_unchanged()
        return got

    def help_fetch(self) -> None:
        """Reads, in the calling thread, part of the site another thread is fetching
        (`site_columns(site, on=...)`) when the run is read in place from its row groups
        (`parquet_reader.RowGroupReader.help`); nothing otherwise (a query runs in DuckDB's
        own threads)."""
        if self._direct is not None:
            self._direct.help()

    def fetch_cursor(self) -> Any:
        """A second connection to the engine's database, for `site_columns(site, on=...)` in
        another thread while this one works (DuckDB runs a query without the GIL). What
        the fetch leaves out is decided here first, on the engine's own connection."""
        self._site_fill()
        cur = self.con.cursor()
        cur.execute("SET parquet_metadata_cache = true")  # (a per-connection setting)
        return cur

    def _site_fill(self) -> _Fill:
        """What `site_columns` leaves out and fills in (asked once, until rows are dropped):
        the zero columns from the row groups' statistics of a run read in place (no scan),
        else from one query; the per-rank columns from `rank_keys`."""
        if self._fill is None:
            zero = self._zero_in_stats
            if zero is None:
                used = self.con.execute(
                    "SELECT coalesce(bool_or(delay_ns <> 0), false), "
                    "coalesce(bool_or(engaged), false) FROM steps"
                ).fetchone()
                zero = {k for k, u in zip(ZERO_UNLESS_USED, used, strict=True) if not u}
            self._fill = _Fill.of(self.rank_keys(), zero)
        return self._fill

    def check_unchanged(self) -> None:
        """Raises `RecordsError` when a file of a run read in place was replaced or removed
        since it was opened (a live job re-exporting, watch dropping an old window): its
        sites read before and after would come from different files."""
        for f, was in self._identity.items():
            if _file_identity(f) != was:
                raise RecordsError(
                    f"`{f}` changed or was removed while the report read the run in place (a "
                    "job still writing there: the runtime's export, watch's windows). Run "
                    "the report again, or on a copy of the folder."
                )

    def number_executions(self) -> tuple[int, str | None]:
        """Numbers the rows' raw execution ids (`records.executions`) into the table
        `exec_map` (process, raw id -> execution) from what needs every row, asked as SQL
        (how many rows carry an id; whether each rank's ids run in blocks; each process's
        ids by their first arrival); returns (the number of executions, 0 when the rows
        give none usable, and a note or None)."""
        from jaxpace.records.executions import REUSED_NOTE, number_executions, partial_note

        if self._footers is not None and not self._footers.execution:  # (no scan: no column)
            return 0, None
        n, known = self.con.execute("SELECT count(*), count(execution) FROM steps").fetchone()
        if not known:
            return 0, None
        if known < n:
            return 0, partial_note(n - known, n)
        blocks = self.con.execute(
            "SELECT count(*) FROM (SELECT execution, lag(execution) OVER (PARTITION BY "
            "process, rank ORDER BY arrive_ns) AS prev FROM steps) "
            "WHERE prev IS NULL OR prev <> execution"
        ).fetchone()[0]
        distinct = self.con.execute(
            "SELECT count(*) FROM (SELECT DISTINCT process, rank, execution FROM steps)"
        ).fetchone()[0]
        if blocks != distinct:
            return 0, REUSED_NOTE
        got = self._arrays(
            "SELECT process, execution, min(arrive_ns) AS first FROM steps GROUP BY ALL"
        )
        ex, note = number_executions(
            got["execution"], got["process"], np.zeros_like(got["process"]), got["first"]
        )
        if ex is None:
            return 0, note
        import pyarrow as pa

        table = pa.table(
            {
                "process": pa.array(got["process"], pa.int64()),
                "execution": pa.array(got["execution"], pa.int64()),
                "ex": pa.array(ex, pa.int64()),
            }
        )
        self.con.register("exec_map_rows", table)
        try:
            self.con.execute("CREATE OR REPLACE TABLE exec_map AS SELECT * FROM exec_map_rows")
        finally:
            self.con.unregister("exec_map_rows")
        self.executions_numbered = int(ex.max()) + 1 if ex.size else 0
        return self.executions_numbered, note

    def all_columns(self, files: Sequence[str]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Every row (`STEP_COLUMNS`, `site` as strings and the raw `execution`,
        `NO_EXECUTION` where null), in the order of `files` and each file's own order;
        and the order applied."""
        from jaxpace.records.format import NO_EXECUTION

        cols = self._arrays(
            f"SELECT site, {', '.join(STEP_COLUMNS)}, "
            f"coalesce(execution, {NO_EXECUTION}) AS execution, file FROM steps"
        )
        rank = {h: files.index(f) if f in files else len(files) for h, f in self._path_of.items()}
        fidx = np.array([rank.get(int(h), len(files)) for h in cols.pop("file").tolist()], np.int64)
        order = np.argsort(fidx, kind="stable")
        return {k: v[order] for k, v in cols.items()}, order

    def rank_keys(self) -> np.ndarray:
        """The distinct (rank, process, device) triples, (3, K) int64, sorted (`summary`)."""
        return self.summary().rank_keys

    def step_ranks(self) -> dict[str, tuple[np.ndarray, np.ndarray, int]]:
        """Per site: its distinct steps (sorted), the distinct ranks at each, its distinct
        ranks in all (`summary`)."""
        return self.summary().step_ranks

    def summary(self) -> _Summary:
        """What the report asks of every row before it reads the sites (`_Summary`), in
        one scan (asked once, until rows are dropped): one GROUPING SETS query over
        (site, step), (site, rank, process, device) and (step, process), where three
        queries took three scans (2.7 s against 1.75 s over 33M rows in 1024 files)."""
        if self._summary is None and self._footers is not None and not self._kept:
            if self._footers.summaries is not None:  # (every file's own: no scan)
                from jaxpace.records.file_summary import Merged, merge

                got = self._footers.summaries
                if not isinstance(got, Merged):  # (merged once; the files' own let go)
                    got = merge(got)
                    self._footers = self._footers._replace(summaries=got)
                self._summary = _Summary(*got)
        if self._summary is None:
            # (Rows, not distinct ranks, at each step: a duplicate record, which the
            # report's per-site analysis refuses, counts twice here; count(DISTINCT) is
            # 10x slower.)
            got = self._arrays(
                "SELECT grouping(site, step, rank, process, device) AS g, site, step, rank, "
                "process, device, count(*) AS n, min(arrive_ns) AS first FROM steps "
                "GROUP BY GROUPING SETS ((site, step), (site, rank, process, device), "
                "(step, process))"
            )
            self._summary = _Summary.of(got)
        return self._summary

    def first_arrivals(self, kept: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """`(keys, first)`: over the `kept` steps of each site, the least `arrive_ns` of each
        (step, process), keyed `step * 2**32 + process` (sorted)."""
        import pyarrow as pa

        first = "SELECT step * 4294967296 + process AS key, min(arrive_ns) AS first FROM steps "
        where = _kept_ranges(kept, self._sites_of_rows())
        if where is not None and where.one is not None:
            # (One range of steps for every site with rows: the summary's firsts of each
            # (step, process) over every row, in that range; no scan.)
            return self.summary().first_in(*where.one)
        if where is not None:  # (each site's kept steps a range: a filter, not a join)
            got = self._arrays(first + where.where + " GROUP BY key ORDER BY key", where.params)
            return got["key"].astype(np.int64), got["first"].astype(np.int64)
        sites = [s for s, st in kept.items() for _ in range(len(st))]
        steps = np.concatenate([np.asarray(st, np.int64) for st in kept.values()] or [[]])
        self.con.register(
            "kept_steps",
            pa.table({"site": pa.array(sites, pa.string()), "step": pa.array(steps, pa.int64())}),
        )
        try:
            got = self._arrays(
                "SELECT s.step * 4294967296 + s.process AS key, min(s.arrive_ns) AS first "
                "FROM steps s JOIN kept_steps k ON s.site = k.site AND s.step = k.step "
                "GROUP BY key ORDER BY key"
            )
        finally:
            self.con.unregister("kept_steps")
        return got["key"].astype(np.int64), got["first"].astype(np.int64)

    def _sites_of_rows(self) -> set[str]:
        """The sites that have rows (from the row groups' statistics of a run read in place,
        else the table)."""
        if self._sites_of_row_groups is not None:
            return set(self._sites_of_row_groups)
        return set(self._distinct_sites())

    def processes(self) -> np.ndarray:
        """The distinct processes, sorted (from `rank_keys`: one scan for both)."""
        return np.unique(self.rank_keys()[1])

    def drop_ranks_outside(self, bound: int) -> tuple[int, tuple[int, int, int] | None]:
        """Deletes the rows whose rank is outside [0, bound); returns how many and one
        (process, step, rank) of them (the first file's first such row)."""
        cond = f"rank < 0 OR rank >= {int(bound)}"
        got = self._footers.ranks if self._footers is not None else None
        if got is not None and 0 <= got[0] and got[1] < int(bound):
            return 0, None  # (the files' statistics rule every row out: no scan)
        n = self.con.execute(f"SELECT count(*) FROM steps WHERE {cond}").fetchone()[0]
        if not n:
            return 0, None
        some = self.con.execute(
            f"SELECT file, process, step, rank FROM steps WHERE {cond} LIMIT 10000"
        ).fetchall()
        ex = min(some, key=lambda r: (self._path_of.get(int(r[0]), ""), r[2], r[3]))
        self._summary = self._fill = None
        if self.in_place:
            self._kept.append(f"NOT ({cond})")
            self._define_view()
        else:
            self.con.execute(f"DELETE FROM steps WHERE {cond}")
        return int(n), (int(ex[1]), int(ex[2]), int(ex[3]))

    # ------------------------------------------------------------------ the reduction

    def open_steps(self, source: str | os.PathLike | Any) -> Scan:
        """Reads `source` into `steps`: the records files of a path (a run directory or
        one file, Parquet or JSONL), or `Records` in memory (what the NCCL Inspector and
        `jax.profiler` readers give, `records.sources.load`); returns what was found."""
        if not isinstance(source, str | os.PathLike):
            return self.open_records(source)
        p = Path(source)
        if p.is_dir() and not records_files(p):
            raise RecordsError(
                f"no records files (`*.parquet`, `*.jsonl`) in {p}; read other sources "
                "with `jaxpace.records.sources.load` and pass their `Records`."
            )
        return self.load(p).scan

    def open_records(self, records: Any) -> Scan:
        """Creates the table `steps` from in-memory `Records` (any source's reader)."""
        import pyarrow as pa

        c = records.columns
        sites = np.asarray(records.sites, dtype=object)
        n = len(records)
        table = pa.table(
            {
                "site": pa.array(sites[c["site"]].tolist() if n else [], pa.string()),
                **{k: pa.array(c[k], pa.int64()) for k in INT_STEP_FIELDS},
                "engaged": pa.array(c["engaged"], pa.bool_()),
                "device": pa.array(c["device"] if "device" in c else np.full(n, -1), pa.int64()),
                "execution": _execution_array(c, n),
                "file": pa.array(np.zeros(n, np.uint64), pa.uint64()),
                "kind": pa.array(np.zeros(n, np.int8), pa.int8()),
            }
        )
        self._new_table()
        self.con.register("records_table", table)
        self.con.execute("INSERT INTO steps SELECT * FROM records_table")
        self.con.unregister("records_table")
        return Scan(files=tuple(records.sources), rows=n)

    def reduce(self) -> Reduction:
        """The reduction over `steps`: per (site, step), per (step, rank), per (site,
        rank); out of core (DuckDB spills to the temporary directory)."""
        for sql in (REDUCE_STEPS_SQL, LATENESS_SQL, MEDIANS_SQL):
            self.con.execute(sql)
        return Reduction(
            steps=self._arrays(STEPS_OUT_SQL),
            lateness=self._arrays(STEP_RANK_SQL),
            ranks=self._arrays(PER_RANK_SQL),
        )

    def _arrays(
        self, sql: str, params: list | None = None, on: Any = None
    ) -> dict[str, np.ndarray]:
        import duckdb

        try:
            cols = (self.con if on is None else on).execute(sql, params or []).fetchnumpy()
        except duckdb.IOException:
            self.check_unchanged()  # (a file gone: say which)
            raise
        self.check_unchanged()
        return {k: np.asarray(v) for k, v in cols.items()}


@dataclasses.dataclass(frozen=True)
class _Summary:
    """What `Engine.summary` found in one scan of every row.

    Attributes:
      rank_keys: the distinct (rank, process, device) triples, (3, K) int64, sorted.
      step_ranks: per site, its distinct steps (sorted), its rows at each, its ranks.
      keys, first: each (step, process)'s least `arrive_ns` over every site, keyed
        `step * 2**32 + process` (sorted).
    """

    rank_keys: np.ndarray
    step_ranks: dict[str, tuple[np.ndarray, np.ndarray, int]]
    keys: np.ndarray
    first: np.ndarray

    @classmethod
    def of(cls, got: dict[str, np.ndarray]) -> _Summary:
        """From the GROUPING SETS rows `got` (`g`: `grouping(site, step, rank, process,
        device)`, a bit set for each column left out of the row's set)."""
        g = got["g"].astype(np.int64)
        i64 = lambda k, sel: got[k][sel].astype(np.int64)  # noqa: E731
        by_rank = g == 0b01000  # (site, rank, process, device)
        site_r = got["site"][by_rank].astype(str)
        keys = np.stack([i64("rank", by_rank), i64("process", by_rank), i64("device", by_rank)])
        rank_keys = unique_rows(*keys)
        names_r, code_r = np.unique(site_r, return_inverse=True)
        pairs = unique_rows(code_r.reshape(-1), keys[0])
        n_ranks = dict(zip(names_r.tolist(), np.bincount(pairs[0], minlength=names_r.size).tolist(),
                           strict=True))  # fmt: skip
        by_step = g == 0b00111  # (site, step)
        site_s, step_s, n_s = (
            got["site"][by_step].astype(str),
            i64("step", by_step),
            i64("n", by_step),
        )
        order = np.lexsort((step_s, site_s))
        site_s, step_s, n_s = site_s[order], step_s[order], n_s[order]
        step_ranks = {}
        if site_s.size:
            cut = np.flatnonzero(site_s[1:] != site_s[:-1]) + 1
            for s, st, n in zip(np.split(site_s, cut), np.split(step_s, cut), np.split(n_s, cut),
                                strict=True):  # fmt: skip
                step_ranks[str(s[0])] = (st, n, int(n_ranks.get(str(s[0]), 0)))
        by_proc = g == 0b10101  # (step, process)
        key = i64("step", by_proc) * 4294967296 + i64("process", by_proc)
        order = np.argsort(key, kind="stable")
        return cls(rank_keys, step_ranks, key[order], i64("first", by_proc)[order])

    def first_in(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """`(keys, first)` of the steps lo..hi (`Engine.first_arrivals` of one range)."""
        step = self.keys >> 32
        sel = (step >= lo) & (step <= hi)
        return self.keys[sel], self.first[sel]


@dataclasses.dataclass(frozen=True)
class _Fill:
    """The columns a site's fetch leaves out (`Engine.site_columns`), and their values.

    Attributes:
      zero: the columns zero (false) in every row of the run (of `ZERO_UNLESS_USED`).
      lo: the least rank, when each rank has one (process, device) (else None: fetched).
      process, device: each rank's process and device (-1: none), indexed by `rank - lo`
        (a table over the span of the ranks) or, ranks far apart, by `ranks`' order.
      ranks: the sorted distinct ranks when they are far apart (looked up with
        `searchsorted`), else None.
    """

    zero: frozenset[str]
    lo: int | None = None
    process: np.ndarray | None = None
    device: np.ndarray | None = None
    ranks: np.ndarray | None = None

    @classmethod
    def of(cls, keys: np.ndarray, zero: set[str]) -> _Fill:
        """From the (rank, process, device) triples `keys` ((3, K), `Engine.rank_keys`)."""
        ranks, first = np.unique(keys[0], return_index=True)
        if not ranks.size or ranks.size != keys.shape[1]:  # (a rank of two (process, device))
            return cls(frozenset(zero))
        lo, span = int(ranks[0]), int(ranks[-1]) - int(ranks[0]) + 1
        proc, dev = keys[1][first], keys[2][first]
        if span > 4 * ranks.size + 4096:  # (ranks far apart: looked up, not tabled)
            return cls(frozenset(zero), lo, proc, dev, ranks)
        table = np.zeros((2, span), np.int64)
        table[:, ranks - lo] = proc, dev
        return cls(frozenset(zero), lo, table[0], table[1])

    @property
    def left_out(self) -> frozenset[str]:
        return self.zero | (frozenset(PER_RANK) if self.lo is not None else frozenset())

    def filled(self, got: dict[str, np.ndarray], cells=None) -> dict[str, np.ndarray]:
        """The fetched columns `got` with the left-out ones filled in, in `STEP_COLUMNS`
        order (then `execution`, when fetched); `cells`: the site's grid when `got` is every
        cell of it in order (a `parquet_reader.LaidOut`'s), so each step's row is its ranks'."""
        rank = got["rank"]
        if self.lo is not None and cells is not None:
            ranks = np.arange(cells.rank0, cells.rank0 + cells.ranks)
            at = np.searchsorted(self.ranks, ranks) if self.ranks is not None else ranks - self.lo
            for k, x in (("process", self.process), ("device", self.device)):
                got[k] = pool.empty(rank.size, np.int64)
                got[k].reshape(cells.steps, -1)[:] = x[at]
        elif self.lo is not None:
            at = np.searchsorted(self.ranks, rank) if self.ranks is not None else rank - self.lo
            got["process"], got["device"] = self.process[at], self.device[at]
        for k in self.zero:
            got[k] = np.zeros(rank.size, bool if k == "engaged" else np.int64)
        return {k: got[k] for k in (*STEP_COLUMNS, *(["execution"] if "execution" in got else []))}


# The JSONL step fields typed as JSON (their text as written), checked below.
_JSON_COLUMNS = {
    "type": "VARCHAR",
    "site": "JSON",
    **{k: "JSON" for k in INT_STEP_FIELDS},
    "device": "JSON",
    "execution": "JSON",
    "engaged": "JSON",
}


class _KeptRanges(NamedTuple):
    """A WHERE clause keeping the rows of some kept steps (`_kept_ranges`)."""

    where: str
    params: list
    one: tuple[int, int] | None = None  # the one (first, last) step every site with rows keeps


def _kept_ranges(kept: dict[str, np.ndarray], sites: set[str]) -> _KeptRanges | None:
    """The WHERE clause and its parameters keeping the rows of `kept` (site -> its kept
    steps) when each site's kept steps are a range of consecutive steps: one range for
    every site with rows (`one`), or a range per site; None otherwise (a join then)."""
    ranges = {}
    for site, st in kept.items():
        st = np.asarray(st, np.int64)
        if st.size and int(st[-1]) - int(st[0]) == st.size - 1 and (np.diff(st) == 1).all():
            ranges[site] = (int(st[0]), int(st[-1]))
        elif st.size:
            return None
    if not ranges:
        return _KeptRanges("WHERE false", [])
    if set(ranges) == sites and len(set(ranges.values())) == 1:
        lo, hi = next(iter(ranges.values()))
        return _KeptRanges("WHERE step BETWEEN $1 AND $2", [lo, hi], (lo, hi))
    if len(ranges) > 64:
        return None
    terms, params = [], []
    for site, (lo, hi) in ranges.items():
        n = len(params)
        terms.append(f"(site = ${n + 1} AND step BETWEEN ${n + 2} AND ${n + 3})")
        params += [site, lo, hi]
    return _KeptRanges("WHERE " + " OR ".join(terms), params)


def _file_identity(path: str) -> tuple[int, int, int] | None:
    """(inode, size, mtime in ns) of `path`, None when it is gone: an atomic replace
    (the writers' temporary file and rename) gives a new inode."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _jsonl_select_sql(files: list[str]) -> str:
    """The rows of `read_json` over `files`, each with its `kind`: a step whose every value
    is as docs/records.md says (an integer field an integer literal within (-2^63, 2^63):
    its JSON text only digits and "-"; `1.5`, `1e3`, `"3"` and `true` are not, though
    DuckDB would cast them), the header, or bad."""
    ints = [f"TRY_CAST({k} AS BIGINT) AS {k}" for k in INT_STEP_FIELDS]
    text = "concat_ws(',', " + ", ".join(f"{k}::VARCHAR" for k in INT_STEP_FIELDS) + ")"
    site = (
        "CASE WHEN contains(site::VARCHAR, '\\') THEN json_extract_string(site, '$') "
        "ELSE substr(site::VARCHAR, 2, length(site::VARCHAR) - 2) END"
    )
    inner = (
        f"SELECT type, {site} AS name, starts_with(site::VARCHAR, '\"') AS site_ok, "
        f"{', '.join(ints)}, translate({text}, '-0123456789,', '') = '' AS ints_ok, "
        "engaged::VARCHAR AS eng, device::VARCHAR AS dev, TRY_CAST(device AS BIGINT) AS dev_i, "
        "execution::VARCHAR AS exs, TRY_CAST(execution AS BIGINT) AS ex_i, filename "
        f"FROM read_json({_sql_list(files)}, format = 'newline_delimited', columns = "
        + "{"
        + ", ".join(f"'{k}': '{v}'" for k, v in _JSON_COLUMNS.items())
        + "}"
        + f", filename = true, maximum_object_size = {jsonl_checked.MAX_LINE_BYTES - 1})"
    )
    good = " AND ".join(
        [
            "type = 'step'",
            "site_ok",
            "ints_ok",
            *(f"{k} > {_INT64_MIN}" for k in INT_STEP_FIELDS),  # (NULL: missing or huge)
            "wait_ns >= 0 AND delay_ns >= 0",
            "eng IN ('true', 'false')",
            "(dev IS NULL OR dev = 'null' OR (translate(dev, '-0123456789', '') = '' "
            f"AND dev_i > {_INT64_MIN}))",
            "(exs IS NULL OR exs = 'null' OR (translate(exs, '-0123456789', '') = '' "
            f"AND ex_i > {_INT64_MIN}))",
        ]
    )
    return (
        f"SELECT name, {', '.join(INT_STEP_FIELDS)}, eng = 'true', coalesce(dev_i, -1), "
        f"ex_i, hash(filename), CASE WHEN type = 'header' THEN {HEADER} "
        f"WHEN coalesce({good}, false) THEN {STEP} ELSE {BAD} END FROM ({inner})"
    )


def _jsonl_insert_sql(files: list[str]) -> str:
    return "INSERT INTO steps " + _jsonl_select_sql(files)


def _file_in_error(message: str, files: list[Path]) -> Path | None:
    """The file a DuckDB JSON error names, if it is one of `files`."""
    m = re.search(r'in file "([^"]+)"', message)
    if not m:
        return None
    for f in files:
        if str(f) == m.group(1):
            return f
    return None


def _execution_array(cols: Any, n: int) -> Any:
    """The `execution` column for the table: null where a row has none."""
    import pyarrow as pa

    from jaxpace.records.format import NO_EXECUTION

    if "execution" not in cols:
        return pa.nulls(n, pa.int64())
    ex = np.asarray(cols["execution"], np.int64)
    return pa.array(ex, pa.int64(), mask=ex == NO_EXECUTION)


def _parquet_select_sql(files: list[str], names: set[str], by_name: bool = True) -> str:
    """The rows of the Parquet `files` as the table `steps`' columns (`names`: the files'
    column names), each with its `kind`: a step, or why it is dropped (a null, an
    integer out of int64's range, a negative duration). `by_name`: the files' columns
    differ (matched by name; else every file has the first one's columns, in order)."""
    ints = [f"CAST({k} AS BIGINT)" for k in INT_STEP_FIELDS]
    nulls = " OR ".join(f"{k} IS NULL" for k in ("site", *INT_STEP_FIELDS, "engaged"))
    huge = " OR ".join(f"{k} = {_INT64_MIN}" for k in ints)
    dev = "coalesce(CAST(device AS BIGINT), -1)" if "device" in names else "-1"
    ex = "CAST(execution AS BIGINT)" if "execution" in names else "CAST(NULL AS BIGINT)"
    return (
        "SELECT site, "
        + ", ".join(f"{i} AS {k}" for i, k in zip(ints, INT_STEP_FIELDS, strict=True))
        + f", engaged, {dev} AS device, {ex} AS execution, hash(filename) AS file, "
        f"CASE WHEN {nulls} THEN {NULLS} WHEN {huge} THEN {HUGE} "
        f"WHEN wait_ns < 0 OR delay_ns < 0 THEN {NEGATIVE} ELSE {STEP} END AS kind "
        f"FROM read_parquet({_sql_list(files)}, union_by_name = {str(by_name).lower()}, "
        "filename = true)"
    )


class _Stats(NamedTuple):
    """One column's statistics in one row group, read once (pyarrow decodes `min` and
    `max` again on every access)."""

    min: Any
    max: Any
    null_count: int | None  # (None: not written)


def _statistics(meta: Any) -> dict[str, list[_Stats | None]]:
    """Each step column's statistics (None where a row group has no min and max) in each
    row group that has rows (a process that recorded no step has none), read once per
    file."""
    names = meta.schema.names
    cols = {k: names.index(k) for k in ("site", *INT_STEP_FIELDS, "engaged") if k in names}
    out: dict[str, list[_Stats | None]] = {k: [] for k in cols}
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        if not rg.num_rows:
            continue
        for k, i in cols.items():
            st = rg.column(i).statistics
            ok = st is not None and st.has_min_max
            nulls = st.null_count if ok and st.has_null_count else None
            out[k].append(_Stats(st.min, st.max, nulls) if ok else None)
    return out


def _one_site_per_row_group(stats: dict[str, list[_Stats | None]]) -> set[str] | None:
    """The sites of a Parquet file's row groups when each holds one site's rows (its
    `site` statistics' min equal to its max, no null), as `records.format.write_parquet`
    writes them; else None. `stats`: the file's `_statistics`."""
    if "site" not in stats:
        return None
    sites = set()
    for st in stats["site"]:
        if st is None or st.min != st.max or st.null_count:
            return None
        sites.add(st.min)
    return sites


def _every_row_a_step(stats: dict[str, list[_Stats | None]]) -> bool:
    """Whether a Parquet file's row-group statistics (`_statistics`) show that no row is
    dropped (`_drop_parquet_rows`): no null in a step column, every integer within
    (-2^63, 2^63) (so none is int64's least, the mark of a huge value, and none fails the
    cast), no negative wait or delay. False when some statistic is missing: the rows are
    scanned."""
    for k in ("site", *INT_STEP_FIELDS, "engaged"):
        least = 0 if k in ("wait_ns", "delay_ns") else -(1 << 63) + 1
        for st in stats.get(k, [None]):
            if st is None or st.null_count != 0:
                return False
            if k in INT_STEP_FIELDS and not (least <= st.min and st.max < (1 << 63)):
                return False
    return True


def _rank_range(stats: dict[str, list[_Stats | None]]) -> tuple[int, int] | None:
    """The least and greatest `rank` in a Parquet file's row-group statistics
    (`_statistics`); None when a row group has none (or the file no rows)."""
    st = stats.get("rank") or [None]
    if any(x is None or not isinstance(x.min, int) for x in st):
        return None
    return min(x.min for x in st), max(x.max for x in st)


def _zero_in_statistics(stats: dict[str, list[_Stats | None]]) -> set[str]:
    """The columns of `ZERO_UNLESS_USED` a Parquet file's row-group statistics
    (`_statistics`) show zero (false) in every row it keeps: their max at most 0 (a row
    with a negative delay is dropped). A column without statistics in some row group is
    not among them."""
    return {
        k
        for k in ZERO_UNLESS_USED
        if k in stats and all(s is not None and not s.max > 0 for s in stats[k])
    }


class _Footers(NamedTuple):
    """What the footers of a run read in place say of every row (`Engine._load_parquet`).

    Attributes:
      rows: the rows they count.
      ranks: the least and greatest `rank` their statistics show (None: some file has none).
      execution: whether some file has an `execution` column.
      summaries: each file's own summary of its rows (`records.file_summary`), checked
        against its footer, or their `Merged` once `summary` has merged them; None when
        some file has none (the summary is a scan then).
    """

    rows: int
    ranks: tuple[int, int] | None
    execution: bool
    summaries: Any = None


class _ParquetHead(NamedTuple):
    """What a Parquet records file's footer says (`_parquet_header`).

    Attributes:
      header: its jaxpace header.
      names: its column names.
      sites: its sites, if each row group holds one site's rows (else None).
      layout: its columns' (name, type) in order.
      zero: the columns its statistics show zero in every row (`_zero_in_statistics`).
      clean: its statistics show every row a step (`_every_row_a_step`).
      ranks: the least and greatest `rank` its statistics show (None: some row group
        has none).
      rows: its rows (the footer's count).
      summary: its own summary of its rows (`records.file_summary`), when it has one that
        agrees with its footer's statistics; else None.
    """

    header: dict[str, Any]
    names: set[str]
    sites: set[str] | None
    layout: tuple
    zero: set[str]
    clean: bool
    ranks: tuple[int, int] | None
    rows: int
    summary: Any = None
    meta: Any = None
    groups: dict[str, list[int]] | None = None
    bounds: dict[str, tuple[int, int, int, int] | None] | None = None


def _row_group_reader(files: list[str], footers, names: set[str], layouts: int) -> Any:
    """A `parquet_reader.RowGroupReader` over the files of a run read in place, when they
    share one layout and their footers are small enough to keep (`FOOTER_BYTES_KEPT`);
    else None (each site a query)."""
    from jaxpace.records.parquet_reader import FOOTER_BYTES_KEPT, RowGroupReader

    if layouts != 1 or sum(f[0].serialized_size for f in footers) > FOOTER_BYTES_KEPT:
        return None
    metas, groups, bounds = zip(*footers, strict=True)
    return RowGroupReader(files, metas, groups, names, bounds)


def _parquet_header(path: Path, skipped: list[str]) -> _ParquetHead | None:
    """What a Parquet records file's footer says (`_ParquetHead`), its columns' types
    checked; None (and a note in `skipped`) for a file without its footer."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jaxpace.records.parquet_reader import check_schema, header_of

    with open_regular(path, "records file") as f:
        try:
            pf = pq.ParquetFile(f)
            schema = pf.schema_arrow
            stats = _statistics(pf.metadata)
            rows = int(pf.metadata.num_rows)
            grouped = _one_site_per_row_group(stats)
            zero = _zero_in_statistics(stats)
            clean = _every_row_a_step(stats)
            summary = groups = bounds = None
            if grouped is not None:
                sites_of = _row_group_sites(pf.metadata, stats)
                summary = _file_summary(pf.metadata, stats, sites_of, rows)
                groups = _site_groups(sites_of)
                bounds = _site_bounds(sites_of, stats)
        except (pa.ArrowException, OSError, ValueError) as e:
            skipped.append(
                f"PARTIAL: skipped {path}: not a complete Parquet file ({str(e)[:120]}); "
                "a process killed while writing it leaves no footer. The other files are "
                "read."
            )
            return None
    header = header_of(schema, str(path))
    check_schema(schema, str(path))
    layout = tuple((x.name, str(x.type)) for x in schema)
    return _ParquetHead(
        header, set(schema.names), grouped, layout, zero, clean, _rank_range(stats), rows,
        summary, pf.metadata, groups, bounds,
    )  # fmt: skip


def _row_group_sites(meta: Any, stats: dict[str, list[_Stats | None]]) -> list[tuple]:
    """Each row group with rows of a file laid out one site to a row group, as (site, row
    group, rows): its site from `stats` (`_statistics`, over those row groups)."""
    with_rows = [(g, n) for g in range(meta.num_row_groups) if (n := meta.row_group(g).num_rows)]
    return [(st.min, g, n) for st, (g, n) in zip(stats["site"], with_rows, strict=True)]


def _site_groups(sites_of: list[tuple[str, int, int]]) -> dict[str, list[int]]:
    """`{site: its row groups}` of a file laid out one site to a row group (`sites_of`:
    each row group with rows as (site, row group, rows))."""
    out: dict[str, list[int]] = {}
    for site, g, _ in sites_of:
        out.setdefault(site, []).append(g)
    return out


def _site_bounds(sites_of, stats: dict[str, list[_Stats | None]]) -> dict[str, tuple | None]:
    """`{site: (least step, greatest step, least rank, greatest rank)}` of a file laid out one
    site to a row group, from its row groups' statistics (None: some row group has none),
    where `RowGroupReader` places the site's rows on the site's grid."""
    out: dict[str, tuple] = {}
    unknown = set()
    for (site, _, _), s, r in zip(sites_of, stats["step"], stats["rank"], strict=True):
        if s is None or r is None:
            unknown.add(site)
            continue
        b = (int(s.min), int(s.max), int(r.min), int(r.max))
        w = out.get(site, b)
        out[site] = (min(w[0], b[0]), max(w[1], b[1]), min(w[2], b[2]), max(w[3], b[3]))
    return {site: None if site in unknown else out[site] for site in {*out, *unknown}}


def _file_summary(meta: Any, stats: dict[str, list[_Stats | None]], sites_of, rows: int):
    """A file's own summary (`records.file_summary`) when it has one and it agrees with
    the footer (`sites_of`: each row group with rows as (site, row group, rows)); else
    None."""
    from jaxpace.records import file_summary

    got = file_summary.parse((meta.metadata or {}).get(file_summary.SUMMARY_KEY))
    if got is None:
        return None
    row_sites = [(site, n) for site, _, n in sites_of]
    return got if file_summary.check(got, rows, stats, row_sites) else None


def read_headers(path: Path) -> list[dict[str, Any]]:
    """The header of one records file ([] when it has none or cannot be read)."""
    from jaxpace.records.parquet_reader import is_parquet

    if is_parquet(path):
        import pyarrow.parquet as pq

        try:
            meta = pq.read_schema(path).metadata or {}
        except (OSError, ValueError):
            return []
        raw = meta.get(HEADER_KEY)
        return [json.loads(raw)] if raw else []
    try:
        header, _, _ = first_line(path)
    except RecordsError:
        return []
    return [header] if header is not None else []


def connect(**kw: Any) -> Engine:
    """`Engine(**kw)`: threads (default 2), `memory_limit` (default 1 GB), `temp_directory`,
    `max_temp_bytes` (default half the free space)."""
    return Engine(**kw)
