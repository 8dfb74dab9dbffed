"""The records format (docs/records.md): one home for its version, file names and dicts.

The runtime writes records with these functions, the report reads them, and
the simulator and the synthetic generator produce them, so all four agree.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from jaxpace.records.safe_io import check_replaceable, make_dirs, write_atomic

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

    Through `safe_io.write_atomic`, the one atomic writer: a uniquely named
    temporary file beside `path`, then one rename (a reader never sees half a
    file, concurrent writers never share a temporary name, a failed write
    leaves the earlier file whole). Missing parent directories are created.
    Only a regular file (or nothing) at `path` is replaced: a symlink,
    directory, device node, FIFO or socket there raises
    `FileExistsError`/`IsADirectoryError` and is left as it was.
    """
    p = os.fspath(path)
    if p.endswith(os.sep) or (os.altsep and p.endswith(os.altsep)):
        raise IsADirectoryError(
            f"records path {p!r} names a directory; pass a file path such as "
            f"{os.path.join(p, records_filename(0))!r}."
        )

    def fill(f) -> None:
        for rec in records:
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")

    return write_atomic(
        p,
        fill,
        what="records",
        make_parents=True,
    )
