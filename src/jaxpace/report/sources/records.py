"""jaxpace's own records (`records-p*.jsonl`, docs/records.md): the existing reader."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from jaxpace.report.records import Records, load_records
from jaxpace.report.sources._common import Loaded

__all__ = ["load"]


def load(source: Records | str | os.PathLike | Iterable[Mapping[str, Any]]) -> Loaded:
    """`load_records(source)`, labelled as jaxpace records."""
    recs = load_records(source)
    label = "jaxpace records"
    if recs.sources and recs.sources != ("<memory>",):
        label += f": {len(recs.sources)} files"
    return Loaded(recs, label, timed=True)
