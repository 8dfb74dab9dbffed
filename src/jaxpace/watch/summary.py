"""A window's trace as a compact per-(collective, execution) summary, and summaries as `Records`.

Each process reads only its own window trace with the report's `jax.profiler`
reader (`jaxpace.records.sources.xprof.load`: per device, per collective op,
per execution the time inside it) and keeps, per (site, execution, device),
the arrival (microseconds from the window's first collective, this process's
own clock) and the time inside the collective. The reader numbers one
process's executions in `run_id` order, which is the same on every process for
the same executions; the window's blocked edges make every process's window
hold the same executions, and `combine` joins a site only where every process
holds the same number of them (otherwise it leaves the site out and says so).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxpace.errors import RecordsError
from jaxpace.records.reader import Records
from jaxpace.records.sources import xprof
from jaxpace.records.sources.common import make_records

__all__ = [
    "MAX_ROWS",
    "MAX_SITES",
    "SUMMARY_VERSION",
    "combine",
    "compact",
    "empty",
    "merge",
    "summarize",
]

SUMMARY_VERSION = 1
# Sites and rows (site x execution x local device) kept per process and window, so a
# summary stays a few KB to ~100 KB in the coordination service whatever the program
# (4096 rows of five small integers are ~100 KB of JSON; 16 sites x 5 steps x 8 devices,
# 640 rows, ~16 KB). Past them, sites are left out in an order every process agrees on.
MAX_SITES = 16
MAX_ROWS = 4096
_MAX_US = 10**12  # an arrival or a duration above ~11.6 days is not a window's


def empty(
    *, process: int, host: str, window: int, first: int, last: int, why: str
) -> dict[str, Any]:
    """The summary of a window this process could not trace or read: no rows, `why`."""
    return {
        "v": SUMMARY_VERSION,
        "process": int(process),
        "host": str(host),
        "window": int(window),
        "first_step": int(first),
        "last_step": int(last),
        "sites": [],
        "rows": [],
        "notes": [why],
        "partial": True,
    }


def summarize(
    trace_dir: str | Path, *, process: int, host: str, window: int, first: int, last: int
) -> dict[str, Any]:
    """This process's window (`trace_dir`, as `jax.profiler.start_trace` wrote it) as a summary.

    Returns a JSON-able dict: `sites` (names `hlo_module/hlo_op`), `rows` of
    `[site index, execution index, global device id, arrive_us, wait_us]`,
    `notes`, `partial`. A trace that cannot be read gives `empty(...)`.
    """
    where = dict(process=process, host=host, window=window, first=first, last=last)
    try:
        loaded = xprof.load(Path(trace_dir))
    except (RecordsError, OSError) as e:
        return empty(**where, why=f"process {process}: window trace unreadable ({e})")
    cols = loaded.records.columns
    sites = list(loaded.records.sites)
    site, step, device = cols["site"], cols["step"], cols["device"]
    arrive, wait = cols["arrive_ns"], cols["wait_ns"]
    notes = [n for n in loaded.records.notes if n.startswith("PARTIAL")]
    keep = np.ones(site.size, bool)
    counts = np.bincount(site, minlength=len(sites))
    if len(sites) > MAX_SITES or site.size > MAX_ROWS:
        # The same choice on every process (no timing in it): most executions, then name.
        order = sorted(range(len(sites)), key=lambda i: (-int(counts[i]), sites[i]))
        kept, rows = [], 0
        for i in order:
            if len(kept) < MAX_SITES and rows + counts[i] <= MAX_ROWS:
                kept.append(i)
                rows += int(counts[i])
        keep = np.isin(site, kept)
        notes.append(
            f"process {process}: {len(sites) - len(kept)} of {len(sites)} sites left out of "
            f"the window summary (at most {MAX_SITES} sites and {MAX_ROWS} rows)."
        )
    t0 = int(arrive[keep].min()) if keep.any() else 0
    rows = np.stack(
        [
            site[keep],
            step[keep],
            device[keep],
            (arrive[keep] - t0) // 1000,
            wait[keep] // 1000,
        ],
        axis=1,
    )
    return {
        "v": SUMMARY_VERSION,
        **{"process": int(process), "host": str(host), "window": int(window)},
        **{"first_step": int(first), "last_step": int(last)},
        "sites": sites,
        "rows": rows.astype(np.int64).tolist(),
        "notes": notes,
        "partial": bool(loaded.records.partial),
        "platform": _platform_of(loaded.records.headers),
    }


PLATFORMS = ("cpu", "gpu", "tpu")  # what the trace reader tells apart (`xprof.trace_platform`)


def _platform_of(headers: Sequence[Mapping[str, Any]]) -> str:
    """The platform the headers name, if it is one the trace reader tells apart, else
    "unknown" (a summary from another process is untrusted input)."""
    found = {str(h.get("platform", "")).lower() for h in headers}
    return found.pop() if len(found) == 1 and found <= set(PLATFORMS) else "unknown"


def compact(s: Any) -> Any:
    """`s` (a summary just parsed from JSON) with its `rows` as one int64 array of shape
    (rows, 5) instead of lists of Python ints: the deciding process holds every process's
    summary of a window at once (8192 processes' 160-row summaries peaked at 307 MiB as
    lists, 99 MiB as arrays, benchmarks/watch_exchange.py). Malformed rows stay as they are
    (`combine` then leaves that process out, saying why)."""
    if isinstance(s, dict) and isinstance(s.get("rows"), list):
        try:
            s["rows"] = np.asarray(s["rows"], dtype=np.int64).reshape(-1, 5)
        except (TypeError, ValueError, OverflowError):
            pass
    return s


def _rows(s: Mapping[str, Any], n_sites: int) -> np.ndarray | None:
    """The summary's rows as an int64 array, or None when any is malformed (untrusted input)."""
    rows = s.get("rows")
    if isinstance(rows, np.ndarray) and rows.dtype == np.int64 and rows.ndim == 2:
        a = rows if rows.shape[1] == 5 else None
    elif isinstance(rows, list):
        try:
            a = np.asarray(rows, dtype=np.int64).reshape(-1, 5)
        except (TypeError, ValueError, OverflowError):
            return None
    else:
        return None
    if a is None:
        return None
    ok = (
        (a[:, 0] >= 0)
        & (a[:, 0] < n_sites)
        & (a[:, 1] >= 0)
        & (a[:, 2] >= 0)
        & (np.abs(a[:, 3]) < _MAX_US)
        & (a[:, 4] >= 0)
        & (a[:, 4] < _MAX_US)
    )
    return a if ok.all() else None


def _read_all(
    summaries: Mapping[int, Mapping[str, Any] | None],
    process_count: int,
    window: int,
    lost: Sequence[int],
) -> tuple[dict[int, tuple[list[str], np.ndarray]], list[str], list[str]]:
    """Per process that sent a well-formed summary of `window`: its sites and rows; the
    hosts by process ("?" where unknown); notes on every process left out and why."""
    notes: list[str] = []
    per_proc: dict[int, tuple[list[str], np.ndarray]] = {}
    hosts = ["?"] * process_count
    for p in range(process_count):
        s = summaries.get(p)
        if p in lost:
            notes.append(
                f"process {p}: its summary of this window was replaced by a later window's "
                "before it was read, or dropped while its watch thread was behind (the "
                "analysis runs behind the windows and never holds a step)"
            )
            continue
        if not isinstance(s, Mapping) or s.get("window") != window:
            notes.append(f"process {p}: no summary of this window (died, late or skipped)")
            continue
        hosts[p] = str(s.get("host", "?"))[:256]
        if s.get("partial"):  # what its reader or its wrapper said went missing
            got = [str(n)[:1000] for n in s.get("notes", [])[:8] if isinstance(n, str)]
            notes += got or [f"process {p}: partial window"]
        sites = [str(x) for x in s.get("sites", []) if isinstance(x, str)]
        rows = _rows(s, len(sites))
        if rows is None:
            notes.append(f"process {p}: malformed summary, left out")
            continue
        if rows.size:
            per_proc[p] = (sites, rows)
    return per_proc, hosts, notes


def combine(
    summaries: Mapping[int, Mapping[str, Any] | None],
    *,
    process_count: int,
    window: int,
    first: int,
    last: int,
    run_id: str,
    lost: Sequence[int] = (),
) -> tuple[Records | None, list[str]]:
    """The window's `Records` from every process's summary, and notes on what is missing.

    Steps are the wrapper's call indices (`first + execution`, one execution per
    call and site), so consecutive windows keep their gaps. Ranks are the global
    device ids present, in order. `lost`: processes whose summary of this
    window a later one replaced. Returns `(None, notes)` when no site is held
    by every process that answered.
    """
    per_proc, hosts, notes = _read_all(summaries, process_count, window, lost)
    if not per_proc:
        return None, notes
    names = sorted(
        {sites[i] for sites, rows in per_proc.values() for i in set(rows[:, 0].tolist())}
    )
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("site", "step", "process", "device")}
    cols.update(arrive_ns=[], wait_ns=[])
    for si, name in enumerate(names):
        counts = {}
        for p, (sites, rows) in per_proc.items():
            if name in sites:
                r = rows[rows[:, 0] == sites.index(name)]
                counts[p] = int(r[:, 1].max()) + 1 if r.size else 0
        if len(counts) < len(per_proc) or len(set(counts.values())) != 1:
            notes.append(
                f"site `{name}` left out: the processes hold different numbers of its "
                f"executions in this window ({dict(sorted(counts.items()))}); they cannot "
                "be matched execution by execution."
            )
            continue
        for p, (sites, rows) in per_proc.items():
            r = rows[rows[:, 0] == sites.index(name)]
            cols["site"].append(np.full(len(r), si))
            cols["step"].append(first + r[:, 1])
            cols["process"].append(np.full(len(r), p))
            cols["device"].append(r[:, 2])
            cols["arrive_ns"].append(r[:, 3] * 1000)
            cols["wait_ns"].append(r[:, 4] * 1000)
    if not cols["site"]:
        return None, notes
    c = {k: np.concatenate(v).astype(np.int64) for k, v in cols.items()}
    devices = np.unique(c["device"])
    c["rank"] = np.searchsorted(devices, c["device"])
    c["done_ns"] = c["arrive_ns"] + c["wait_ns"]
    partial = bool(notes)
    n_proc = len(per_proc)
    label = (
        f"jaxpace watch: steps {first}-{last}, {devices.size} devices in {n_proc} of "
        f"{process_count} processes"
    )
    recs = make_records(
        c,
        names,
        hosts,
        notes=notes,
        partial=partial,
        files=[],
        run_id=run_id,
        source="watch",
        source_label=label,
        timed=True,
        window=int(window),
        platform=_platform_of([summaries[q] for q in per_proc]),
    )
    return recs, notes


def merge(parts: Sequence[Records], *, run_id: str) -> Records:
    """Consecutive windows' `Records` as one (steps keep the call index, so windows stay apart)."""
    if len(parts) == 1:
        return parts[0]
    names = sorted({s for r in parts for s in r.sites})
    cols: dict[str, list[np.ndarray]] = {}
    for r in parts:
        remap = np.asarray([names.index(s) for s in r.sites], np.int64)
        for k, v in r.columns.items():
            cols.setdefault(k, []).append(remap[v] if k == "site" else v)
    c = {k: np.concatenate(v) for k, v in cols.items()}
    devices = np.unique(c["device"])
    c["rank"] = np.searchsorted(devices, c["device"])
    last = parts[-1]
    hosts = ["?"] * (last.process_count or 0)
    for r in parts:  # the latest known host of each process
        for h in r.headers:
            p = int(h["process_index"])
            if p < len(hosts) and h.get("host", "?") != "?":
                hosts[p] = str(h["host"])
    label = (
        f"jaxpace watch: {len(parts)} windows, steps {int(c['step'].min())}-{int(c['step'].max())}"
    )
    return make_records(
        {k: v for k, v in c.items() if k not in ("delay_ns", "engaged")},
        names,
        hosts,
        notes=[],
        partial=any(r.partial for r in parts),
        files=[],
        run_id=run_id,
        source="watch",
        source_label=label,
        timed=True,
        platform=_platform_of([h for r in parts for h in r.headers]),
    )
