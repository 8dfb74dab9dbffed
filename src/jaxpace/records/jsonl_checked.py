"""The careful JSONL reader: one records file a line at a time, every value checked.

The engine (`jaxpace.records.engine`) reads JSONL records with DuckDB's
`read_json`, which fails a whole query at a cut line or `Infinity` and casts
`1.5`, `1e3` or `"3"` to an integer silently; a file it cannot read cleanly comes
here instead. Each line is parsed with `json` and checked against docs/records.md:
a line that is not JSON, lacks a field, or holds a value of the wrong kind (a
float, a string or a bool where an integer belongs, `NaN`, `Infinity`) is dropped,
counted and located (`file:line: why`); an integer beyond the int64 range and a
negative duration likewise, each counted on its own; a last line cut short (a
process killed while writing) is skipped and noted. The first line must be the
header. Files are opened with `safe_io.open_regular` (regular files only, never
blocking in `open()`) and lines are read bounded (`MAX_LINE_BYTES`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from jaxpace.errors import RecordsError
from jaxpace.records.format import INT_STEP_FIELDS, NO_EXECUTION
from jaxpace.records.safe_io import open_regular

__all__ = [
    "MAX_ABS_INT",
    "MAX_LINE_BYTES",
    "CheckedFile",
    "Drops",
    "ends_with_newline",
    "first_line",
    "read_checked",
]

# Longest records line accepted. A step line is ~200 bytes and a header with
# rank groups for 1024 ranks well under 1 MiB; a longer line is not a records
# line, and it is refused after reading at most this much of it.
MAX_LINE_BYTES = 8 * 1024 * 1024

# An integer field of a step record lies strictly inside (-2^63, 2^63) (int64 without its
# minimum, whose negation wraps); a record with one outside is dropped, counted, located.
MAX_ABS_INT = 1 << 63

# How many dropped lines are named (`file:line: why`) in the notes.
_EXAMPLES = 3


@dataclasses.dataclass
class Drops:
    """Step lines dropped while reading, counted and located.

    Attributes:
      bad: lines with a bad value (not JSON, a missing field, a value of the wrong
        kind); `bad_examples` the first few as `file:line: why`.
      huge: step records with an integer beyond the int64 range; `huge_first` where.
      negative: step records with a negative `wait_ns` or `delay_ns`; `negative_first`.
      cut: `file:line` of each last line cut short (skipped).
      empty: files with no line at all.
    """

    bad: int = 0
    bad_examples: list[str] = dataclasses.field(default_factory=list)
    huge: int = 0
    huge_first: str | None = None
    negative: int = 0
    negative_first: str | None = None
    cut: list[str] = dataclasses.field(default_factory=list)
    empty: list[str] = dataclasses.field(default_factory=list)

    def add_bad(self, where: str, why: str) -> None:
        self.bad += 1
        if len(self.bad_examples) < _EXAMPLES:
            self.bad_examples.append(f"{where}: {why}")

    def merge(self, other: Drops) -> None:
        self.bad += other.bad
        self.bad_examples = (self.bad_examples + other.bad_examples)[:_EXAMPLES]
        self.huge += other.huge
        self.huge_first = self.huge_first or other.huge_first
        self.negative += other.negative
        self.negative_first = self.negative_first or other.negative_first
        self.cut += other.cut
        self.empty += other.empty

    def any(self) -> bool:
        return bool(self.bad or self.huge or self.negative or self.cut or self.empty)

    def notes(self) -> list[str]:
        """`PARTIAL:` notes for what was dropped (none when nothing was)."""
        out = []
        if self.bad:
            more = "; ..." if self.bad > len(self.bad_examples) else ""
            out.append(
                f"PARTIAL: {self.bad} step line(s) with a bad value dropped ("
                + "; ".join(self.bad_examples)
                + more
                + "); records lines hold the fields of docs/records.md, integers as integers."
            )
        if self.huge:
            out.append(
                f"PARTIAL: skipped {self.huge} step record(s) with an integer beyond the int64 "
                f"range (first at {self.huge_first}): no clock or duration in nanoseconds is "
                "that large (292 years), so these are corrupt."
            )
        if self.negative:
            out.append(
                f"PARTIAL: skipped {self.negative} step record(s) with a negative `wait_ns` "
                f"or `delay_ns` (first at {self.negative_first}): durations cannot be "
                "negative, so these came from a clock that went backwards or an edited "
                "file and are not trusted."
            )
        for where in self.cut:
            out.append(
                f"PARTIAL: {where}: last line is cut short (the process was probably "
                "killed while writing); skipped it."
            )
        for path in self.empty:
            out.append(f"PARTIAL: {path} is empty (the process wrote nothing).")
        return out


@dataclasses.dataclass
class CheckedFile:
    """One file read the careful way: its header (None when empty), its step columns
    (`site` as strings, the integer fields, `engaged`, `device` with -1 for none) and
    what was dropped."""

    header: dict[str, Any] | None
    header_where: str
    columns: dict[str, np.ndarray]
    drops: Drops


def _too_long(where: str) -> RecordsError:
    return RecordsError(
        f"{where}: line is longer than {MAX_LINE_BYTES // (1024 * 1024)} MiB; records "
        "lines are short JSON objects (docs/records.md). This is not a jaxpace records "
        "file, or it is corrupt; remove that line or point at the run's own files."
    )


def _readline(f: Any, path: Path) -> bytes:
    try:
        return f.readline(MAX_LINE_BYTES + 1)  # bounded: never a whole huge line
    except OSError as e:
        raise RecordsError(f"cannot read records file {path}: {e.strerror or e}.") from None


def _parse_header(raw: bytes, where: str) -> dict[str, Any]:
    try:
        rec = json.loads(raw.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
        rec = None
    if not (isinstance(rec, Mapping) and rec.get("type") == "header"):
        raise RecordsError(
            f'{where}: first line is not a header (`"type": "header"`); this does '
            "not look like a jaxpace records file (docs/records.md)."
        )
    return dict(rec)


def ends_with_newline(path: Path) -> bool:
    """Whether the file's last byte is a newline (a file cut short mid-line is not)."""
    with open_regular(path, "records file") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() == 0:
            return True
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def first_line(path: Path) -> tuple[dict[str, Any] | None, str, int]:
    """`(header, where, line)` of a JSONL records file: its first non-blank line, which
    must be the header (else a `RecordsError` naming it); `(None, path, 0)` when the file
    has no line. Opening it refuses anything but a regular file."""
    with open_regular(path, "records file") as f:
        i = 0
        while True:
            raw = _readline(f, path)
            if not raw:
                return None, str(path), 0
            i += 1
            if len(raw) > MAX_LINE_BYTES:
                raise _too_long(f"{path}:{i}")
            if raw.strip():
                where = f"{path}:{i}"
                return _parse_header(raw, where), where, i


def _int_ok(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _why_bad(rec: Any) -> str | None:
    """Why a parsed line is not a valid step record (None when it is one)."""
    if not isinstance(rec, Mapping):
        return f"a JSON {type(rec).__name__}, not an object"
    kind = rec.get("type")
    if kind == "header":
        return "a second header"
    if kind != "step":
        return f"unknown record `type` {kind!r}"
    missing = [k for k in ("site", *INT_STEP_FIELDS, "engaged") if k not in rec]
    if missing:
        return f"lacks {', '.join(f'`{k}`' for k in missing)}"
    for k in INT_STEP_FIELDS:
        if not _int_ok(rec[k]):
            return f"`{k}` must be an integer, got {str(rec[k])[:24]}"
    if not isinstance(rec["site"], str):
        return f"`site` must be a string, got {str(rec['site'])[:24]}"
    if not isinstance(rec["engaged"], bool):
        return f"`engaged` must be true or false, got {str(rec['engaged'])[:24]}"
    dev = rec.get("device")
    if dev is not None and not _int_ok(dev):
        return f"`device` must be an integer or null, got {str(dev)[:24]}"
    ex = rec.get("execution")
    if ex is not None and not _int_ok(ex):
        return f"`execution` must be an integer or null, got {str(ex)[:24]}"
    return None


def _add_step(rec: Mapping[str, Any], where: str, cols: dict[str, list], drops: Drops) -> None:
    why = _why_bad(rec)
    if why is not None:
        drops.add_bad(where, why)
        return
    dev = rec.get("device")
    ex = rec.get("execution")
    if any(not -MAX_ABS_INT < rec[k] < MAX_ABS_INT for k in INT_STEP_FIELDS) or any(
        v is not None and not -MAX_ABS_INT < v < MAX_ABS_INT for v in (dev, ex)
    ):
        drops.huge += 1
        drops.huge_first = drops.huge_first or where
        return
    if rec["wait_ns"] < 0 or rec["delay_ns"] < 0:
        drops.negative += 1
        drops.negative_first = drops.negative_first or where
        return
    cols["site"].append(rec["site"])
    for k in INT_STEP_FIELDS:
        cols[k].append(rec[k])
    cols["engaged"].append(rec["engaged"])
    cols["device"].append(-1 if dev is None else dev)
    cols["execution"].append(NO_EXECUTION if ex is None else ex)


def read_checked(path: Path) -> CheckedFile:
    """Reads one JSONL records file a line at a time, every value checked (the module's
    docstring); raises `RecordsError` only for a file that is not records at all (no
    header first, a line longer than `MAX_LINE_BYTES`, not a regular file)."""
    header, header_where, at = first_line(path)
    drops = Drops()
    cols: dict[str, list] = {
        k: [] for k in ("site", *INT_STEP_FIELDS, "engaged", "device", "execution")
    }
    if header is None:
        drops.empty.append(str(path))
    else:
        with open_regular(path, "records file") as f:
            for _ in range(at):
                _readline(f, path)
            i = at
            while raw := _readline(f, path):
                i += 1
                where = f"{path}:{i}"
                if len(raw) > MAX_LINE_BYTES:
                    raise _too_long(where)
                if not raw.strip():
                    continue
                try:
                    rec = json.loads(raw.decode("utf-8", errors="replace"))
                except RecursionError:
                    drops.add_bad(where, "JSON nested too deeply")
                    continue
                except ValueError:
                    if not raw.endswith(b"\n"):  # only the last line can lack it: cut short
                        drops.cut.append(where)
                    else:
                        drops.add_bad(where, "not JSON")
                    continue
                _add_step(rec, where, cols, drops)
    columns = {
        k: np.asarray(v, dtype=object if k == "site" else bool if k == "engaged" else np.int64)
        for k, v in cols.items()
    }
    return CheckedFile(header, header_where, columns, drops)
