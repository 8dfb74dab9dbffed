"""Stall records (`stall-p{i}.json`, written by the stall watchdog): found, summarized, shown first.

Reads files only; no runtime import (the watchdog writes them, see
docs/troubleshooting.md, "My job hangs").
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from jaxpace.records.safe_io import read_capped

__all__ = ["format_stalls", "load_stalls"]

# A stall record holds one message and the stacks of every thread (faulthandler
# text, tens of KiB for hundreds of threads); a larger file is not one.
MAX_STALL_BYTES = 16 * 1024 * 1024

_NAME = re.compile(r"^stall-p(\d+)\.json$")


def load_stalls(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every readable `stall-p*.json` in `run_dir` (or next to a records file), by process.

    Raises:
      RecordsError: a stall file is not a regular file (a FIFO, a device, also
        through a symlink) or is larger than `MAX_STALL_BYTES`.

    >>> load_stalls("/nonexistent")
    []
    """
    base = Path(run_dir)
    d = base if base.is_dir() else base.parent
    out = []
    try:
        paths = sorted(d.glob("stall-p*.json"), key=lambda p: int(_NAME.match(p.name).group(1)))
    except (OSError, AttributeError):
        return []
    for p in paths:
        # A FIFO, a device (a symlink to /dev/zero) or an oversized file raises
        # RecordsError; a half-written one is skipped.
        data = read_capped(p, "stall record", MAX_STALL_BYTES)
        try:
            rec = json.loads(data.decode("utf-8", errors="replace"))
        except (ValueError, RecursionError):
            continue
        if isinstance(rec, dict) and rec.get("type") == "stall":
            rec.setdefault("path", str(p))
            out.append(rec)
    return out


def format_stalls(stalls: list[dict[str, Any]]) -> str:
    """The lines `jaxpace report` prints before everything else ("" when there are none).

    >>> print(format_stalls([{"process_index": 0, "role": "stalled", "message": "jaxpace: stalled 3.1 s at s step 20; ..."},
    ...                      {"process_index": 1, "role": "answered", "entry": {"site": "s", "step": 19, "state": "left"}, "stacks": 'File "t.py", line 9 in load'}]))
    STALLED: this run hung; the stall watchdog's records come first.
      process 0: jaxpace: stalled 3.1 s at s step 20; ...
      process 1 (answered): last after s step 19; its innermost frame: File "t.py", line 9 in load
      stacks of every thread: stall-p{i}.json ("stacks")
    """
    if not stalls:
        return ""
    lines = ["STALLED: this run hung; the stall watchdog's records come first."]
    for r in stalls:
        p = r.get("process_index")
        if r.get("role") == "stalled":
            lines.append(f"  process {p}: {r.get('message')}")
        else:
            e = r.get("entry") or {}
            verb = "inside" if e.get("state") == "in" else "after"
            where = f"{verb} {e.get('site')} step {e.get('step')}" if e.get("site") else "none"
            frame = _main_frame(r.get("stacks") or "")
            lines.append(
                f"  process {p} (answered): last {where}"
                + (f"; its innermost frame: {frame}" if frame else "")
            )
    lines.append('  stacks of every thread: stall-p{i}.json ("stacks")')
    return "\n".join(lines)


def _main_frame(stacks: str) -> str:
    """The innermost frame of the main thread in faulthandler text (first `File` line after it)."""
    block = stacks
    if "(most recent call first)" in stacks:
        # faulthandler lists each thread, innermost frame first; the main thread is the
        # one whose outermost frame is <module>.
        for chunk in re.split(r"\n(?=(?:Current thread|Thread) 0x)", stacks):
            if "<module>" in chunk:
                block = chunk
                break
    for line in block.splitlines():
        if line.strip().startswith("File "):
            return line.strip()
    return ""
