"""Reading timing records (docs/records.md) into columns, and writing them back.

The format itself (version, file names, the header and step dicts) is defined
once in `jaxpace.records.format`; this module only parses and validates it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from jaxpace.errors import RecordsError
from jaxpace.records.executions import number_executions, partial_note
from jaxpace.records.format import (
    FORMAT_VERSION,
    INT_STEP_FIELDS,
    NO_EXECUTION,
    REQUIRED_STEP_FIELDS,
    has_records,
    records_filename,
    records_files,
    step_record,
    write_parquet,
)
from jaxpace.records.format import (
    write_jsonl as _write_jsonl_file,
)
from jaxpace.records.jsonl_checked import MAX_ABS_INT, MAX_LINE_BYTES  # noqa: F401 (re-exported)
from jaxpace.records.run_checks import check_truncated, missing_note, rank_bound, truncation_notes
from jaxpace.records.safe_io import check_declared_count

__all__ = ["Records", "find_runs", "load_records", "run_meta", "without_foreign_ranks"]


@dataclasses.dataclass(frozen=True, eq=False)
class Records:
    """Timing records of one run, columnar (one array entry per site, step and rank).

    Build with `load_records` (files, a directory, or a list of dicts as
    `Pacer.records()` returns); `jaxpace.report.analyze` consumes it.

    Attributes:
      headers: header dicts (docs/records.md), one per process, by `process_index`.
      sites: the distinct collective sites, sorted.
      columns: `site` (int index into `sites`), `step`, `rank`, `process`,
        `arrive_ns`, `done_ns`, `wait_ns`, `delay_ns` (int64 arrays) and
        `engaged` (bool array), all of one length.
      run_id: the run id every header agrees on, or None without headers.
      process_count: processes the run had (from the headers), or None.
      granularity: `"process"` or `"device"`.
      partial: True when something was missing (a truncated file, a process
        without a file); `notes` says what.
      notes: human-readable remarks about the input.
      sources: the files read (or `"<memory>"`).
    """

    headers: tuple[dict[str, Any], ...]
    sites: tuple[str, ...]
    columns: dict[str, np.ndarray]
    run_id: str | None = None
    process_count: int | None = None
    granularity: str = "process"
    partial: bool = False
    notes: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()

    def __len__(self) -> int:
        return int(self.columns["step"].shape[0])

    @property
    def ranks(self) -> np.ndarray:
        """Sorted distinct ranks present in the records."""
        return np.unique(self.columns["rank"])

    def hosts(self) -> dict[int, str]:
        """Maps each rank to the host of the process that wrote its records."""
        host_of_proc = {int(h["process_index"]): str(h.get("host", "?")) for h in self.headers}
        out: dict[int, str] = {}
        ranks, first = np.unique(self.columns["rank"], return_index=True)
        for r, i in zip(ranks.tolist(), first.tolist(), strict=True):
            out[int(r)] = host_of_proc.get(int(self.columns["process"][i]), "?")
        return out

    def process_of_rank(self) -> dict[int, int]:
        """Maps each rank to the process that wrote its records."""
        ranks, first = np.unique(self.columns["rank"], return_index=True)
        procs = self.columns["process"][first]
        return {int(r): int(p) for r, p in zip(ranks.tolist(), procs.tolist(), strict=True)}

    def rank_groups(self) -> dict[str, dict[int, str]]:
        """Topology groups from the headers: kind (`numa`, `nic`, ...) -> rank -> label."""
        out: dict[str, dict[int, str]] = {}
        for h in self.headers:
            topo = h.get("topology") or {}
            groups = topo.get("rank_groups") if isinstance(topo, Mapping) else None
            if not isinstance(groups, Mapping):
                continue
            for kind, mapping in groups.items():
                if isinstance(mapping, Mapping):
                    dst = out.setdefault(str(kind), {})
                    for r, label in mapping.items():
                        dst[int(r)] = str(label)
        return out

    def to_dicts(self) -> list[dict[str, Any]]:
        """The records as dicts in the JSONL format: headers first, then steps."""
        c = self.columns
        out: list[dict[str, Any]] = [dict(h) for h in self.headers]
        cols = {k: c[k].tolist() for k in INT_STEP_FIELDS}
        engaged = c["engaged"].tolist()
        site = c["site"].tolist()
        device = c.get("device")
        dev = device.tolist() if device is not None else [-1] * len(self)
        ex = c["execution"].tolist() if "execution" in c else [None] * len(self)
        for i in range(len(self)):
            out.append(
                step_record(
                    site=self.sites[site[i]],
                    step=cols["step"][i],
                    rank=cols["rank"][i],
                    process=cols["process"][i],
                    device=None if dev[i] < 0 else dev[i],
                    arrive_ns=cols["arrive_ns"][i],
                    done_ns=cols["done_ns"][i],
                    wait_ns=cols["wait_ns"][i],
                    delay_ns=cols["delay_ns"][i],
                    engaged=engaged[i],
                    execution=ex[i],
                )
            )
        return out

    def write_jsonl(self, directory: str | os.PathLike) -> list[Path]:
        """Writes one `records-p{process}.jsonl` per process, as `Pacer.export` does.

        Returns:
          The paths written.
        """
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        by_proc: dict[int, list[dict[str, Any]]] = {}
        for h in self.headers:
            by_proc.setdefault(int(h["process_index"]), []).append(h)
        for rec in self.to_dicts()[len(self.headers) :]:
            by_proc.setdefault(int(rec["process"]), []).append(rec)
        return [
            Path(_write_jsonl_file(d / records_filename(p, "jsonl"), recs))
            for p, recs in sorted(by_proc.items())
        ]

    def write_parquet(self, directory: str | os.PathLike) -> list[Path]:
        """Writes one `records-p{process}.parquet` per process (the native format).

        Returns:
          The paths written.
        """
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        c = self.columns
        proc = c["process"]
        order = np.argsort(proc, kind="stable")
        procs = sorted(
            {int(h["process_index"]) for h in self.headers} | set(np.unique(proc).tolist())
        )
        by_proc = {int(h["process_index"]): h for h in self.headers}
        bounds = np.searchsorted(proc[order], [*procs, max(procs, default=0) + 1], side="left")
        out = []
        for i, p in enumerate(procs):
            idx = order[bounds[i] : bounds[i + 1]]
            idx = idx[proc[idx] == p]
            header = by_proc.get(p)
            if header is None:
                raise RecordsError(
                    f"step records of process {p} have no header; a Parquet records file "
                    "holds its header in its metadata. Add the process's header."
                )
            cols = {k: c[k][idx] for k in (*INT_STEP_FIELDS, "site", "engaged")}
            cols["device"] = c["device"][idx] if "device" in c else np.full(idx.size, -1)
            if "execution" in c:
                cols["execution"] = c["execution"][idx]
            header = {
                **header,
                "format": header.get("format", FORMAT_VERSION),
                "granularity": header.get("granularity", self.granularity),
            }
            out.append(Path(write_parquet(d / records_filename(p), header, cols, self.sites)))
        return out


# The step columns of `Records`, in the order `build` makes them.
_COLUMN_DTYPES: dict[str, Any] = {
    **{k: np.int64 for k in INT_STEP_FIELDS},
    "site": np.int64,
    "engaged": bool,
    "device": np.int64,
    "execution": np.int64,  # `NO_EXECUTION` where a record has none
}


class _Builder:
    """Accumulates parsed lines, then validates and freezes them into `Records`."""

    def __init__(self) -> None:
        self.headers: list[tuple[dict[str, Any], str]] = []  # (header, where)
        self.site_index: dict[str, int] = {}
        # Step columns in order, as Python lists (record dicts in memory), converted by
        # `build` (so an integer too large for int64 fails there).
        self.segments: list[tuple[int, dict[str, list]]] = []
        self.rows = 0
        self.notes: list[str] = []
        self.partial = False
        self.sources: list[str] = []
        self.negative = 0  # step records skipped for a negative wait_ns/delay_ns
        self.huge = 0  # step records skipped for an integer out of range (`MAX_ABS_INT`)
        self.huge_first: str | None = None
        self.negative_first: str | None = None

    def add_header(self, rec: Mapping[str, Any], where: str) -> None:
        fmt = rec.get("format")
        if fmt != FORMAT_VERSION:
            raise RecordsError(
                f"{where}: header has `format` {fmt!r}, expected {FORMAT_VERSION}. "
                "This file was written by a different jaxpace version; read it with "
                "the version that wrote it (see the header's `jaxpace_version`)."
            )
        for key in ("run_id", "process_index", "process_count"):
            if key not in rec:
                raise RecordsError(
                    f"{where}: header lacks `{key}`; expected the fields of docs/records.md "
                    "(`type`, `format`, `run_id`, `process_index`, `process_count`, `host`, ...)."
                )
        _check_int(rec, "process_index", where)
        _check_int(rec, "process_count", where)
        check_declared_count(rec["process_count"], "process_count", where)
        if not 0 <= rec["process_index"] < rec["process_count"]:
            raise RecordsError(
                f"{where}: `process_index` is {rec['process_index']}, expected an integer in "
                f"[0, {rec['process_count']}) (below `process_count`). The header is corrupt; "
                "fix it or point at the run's own files."
            )
        if "truncated" in rec:
            check_truncated(rec["truncated"], where)
        if "interleaved_phases" in rec:
            _check_int(rec, "interleaved_phases", where)
            if rec["interleaved_phases"] < 1:
                raise RecordsError(f"{where}: `interleaved_phases` must be >= 1.")
        self.headers.append((dict(rec), where))

    def add_step(self, rec: Mapping[str, Any], where: str) -> None:
        missing = [k for k in REQUIRED_STEP_FIELDS if k not in rec]
        if missing:
            raise RecordsError(
                f"{where}: step record lacks {', '.join(f'`{k}`' for k in missing)}; "
                f"expected the fields {', '.join(f'`{k}`' for k in REQUIRED_STEP_FIELDS)} "
                "(docs/records.md)."
            )
        for k in INT_STEP_FIELDS:
            _check_int(rec, k, where)
        site = rec["site"]
        if not isinstance(site, str):
            raise RecordsError(f"{where}: `site` must be a string, got {site!r}.")
        ex = rec.get("execution")  # optional: the program execution's id
        if ex is not None:
            _check_int(rec, "execution", where)
        if any(not -MAX_ABS_INT < rec[k] < MAX_ABS_INT for k in INT_STEP_FIELDS) or (
            ex is not None and not -MAX_ABS_INT < ex < MAX_ABS_INT
        ):
            # Never an OverflowError building the columns: dropped, counted, located.
            self.huge += 1
            if self.huge_first is None:
                self.huge_first = where
            return
        if rec["wait_ns"] < 0 or rec["delay_ns"] < 0:
            # A clock that went backwards, or an edited file: the runtime drops such a
            # record rather than trust it; the reader does the same, counts and notes it.
            self.negative += 1
            if self.negative_first is None:
                self.negative_first = where
            return
        idx = self.site_index.setdefault(site, len(self.site_index))
        cols = self._list_part()
        for k in INT_STEP_FIELDS:
            cols[k].append(rec[k])
        cols["site"].append(idx)
        cols["engaged"].append(bool(rec["engaged"]))
        dev = rec.get("device")
        cols["device"].append(-1 if dev is None else int(dev))
        cols["execution"].append(NO_EXECUTION if ex is None else ex)
        self.rows += 1

    def _list_part(self) -> dict[str, list]:
        if self.segments:
            first, lists = self.segments[-1]
            if first + len(lists["step"]) == self.rows:
                return lists
        lists = {k: [] for k in _COLUMN_DTYPES}
        self.segments.append((self.rows, lists))
        return lists

    def _column(self, key: str) -> np.ndarray:
        """Column `key` of every row, in order."""
        dtype = _COLUMN_DTYPES[key]
        parts = [np.asarray(lists[key], dtype=dtype) for _, lists in self.segments]
        return np.concatenate(parts) if parts else np.zeros(0, dtype)

    def add(self, rec: Any, where: str) -> None:
        if not isinstance(rec, Mapping):
            raise RecordsError(
                f"{where}: expected a JSON object, got {type(rec).__name__}; every line of a "
                "records file is an object with a `type` of `header` or `step`."
            )
        kind = rec.get("type")
        if kind == "step":
            self.add_step(rec, where)
        elif kind == "header":
            self.add_header(rec, where)
        else:
            raise RecordsError(
                f"{where}: unknown record `type` {kind!r}; expected `header` or `step` "
                "(docs/records.md)."
            )

    def _skipped_notes(self) -> list[str]:
        """`PARTIAL:` notes for the step records dropped while reading."""
        notes = []
        if self.huge:
            notes.append(
                f"PARTIAL: skipped {self.huge} step record(s) with an integer beyond the int64 "
                f"range (first at {self.huge_first}): no clock or duration in nanoseconds is "
                "that large (292 years), so these are corrupt."
            )
        if self.negative:
            notes.append(
                f"PARTIAL: skipped {self.negative} step record(s) with a negative `wait_ns` "
                f"or `delay_ns` (first at {self.negative_first}): durations cannot be "
                "negative, so these came from a clock that went backwards or an edited "
                "file and are not trusted."
            )
        return notes

    def build(self, *, require_headers: bool, processes: np.ndarray | None = None) -> Records:
        if not self.rows and not self.headers:
            raise RecordsError(
                f"no timing records in {', '.join(self.sources) or 'the input'}. Point "
                "`jaxpace report` at a run directory written by `Pacer.export`."
            )
        if require_headers and not self.headers:
            raise RecordsError("no header line found; expected docs/records.md files.")
        run_ids = sorted({str(h["run_id"]) for h, _ in self.headers})
        if len(run_ids) > 1:
            where = "; ".join(f"{w}: `{h['run_id']}`" for h, w in self.headers)
            raise RecordsError(
                f"records of {len(run_ids)} different runs are mixed: run ids "
                f"{', '.join(f'`{r}`' for r in run_ids)} ({where}). Put each run's files in "
                "its own directory and report on one at a time."
            )
        by_proc: dict[int, tuple[dict, str]] = {}
        for h, w in self.headers:
            p = int(h["process_index"])
            if p in by_proc:
                raise RecordsError(
                    f"two headers claim `process_index` {p}: {by_proc[p][1]} and {w}. A run "
                    "directory holds one file per process; remove the duplicate."
                )
            by_proc[p] = (h, w)
        headers = tuple(h for _, (h, _) in sorted(by_proc.items()))
        counts = {int(h["process_count"]) for h in headers}
        if len(counts) > 1:
            raise RecordsError(
                f"headers disagree on `process_count`: {sorted(counts)}; the files do not "
                "belong to one run."
            )
        process_count = counts.pop() if counts else None
        notes = list(self.notes) + self._skipped_notes()
        partial = self.partial or bool(self.huge or self.negative)
        notes += truncation_notes(headers)
        missing = missing_note(process_count, by_proc)
        if missing:
            partial = True
            notes.append(missing)
        granularities = {str(h.get("granularity", "process")) for h in headers}
        granularity = "device" if "device" in granularities else "process"
        sites = tuple(sorted(self.site_index, key=self.site_index.get))
        order = np.argsort(np.array(sites, dtype=object)) if sites else np.zeros(0, int)
        remap = np.empty(len(sites), dtype=np.int64)
        remap[order] = np.arange(len(sites))
        columns = {k: self._column(k) for k in INT_STEP_FIELDS}
        columns["site"] = remap[self._column("site")]
        columns["engaged"] = self._column("engaged")
        columns["device"] = self._column("device")
        note = _execution_column(columns, self._column("execution"))
        if note:
            notes.append(note)
        seen = np.unique(columns["process"]) if processes is None else processes
        unknown = sorted(set(seen.tolist()) - set(by_proc))
        if by_proc and unknown:
            notes.append(
                f"step records name process {', '.join(map(str, unknown))} without a header "
                "for it; their hosts are unknown."
            )
        return Records(
            headers=headers,
            sites=tuple(sorted(sites)),
            columns=columns,
            run_id=run_ids[0] if run_ids else None,
            process_count=process_count,
            granularity=granularity,
            partial=partial,
            notes=tuple(notes),
            sources=tuple(self.sources),
        )


def _execution_column(columns: dict[str, np.ndarray], raw: np.ndarray) -> str | None:
    """Adds the `execution` column (executions numbered in order, `records.executions`)
    when every record has an execution id; returns a note when some have one and it is
    not used."""
    known = raw != NO_EXECUTION
    if not known.any():
        return None
    if not known.all():
        return partial_note(int((~known).sum()), raw.size)
    ex, note = number_executions(raw, columns["process"], columns["rank"], columns["arrive_ns"])
    if ex is not None:
        columns["execution"] = ex
    return note


def foreign_ranks_note(recs: Any, n: int, bound: int, example: tuple[int, int, int]) -> str:
    """The note on `n` step records dropped for a rank outside `0..bound-1`; `example` is
    one of them as (process, step, rank). `recs`: `Records` or `SiteRecords`."""
    proc, step, r = example
    files = [f for f in recs.sources if Path(f).name.startswith(f"records-p{proc}.")]
    where = files[0] if files else f"the records of process {proc}"
    return (
        f"PARTIAL: dropped {n} step record(s) whose rank is outside the run's "
        f"ranks 0-{bound - 1} (from the headers: {int(recs.headers[0]['process_count'])} "
        f"processes, granularity `{recs.granularity}`), e.g. rank {r} at step {step} in "
        f"{where}; a corrupt or foreign record, not compared."
    )


def without_foreign_ranks(recs: Records) -> Records:
    """`recs` without the step records whose rank is outside the run's ranks (as the
    headers give them: `run_checks.rank_bound`), marked partial with a note saying how many and
    where; `recs` itself when there are none (or the headers do not say)."""
    bound = rank_bound(recs.headers, recs.granularity)
    columns = recs.columns
    if bound is None or not columns["rank"].size:
        return recs
    rank = columns["rank"]
    bad = (rank < 0) | (rank >= bound)
    if not bad.any():
        return recs
    i = int(np.flatnonzero(bad)[0])
    proc, step, r = int(columns["process"][i]), int(columns["step"][i]), int(rank[i])
    note = foreign_ranks_note(recs, int(bad.sum()), bound, (proc, step, r))
    return dataclasses.replace(
        recs,
        columns={k: v[~bad] for k, v in columns.items()},
        partial=True,
        notes=(*recs.notes, note),
    )


def _check_int(rec: Mapping[str, Any], key: str, where: str) -> None:
    v = rec[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise RecordsError(f"{where}: `{key}` must be an integer, got {v!r}.")


def find_runs(directory: str | os.PathLike, max_depth: int = 3) -> list[Path]:
    """Subdirectories of `directory` (up to `max_depth` levels down) holding records files.

    A folder of several runs, such as `jaxpace demo`'s output (`diagnose/off`,
    `ab/off`, ...), has no records itself; these are the runs inside it, sorted.

    >>> find_runs("/nonexistent")
    []
    """
    found: list[Path] = []
    level = [Path(directory)]
    for _ in range(max_depth):
        nxt = []
        for d in level:
            try:
                subs = sorted(p for p in d.iterdir() if p.is_dir() and not p.is_symlink())
            except OSError:
                continue
            for sub in subs:
                (found if has_records(sub) else nxt).append(sub)
        level = nxt
    return sorted(found)


def _no_records_message(path: Path) -> str:
    runs = find_runs(path)
    if not runs:
        return (
            f"no records files (`*.parquet`, `*.jsonl`) in directory {path}. Expected the "
            "files `Pacer.export` writes (`records-p0.parquet`, ... or `records-p0.jsonl`, ...)."
        )
    listed = "\n".join(f"  jaxpace report {r}" for r in runs)
    return (
        f"{path} has no records files itself but holds {len(runs)} runs; report one of "
        f"them:\n{listed}"
    )


def run_files(path: Path) -> list[Path]:
    """The records files `path` names (a run directory's, or the file itself); raises a
    `RecordsError` that says what was expected when there are none."""
    if path.is_dir():
        files = records_files(path)
        if not files:
            raise RecordsError(_no_records_message(path))
        return files
    if path.is_file() or os.path.lexists(path):
        return [path]  # anything but a regular file is refused when opened
    raise RecordsError(f"records path {path} does not exist; pass a run directory or a JSONL file.")


def run_meta(
    headers: Iterable[tuple[Mapping[str, Any], str]],
    notes: Iterable[str],
    sources: Iterable[str],
    processes: np.ndarray,
    rows: int,
) -> Records:
    """`Records` without rows that carry a run's headers (each checked; one run, one
    header per process), its notes (what was dropped, what is missing) and sources.

    Args:
      headers: `(header, where)` of each file.
      notes: notes of the reading (`PARTIAL:` ones mark the run partial).
      sources: the files read.
      processes: the distinct processes the step rows name.
      rows: how many step rows there are (0 with no header: nothing at all, an error).
    """
    builder = _Builder()
    builder.sources = [str(s) for s in sources]
    for h, where in headers:
        builder.add_header(h, where)
    builder.notes = list(notes)
    builder.partial = any(n.startswith("PARTIAL") for n in builder.notes)
    if rows and not builder.headers:
        builder.rows = rows  # ("no header line found", not "no timing records")
    meta = builder.build(require_headers=True, processes=np.asarray(processes, np.int64))
    return meta


def load_records(
    source: str | os.PathLike | Iterable[Mapping[str, Any]] | Records,
) -> Records:
    """Reads timing records from a Parquet or JSONL file, a run directory, or a list of dicts.

    A directory contributes every `*.parquet` and `*.jsonl` file in it (one per
    process). A last line cut short (a killed process) or a Parquet file without
    its footer is skipped and the result marked `partial`; so is a run whose
    headers announce more processes than have files. Anything else malformed raises.

    Args:
      source: a path to one records file or a directory of them; or an iterable
        of record dicts (headers optional), e.g. `Pacer.records()`; or
        `Records` (returned as is).

    Returns:
      The `Records` of one run.

    Raises:
      RecordsError: unreadable or malformed input (names file and line), files of
        different runs mixed, or no records at all.

    >>> from jaxpace.report import synthetic_records
    >>> recs = load_records(synthetic_records(num_ranks=2, num_steps=3))
    >>> len(recs), recs.ranks.tolist(), recs.partial
    (6, [0, 1], False)
    """
    if isinstance(source, Records):
        return source
    if isinstance(source, str | os.PathLike):
        return _load_files(Path(source))
    builder = _Builder()
    if isinstance(source, Mapping) or not isinstance(source, Iterable):
        raise RecordsError(
            f"cannot read records from a {type(source).__name__}; pass a path, a run "
            "directory, or a list of record dicts."
        )
    builder.sources.append("<memory>")
    for i, rec in enumerate(source):
        builder.add(rec, f"<memory>[{i}]")
    return builder.build(require_headers=False)


def _load_files(path: Path) -> Records:
    """A run's files through the engine (`records.engine`), every row in file order."""
    from jaxpace.records.engine import Engine

    files = run_files(path)
    with Engine() as e:
        loaded = e.load(path, file_order=True)
        cols, _ = e.all_columns([str(f) for f in files])
        meta = run_meta(
            loaded.headers,
            loaded.scan.notes(),
            [str(f) for f in files],
            np.unique(cols["process"]),
            int(cols["step"].size),
        )
    sites = loaded.sites
    site = cols.pop("site")
    names = np.array(sites, dtype=object)
    columns = {k: cols[k].astype(np.int64, copy=False) for k in INT_STEP_FIELDS}
    columns["site"] = (
        np.searchsorted(names, site).astype(np.int64) if site.size else np.zeros(0, np.int64)
    )
    columns["engaged"] = cols["engaged"].astype(bool, copy=False)
    columns["device"] = cols["device"].astype(np.int64, copy=False)
    note = _execution_column(columns, cols["execution"].astype(np.int64, copy=False))
    if note:
        meta = dataclasses.replace(meta, notes=(*meta.notes, note))
    return dataclasses.replace(meta, sites=sites, columns=columns)
