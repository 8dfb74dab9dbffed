"""jaxpace's own records (`records-p*.jsonl`, docs/records.md): the existing reader."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from jaxpace.records.reader import Records, load_records
from jaxpace.records.sources.common import Loaded

__all__ = ["load"]


def load(source: Records | str | os.PathLike | Iterable[Mapping[str, Any]]) -> Loaded:
    """`load_records(source)`, labelled as jaxpace records.

    `Records` that another source made (`Loaded.records`) keep that source's label
    and timing (their headers carry `source_label` and `timed`).
    """
    recs = load_records(source)
    first = recs.headers[0] if recs.headers else {}
    if "source_label" in first:
        timed = all(h.get("timed", True) is not False for h in recs.headers)
        return Loaded(recs, str(first["source_label"]), timed=timed)
    return Loaded(recs, "jaxpace records", timed=True)
