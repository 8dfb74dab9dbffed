"""The records' heavy reduction as SQL, run by DuckDB out of core over Parquet, JSONL and Inspector logs.

One module holds the SQL: a `steps` view over a run's files (Parquet read as is;
JSONL read as text and every value checked explicitly, because DuckDB's strict
JSON reader fails a whole query at the first `Infinity` or cut line and its
`ignore_errors` turns bad values into NULLs silently; NCCL Inspector logs
through their reader), then the reduction over ranks per (site, step) and the
per-rank statistics. Each step compares the ranks present in it. DuckDB runs
with its threads capped, a memory limit and a temporary directory to spill
to, and never downloads an extension (`autoinstall_known_extensions` and
`autoload_known_extensions` off: object storage needs `httpfs` installed
explicitly, docs/records.md). duckdb and pyarrow are imported here only.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxpace.errors import RecordsError
from jaxpace.records.format import INT_STEP_FIELDS, records_files

__all__ = ["Engine", "Reduction", "Scan", "connect"]

# An integer value of a JSONL step line: what JSON writes, at most 18 digits (so it fits
# in int64 whatever the digits); anything else (1e3, 1.5, Infinity, 2^63) is a bad value.
_INT_RE = r"-?(0|[1-9][0-9]{0,17})"
_STEP_SELECT = ", ".join(
    [
        "CAST(site AS VARCHAR) AS site",
        *(f"CAST({k} AS BIGINT) AS {k}" for k in INT_STEP_FIELDS),
        "CAST(engaged AS BOOLEAN) AS engaged",
    ]
)


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
      bad: step lines dropped for a bad value (not JSON, a missing field, a number that is
        not an integer of at most 18 digits, `Infinity`, ...); `bad_examples` the first
        few as `file:line: why`.
      negative: step rows dropped for a negative `wait_ns` or `delay_ns`.
      cut: files whose last line was cut short (no newline, not JSON).
    """

    files: tuple[str, ...]
    rows: int
    bad: int = 0
    bad_examples: tuple[str, ...] = ()
    negative: int = 0
    cut: tuple[str, ...] = ()

    def notes(self) -> list[str]:
        """`PARTIAL:` notes for what was dropped (none when nothing was)."""
        out = []
        if self.bad:
            more = "; ..." if self.bad > len(self.bad_examples) else ""
            out.append(
                f"PARTIAL: {self.bad} step line(s) with a bad value dropped ("
                + "; ".join(self.bad_examples)
                + more
                + ")."
            )
        if self.negative:
            out.append(
                f"PARTIAL: {self.negative} step record(s) with a negative `wait_ns` or "
                "`delay_ns` dropped (a clock that went backwards or an edited file)."
            )
        if self.cut:
            out.append(
                f"PARTIAL: last line cut short in {len(self.cut)} file(s) (a process killed "
                f"while writing), skipped: {', '.join(self.cut[:3])}"
                + (" ..." if len(self.cut) > 3 else "")
            )
        return out


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
    ) -> None:
        import duckdb

        self._own_tmp = temp_directory is None
        self.temp_directory = (
            tempfile.mkdtemp(prefix="jaxpace-duckdb-")
            if temp_directory is None
            else os.fspath(temp_directory)
        )
        self.con = duckdb.connect(
            ":memory:",
            config={
                "threads": int(threads or min(2, os.cpu_count() or 1)),
                "memory_limit": memory_limit,
                "temp_directory": self.temp_directory,
                "preserve_insertion_order": False,
                # Never a download at run time (an offline cluster): extensions are
                # installed explicitly and loaded by name (docs/records.md).
                "autoinstall_known_extensions": False,
                "autoload_known_extensions": False,
            },
        )

    def close(self) -> None:
        self.con.close()
        if self._own_tmp:
            shutil.rmtree(self.temp_directory, ignore_errors=True)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ reading

    def open_steps(self, path: str | os.PathLike) -> Scan:
        """Creates the view `steps` over the records of `path` (a run directory or one
        file: Parquet, JSONL, NCCL Inspector logs or `jax.profiler` traces); returns what
        the scan found."""
        p = Path(path)
        files = records_files(p) if p.is_dir() else [p]
        if not files or (not p.is_dir() and p.suffix not in (".parquet", ".jsonl")):
            from jaxpace.records.sources import detect, load

            if detect(p) in ("nccl_inspector", "xprof"):  # through their readers
                return self.open_records(load(p).records)
            if not files:
                raise RecordsError(f"no records files (`*.parquet`, `*.jsonl`) in {p}.")
        parquet = [str(f) for f in files if _is_parquet(f)]
        jsonl = [str(f) for f in files if str(f) not in set(parquet)]
        parts, scan = [], Scan(files=tuple(map(str, files)), rows=0)
        if parquet:
            parts.append(f"SELECT {_STEP_SELECT} FROM read_parquet({_sql_list(parquet)})")
        if jsonl:
            scan = self._open_jsonl(jsonl, scan)
            parts.append(f"SELECT {_STEP_SELECT} FROM jsonl_steps")
        self.con.execute("CREATE OR REPLACE TEMP VIEW all_steps AS " + " UNION ALL ".join(parts))
        negative = self.con.execute(
            "SELECT count(*) FROM all_steps WHERE wait_ns < 0 OR delay_ns < 0"
        ).fetchone()[0]
        self.con.execute(
            "CREATE OR REPLACE TEMP VIEW steps AS SELECT * FROM all_steps "
            "WHERE wait_ns >= 0 AND delay_ns >= 0"
        )
        rows = self.con.execute("SELECT count(*) FROM steps").fetchone()[0]
        return dataclasses.replace(scan, rows=int(rows), negative=int(negative))

    def open_records(self, records: Any) -> Scan:
        """Creates the view `steps` over in-memory `Records` (any source's reader)."""
        import pyarrow as pa

        c = records.columns
        sites = np.asarray(records.sites, dtype=object)
        table = pa.table(
            {
                "site": pa.array(sites[c["site"]].tolist() if len(records) else [], pa.string()),
                **{k: pa.array(c[k], pa.int64()) for k in INT_STEP_FIELDS},
                "engaged": pa.array(c["engaged"], pa.bool_()),
            }
        )
        self.con.register("records_table", table)
        self.con.execute("CREATE OR REPLACE TEMP VIEW steps AS SELECT * FROM records_table")
        return Scan(files=tuple(records.sources), rows=len(records))

    def _open_jsonl(self, files: list[str], scan: Scan) -> Scan:
        """The view `jsonl_steps` over the JSONL files' step lines, every value checked;
        counts and locates the lines dropped."""
        fields = ["type", "site", *INT_STEP_FIELDS, "engaged"]
        paths = ", ".join(_sql_str("$." + f) for f in fields)
        self.con.execute(
            f"""
            CREATE OR REPLACE TEMP TABLE jsonl_lines AS
            WITH raw AS (
              SELECT filename, string_split(content, chr(10)) AS ls FROM read_text({_sql_list(files)})
            ), lines AS (
              SELECT filename, generate_subscripts(ls, 1) AS line, unnest(ls) AS text,
                     len(ls) AS n FROM raw
            )
            SELECT filename, line, line = n AND text <> '' AS last_unended,
                   json_valid(text) AS ok,
                   CASE WHEN json_valid(text) THEN json_extract_string(text, [{paths}]) END AS v,
                   CASE WHEN json_valid(text) THEN json_type(text, '$.site') END AS site_type
            FROM lines WHERE trim(text) <> ''
            """
        )
        checks = [f"regexp_full_match(coalesce(v[{i + 3}], ''), '{_INT_RE}')" for i in range(7)]
        valid = " AND ".join(["site_type = 'VARCHAR'", *checks, "v[10] IN ('true', 'false')"])
        self.con.execute(
            f"""
            CREATE OR REPLACE TEMP TABLE jsonl_checked AS
            SELECT filename, line, last_unended, ok, v[1] AS type, ({valid}) AS good, v
            FROM jsonl_lines
            """
        )
        cols = ", ".join(
            ["v[2] AS site"]
            + [f"CAST(v[{i + 3}] AS BIGINT) AS {k}" for i, k in enumerate(INT_STEP_FIELDS)]
            + ["v[10] = 'true' AS engaged"]
        )
        self.con.execute(
            f"CREATE OR REPLACE TEMP VIEW jsonl_steps AS SELECT {cols} FROM jsonl_checked "
            "WHERE ok AND type = 'step' AND good"
        )
        cut = [
            r[0]
            for r in self.con.execute(
                "SELECT filename || ':' || line FROM jsonl_checked WHERE NOT ok AND last_unended "
                "ORDER BY filename"
            ).fetchall()
        ]
        bad_where = (
            "(NOT ok AND NOT last_unended) OR (ok AND type = 'step' AND NOT good) "
            "OR (ok AND coalesce(type, '') NOT IN ('step', 'header'))"
        )
        bad = self.con.execute(f"SELECT count(*) FROM jsonl_checked WHERE {bad_where}").fetchone()[
            0
        ]
        examples = [
            f"{f}:{line}: {'not JSON' if not ok else 'a field is missing or not as docs/records.md says'}"
            for f, line, ok in self.con.execute(
                f"SELECT filename, line, ok FROM jsonl_checked WHERE {bad_where} "
                "ORDER BY filename, line LIMIT 3"
            ).fetchall()
        ]
        return dataclasses.replace(scan, bad=int(bad), bad_examples=tuple(examples), cut=tuple(cut))

    # ------------------------------------------------------------------ reducing

    def reduce(self) -> Reduction:
        """The reduction over the `steps` view: per (site, step), per (step, rank), per
        (site, rank); out of core (DuckDB spills to the temporary directory)."""
        for sql in (REDUCE_STEPS_SQL, LATENESS_SQL, MEDIANS_SQL):
            self.con.execute(sql)
        return Reduction(
            steps=self._arrays(STEPS_OUT_SQL),
            lateness=self._arrays(STEP_RANK_SQL),
            ranks=self._arrays(PER_RANK_SQL),
        )

    def _arrays(self, sql: str) -> dict[str, np.ndarray]:
        cols = self.con.execute(sql).fetchnumpy()
        return {k: np.asarray(v) for k, v in cols.items()}

    def headers(self, path: str | os.PathLike) -> list[dict[str, Any]]:
        """The headers of a run's Parquet (metadata) and JSONL (first line) files."""
        out = []
        p = Path(path)
        for f in records_files(p) if p.is_dir() else [p]:
            out.extend(read_headers(f))
        return out


def read_headers(path: Path) -> list[dict[str, Any]]:
    """The header of one records file ([] when it has none or cannot be read)."""
    from jaxpace.records.format import HEADER_KEY

    if _is_parquet(path):
        import pyarrow.parquet as pq

        try:
            meta = pq.read_schema(path).metadata or {}
        except (OSError, ValueError):
            return []
        raw = meta.get(HEADER_KEY)
        return [json.loads(raw)] if raw else []
    with open(path, "rb") as f:
        first = f.readline(8 << 20)
    try:
        h = json.loads(first)
    except ValueError:
        return []
    return [h] if isinstance(h, dict) and h.get("type") == "header" else []


def _is_parquet(path: str | os.PathLike) -> bool:
    from jaxpace.records.parquet_reader import is_parquet

    return is_parquet(Path(path))


def connect(**kw: Any) -> Engine:
    """`Engine(**kw)`: threads (default 2), `memory_limit` (default 1 GB), `temp_directory`."""
    return Engine(**kw)
