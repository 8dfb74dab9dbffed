"""What watch keeps on disk under `out=`: the verdict (JSON) and the last windows (records).

One small home for the on-disk form, so the format can change in one place:
`store_windows` writes the last `KEEP_WINDOWS` windows' combined records as
one run in the native records format (Parquet, `records-p*.parquet`); `write_verdict` writes
the current verdict and the last ones. Every file goes through the one atomic writer
(`jaxpace.records.safe_io.write_atomic`: a temporary file and a rename beside it; symlinks
and special files refused).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jaxpace.records.format import FORMAT_VERSION, write_jsonl
from jaxpace.records.reader import Records
from jaxpace.records.safe_io import write_atomic

__all__ = [
    "HISTORY_FILE",
    "KEEP_WINDOWS",
    "VERDICT_FILE",
    "store_windows",
    "write_verdict",
]

KEEP_WINDOWS = 16  # windows kept under `out=/windows/`
VERDICT_FILE = "verdict.json"
HISTORY_FILE = "verdicts.ndjson"


def write_verdict(out: str | os.PathLike, verdicts: Sequence[dict[str, Any]]) -> Path:
    """`out/verdict.json`: the newest verdict; `out/verdicts.ndjson`: the last ones, one a
    line, oldest first. Each replaced atomically. Returns the verdict's path."""
    path = Path(out) / VERDICT_FILE
    write_jsonl(Path(out) / HISTORY_FILE, verdicts)
    text = json.dumps(verdicts[-1], indent=1, sort_keys=True) + "\n"
    write_atomic(path, text, what="watch verdict", make_parents=True)
    return path


def store_windows(out: str | os.PathLike, windows: Sequence[Records], *, run_id: str) -> Path:
    """Keeps the last windows (every process, steps = the wrapper's call indices, so
    windows keep their gaps) as one run in the native records format,
    `out/windows/records-p*.parquet`, rewritten after each window: `jaxpace report
    OUT/windows` reads them as one run with the job's real processes.
    Returns the folder."""
    from jaxpace.watch.summary import merge

    recs = merge(list(windows), run_id=run_id)
    headers = tuple({**h, "format": FORMAT_VERSION} for h in recs.headers)
    folder = Path(out) / "windows"
    dataclasses.replace(recs, headers=headers).write_parquet(folder)
    return folder
