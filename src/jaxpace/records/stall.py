"""A stall record on disk: `stall-p{i}.json` (written atomically) with every thread's stack."""

from __future__ import annotations

import faulthandler
import json
import os
import tempfile

__all__ = ["stacks", "stall_filename", "write"]


def stall_filename(process_index: int) -> str:
    return f"stall-p{process_index}.json"


def write(directory: str, process_index: int, rec: dict) -> str:
    """Writes `rec` as `stall-p{process_index}.json` in `directory` (created); returns the path.

    Atomic (a temporary file, then one rename). Raises `OSError` when it cannot write.
    """
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, stall_filename(process_index))
    fd, tmp = tempfile.mkstemp(prefix=".stall-", dir=directory)
    with os.fdopen(fd, "w") as f:
        json.dump(rec, f, indent=1)
    os.replace(tmp, path)
    return path


def stacks() -> str:
    """Every thread's Python stack in this process (faulthandler's text)."""
    try:
        with tempfile.TemporaryFile(mode="w+") as f:
            faulthandler.dump_traceback(file=f, all_threads=True)
            f.flush()
            f.seek(0)
            return f.read()
    except Exception as e:  # noqa: BLE001
        return f"(stack dump failed: {e!r})"
