"""jaxpace's own records (`records-p*.parquet`, or `.jsonl` on request; docs/records.md), and records other readers made."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from typing import Any

from jaxpace.records.by_site import SiteRecords, open_run
from jaxpace.records.reader import Records, load_records
from jaxpace.records.sources.common import Loaded

__all__ = ["CONVERTED_SOURCES", "load", "load_by_site"]

# The `source` header values of records that another source's reader made (`Loaded.records`,
# or `jaxpace convert`'s files): only theirs say `source_label` and `timed`.
CONVERTED_SOURCES = ("nccl_inspector", "xprof", "watch")


def load(source: Records | str | os.PathLike | Iterable[Mapping[str, Any]]) -> Loaded:
    """`load_records(source)`, labelled as jaxpace records.

    `Records` that another source made (`Loaded.records`, or files `jaxpace convert`
    wrote from them) keep that source's label and timing (their headers carry `source`,
    `source_label` and `timed`); in any other records these fields are ignored, noted.
    """
    return _labelled(load_records(source))


def load_by_site(path: str | os.PathLike) -> Loaded:
    """`load` of a records path, read one site at a time (`records.by_site.open_run`):
    `Loaded.records` is `SiteRecords`."""
    return _labelled(open_run(path))


def _renote(recs: Records | SiteRecords, notes: tuple[str, ...], partial: bool):
    if isinstance(recs, SiteRecords):
        return recs.with_notes(notes, partial)
    return dataclasses.replace(recs, notes=notes, partial=partial)


def _labelled(recs: Records | SiteRecords) -> Loaded:
    """`recs` labelled as jaxpace records, or as the source they were converted from."""
    first = recs.headers[0] if recs.headers else {}
    if first.get("source") in CONVERTED_SOURCES and "source_label" in first:
        timed = all(h.get("timed", True) is not False for h in recs.headers)
        kept = first.get("source_notes")  # `jaxpace convert`: the source reader's notes
        if isinstance(kept, list) and all(isinstance(n, str) for n in kept):
            recs = _renote(
                recs, (*kept, *recs.notes), recs.partial or first.get("source_partial") is True
            )
        return Loaded(recs, str(first["source_label"]), timed=timed)
    odd = sorted({k for h in recs.headers for k in ("source_label", "timed") if k in h})
    if odd:
        # Not a converted source: jaxpace's own records, whatever these fields say.
        note = (
            f"header field(s) {', '.join(f'`{k}`' for k in odd)} ignored: they are read only "
            "from records converted from another source (`source` "
            f"{' or '.join(f'`{s}`' for s in CONVERTED_SOURCES)}); these are jaxpace's own "
            "records, read as such."
        )
        recs = _renote(recs, (*recs.notes, note), recs.partial)
    return Loaded(recs, "jaxpace records", timed=True)
