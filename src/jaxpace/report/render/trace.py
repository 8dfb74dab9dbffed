"""The report's Perfetto trace: a `Report`'s per-step data, or records, through the one
writer (`jaxpace.records.perfetto`)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from jaxpace.records import perfetto
from jaxpace.records.reader import Records
from jaxpace.report.model import Report

__all__ = ["write_trace"]


def write_trace(
    records_or_report: Report | Records | str | os.PathLike | Iterable[Mapping[str, Any]],
    path: str | os.PathLike,
    *,
    site: str | None = None,
    max_steps: int | None = None,
) -> Path:
    """Writes a Perfetto / Chrome trace-event JSON, one track per rank
    (`jaxpace.records.perfetto.write_trace` says how it is laid out).

    Args:
      records_or_report: a `Report` (uses its site, the whole step by default) or
        anything `load_records` reads.
      path: output file.
      site: site to draw (records input only; default: the one with most records).
      max_steps: draw at most this many steps (the first ones).

    Returns:
      The path written.
    """
    if isinstance(records_or_report, Report):
        data = records_or_report.data
        if data is None:
            raise ValueError("this `Report` has no per-step data (was it loaded from JSON?).")
        return perfetto.write_site_trace(data, records_or_report.site, path, max_steps=max_steps)
    return perfetto.write_trace(records_or_report, path, site=site, max_steps=max_steps)
