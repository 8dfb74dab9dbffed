"""What the source readers share: `Loaded`, the bad-input tally, lines read in bounded
chunks, and the step to the columnar `Records` every stage reads."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from jaxpace.records.reader import Records

__all__ = ["MAX_LINE_BYTES", "Loaded", "Tally", "blocks", "make_records"]

# A line longer than this is not a record of any source (Inspector lines are
# 200-500 bytes, 2-3 KB with per-channel kernel times): it is skipped, never held.
MAX_LINE_BYTES = 1 << 20
_CHUNK_BYTES = 4 << 20


@dataclasses.dataclass(frozen=True)
class Loaded:
    """One source's timings as `Records`, and where they came from.

    Attributes:
      records: the columnar records every stage reads (`arrive_ns`/`done_ns` on
        each process's own clock; `wait_ns` the time inside the collective): `Records`
        from `load`, `records.by_site.SiteRecords` (one site at a time) from
        `load_by_site`.
      source: one line for the report's header: the kind of input and its files.
      timed: whether `arrive_ns`/`done_ns` are timestamps; without them compute
        and step time are unknown and only the time inside each collective counts.
    """

    records: Records
    source: str
    timed: bool = True


class Tally:
    """Counts bad input lines and keeps the first few as `file:line: why` examples."""

    def __init__(self, keep: int = 3) -> None:
        self.count = 0
        self.examples: list[str] = []
        self.keep = keep

    def bad(self, path: Path, line: int, why: str) -> None:
        self.count += 1
        if len(self.examples) < self.keep:
            self.examples.append(f"{path}:{line}: {why}")

    def note(self, what: str) -> str | None:
        """`N WHAT skipped (e.g. file:line: why; ...)`, or None when there were none."""
        if not self.count:
            return None
        more = "; ..." if self.count > len(self.examples) else ""
        return f"{self.count} {what} skipped (" + "; ".join(self.examples) + more + ")."


def blocks(f: BinaryIO, path: Path, tally: Tally) -> Iterator[tuple[int, bytes, bool]]:
    """(number of its first line, complete lines ending in a newline, True) per chunk of
    a file, then (number, the last line, False) when the file does not end in a
    newline. Memory stays bounded whatever the file holds: a line over
    `MAX_LINE_BYTES` is counted in `tally` and skipped."""
    carry = b""
    number = 1
    skipping = False
    while chunk := f.read(_CHUNK_BYTES):
        data = carry + chunk
        cut = data.rfind(b"\n") + 1
        block, carry = data[:cut], data[cut:]
        if skipping and block:  # the rest of an over-long line
            first = block.index(b"\n") + 1
            block, skipping = block[first:], False
            number += 1
        if block:
            yield number, block, True
            number += block.count(b"\n")
        if len(carry) > MAX_LINE_BYTES:
            if not skipping:
                tally.bad(path, number, f"line longer than {MAX_LINE_BYTES} bytes")
            skipping, carry = True, b""
    if carry and not skipping:
        yield number, carry, False


def make_records(
    columns: dict[str, np.ndarray],
    sites: list[str],
    hosts: list[str],
    *,
    notes: list[str],
    partial: bool,
    files: list[Path],
    run_id: str | None = None,
    site_info: dict[str, dict[str, Any]] | None = None,
    **header: Any,
) -> Records:
    """`Records` of one run from its step columns and per-process hosts.

    `columns` holds `site` (index into `sites`), `step`, `rank`, `process`,
    `device` (-1 if unknown), `arrive_ns`, `done_ns` and `wait_ns`; the
    pacing columns (`delay_ns`, `engaged`) are zero: nothing was paced. `site_info`
    becomes the headers' `sites` (docs/records.md: what the source says of each site).
    """
    if site_info:
        header = {**header, "sites": site_info}
    n = columns["step"].shape[0]
    cols = {k: np.ascontiguousarray(v, dtype=np.int64) for k, v in columns.items()}
    cols["delay_ns"] = np.zeros(n, np.int64)
    cols["engaged"] = np.zeros(n, bool)
    headers = tuple(
        {
            "type": "header",
            "run_id": run_id,
            "process_index": p,
            "process_count": len(hosts),
            "host": h,
            **header,
        }
        for p, h in enumerate(hosts)
    )
    return Records(
        headers=headers,
        sites=tuple(sites),
        columns=cols,
        run_id=run_id,
        process_count=len(hosts),
        granularity="device",
        partial=partial,
        notes=tuple(notes),
        sources=tuple(str(f) for f in files),
    )
