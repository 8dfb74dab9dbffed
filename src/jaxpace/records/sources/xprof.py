"""`jax.profiler` traces (`<dir>/plugins/profile/<run>/<host>.trace.json.gz`) as `Records`.

A trace is Chrome trace JSON. On CPU, every device's thunks are complete
(`"ph": "X"`) events with `dur` and `args.device_ordinal` (the global device
id), `args.hlo_module`, `args.hlo_op` and `args.run_id` (the same in every
process for one execution); the collectives are the ops named `all-reduce`,
`all-gather`, `reduce-scatter`, `collective-permute`, `all-to-all` (with
`-start`, `.N` and fusion variants; `_` for `-` in `shard_map` programs).
On GPU (built from the format's documentation, not yet checked on a real GPU
trace), the NCCL kernels (`nccl...` events) on the stream lines of the
`/device:GPU:N` processes are the collectives.

One collective is matched across devices by (`hlo_module`, `hlo_op`,
`run_id`, occurrence within the execution), or by occurrence order where
`run_id` is absent; timestamps are compared only within one process. A rank
is a device, numbered in global device id order. The time inside the
collective is the rank's wait plus the transfer: the rank that spent the
least arrived last. Files are decompressed and decoded one event at a time.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from jaxpace.errors import RecordsError
from jaxpace.records.sources.common import Loaded, make_records

__all__ = ["TRACE_GLOBS", "collective_kind", "find_traces", "load"]

TRACE_GLOBS = ("*.trace.json.gz", "*.trace.json")
# Longest first where one contains another (`all-reduce-scatter` is a reduce-scatter).
_KINDS = (
    "reduce-scatter",
    "all-gather",
    "all-to-all",
    "collective-permute",
    "collective-broadcast",
    "all-reduce",
)
_NCCL_KINDS = {
    "reducescatter": "reduce-scatter",
    "allgather": "all-gather",
    "alltoall": "all-to-all",
    "sendrecv": "collective-permute",
    "broadcast": "collective-broadcast",
    "allreduce": "all-reduce",
}
_GPU = re.compile(r"/device:GPU:(\d+)")
_CHUNK_CHARS = 1 << 20
_MAX_EVENT_CHARS = 16 << 20


def collective_kind(op: str) -> str | None:
    """The collective an HLO op or NCCL kernel name stands for, or None.

    `-done` ops are None: they time the wait for an async collective on the
    compute stream, not the collective.

    >>> collective_kind("all-reduce.3"), collective_kind("reduce_scatter.7")
    ('all-reduce', 'reduce-scatter')
    >>> collective_kind("all-gather-done"), collective_kind("dot.1")
    (None, None)
    >>> collective_kind("ncclDevKernel_AllGather_RING_LL")
    'all-gather'
    """
    name = op.replace("_", "-").lower()
    if name.startswith("nccl"):
        flat = name.replace("-", "")
        return next((k for n, k in _NCCL_KINDS.items() if n in flat), None)
    if "-done" in name:
        return None
    return next((k for k in _KINDS if k in name), None)


def find_traces(path: Path) -> list[Path]:
    """The trace files of `path`: the file itself, or every `*.trace.json[.gz]` below it."""
    if path.is_file():
        return [path]
    return sorted({f for g in TRACE_GLOBS for f in path.rglob(g) if f.is_file()})


def _open(path: Path) -> TextIO:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return path.open("r", encoding="utf-8", errors="replace")


def _events(f: TextIO, path: Path) -> Iterator[dict[str, Any]]:
    """The objects of the `traceEvents` array, decoded one at a time."""
    dec = json.JSONDecoder()
    buf, pos, eof = "", 0, False

    def more() -> bool:
        nonlocal buf, pos, eof
        chunk = f.read(_CHUNK_CHARS)
        buf, pos, eof = buf[pos:] + chunk, 0, not chunk
        return bool(chunk)

    while True:
        i = buf.find('"traceEvents"')
        j = buf.find("[", i) if i >= 0 else -1
        if j >= 0:
            pos = j + 1
            break
        if len(buf) > _MAX_EVENT_CHARS or not more():
            raise RecordsError(f"{path}: no `traceEvents` array; is this a Chrome trace?")
    while True:
        while pos < len(buf) and buf[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(buf):
            if not more():
                raise RecordsError(f"{path}: the trace ends inside `traceEvents` (cut short?).")
            continue
        if buf[pos] == "]":
            return
        try:
            obj, pos = dec.raw_decode(buf, pos)
        except json.JSONDecodeError as e:
            if len(buf) - pos > _MAX_EVENT_CHARS or not more():
                raise RecordsError(f"{path}: malformed trace event ({e.msg}).") from None
            continue
        if isinstance(obj, dict):
            yield obj


class _File:
    """The collective events of one trace file and the names of its processes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.host = path.name.split(".trace.json")[0]
        logdir = path.parent
        if path.parent.parent.name == "profile" and path.parent.parent.parent.name == "plugins":
            logdir = path.parent.parent.parent.parent
        self.logdir = logdir
        self.pid_names: dict[Any, str] = {}
        # (device key, module, op, kind, run_id or None, ts_us, dur_us); the device
        # key is the global id (CPU) or ("gpu", trace pid) until resolved.
        self.events: list[tuple[Any, str, str, str, int | None, float, float]] = []


def _event(ev: dict[str, Any], out: _File) -> None:
    """Keeps `ev` if it is a collective; records process names."""
    ph = ev.get("ph")
    if ph == "M":
        if ev.get("name") == "process_name" and isinstance(ev.get("args"), dict):
            out.pid_names[ev.get("pid")] = str(ev["args"].get("name", ""))
        return
    if ph != "X":
        return
    args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
    name = str(ev.get("name", ""))
    op = str(args.get("hlo_op") or "")
    if name.lower().startswith("nccl"):
        kind = collective_kind(name)
        device: Any = ("gpu", ev.get("pid"))
        op = op or f"nccl-{kind}"
    elif op and "device_ordinal" in args:
        kind = collective_kind(op)
        device = _to_int(args["device_ordinal"])
    else:
        return
    ts, dur = ev.get("ts"), ev.get("dur")
    if kind is None or device is None or not _number(ts) or not _number(dur) or dur < 0:
        return
    run = _to_int(args.get("run_id"))
    out.events.append((device, str(args.get("hlo_module", "?")), op, kind, run, ts, dur))


def _to_int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v == v


def _read(path: Path, notes: list[str]) -> _File:
    """The collectives of one trace; a file cut short or malformed keeps the events
    before the damage, with a note (the report is then partial)."""
    out = _File(path)
    try:
        with _open(path) as f:
            for ev in _events(f, path):
                _event(ev, out)
    except (OSError, EOFError, zlib.error, RecordsError) as e:
        why = str(e).removeprefix(f"{path}: ")
        notes.append(
            f"PARTIAL: trace {path} unreadable past its first {len(out.events)} collective "
            f"events ({why}); read those."
        )
    if any(isinstance(e[0], tuple) for e in out.events):  # GPU: the NCCL kernels only
        out.events = [e for e in out.events if isinstance(e[0], tuple)]
    return out


def _processes(files: list[_File]) -> tuple[list[tuple[Path, str]], dict[int, int]]:
    """Processes (logdir, host), ordered by lowest global device id (CPU) or by name
    (GPU: global ids are process offset + local ordinal), and each file's process."""
    keys = sorted({(f.logdir, f.host) for f in files})
    low: dict[tuple[Path, str], float] = {k: float("inf") for k in keys}
    for f in files:
        for e in f.events:
            if isinstance(e[0], int):
                low[(f.logdir, f.host)] = min(low[(f.logdir, f.host)], e[0])
    keys.sort(key=lambda k: (low[k], _natural(str(k[0])), _natural(k[1])))
    index = {k: i for i, k in enumerate(keys)}
    return keys, {i: index[(f.logdir, f.host)] for i, f in enumerate(files)}


def _natural(s: str) -> tuple:
    """`p2` before `p10`: digit runs compare as numbers."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s))


def _resolve_gpu(files: list[_File], proc_of: dict[int, int]) -> None:
    """Replaces ("gpu", pid) device keys by global ids: process offset + local ordinal."""
    local: dict[int, set[int]] = defaultdict(set)
    for i, f in enumerate(files):
        for name in f.pid_names.values():
            if m := _GPU.search(name):
                local[proc_of[i]].add(int(m[1]))
    per = max((max(s) + 1 for s in local.values()), default=0)
    for i, f in enumerate(files):
        fixed = []
        for e in f.events:
            if isinstance(e[0], tuple):
                m = _GPU.search(f.pid_names.get(e[0][1], ""))
                if m is None:
                    continue
                e = (proc_of[i] * per + int(m[1]), *e[1:])
            fixed.append(e)
        f.events = fixed


def _keys(files: list[_File], proc_of: dict[int, int]) -> tuple[dict, dict]:
    """Per site, each event as (join key, device, process, ts, dur), the key being
    (run_id, occurrence) or (window, occurrence); and per site the keys that end some
    process's window (no compute or step time across them)."""
    per_site: dict[str, list] = defaultdict(list)
    ends: dict[str, set] = defaultdict(set)
    window_of: dict[int, int] = defaultdict(int)
    for i, f in enumerate(files):
        w = window_of[proc_of[i]]
        window_of[proc_of[i]] += 1
        occ: dict[tuple, int] = defaultdict(int)
        last: dict[str, tuple] = {}
        for dev, module, op, _kind, run, ts, dur in sorted(f.events, key=lambda e: e[5]):
            site = f"{module}/{op}"
            group = (dev, site, run if run is not None else w)
            key = (0, run, occ[group]) if run is not None else (1, w, occ[group])
            occ[group] += 1
            per_site[site].append((key, dev, proc_of[i], ts, dur))
            last[site] = max(last.get(site, key), key)
        for site, key in last.items():
            ends[site].add(key)
    return per_site, ends


def _columns(per_site: dict, ends: dict) -> tuple[list[str], dict[str, list]]:
    """Sites (sorted) and the step columns; steps are numbered in key order, one
    number left out after each window's end so that no two windows look consecutive."""
    sites = sorted(per_site)
    cols: dict[str, list] = {k: [] for k in ("site", "step", "device", "process", "ts", "dur")}
    for si, site in enumerate(sites):
        step_of, gap = {}, 0
        for j, key in enumerate(sorted({e[0] for e in per_site[site]})):
            step_of[key] = j + gap
            gap += key in ends[site]
        for key, dev, proc, ts, dur in per_site[site]:
            cols["site"].append(si)
            cols["step"].append(step_of[key])
            cols["device"].append(dev)
            cols["process"].append(proc)
            cols["ts"].append(ts)
            cols["dur"].append(dur)
    return sites, cols


def load(path: Path) -> Loaded:
    """Reads `jax.profiler` traces (a file, or every trace below a directory).

    Raises:
      RecordsError: no traces, unreadable or malformed files, or no collective.
    """
    paths = find_traces(path)
    if not paths:
        raise RecordsError(f"no `jax.profiler` traces (`*.trace.json.gz`) under {path}.")
    notes: list[str] = []
    files = [_read(p, notes) for p in paths]
    keys, proc_of = _processes(files)
    _resolve_gpu(files, proc_of)
    n_events = sum(len(f.events) for f in files)
    if n_events == 0:
        raise RecordsError(
            f"the {len(paths)} `jax.profiler` traces under {path} hold no collective "
            "(all-reduce, all-gather, reduce-scatter, collective-permute, all-to-all). Was "
            "the traced program running on several devices, and were the steps inside "
            "the trace window? " + " ".join(notes)
        )
    sites, cols = _columns(*_keys(files, proc_of))
    device = np.asarray(cols["device"], np.int64)
    devices = np.unique(device)
    ts_ns = np.rint(np.asarray(cols["ts"], float) * 1000).astype(np.int64)
    dur_ns = np.rint(np.asarray(cols["dur"], float) * 1000).astype(np.int64)
    columns = {
        "site": np.asarray(cols["site"], np.int64),
        "step": np.asarray(cols["step"], np.int64),
        "rank": np.searchsorted(devices, device),
        "process": np.asarray(cols["process"], np.int64),
        "device": device,
        "arrive_ns": ts_ns,
        "done_ns": ts_ns + dur_ns,
        "wait_ns": dur_ns,
    }
    if not np.array_equal(devices, np.arange(devices.size)):
        shown = ", ".join(f"{r}={d}" for r, d in enumerate(devices[:16].tolist()))
        notes.append(
            f"ranks are devices in global id order (rank=device id): {shown}"
            + (" ..." if devices.size > 16 else "")
        )
    label = (
        f"jax.profiler traces: {len(paths)} files, {devices.size} devices in "
        f"{len(keys)} processes on {len({k[1] for k in keys})} hosts"
    )
    recs = make_records(
        columns,
        sites,
        [k[1] for k in keys],
        notes=notes,
        partial=any(n.startswith("PARTIAL") for n in notes),
        files=paths,
        run_id=path.resolve().name,
        source="xprof",
        source_label=label,
        timed=True,
    )
    return Loaded(recs, label, timed=True)
