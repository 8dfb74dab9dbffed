"""A stall record on disk: `stall-p{i}.json` (written atomically) with every thread's stack."""

from __future__ import annotations

import faulthandler
import json
import os
import tempfile

from jaxpace.records.safe_io import write_atomic

__all__ = ["stacks", "stall_filename", "write"]


def stall_filename(process_index: int) -> str:
    return f"stall-p{process_index}.json"


def write(directory: str, process_index: int, rec: dict) -> str:
    """Writes `rec` as `stall-p{process_index}.json` in `directory` (created); returns the path.

    Through `safe_io.write_atomic` (a temporary file, then one rename; a
    symlink or special file there is refused). Raises `OSError` when it cannot write.
    """
    path = os.path.join(directory, stall_filename(process_index))
    return write_atomic(
        path, lambda f: json.dump(rec, f, indent=1), what="stall record", make_parents=True
    )


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
