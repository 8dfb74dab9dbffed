"""Reading timing records (docs/records.md) into columns, and writing them back.

The format itself (version, file names, the header and step dicts) is defined
once in `jaxpace._records`; this module only parses and validates it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from jaxpace._records import (
    FORMAT_VERSION,
    INT_STEP_FIELDS,
    RECORDS_GLOB,
    REQUIRED_STEP_FIELDS,
    records_filename,
    step_record,
)
from jaxpace._records import (
    write_jsonl as _write_jsonl_file,
)
from jaxpace.errors import RecordsError
from jaxpace.report.safe_io import check_declared_count, open_regular

__all__ = ["Records", "find_runs", "load_records"]


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
            Path(_write_jsonl_file(d / records_filename(p), recs))
            for p, recs in sorted(by_proc.items())
        ]


# The step columns of `Records`, in the order `build` makes them.
_COLUMN_DTYPES: dict[str, Any] = {
    **{k: np.int64 for k in INT_STEP_FIELDS},
    "site": np.int64,
    "engaged": bool,
    "device": np.int64,
}


class _Builder:
    """Accumulates parsed lines, then validates and freezes them into `Records`."""

    def __init__(self) -> None:
        self.headers: list[tuple[dict[str, Any], str]] = []  # (header, where)
        self.site_index: dict[str, int] = {}
        # Step columns in file order. The fast reader writes its rows straight into
        # `store` (arrays grown by doubling; `expected_rows` sizes them once); rows
        # read a line at a time by `add_step` stay Python lists (`segments`: their
        # first row and lists) until `build` converts them, as before the fast
        # reader existed (so an integer too large for int64 fails there).
        self.store: dict[str, np.ndarray] = {}
        self.segments: list[tuple[int, dict[str, list]]] = []
        self.rows = 0
        self.expected_rows = 0
        self.notes: list[str] = []
        self.partial = False
        self.sources: list[str] = []
        self.negative = 0  # step records skipped for a negative wait_ns/delay_ns
        self.negative_first: str | None = None
        self.buffer: bytearray | None = None  # the fast reader's, reused file to file

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
            _check_truncated(rec["truncated"], where)
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
        self.rows += 1

    def _list_part(self) -> dict[str, list]:
        if self.segments:
            first, lists = self.segments[-1]
            if first + len(lists["step"]) == self.rows:
                return lists
        lists = {k: [] for k in _COLUMN_DTYPES}
        self.segments.append((self.rows, lists))
        return lists

    def add_columns(self, cols: dict[str, np.ndarray]) -> None:
        """Appends step records already parsed and checked, as arrays (`site`: index
        into `site_index`; negative durations already dropped)."""
        n = int(cols["step"].shape[0])
        if not n:
            return
        self._reserve(self.rows + n)
        for k, a in self.store.items():
            a[self.rows : self.rows + n] = cols[k]
        self.rows += n

    def _reserve(self, rows: int) -> None:
        cap = self.store["step"].shape[0] if self.store else 0
        if rows <= cap:
            return
        new_cap = max(rows, 2 * cap, self.expected_rows)
        old, self.store = self.store, {}
        for k, dtype in _COLUMN_DTYPES.items():
            self.store[k] = np.empty(new_cap, dtype=dtype)  # pages are touched as filled
            if k in old:
                self.store[k][: self.rows] = old[k][: self.rows]

    def _column(self, key: str) -> np.ndarray:
        """Column `key` of every row, in order (the line-at-a-time rows converted here)."""
        dtype = _COLUMN_DTYPES[key]
        if not self.store and len(self.segments) == 1:
            return np.asarray(self.segments[0][1][key], dtype=dtype)
        self._reserve(self.rows)
        out = self.store[key][: self.rows] if self.store else np.zeros(0, dtype)
        for first, lists in self.segments:
            out[first : first + len(lists[key])] = np.asarray(lists[key], dtype=dtype)
        return out

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

    def build(self, *, require_headers: bool) -> Records:
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
        notes = list(self.notes)
        partial = self.partial
        if self.negative:
            partial = True
            notes.append(
                f"PARTIAL: skipped {self.negative} step record(s) with a negative `wait_ns` "
                f"or `delay_ns` (first at {self.negative_first}): durations cannot be "
                "negative, so these came from a clock that went backwards or an edited "
                "file and are not trusted."
            )
        notes += _truncation_notes(headers)
        missing = _missing_note(process_count, by_proc)
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
        unknown = sorted(set(np.unique(columns["process"]).tolist()) - set(by_proc))
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


def _missing_note(process_count: int | None, by_proc: Mapping[int, Any]) -> str | None:
    """The PARTIAL note for processes the headers announce but no file holds (or None).

    Lists at most 20 of them, never building a set of `process_count` items.
    """
    if process_count is None:
        return None
    n_missing = process_count - len(by_proc)  # every index is < process_count
    if not n_missing:
        return None
    shown = []
    for p in range(process_count):
        if p not in by_proc:
            shown.append(p)
            if len(shown) == 20:
                break
    more = f", and {n_missing - len(shown)} more" if n_missing > len(shown) else ""
    return (
        f"PARTIAL: records of {n_missing} of {process_count} processes are "
        f"missing (process {', '.join(map(str, shown))}{more}); their ranks are "
        "absent, so lateness is relative to the ranks that reported."
    )


def _check_truncated(t: Any, where: str) -> None:
    """The header's `truncated` field: `{"capacity": int, "first_step": {site: int}}`."""
    ok = (
        isinstance(t, Mapping)
        and isinstance(t.get("capacity"), int)
        and not isinstance(t.get("capacity"), bool)
        and isinstance(t.get("first_step"), Mapping)
        and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for v in t["first_step"].values()
        )
    )
    if not ok:
        raise RecordsError(
            f"{where}: header field `truncated` must be "
            '`{"capacity": N, "first_step": {"site": step, ...}}` (docs/records.md), got '
            f"{str(t)[:80]!r}. The header is corrupt; fix it or point at the run's own files."
        )


def _truncation_notes(headers: tuple[dict, ...]) -> list[str]:
    """One `TRUNCATED:` note when any process kept only the last `capacity` steps of a site."""
    first: dict[str, int] = {}
    caps = set()
    for h in headers:
        t = h.get("truncated")
        if t:
            caps.add(int(t["capacity"]))
            for site, step in t["first_step"].items():
                first[str(site)] = max(first.get(str(site), 0), int(step))
    if not first:
        return []
    where = "; ".join(
        f"`{site}` from step {step} (steps 0-{step - 1} dropped)"
        for site, step in sorted(first.items())[:8]
    )
    more = f"; and {len(first) - 8} more sites" if len(first) > 8 else ""
    return [
        f"TRUNCATED: the records hold only the last {'/'.join(map(str, sorted(caps)))} steps "
        f"per site and rank (the ring buffer's `capacity`): {where}{more}. The report covers "
        "the steps kept. To keep more, pass `jp.Pacer(capacity=...)` or "
        "`jp.configure(capacity=...)` (memory grows with it, docs/records.md), or export "
        "more often."
    ]


def _check_int(rec: Mapping[str, Any], key: str, where: str) -> None:
    v = rec[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise RecordsError(f"{where}: `{key}` must be an integer, got {v!r}.")


# Longest records line accepted. A step line is ~200 bytes and a header with
# rank groups for 1024 ranks well under 1 MiB; a longer line is not a records
# line, and it is refused after reading at most this much of it.
MAX_LINE_BYTES = 8 * 1024 * 1024


def _read_file(builder: _Builder, path: Path) -> None:
    builder.sources.append(str(path))
    with open_regular(path, "records file") as f:
        _read_lines(builder, path, f)


def _too_long(where: str) -> RecordsError:
    return RecordsError(
        f"{where}: line is longer than {MAX_LINE_BYTES // (1024 * 1024)} MiB; records "
        "lines are short JSON objects (docs/records.md). This is not a jaxpace records "
        "file, or it is corrupt; remove that line or point at the run's own files."
    )


def _one_line(builder: _Builder, path: Path, i: int, raw: bytes, first_seen: bool) -> bool:
    """Reads line `i` (bytes `raw`, with its newline if it has one) of `path` the
    per-line way: `json`, then `builder.add`. Returns whether the header was seen."""
    where = f"{path}:{i}"
    if len(raw) > MAX_LINE_BYTES:
        raise _too_long(where)
    line = raw.decode("utf-8", errors="replace")
    if not line.strip():
        return first_seen
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        if not raw.endswith(b"\n"):  # only the last line can lack it: cut short
            builder.partial = True
            builder.notes.append(
                f"PARTIAL: {where}: last line is cut short (the process was probably "
                "killed while writing); skipped it."
            )
            return first_seen
        raise RecordsError(
            f"{where}: not valid JSON ({e.msg} at column {e.colno}): {line[:80]!r}. "
            "Records files hold one JSON object per line (docs/records.md); remove or "
            "fix that line."
        ) from None
    except RecursionError:
        raise RecordsError(
            f"{where}: JSON nested too deeply to read: {line[:40]!r}... Records lines "
            "are flat JSON objects (docs/records.md); remove or fix that line."
        ) from None
    if not first_seen:
        first_seen = True
        if not (isinstance(rec, Mapping) and rec.get("type") == "header"):
            raise RecordsError(
                f'{where}: first line is not a header (`"type": "header"`); this does '
                "not look like a jaxpace records file (docs/records.md)."
            )
    builder.add(rec, where)
    return first_seen


def _readline(f: Any, path: Path, size: int = MAX_LINE_BYTES + 1) -> bytes:
    try:
        return f.readline(size)  # bounded: never a whole huge line
    except OSError as e:
        raise RecordsError(f"cannot read records file {path}: {e.strerror or e}.") from None


# The fast reader (`_read_chunks`) is used after a file's header; False reads every
# line the per-line way (`_read_per_line`), the reference the fast one matches.
_FAST_READ = True


def _read_lines(builder: _Builder, path: Path, f: Any) -> None:
    fast = _FAST_READ and _FAST_LAYOUT
    i, first_seen = _read_per_line(builder, path, f, until_header=fast)
    if not first_seen:
        builder.partial = True
        builder.notes.append(f"PARTIAL: {path} is empty (the process wrote nothing).")
        return
    if fast:
        _read_chunks(builder, path, f, i)


def _read_per_line(builder: _Builder, path: Path, f: Any, *, until_header: bool):
    """Lines one at a time, to the end (or only up to the header); `(lines read, header seen)`."""
    first_seen = False
    i = 0
    while not (until_header and first_seen):
        raw = _readline(f, path)
        if not raw:
            break
        i += 1
        first_seen = _one_line(builder, path, i, raw, first_seen)
    return i, first_seen


# ---------------------------------------------------------------- fast step lines
#
# After its header, a file is read in chunks of `_CHUNK_BYTES`, and the complete
# lines of each chunk are checked and parsed at once with NumPy (no Python loop
# per line). A line is taken as parsed when it is, byte for byte, the layout the
# runtime's writer produces (`jaxpace._records.write_jsonl` of a `step_record`:
# its keys in its order, no spaces):
#
#   {"type":"step","site":"S","step":I,"rank":I,"process":I,"device":I|null,
#    "arrive_ns":I,"done_ns":I,"wait_ns":I,"delay_ns":I,"engaged":true|false}
#
# S printable ASCII without `"` or `\` (at most 256 bytes), each I an integer as
# JSON writes it (`-?(0|[1-9][0-9]*)`, at most 18 digits: it fits in int64), and
# nothing else on the line (no "\r"). For such a line `json.loads` and
# `_Builder.add_step` give exactly these values and no error, so the columns are
# filled from the bytes directly. Every other line (blank, CRLF, reordered or
# extra keys, floats, NaN, escapes, non-ASCII, huge or cut short) goes through
# `_one_line`, in file order, with its messages unchanged.
#
# How a line is checked, from the positions of its "\n" and of its last nine
# commas (one before each key after the site): the prefix up to the site; the
# site's bytes; a quote right before the first of those commas; at each comma the
# key `,"name":`; between it and the next comma a number (digits, an optional
# "-"), `null` for the device; `true}` or `false}` up to the "\n". These pieces
# cover the line end to end, so a line that passes is the layout exactly.

_CHUNK_BYTES = 2 * 1024 * 1024
_BLOCK_LINES = 2048
_MAX_SITE_BYTES = 256
_MAX_DIGITS = 18
_PAD = _MAX_SITE_BYTES + 64  # spare bytes after a chunk: every gather stays inside

_STEP_TEMPLATE = step_record(
    site="", step=0, rank=0, process=0, arrive_ns=0, done_ns=0, delay_ns=0, engaged=False
)
_TAIL_KEYS = tuple(_STEP_TEMPLATE)[2:]  # after "type" and "site"
_INT_KEYS = _TAIL_KEYS[:-1]  # "device" may also be null; the last is "engaged"
_PREFIX = "".join(json.dumps(_STEP_TEMPLATE, separators=(",", ":")).partition('"site":"')[:2])
_PREFIX_B = _PREFIX.encode()  # b'{"type":"step","site":"'
# The layout above, as `step_record` writes it today; if it ever changes shape,
# every line is read the per-line way (tests/test_records_fast.py checks it holds).
_FAST_LAYOUT = (
    tuple(_STEP_TEMPLATE)[:2] == ("type", "site")
    and _PREFIX == '{"type":"step","site":"'
    and _TAIL_KEYS[-1] == "engaged"
    and sorted(_INT_KEYS) == sorted((*INT_STEP_FIELDS, "device"))
    and all(len(k) <= 12 for k in _TAIL_KEYS)
)
_DEVICE = _INT_KEYS.index("device") if "device" in _INT_KEYS else 0
_U = np.uint64


def _word(b: bytes) -> tuple[int, int]:
    """(value, mask) of up to 8 bytes as the little-endian uint64 read where they start."""
    return int.from_bytes(b.ljust(8, b"\0"), "little"), (1 << (8 * len(b))) - 1


_KEYS_B = [f',"{k}":'.encode() for k in _TAIL_KEYS]
_VALUE_OFF = np.array([len(k) for k in _KEYS_B], dtype=np.int64)[:, None]  # comma to value
# Each `,"name":` is checked as two words, its last 8 bytes and (longer ones) its first 8.
_KEY_LAST = np.array([_word(k[-8:])[0] for k in _KEYS_B], dtype=_U)[:, None]
_LONG = np.flatnonzero([len(k) > 8 for k in _KEYS_B])
_KEY_FIRST = np.array([_word(_KEYS_B[j][:8])[0] for j in _LONG], dtype=_U)[:, None]
_PREFIX_WORDS = np.array([_word(_PREFIX_B[j : j + 8])[0] for j in (0, 8, 15)], dtype=_U)
# _KEEP[k]: the top k bytes of a word (the last k characters before where it ends).
_KEEP = np.array([((1 << (8 * k)) - 1) << (64 - 8 * k) for k in range(9)], dtype=_U)
_W_NULL, _M4 = (_U(x) for x in _word(b"null"))
_W_TRUE = _U(_word(b"true")[0])
_W_FALSE, _M5 = (_U(x) for x in _word(b"false"))
_POW10 = (_U(1), _U(10**8), _U(10**16))
# SWAR steps turning 8 digit bytes into their value (D. Lemire's 8-digit parse).
_SWAR = (
    (_U(0x0F0F0F0F0F0F0F0F), _U(2561), _U(8)),
    (_U(0x00FF00FF00FF00FF), _U(6553601), _U(16)),
    (_U(0x0000FFFF0000FFFF), _U(42949672960001), _U(32)),
)
_SITE_BYTES = re.compile(rb"[\x20-\x21\x23-\x5b\x5d-\x7e]*")  # printable, no `"` or `\`


def _words(buf: bytes | bytearray) -> np.ndarray:
    """`out[i]`: the 8 bytes of `buf` from byte `i` as a little-endian uint64 (no copy)."""
    return np.ndarray(shape=(len(buf) - 7,), dtype="<u8", buffer=buf, strides=(1,))


def _digits8(x: np.ndarray) -> np.ndarray:
    """Values of words holding digits 0-9 (the first one in the lowest byte): SWAR, in place."""
    for mask, mul, shift in _SWAR:
        x &= mask
        x *= mul
        x >>= shift
    return x


def _parse_ints(
    arr: np.ndarray, words: np.ndarray, vs: np.ndarray, ve: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """JSON integers in byte spans `[vs, ve)` (fields x lines): (int64 values, valid).

    Valid: digits only, 1 to 18 of them, no leading zero (the sign is outside the
    span). A field reads as many 8-byte words as its longest value needs.
    """
    dl = ve - vs
    valid = (dl - 1).view(np.uint64) < _MAX_DIGITS  # 1 to 18 digits
    valid &= (arr[vs] != 48) | (dl == 1)  # no leading zero
    np.clip(dl, 0, _MAX_DIGITS, out=dl)
    longest = dl.max(axis=1)
    value = bad = None
    for j in range(3):
        rows = np.flatnonzero(longest > 8 * j)  # the fields with a value this long
        if not rows.size:
            break
        whole = rows.size == vs.shape[0]
        end = ve - 8 * (j + 1) if whole else ve[rows] - 8 * (j + 1)
        n_keep = dl - 8 * j if whole else dl[rows] - 8 * j
        np.clip(n_keep, 0, 8, out=n_keep)
        x = words[end]
        x ^= _U(0x3030303030303030)
        x &= _KEEP[n_keep]
        # A byte's top bit set in `y` where it was not a digit: >= 0x80 after the
        # xor, or >= 10 and so >= 0x80 once 0x76 is added (no carry out of a byte
        # below 0x80; a carry out of one above does not matter, it is flagged).
        y = x + _U(0x7676767676767676)
        y |= x
        d = _digits8(x)
        if j:
            d *= _POW10[j]
        if value is None or bad is None:
            if whole:
                value, bad = d, y
                continue
            value, bad = np.zeros(vs.shape, _U), np.zeros(vs.shape, _U)
        if whole:
            value += d
            bad |= y
        else:
            value[rows] += d
            bad[rows] |= y
    if value is None or bad is None:
        return np.zeros(vs.shape, np.int64), np.zeros(vs.shape, bool)
    bad &= _U(0x8080808080808080)
    valid &= bad == 0
    return value.view(np.int64), valid


def _fast_lines(
    buf: bytearray, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray, list[str]]:
    """Which lines `[starts, ends)` of `buf` (`ends` at each "\\n", the lines one
    after the other) have the writer's step layout.

    Returns:
      (fast, cols, site_code, sites): `fast` per line; `cols` the integer fields and
      `engaged` per line (meaningful where `fast`); `site_code` indexes `sites`.
    """
    n, nk = starts.shape[0], len(_TAIL_KEYS)
    arr = np.frombuffer(buf, dtype=np.uint8)
    words = _words(buf)
    lo = int(starts[0])
    commas = np.flatnonzero(arr[lo : ends[-1] + 1] == 44) + lo
    if commas.size < nk:
        return np.zeros(n, dtype=bool), {}, np.zeros(n, np.int64), []
    if commas.size % n == 0 and commas.size // n >= nk + 1:
        # Usually every line has as many commas (a line that has not fails below).
        tail = np.ascontiguousarray(commas.reshape(n, -1)[:, -nk:].T)
    else:
        last = np.searchsorted(commas, ends) - 1
        tail = commas[np.clip(last[None, :] - np.arange(nk - 1, -1, -1)[:, None], 0, None)]
    # Its last nine commas: `tail[k]` is the comma before key k (keys x lines).
    ok = words[starts] == _PREFIX_WORDS[0]
    for j, off in ((1, 8), (2, 15)):
        ok &= words[starts + off] == _PREFIX_WORDS[j]
    site_start = starts + len(_PREFIX_B)
    site_len = tail[0] - 1 - site_start
    ok &= (site_len >= 0) & (site_len <= _MAX_SITE_BYTES)
    ok &= arr[tail[0] - 1] == 34  # the site's closing quote right before its comma
    vs = tail + _VALUE_OFF  # where each value starts
    key = words[vs - 8] == _KEY_LAST
    key[_LONG] &= words[tail[_LONG]] == _KEY_FIRST
    ok &= key.all(axis=0)
    engaged, last_ok = _engaged(arr, words, vs[-1], ends)
    ok &= last_ok
    cols, valid = _values(arr, words, vs[:-1], tail[1:])
    ok &= valid
    cols["engaged"] = engaged
    site_code, sites = _site_codes(arr, words, site_start, site_len, ok)
    return ok, cols, site_code, sites


def _engaged(
    arr: np.ndarray, words: np.ndarray, vs: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The last value: (is `true`, is `true}` or `false}` right up to the "\\n")."""
    w = words[vs]
    n_left = ends - vs
    true = (n_left == 5) & ((w & _M4) == _W_TRUE)
    false = (n_left == 6) & ((w & _M5) == _W_FALSE)
    return true, (arr[ends - 1] == 125) & (true | false)


def _values(
    arr: np.ndarray, words: np.ndarray, vs: np.ndarray, ve: np.ndarray
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The integer fields in `[vs, ve)` (fields x lines): (columns, valid per line)."""
    neg = arr[vs] == 45  # "-"
    ints, valid = _parse_ints(arr, words, vs + neg, ve)
    dev = _DEVICE
    null = (ve[dev] - vs[dev] == 4) & ((words[vs[dev]] & _M4) == _W_NULL)
    if null.any():
        valid[dev] |= null
        ints[dev] = np.where(null, -1, ints[dev])
    if neg.any():
        np.negative(ints, out=ints, where=neg)
    ok = valid.all(axis=0)
    return dict(zip(_INT_KEYS, ints, strict=True)), ok


def _site_codes(
    arr: np.ndarray, words: np.ndarray, start: np.ndarray, length: np.ndarray, ok: np.ndarray
) -> tuple[np.ndarray, list[str]]:
    """Site strings of the `ok` lines: an index per line into a list of distinct sites.

    Clears `ok` of lines whose site is not printable ASCII without `"` or `\\`.
    """
    code = np.zeros(start.shape[0], dtype=np.int64)
    idx = np.flatnonzero(ok)
    if not idx.size:
        return code, []
    s0, l0 = int(start[idx[0]]), int(length[idx[0]])
    first = bytes(arr[s0 : s0 + l0])
    same = length[idx] == l0  # the usual case: one site, compared a word at a time
    for off in range(0, l0, 8):
        want, mask = (_U(x) for x in _word(first[off : off + 8]))
        same &= (words[start[idx] + off] & mask) == want
    if same.all():
        if not _SITE_BYTES.fullmatch(first):
            ok[idx] = False
            return code, []
        return code, [first.decode("ascii")]
    width = max(int(length[idx].max()), 1)
    rows = np.lib.stride_tricks.sliding_window_view(arr, width)[start[idx]]
    rows[np.arange(width) >= length[idx][:, None]] = 0  # 0 is not a site byte
    view = np.ascontiguousarray(rows).view(f"V{width}").ravel()
    _, first_at, inv = np.unique(view, return_index=True, return_inverse=True)
    inv = inv.ravel()
    sites = [bytes(arr[start[idx[i]] : start[idx[i]] + length[idx[i]]]) for i in first_at]
    good = np.array([bool(_SITE_BYTES.fullmatch(b)) for b in sites])
    ok[idx] = good[inv]
    code[idx] = inv
    return code, [b.decode("ascii") if g else "" for b, g in zip(sites, good, strict=True)]


def _read_chunks(builder: _Builder, path: Path, f: Any, i: int) -> None:
    """Reads the rest of `f` (after line `i`) a chunk at a time, fast lines at once."""
    cap = _CHUNK_BYTES
    if builder.buffer is None:  # one buffer for all files of a load
        builder.buffer = bytearray(cap + _PAD)
    buf = builder.buffer
    have = 0  # the start of a line at buf[:have], its end not read yet
    while True:
        got = _readinto(f, path, memoryview(buf)[have:cap])
        if not got:
            if have:  # a last line without "\n"
                _one_line(builder, path, i + 1, bytes(buf[:have]), True)
            return
        end = have + got
        k = buf.rfind(b"\n", have, end)
        if k < 0 and end < cap:
            have = end
            continue
        if k < 0:  # a line longer than a chunk: its rest the bounded per-line way
            i += 1
            rest = _readline(f, path, MAX_LINE_BYTES + 1 - end)
            if end + len(rest) > MAX_LINE_BYTES:
                raise _too_long(f"{path}:{i}")
            _one_line(builder, path, i, bytes(buf[:end]) + rest, True)
            have = 0
            continue
        i = _read_block(builder, path, buf, k + 1, i)
        buf[: end - k - 1] = buf[k + 1 : end]
        have = end - k - 1


def _readinto(f: Any, path: Path, view: memoryview) -> int:
    try:
        with view:
            return f.readinto(view) or 0
    except OSError as e:
        raise RecordsError(f"cannot read records file {path}: {e.strerror or e}.") from None


def _read_block(builder: _Builder, path: Path, buf: bytearray, size: int, i: int) -> int:
    """Reads the complete lines `buf[:size]` (lines `i + 1`, ...); returns the last number.

    The lines go to `_fast_lines` `_BLOCK_LINES` at a time: its per-line arrays stay
    small enough to be reused by the allocator (larger ones cost page faults).
    """
    ends = np.flatnonzero(np.frombuffer(buf, dtype=np.uint8, count=size) == 10)
    starts = np.concatenate([[0], ends[:-1] + 1])
    for a in range(0, ends.size, _BLOCK_LINES):
        b = min(a + _BLOCK_LINES, ends.size)
        _read_some(builder, path, buf, starts[a:b], ends[a:b], i + a)
    return i + ends.size


def _read_some(
    builder: _Builder, path: Path, buf: bytearray, starts: np.ndarray, ends: np.ndarray, i: int
) -> None:
    """Lines `[starts, ends]` of `buf` (numbers `i + 1`, ...): fast ones at once, the
    others one at a time, in file order."""
    fast, cols, site_code, sites = _fast_lines(buf, starts, ends)
    fast &= ends - starts < MAX_LINE_BYTES  # (fast lines are short; for a lower cap)
    slow = np.flatnonzero(~fast)
    if slow.size > 32 and slow.size * 8 > ends.size:  # mostly other lines: one at a time
        slow = np.arange(ends.size)
    done = 0
    for j in [*slow.tolist(), ends.size]:
        if j > done:
            _add_fast(builder, path, i + done, cols, site_code, sites, done, j)
        if j < ends.size:
            _one_line(builder, path, i + j + 1, bytes(buf[starts[j] : ends[j] + 1]), True)
        done = j + 1


def _add_fast(
    builder: _Builder,
    path: Path,
    i: int,
    cols: dict[str, np.ndarray],
    site_code: np.ndarray,
    sites: list[str],
    lo: int,
    hi: int,
) -> None:
    """Adds fast lines `lo:hi` of a block (line numbers `i + 1`, ...) to `builder`."""
    keep = (cols["wait_ns"][lo:hi] >= 0) & (cols["delay_ns"][lo:hi] >= 0)
    names = (*INT_STEP_FIELDS, "engaged", "device")
    if keep.all():  # the usual case: slices, no copies
        out = {k: cols[k][lo:hi] for k in names}
        code = site_code[lo:hi]
    else:
        # As `add_step`: dropped, counted, the first one named.
        if builder.negative_first is None:
            builder.negative_first = f"{path}:{i + 1 + int(np.argmin(keep))}"
        builder.negative += int((~keep).sum())
        out = {k: cols[k][lo:hi][keep] for k in names}
        code = site_code[lo:hi][keep]
    if len(sites) == 1:
        if code.size:
            index = builder.site_index.setdefault(sites[0], len(builder.site_index))
            out["site"] = np.full(code.size, index, dtype=np.int64)
        else:
            out["site"] = code
    else:
        lut = np.zeros(max(len(sites), 1), dtype=np.int64)
        for s in np.unique(code).tolist():
            lut[s] = builder.site_index.setdefault(sites[s], len(builder.site_index))
        out["site"] = lut[code]
    builder.add_columns(out)


def find_runs(directory: str | os.PathLike, max_depth: int = 3) -> list[Path]:
    """Subdirectories of `directory` (up to `max_depth` levels down) holding `*.jsonl` files.

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
                (found if any(sub.glob(RECORDS_GLOB)) else nxt).append(sub)
        level = nxt
    return sorted(found)


def _no_records_message(path: Path) -> str:
    runs = find_runs(path)
    if not runs:
        return (
            f"no `*.jsonl` records files in directory {path}. Expected the files "
            "`Pacer.export` writes (`records-p0.jsonl`, ...)."
        )
    listed = "\n".join(f"  jaxpace report {r}" for r in runs)
    return (
        f"{path} has no records files itself but holds {len(runs)} runs; report one of "
        f"them:\n{listed}"
    )


# No step line is shorter (every required field, no spaces): files of N bytes hold
# at most N / this many records, which sizes the columns once.
_MIN_STEP_LINE_BYTES = 100


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # reading it says what is wrong
        return 0


def load_records(
    source: str | os.PathLike | Iterable[Mapping[str, Any]] | Records,
) -> Records:
    """Reads timing records from a JSONL file, a run directory, or a list of dicts.

    A directory contributes every `*.jsonl` file in it (one per process). A last
    line cut short (a killed process) is skipped and the result marked
    `partial`; so is a run whose headers announce more processes than have
    files. Anything else malformed raises.

    Args:
      source: a path to one JSONL file or a directory of them; or an iterable
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
    builder = _Builder()
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        if path.is_dir():
            files = sorted(path.glob(RECORDS_GLOB))
            if not files:
                raise RecordsError(_no_records_message(path))
        elif path.is_file() or os.path.lexists(path):
            files = [path]  # anything but a regular file is refused when opened
        else:
            raise RecordsError(
                f"records path {path} does not exist; pass a run directory or a JSONL file."
            )
        builder.expected_rows = sum(_size(f) for f in files) // _MIN_STEP_LINE_BYTES + 1
        for f in files:
            _read_file(builder, f)
        return builder.build(require_headers=True)
    if isinstance(source, Mapping) or not isinstance(source, Iterable):
        raise RecordsError(
            f"cannot read records from a {type(source).__name__}; pass a path, a run "
            "directory, or a list of record dicts."
        )
    builder.sources.append("<memory>")
    for i, rec in enumerate(source):
        builder.add(rec, f"<memory>[{i}]")
    return builder.build(require_headers=False)
