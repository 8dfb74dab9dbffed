"""The records format (docs/records.md): one home for its version, file names and dicts.

The runtime writes records with these functions, the report reads them, and
the simulator and the synthetic generator produce them, so all four agree.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "FORMAT_VERSION",
    "INT_STEP_FIELDS",
    "REQUIRED_STEP_FIELDS",
    "RECORDS_GLOB",
    "check_replaceable",
    "header_record",
    "make_dirs",
    "records_filename",
    "step_record",
    "write_jsonl",
]

FORMAT_VERSION = 1

# Integer fields of a step record; with `site` and `engaged` they are required.
INT_STEP_FIELDS = ("step", "rank", "process", "arrive_ns", "done_ns", "wait_ns", "delay_ns")
REQUIRED_STEP_FIELDS = ("site", *INT_STEP_FIELDS, "engaged")
RECORDS_GLOB = "*.jsonl"


def records_filename(process_index: int) -> str:
    """`records-p{process_index}.jsonl`, the file one process writes."""
    return f"records-p{int(process_index)}.jsonl"


def header_record(
    *,
    run_id: str,
    process_index: int,
    process_count: int,
    host: str,
    pid: int,
    granularity: str,
    jaxpace_version: str,
    policy: str,
    local_devices: list[int],
    rank_groups: Mapping[str, Mapping[Any, Any]] | None,
    **extra: Any,
) -> dict[str, Any]:
    """The first line of every records file (docs/records.md, "header")."""
    topology = None
    if rank_groups is not None:
        topology = {
            "rank_groups": {
                str(kind): {str(r): str(v) for r, v in mapping.items()}
                for kind, mapping in rank_groups.items()
            }
        }
    return {
        "type": "header",
        "format": FORMAT_VERSION,
        "run_id": run_id,
        "process_index": int(process_index),
        "process_count": int(process_count),
        "host": str(host),
        "pid": int(pid),
        "granularity": granularity,
        "jaxpace_version": jaxpace_version,
        "policy": policy,
        "local_devices": list(local_devices),
        "topology": topology,
        **extra,
    }


def step_record(
    *,
    site: str,
    step: int,
    rank: int,
    process: int,
    arrive_ns: int,
    done_ns: int,
    delay_ns: int,
    engaged: bool,
    device: int | None = None,
    wait_ns: int | None = None,
) -> dict[str, Any]:
    """One measured collective call of one rank (docs/records.md, "step").

    `wait_ns` defaults to `done_ns - arrive_ns`; pass it to write back a
    record read from a file unchanged.
    """
    return {
        "type": "step",
        "site": site,
        "step": int(step),
        "rank": int(rank),
        "process": int(process),
        "device": device,
        "arrive_ns": int(arrive_ns),
        "done_ns": int(done_ns),
        "wait_ns": int(done_ns) - int(arrive_ns) if wait_ns is None else int(wait_ns),
        "delay_ns": int(delay_ns),
        "engaged": bool(engaged),
    }


def write_jsonl(path: str | os.PathLike, records: Iterable[Mapping[str, Any]]) -> str:
    """Writes records one JSON object a line, atomically; returns the path.

    The text goes to a uniquely named temporary file beside `path`, which then
    replaces `path` in one rename: a reader never sees half a file, and
    concurrent writers never share a temporary name (the last one wins).
    Missing parent directories are created. Only a regular file (or nothing)
    at `path` is replaced: a symlink, directory, device node, FIFO or socket
    there raises `FileExistsError`/`IsADirectoryError` and is left as it was.
    """
    p = os.fspath(path)
    if p.endswith(os.sep) or (os.altsep and p.endswith(os.altsep)):
        raise IsADirectoryError(
            f"records path {p!r} names a directory; pass a file path such as "
            f"{os.path.join(p, records_filename(0))!r}."
        )
    check_replaceable(p)
    d = os.path.dirname(p) or "."
    make_dirs(d)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(p) + ".", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "w") as f:
            for rec in records:
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        os.chmod(tmp, 0o644)
        check_replaceable(p)  # again, just before the rename
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return p


def check_replaceable(path: str) -> None:
    """Raises unless `path` is missing or a regular file (never follows a symlink)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except NotADirectoryError as e:
        raise NotADirectoryError(
            f"cannot write records to {path!r}: a parent of it is a file, not a directory. "
            "Pick another path."
        ) from e
    mode = st.st_mode
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(
            f"cannot write records to {path!r}: it is a directory. Pass a file path inside it, "
            f"e.g. {os.path.join(path, records_filename(0))!r}."
        )
    kinds = [
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISCHR, "a device node"),
        (stat.S_ISBLK, "a device node"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ]
    kind = next((k for test, k in kinds if test(mode)), "not a regular file")
    raise FileExistsError(
        f"refusing to write records over {path!r}: it is {kind}, and only a regular file "
        "(or a new path) is replaced. Pass a new file path or a directory."
    )


def make_dirs(directory: str) -> None:
    """`os.makedirs(directory, exist_ok=True)` with an error that says which part is wrong."""
    try:
        os.makedirs(directory, exist_ok=True)
    except FileExistsError as e:
        raise NotADirectoryError(
            f"cannot create directory {directory!r} for records: {directory!r} or one of its "
            "parents exists and is not a directory. Pick another path."
        ) from e
    except NotADirectoryError as e:
        raise NotADirectoryError(
            f"cannot create directory {directory!r} for records: one of its parents is a "
            "file, not a directory. Pick another path."
        ) from e
    except PermissionError as e:
        raise PermissionError(
            f"cannot create directory {directory!r} for records: permission denied. "
            "Pick a writable path."
        ) from e
