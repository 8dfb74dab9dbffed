"""Where `jaxpace report` reads its timings from, each turned into the same `Records`.

- `records`: jaxpace's own records (`records-p*.jsonl`);
- `xprof`: `jax.profiler` traces (`plugins/profile/<run>/<host>.trace.json.gz`);
- `nccl_inspector`: NCCL Inspector logs (`<host>-pid<pid>.log`).

`detect` tells them apart by their file names; `load` reads any of them.
Nothing downstream knows where the data came from except `Loaded.source`,
the line the report's header shows.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from jaxpace.errors import RecordsError
from jaxpace.records.by_site import by_site
from jaxpace.records.format import has_records
from jaxpace.records.reader import Records, find_runs
from jaxpace.records.site_data import SiteData
from jaxpace.records.sources import jaxpace_records as records
from jaxpace.records.sources import nccl_inspector, xprof
from jaxpace.records.sources.common import Loaded

__all__ = ["SOURCES", "Loaded", "detect", "load", "load_by_site", "untimed"]

SOURCES = ("records", "xprof", "nccl_inspector")


def detect(path: str | os.PathLike) -> str:
    """Which source `path` holds: `records`, `xprof` or `nccl_inspector`.

    A file is known by its name; a directory by the files in it: records files
    first, then `jax.profiler` traces anywhere below, then Inspector logs (in it
    or one level down). Anything else is `records` (whose reader explains what
    it expected).

    >>> detect("run/records-p0.jsonl"), detect("vm.trace.json.gz"), detect("n1-pid42.log")
    ('records', 'xprof', 'nccl_inspector')
    """
    p = Path(path)
    name = p.name
    if name.endswith((".trace.json.gz", ".trace.json")):
        return "xprof"
    if name.endswith(".log"):
        return "nccl_inspector"
    if not p.is_dir() or has_records(p):
        return "records"
    if xprof.find_traces(p):
        return "xprof"
    if nccl_inspector.find_logs(p):
        return "nccl_inspector"
    return "records"


def load(source: Records | str | os.PathLike | Iterable[Mapping[str, Any]]) -> Loaded:
    """The timings of `source` as `Records`, with where they came from.

    Args:
      source: a path (jaxpace records, a `jax.profiler` trace directory or file,
        NCCL Inspector logs), `Records`, or record dicts.

    Raises:
      RecordsError: unreadable or malformed input, naming the file.
    """
    if isinstance(source, str | os.PathLike):
        kind = _kind(Path(source))
        if kind == "xprof":
            return xprof.load(Path(source))
        if kind == "nccl_inspector":
            return nccl_inspector.load(Path(source))
    return records.load(source)


def load_by_site(source: Records | str | os.PathLike | Iterable[Mapping[str, Any]]) -> Loaded:
    """`load`, with `Loaded.records` as `SiteRecords` (`records.by_site`): jaxpace's own
    records files are read by the engine and handed out one site at a time; any other
    source's `Records` are sliced by site. Close `Loaded.records` when done."""
    if isinstance(source, str | os.PathLike) and _kind(Path(source)) == "records":
        return records.load_by_site(source)
    loaded = load(source)
    return dataclasses.replace(loaded, records=by_site(loaded.records))


def _kind(p: Path) -> str:
    """`detect(p)`, refusing a directory that holds no timings (naming what it expected)."""
    kind = detect(p)
    if kind == "records" and p.is_dir() and not has_records(p) and not find_runs(p):
        if next(p.rglob("*.xplane.pb"), None) is not None:
            raise RecordsError(
                f"{p} holds `jax.profiler` XPlane files (`*.xplane.pb`) but no Chrome "
                "trace (`*.trace.json.gz`) beside them; jaxpace reads the Chrome trace."
            )
        raise RecordsError(
            f"no timings in directory {p}: expected jaxpace records "
            "(`records-p0.parquet` or `.jsonl`, ... as `Pacer.export` writes them), `jax.profiler` "
            "traces (`*.trace.json.gz` anywhere below it) or NCCL Inspector logs "
            "(`<host>-pid<pid>.log`, in it or one folder down)."
        )
    return kind


def untimed(data: SiteData) -> tuple[SiteData, str]:
    """`data` without compute and step time (a source without arrival times), and
    the note that says so."""
    nan = np.full(data.wait.shape, np.nan)
    note = (
        "this source gives each rank's time inside the collective but no arrival times: "
        "compute, step time and the forecast are not measured; waits, the ranking and "
        "the culprit are."
    )
    return dataclasses.replace(data, compute=nan, step_time=nan.copy()), note
