"""`jax.profiler` traces (`<dir>/plugins/profile/<session>/<host>.trace.json.gz`) as `Records`.

A trace is Chrome trace JSON. On CPU, every device's thunks are complete
(`"ph": "X"`) events with `dur` and `args.device_ordinal` (the global device
id), `args.hlo_module`, `args.hlo_op` and `args.run_id` (the same in every
process for one execution); the collectives are the ops named `all-reduce`,
`all-gather`, `reduce-scatter`, `collective-permute`, `all-to-all` (with
`-start`, `.N` and fusion variants; `_` for `-` in `shard_map` programs), and the
`shard_map` collectives jax 0.10.2 names after their JAX primitive (`psum_invariant.N`,
`pmax.N`, `ppermute.N`: `collective_kind`).
On GPU (built from the format's documentation, not yet checked on a real GPU
trace), the NCCL kernels (`nccl...` events) on the stream lines of the
`/device:GPU:N` processes are the collectives.

Runs. Each `start_trace` writes one profiler session (a `plugins/profile/<session>`
folder, named by the second) per process. A process numbers its executions of a
module upwards (`run_id`), so its sessions belong to one run while their run_ids
keep rising and the same other processes traced them; a session that repeats or
goes back is a second run (a program traced again into the same folder: XLA:CPU
repeats its run_ids exactly), as is one traced with other processes than the
session before, or a process folder whose devices another one in the same run
already holds (`_group_runs`). Without `run_id` (GPU) sessions of one process are
windows of one run. Several runs are never merged: `load` names them and reads the one
chosen (`run=`, `jaxpace report --run`).

Windows. One collective is matched across devices by (`hlo_module`, `hlo_op`,
`run_id`, occurrence within the execution). Without `run_id` (GPU NCCL kernels)
occurrences are matched within each session, after aligning each process's
sequence on a shared offset: every rank leaves a collective together, so the
intervals between one process's exits repeat on every other process, shifted by
how many executions earlier it began tracing. The offset that matches them best,
by at least `ALIGN_RATIO` times over every other offset, is used and stated;
when none does, the note says so, the report is PARTIAL and no culprit is named
for that collective.

Timestamps are compared only within one process. A rank is a device, numbered
in global device id order. The time inside the collective is the rank's wait
plus the transfer: the rank that spent the least arrived last.

Input is untrusted: files are decompressed and decoded one event at a time, at
most `MAX_TRACE_BYTES` decompressed and `MAX_TRACE_EVENTS` events per file, and
events nested no deeper than the JSON decoder allows (each a clear error); a collective whose `ts`, `dur` or
device is not a finite number in range is dropped and counted, naming the file
and the event's index in `traceEvents`.
"""

from __future__ import annotations

import codecs
import dataclasses
import gzip
import math
import re
import sys
import zlib
from collections import defaultdict
from collections.abc import Iterator
from json import JSONDecodeError, JSONDecoder
from pathlib import Path
from typing import Any

import numpy as np

from jaxpace.errors import RecordsError
from jaxpace.records.executions import number_executions
from jaxpace.records.sources.common import Loaded, make_records

__all__ = [
    "ALIGN_RATIO",
    "MAX_TRACE_BYTES",
    "MAX_TRACE_EVENTS",
    "TRACE_GLOBS",
    "TraceRun",
    "Traces",
    "collective_kind",
    "find_traces",
    "load",
    "read",
]

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
# jax 0.10.2 names the HLO instruction of a `shard_map` collective after its JAX primitive
# (`psum_invariant.14` for `lax.psum`/`pmean`, `pmax.7`, `ppermute.3`; `all_gather` and
# `psum_scatter` become `all_gather.N` and `reduce_scatter.N`): the whole name, a primitive
# and an optional `.N`, so no other op that merely contains the word is taken.
_PRIMITIVES = re.compile(r"(psum|pmax|pmin|ppermute|pbroadcast)(_invariant)?(\.\d{1,9})?")
_PRIMITIVE_KINDS = {
    "psum": "all-reduce",
    "pmax": "all-reduce",
    "pmin": "all-reduce",
    "ppermute": "collective-permute",
    "pbroadcast": "collective-broadcast",
}
_GPU = re.compile(r"/device:GPU:(\d{1,7})(?!\d)")
_SKIP = re.compile(r"[ \t\r\n,]*")  # between events: skipped at C speed
_CHUNK_BYTES = 1 << 20
_MAX_EVENT_CHARS = 16 << 20
# Decompressed bytes read from one trace file at most. The profiler's trace viewer
# keeps about a million events (~250 MB of JSON); a file past this is not a trace.
MAX_TRACE_BYTES = 1 << 30
# Events decoded from one file at most (1-2 us each): tiny events packed under
# the byte bound (`{"a":1},` 134 million times) would otherwise take minutes.
MAX_TRACE_EVENTS = 1 << 23
# `ts` and `dur` are microseconds: 1e15 us (31 years) each keeps `ts + dur` in
# nanoseconds far from the int64 limit (9.2e18).
_MAX_US = 1e15
_MAX_DEVICE = 1 << 24
# The best offset's mismatch must be this many times smaller than any other's.
ALIGN_RATIO = 3.0
# Exit intervals compared at the least, and at least half of the shorter sequence;
# offsets tried (executions either way) and intervals compared per offset at most.
_MIN_OVERLAP = 8
_MAX_SHIFT = 128
_MAX_COMPARED = 1024


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
    >>> collective_kind("psum_invariant.14"), collective_kind("ppermute.3")  # shard_map's
    ('all-reduce', 'collective-permute')
    >>> collective_kind("psum_fusion.2")
    """
    name = op.replace("_", "-").lower()
    if name.startswith("nccl"):
        flat = name.replace("-", "")
        return next((k for n, k in _NCCL_KINDS.items() if n in flat), None)
    if "-done" in name:
        return None
    m = _PRIMITIVES.fullmatch(op.lower())
    if m is not None:
        return _PRIMITIVE_KINDS[m.group(1)]
    return next((k for k in _KINDS if k in name), None)


def find_traces(path: Path) -> list[Path]:
    """The trace files of `path`: the file itself, or every `*.trace.json[.gz]` below it."""
    if path.is_file():
        return [path]
    return sorted({f for g in TRACE_GLOBS for f in path.rglob(g) if f.is_file()})


def _chunks(path: Path) -> Iterator[str]:
    """The file's text, decompressed and decoded a chunk at a time; raises once more
    than `MAX_TRACE_BYTES` come out (a gzip bomb never fills memory or time)."""
    limit = MAX_TRACE_BYTES
    dec = codecs.getincrementaldecoder("utf-8")("replace")
    total = 0
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            total += len(chunk)
            if total > limit:
                raise _Fatal(
                    f"{path}: more than {limit:,} bytes decompressed (`MAX_TRACE_BYTES`); a "
                    "`jax.profiler` trace is far smaller. Is this a trace? Trace fewer "
                    "steps per `start_trace` window if it is one."
                )
            yield dec.decode(chunk)
    yield dec.decode(b"", final=True)


class _Fatal(RecordsError):
    """Input no reader should try to read on (a size or nesting bound): not a partial file."""


def _events(chunks: Iterator[str], path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(index in `traceEvents`, object) for each object of the array, decoded one at a time."""
    dec, big = JSONDecoder(), JSONDecoder(parse_int=_parse_int)
    buf, pos = "", 0

    def decode(at: int) -> tuple[Any, int]:
        try:
            return dec.raw_decode(buf, at)
        except JSONDecodeError:
            raise
        except ValueError:  # an integer past Python's 4300 digits: the slower decoder
            return big.raw_decode(buf, at)

    def more() -> bool:
        nonlocal buf, pos
        chunk = next(chunks, None)
        if chunk is None:
            return False
        buf, pos = buf[pos:] + chunk, 0
        return True

    while True:
        i = buf.find('"traceEvents"')
        j = buf.find("[", i) if i >= 0 else -1
        if j >= 0:
            pos = j + 1
            break
        if len(buf) > _MAX_EVENT_CHARS or not more():
            raise RecordsError(f"{path}: no `traceEvents` array; is this a Chrome trace?")
    index = 0
    while True:
        pos = _SKIP.match(buf, pos).end()  # type: ignore[union-attr]
        if pos >= len(buf):
            if not more():
                raise RecordsError(f"{path}: the trace ends inside `traceEvents` (cut short?).")
            continue
        if buf[pos] == "]":
            return
        try:
            obj, pos = decode(pos)
        except JSONDecodeError as e:
            if len(buf) - pos > _MAX_EVENT_CHARS or not more():
                raise RecordsError(f"{path}: malformed trace event ({e.msg}).") from None
            continue
        except RecursionError:
            raise _Fatal(
                f"{path}: `traceEvents[{index}]` is nested deeper than the JSON decoder's "
                f"limit (about {sys.getrecursionlimit()} levels); trace events nest 3 or 4 "
                "levels. Is this file a `jax.profiler` trace?"
            ) from None
        if isinstance(obj, dict):
            yield index, obj
        index += 1
        if index > MAX_TRACE_EVENTS:
            raise _Fatal(
                f"{path}: more than {MAX_TRACE_EVENTS:,} events in `traceEvents` "
                "(`MAX_TRACE_EVENTS`); a `jax.profiler` trace holds far fewer. Is this a "
                "trace? Trace fewer steps per `start_trace` window if it is one."
            )


def _parse_int(text: str) -> int | float:
    """A JSON integer; past 40 digits (Python refuses past 4300) an infinity, which every
    bound then rejects."""
    if len(text) <= 40:
        return int(text)
    return -math.inf if text.startswith("-") else math.inf


class _Dropped:
    """Collective events dropped for out-of-range numbers: a count and the first few."""

    def __init__(self) -> None:
        self.count = 0
        self.examples: list[str] = []

    def add(self, index: int, why: str) -> None:
        self.count += 1
        if len(self.examples) < 3:
            self.examples.append(f"`traceEvents[{index}]`: {why}")


class _File:
    """The collective events of one trace file and the names of its processes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.host = path.name.split(".trace.json")[0]
        logdir = path.parent
        self.session = ""
        if path.parent.parent.name == "profile" and path.parent.parent.parent.name == "plugins":
            logdir = path.parent.parent.parent.parent
            self.session = path.parent.name
        self.logdir = logdir
        self.pid_names: dict[Any, str] = {}
        # (device key, module, op, kind, run_id or None, ts_us, dur_us); the device
        # key is the global id (CPU) or ("gpu", trace pid) until resolved.
        self.events: list[tuple[Any, str, str, str, int | None, float, float]] = []
        self.notes: list[str] = []
        self.dropped = _Dropped()

    @property
    def process(self) -> tuple[Path, str]:
        return self.logdir, self.host

    def executions(self) -> set[tuple[str, int]]:
        """The (module, run_id) pairs this file traced (membership tests only)."""
        return {(e[1], e[4]) for e in self.events if e[4] is not None}

    def run_id_range(self, pick: Any) -> dict[str, int]:
        """Per module, the lowest (`pick=min`) or highest (`max`) `run_id` traced."""
        out: dict[str, int] = {}
        for e in self.events:
            if e[4] is not None:
                out[e[1]] = pick(out.get(e[1], e[4]), e[4])
        return out

    def cpu_devices(self) -> set[int]:
        return {e[0] for e in self.events if isinstance(e[0], int)}


def _event(ev: dict[str, Any], index: int, out: _File) -> None:
    """Keeps `ev` if it is a collective with numbers in range; records process names."""
    ph = ev.get("ph")
    pid = ev.get("pid")
    if pid is not None and not isinstance(pid, int | str):
        return  # not a process's event (a key must be hashable)
    if ph == "M":
        if ev.get("name") == "process_name" and isinstance(ev.get("args"), dict):
            out.pid_names[pid] = str(ev["args"].get("name", ""))
        return
    if ph != "X":
        return
    args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
    name = str(ev.get("name", ""))
    op = str(args.get("hlo_op") or "")
    if name.lower().startswith("nccl"):
        kind = collective_kind(name)
        device: Any = ("gpu", pid)
        op = op or f"nccl-{kind}"
    elif op and "device_ordinal" in args:
        kind = collective_kind(op)
        device = _to_int(args["device_ordinal"])
        if kind is not None and (device is None or not 0 <= device < _MAX_DEVICE):
            out.dropped.add(index, f"`device_ordinal` {args['device_ordinal']!r} is not "
                        f"an integer in [0, {_MAX_DEVICE})")  # fmt: skip
            return
    else:
        return
    if kind is None:
        return
    ts, dur = ev.get("ts"), ev.get("dur")
    if not (_number(ts) and _number(dur) and -_MAX_US <= ts <= _MAX_US and 0 <= dur <= _MAX_US):
        out.dropped.add(
            index, f"`ts` {ts!r} or `dur` {dur!r} is not a finite number of "
            f"microseconds in [-1e15, 1e15] (`dur` >= 0)",
        )  # fmt: skip
        return
    run = _to_int(args.get("run_id"))
    out.events.append((device, str(args.get("hlo_module", "?")), op, kind, run, ts, dur))


def _to_int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError):
        return None


def _number(v: Any) -> bool:
    """A JSON number (NaN and infinities included: the bounds check rejects them)."""
    return isinstance(v, int | float) and not isinstance(v, bool)


def _read(path: Path) -> _File:
    """The collectives of one trace; a file cut short or malformed keeps the events
    before the damage, with a note (the report is then partial)."""
    out = _File(path)
    try:
        for index, ev in _events(_chunks(path), path):
            _event(ev, index, out)
    except _Fatal:
        raise
    except (OSError, EOFError, zlib.error, RecordsError) as e:
        why = str(e).removeprefix(f"{path}: ")
        out.notes.append(
            f"PARTIAL: trace {path} unreadable past its first {len(out.events)} collective "
            f"events ({why}); read those."
        )
    if any(isinstance(e[0], tuple) for e in out.events):  # GPU: the NCCL kernels only
        out.events = [e for e in out.events if isinstance(e[0], tuple)]
    return out


def _natural(s: str) -> tuple:
    """`p2` before `p10`: digit runs compare as numbers (then the text: `p01` != `p1`)."""
    parts = tuple(
        (0, len(t.lstrip("0")), t.lstrip("0")) if t.isdigit() else (1, 0, t)
        for t in re.split(r"(\d+)", s)
    )  # digits compared as numbers without `int` (no limit on their length)
    return parts, s


def _process_key(p: tuple[Path, str]) -> tuple:
    return _natural(str(p[0])), _natural(p[1])


@dataclasses.dataclass(frozen=True)
class TraceRun:
    """One run among the traces under a path.

    Attributes:
      number: 1, 2, ... in the order of the runs' first sessions.
      sessions: the profiler session folders (`plugins/profile/<session>`) it holds.
      processes: how many processes (folder and host) traced it.
      files: its trace files.
    """

    number: int
    sessions: tuple[str, ...]
    processes: int
    files: tuple[Path, ...]

    def describe(self) -> str:
        """`run N: F trace files of P processes, sessions A, B`."""
        shown = ", ".join(self.sessions[:3]) + (", ..." if len(self.sessions) > 3 else "")
        files, procs = len(self.files), self.processes
        return (
            f"run {self.number}: {files} trace file{'s' * (files != 1)} of {procs} "
            f"process{'es' * (procs != 1)}" + (f", sessions {shown}" if shown else "")
        )


def _group_runs(files: list[_File]) -> list[list[int]]:
    """The files of each run (indices), runs in the order of their first session.

    A process's sessions, in name (time) order, stay in one stretch while its
    run_ids of a module keep rising (one process numbers its executions upwards)
    and the other processes that traced the same executions stay the same; a
    session that repeats or goes back, or that shares its executions with other
    processes than the one before, starts the next stretch. Stretches of different
    processes sharing an execution are one run (a process at most once per run;
    without `run_id`, the k-th stretch of every process); a run is split further
    where two processes claim one device.
    """
    by_process: dict[tuple[Path, str], list[int]] = defaultdict(list)
    traced_by: dict[tuple[str, int], set[tuple[Path, str]]] = defaultdict(set)
    executions = [f.executions() for f in files]
    for i, f in enumerate(files):
        by_process[f.process].append(i)
        for e in executions[i]:
            traced_by[e].add(f.process)
    stretch: dict[int, int] = {}
    for p, members in by_process.items():
        members.sort(key=lambda i: (_natural(files[i].session), str(files[i].path)))
        latest: dict[str, int] = {}  # per module, the highest run_id of the stretch so far
        partners: set[tuple[Path, str]] = set()
        n = 0
        for i in members:
            mine = set().union(*(traced_by[e] for e in executions[i])) - {p}
            first = files[i].run_id_range(min)
            if any(m in latest and r <= latest[m] for m, r in first.items()) or (
                mine and partners and mine != partners
            ):
                n, latest = n + 1, {}
            for m, r in files[i].run_id_range(max).items():
                latest[m] = max(latest.get(m, r), r)
            partners = mine or partners
            stretch[i] = n
    # Stretches, earliest first, join the first run that does not hold their process yet
    # and shares an execution with them (without run_id: was started by the same index).
    nodes = sorted(
        {(stretch[i], files[i].process) for i in stretch}, key=lambda n: (n[0], _process_key(n[1]))
    )
    runs: list[tuple[set[tuple[str, int]], set[tuple[Path, str]], int, list[int]]] = []
    for k, p in nodes:
        idx = [i for i in by_process[p] if stretch[i] == k]
        execs = set().union(*(executions[i] for i in idx))
        for seen, procs, index, members in runs:
            if p in procs or (seen.isdisjoint(execs) if execs else index != k):
                continue
            seen |= execs
            procs.add(p)
            members.extend(idx)
            break
        else:
            runs.append((execs, {p}, k, idx))
    out: list[list[int]] = []
    for *_, members in runs:
        groups: list[tuple[set[int], list[int]]] = []  # devices held, files
        for p in sorted({files[i].process for i in members}, key=_process_key):
            idx = [i for i in members if files[i].process == p]
            devs = set().union(*(files[i].cpu_devices() for i in idx))
            for held, group in groups:
                if held.isdisjoint(devs):
                    held |= devs
                    group.extend(idx)
                    break
            else:
                groups.append((devs, idx))
        out.extend(sorted(g) for _, g in groups)

    def first(run: list[int]) -> tuple:
        return min((_natural(files[i].session), str(files[i].path)) for i in run)

    return sorted(out, key=first)


@dataclasses.dataclass
class Traces:
    """Every trace file under a path, read once, and the runs they hold (`read`)."""

    path: Path
    runs: tuple[TraceRun, ...]
    _files: list[_File] = dataclasses.field(repr=False)
    _members: list[list[int]] = dataclasses.field(repr=False)

    def load(self, run: int | str | None = None) -> Loaded:
        """The `Records` of one run: `run` is its number (or a session name that only
        it holds); None when the traces hold one run.

        Raises:
          RecordsError: several runs and `run` None, `run` not among them, or no
            collective in the run.
        """
        chosen = self._choose(run)
        files = sorted(
            (self._files[i] for i in self._members[chosen.number - 1]),
            key=lambda f: (_natural(f.session), str(f.path)),
        )
        label_run = self.path.resolve().name
        if len(self.runs) > 1:
            label_run += f" run {chosen.number}"
        return _load_run(self.path, files, label_run)

    def listing(self, command: str) -> str:
        """One line per run: `command --run N  # description`."""
        return "\n".join(f"  {command} --run {r.number}   # {r.describe()}" for r in self.runs)

    def _choose(self, run: int | str | None) -> TraceRun:
        if run is None:
            if len(self.runs) == 1:
                return self.runs[0]
            raise RecordsError(
                f"{self.path} holds {len(self.runs)} runs of `jax.profiler` traces (a "
                "program traced again into the same folder repeats its executions' run_ids; "
                "process folders claiming the same devices are different runs), never "
                "merged: report one with `jaxpace report PATH --run N` (in Python, "
                "`xprof.load(path, run=N)`):\n" + "\n".join(f"  {r.describe()}" for r in self.runs)
            )
        text = str(run).strip()
        for r in self.runs:
            if text == str(r.number):
                return r
        named = [r for r in self.runs if text in r.sessions]
        if len(named) == 1:
            return named[0]
        raise RecordsError(
            f"`--run {text}` is not one of the {len(self.runs)} runs of `jax.profiler` "
            f"traces under {self.path}; expected a run number"
            + (f" 1 to {len(self.runs)}" if len(self.runs) > 1 else " (1)")
            + " or a session folder name that only one run holds:\n"
            + "\n".join(f"  {r.describe()}" for r in self.runs)
        )


def read(path: Path) -> Traces:
    """Reads every trace file under `path` once and finds the runs they hold.

    Raises:
      RecordsError: no traces, or a file past a size or nesting bound.
    """
    paths = find_traces(path)
    if not paths:
        raise RecordsError(f"no `jax.profiler` traces (`*.trace.json.gz`) under {path}.")
    files = [_read(p) for p in paths]
    members = _group_runs(files)
    runs = []
    for n, m in enumerate(members, 1):
        sessions = sorted({files[i].session for i in m if files[i].session}, key=_natural)
        runs.append(
            TraceRun(
                number=n,
                sessions=tuple(sessions),
                processes=len({files[i].process for i in m}),
                files=tuple(files[i].path for i in m),
            )
        )
    return Traces(path, tuple(runs), files, members)


def _processes(files: list[_File]) -> tuple[list[tuple[Path, str]], dict[int, int]]:
    """Processes (logdir, host), ordered by lowest global device id (CPU) or by name
    (GPU: global ids are process offset + local ordinal), and each file's process."""
    keys = sorted({f.process for f in files}, key=_process_key)
    low: dict[tuple[Path, str], float] = {k: float("inf") for k in keys}
    for f in files:
        for e in f.events:
            if isinstance(e[0], int):
                low[f.process] = min(low[f.process], e[0])
    keys.sort(key=lambda k: low[k])  # stable: name order among equals
    index = {k: i for i, k in enumerate(keys)}
    return keys, {i: index[f.process] for i, f in enumerate(files)}


def _resolve_gpu(files: list[_File], proc_of: dict[int, int]) -> None:
    """Replaces ("gpu", pid) device keys by global ids: process offset + local ordinal."""
    local: dict[int, int] = defaultdict(lambda: -1)
    for i, f in enumerate(files):
        for name in f.pid_names.values():
            if (m := _GPU.search(name)) and int(m[1]) < _MAX_DEVICE:
                local[proc_of[i]] = max(local[proc_of[i]], int(m[1]))
    per = max(local.values(), default=-1) + 1
    for i, f in enumerate(files):
        fixed = []
        for e in f.events:
            if isinstance(e[0], tuple):
                m = _GPU.search(f.pid_names.get(e[0][1], ""))
                if m is None or int(m[1]) >= _MAX_DEVICE:
                    continue
                e = (proc_of[i] * per + int(m[1]), *e[1:])
            fixed.append(e)
        f.events = fixed


def trace_platform(files: list[_File]) -> str:
    """`gpu`, `tpu` or `cpu`: what the traced devices are, from the trace's process names
    (`/device:GPU:N`, `/device:TPU:N`) and its events (NCCL kernels are GPU; collectives
    placed by `device_ordinal` on no named accelerator ran on CPU devices); `unknown`
    when there is no collective."""
    names = " ".join(n for f in files for n in f.pid_names.values())
    if any(isinstance(e[0], tuple) for f in files for e in f.events) or _GPU.search(names):
        return "gpu"
    if "/device:TPU:" in names:
        return "tpu"
    return "cpu" if any(f.events for f in files) else "unknown"


def _exit_intervals(events: list[tuple[int, float, float]]) -> np.ndarray:
    """Intervals between one process's successive exits from a collective: per
    occurrence, the median over its devices of `ts + dur`, differenced."""
    by_dev: dict[int, list[float]] = defaultdict(list)
    for dev, ts, dur in events:
        by_dev[dev].append(ts + dur)
    seqs = [np.sort(np.asarray(v, float)) for _, v in sorted(by_dev.items())]
    n = min(s.size for s in seqs)
    return np.diff(np.median(np.stack([s[:n] for s in seqs]), axis=0))


def _best_offset(a: np.ndarray, b: np.ndarray) -> tuple[int, float] | None:
    """(s, ratio): `a[i]` matches `b[i + s]` best, its median mismatch `ratio` times
    smaller than any other offset's; None when fewer than two offsets can be compared."""
    need = max(_MIN_OVERLAP, min(a.size, b.size) // 2)
    costs: list[tuple[float, int, int]] = []
    for s in range(max(-(a.size - need), -_MAX_SHIFT), min(b.size - need, _MAX_SHIFT) + 1):
        i0, i1 = max(0, -s), min(a.size, b.size - s)
        if i1 - i0 < need:
            continue
        mid = (i0 + i1) // 2  # the middle `_MAX_COMPARED` pairs at most: bounded time
        i0, i1 = max(i0, mid - _MAX_COMPARED // 2), min(i1, mid + _MAX_COMPARED // 2)
        costs.append((float(np.median(np.abs(a[i0:i1] - b[i0 + s : i1 + s]))), abs(s), s))
    if len(costs) < 2:
        return None
    costs.sort()
    best, second = costs[0][0], costs[1][0]
    ratio = second / best if best > 0 else (np.inf if second > 0 else 1.0)
    return costs[0][2], float(ratio)


def _align(
    files: list[_File], proc_of: dict[int, int]
) -> tuple[dict[tuple[int, str, int], int], list[str], list[str]]:
    """Occurrence offsets of the events without `run_id`, per (process, site, window);
    the notes; and the sites whose windows could not be aligned across processes."""
    seqs: dict[tuple[str, int], dict[int, list]] = defaultdict(lambda: defaultdict(list))
    window_of: dict[int, int] = defaultdict(int)
    for i, f in enumerate(files):
        w = window_of[proc_of[i]]
        window_of[proc_of[i]] += 1
        for dev, module, op, _kind, run, ts, dur in f.events:
            if run is None:
                seqs[(f"{module}/{op}", w)][proc_of[i]].append((dev, ts, dur))
    shifts: dict[tuple[int, str, int], int] = {}
    notes: list[str] = []
    unaligned: list[str] = []
    for (site, w), per_proc in sorted(seqs.items()):
        if len(per_proc) < 2:
            continue
        intervals = {p: _exit_intervals(ev) for p, ev in sorted(per_proc.items())}
        ref = max(sorted(intervals), key=lambda p: intervals[p].size)
        moved, lost = [], []
        for p, a in intervals.items():
            if p == ref:
                continue
            found = _best_offset(a, intervals[ref])
            if found is None or found[1] < ALIGN_RATIO:
                lost.append(
                    f"{p} ({'too few executions' if found is None else f'{found[1]:.1f}x'})"
                )
                continue
            shifts[(p, site, w)], ratio = found
            if found[0]:
                how = "later" if found[0] > 0 else "earlier"
                moved.append(
                    f"{p} began {abs(found[0])} executions {how} ("
                    + (f"{ratio:.0f}x" if ratio < 1000 else "over 1000x")
                    + " closer than at any other offset)"
                )
        where = f"`{site}` (session {w + 1} of each process)"
        if moved:
            notes.append(
                f"traces of {where} aligned on process {ref}'s by the intervals between exits "
                f"(no `run_id`): process {_first(moved)}; executions only some processes "
                "traced are left out."
            )
        if lost:
            notes.append(
                f"PARTIAL: traces of {where} cannot be aligned on process {ref}'s: without "
                "`run_id` executions are matched by the intervals between exits, and no offset "
                f"matches {ALIGN_RATIO:g}x better than every other for process {_first(lost)}. "
                "Which execution is which across processes is unknown, so no rank is named "
                "late from it; trace every process over the same steps, or on a platform whose "
                "trace carries `run_id`."
            )
            unaligned.append(site)
    return shifts, notes, sorted(set(unaligned))


def _first(items: list[str], n: int = 8) -> str:
    """The first `n` of `items`, `; `-joined, with how many more."""
    more = f"; and {len(items) - n} more" if len(items) > n else ""
    return "; ".join(items[:n]) + more


def _keys(
    files: list[_File], proc_of: dict[int, int], shifts: dict, exec_of: dict | None
) -> tuple[dict, dict]:
    """Per site, each event as (join key, device, process, ts, dur, execution), the key
    being (execution, occurrence) or (window, aligned occurrence); and per site the keys
    that end some process's window (no compute or step time across them). `exec_of`
    (`_execution_map`) numbers each process's (module, run_id); without it the raw
    run_id is the execution."""
    per_site: dict[str, list] = defaultdict(list)
    ends: dict[str, set] = defaultdict(set)
    window_of: dict[int, int] = defaultdict(int)
    for i, f in enumerate(files):
        p = proc_of[i]
        w = window_of[p]
        window_of[p] += 1
        occ: dict[tuple, int] = defaultdict(int)
        last: dict[str, tuple] = {}
        for dev, module, op, _kind, run, ts, dur in sorted(f.events, key=lambda e: e[5]):
            site = f"{module}/{op}"
            group = (dev, site, run if run is not None else w)
            ex = None
            if run is not None:
                ex = exec_of[(p, module, run)] if exec_of is not None else run
                key: tuple = (0, ex, occ[group])
            else:
                key = (1, w, occ[group] + shifts.get((p, site, w), 0))
            occ[group] += 1
            per_site[site].append((key, dev, p, ts, dur, ex))
            last[site] = max(last.get(site, key), key)
        for site, key in last.items():
            ends[site].add(key)
    return per_site, ends


def _columns(per_site: dict, ends: dict) -> tuple[list[str], dict[str, list]]:
    """Sites (sorted) and the step columns; steps are numbered in key order, one
    number left out after each window's end so that no two windows look consecutive."""
    sites = sorted(per_site)
    cols: dict[str, list] = {
        k: [] for k in ("site", "step", "device", "process", "ts", "dur", "exec")
    }
    for si, site in enumerate(sites):
        step_of, gap = {}, 0
        for j, key in enumerate(sorted({e[0] for e in per_site[site]})):
            step_of[key] = j + gap
            gap += key in ends[site]
        for key, dev, proc, ts, dur, ex in per_site[site]:
            cols["exec"].append(ex)
            cols["site"].append(si)
            cols["step"].append(step_of[key])
            cols["device"].append(dev)
            cols["process"].append(proc)
            cols["ts"].append(ts)
            cols["dur"].append(dur)
    return sites, cols


def _execution_map(files: list[_File], proc_of: dict[int, int]) -> tuple[dict | None, str | None]:
    """Each process's (module, run_id) numbered as executions 0, 1, ... in order
    (`records.executions`: by value where the processes' run_ids agree, else the k-th
    on one process is the k-th on every other); None (and why) when some event has no
    run_id (GPU) or the run_ids repeat on a device."""
    keys, device, ts = [], [], []
    for i, f in enumerate(files):
        for dev, module, _op, _kind, run, t, _dur in f.events:
            if run is None or not isinstance(dev, int):
                return None, None  # GPU NCCL kernels: no run_id
            keys.append((proc_of[i], module, run))
            device.append(dev)
            ts.append(t)
    if not keys:
        return None, None
    index: dict[tuple, int] = {}
    ids = np.asarray([index.setdefault(k[1:], len(index)) for k in keys], np.int64)
    process = np.asarray([k[0] for k in keys], np.int64)
    arrive = np.rint(np.asarray(ts, np.float64) * 1000).astype(np.int64)
    ex, note = number_executions(ids, process, np.asarray(device, np.int64), arrive)
    if ex is None:
        return None, note
    return dict(zip(keys, ex.tolist(), strict=False)), note


def load(path: Path, run: int | str | None = None) -> Loaded:
    """Reads `jax.profiler` traces (a file, or every trace below a directory).

    Args:
      path: a trace file or a directory of them (one run or several).
      run: which run, when the traces hold several (`TraceRun.number`, or a
        session folder name only that run holds).

    Raises:
      RecordsError: no traces, several runs and no `run`, a file past a size or
        nesting bound, or no collective.
    """
    return read(path).load(run)


def _load_run(path: Path, files: list[_File], run_id: str) -> Loaded:
    paths = [f.path for f in files]
    notes = [n for f in files for n in f.notes]
    keys, proc_of = _processes(files)
    platform = trace_platform(files)
    kinds = {f"{e[1]}/{e[2]}": e[3] for f in files for e in f.events}
    _resolve_gpu(files, proc_of)
    n_events = sum(len(f.events) for f in files)
    for f in files:
        if f.dropped.count:
            more = "; ..." if f.dropped.count > len(f.dropped.examples) else ""
            notes.append(
                f"PARTIAL: {f.dropped.count} collective events of trace {f.path} skipped "
                "for numbers out of range (" + "; ".join(f.dropped.examples) + more + ")."
            )
    if n_events == 0:
        raise RecordsError(
            f"the {len(paths)} `jax.profiler` traces under {path} hold no collective "
            "(all-reduce, all-gather, reduce-scatter, collective-permute, all-to-all). Was "
            "the traced program running on several devices, and were the steps inside "
            "the trace window? " + " ".join(notes)
        )
    shifts, align_notes, unaligned = _align(files, proc_of)
    notes += align_notes
    exec_of, exec_note = _execution_map(files, proc_of)
    if exec_note:
        notes.append(exec_note)
    sites, cols = _columns(*_keys(files, proc_of, shifts, exec_of))
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
    if exec_of is not None:  # a step is one execution: the whole step folds by it
        columns["execution"] = np.asarray(cols["exec"], np.int64)
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
        run_id=run_id,
        source="xprof",
        source_label=label,
        timed=True,
        platform=platform,
        site_info={s: {"kind": kinds[s]} for s in sites if kinds.get(s)},
    )
    if unaligned:  # the report names nobody from these sites (`RunContext.no_culprit`)
        why = (
            "the processes' traced windows of this collective could not be aligned without "
            "`run_id` (see the notes), so which execution is which across processes is "
            "unknown and its waits do not say who was late"
        )
        info = dict(recs.headers[0].get("sites") or {})
        for s in unaligned:
            info[s] = {**info.get(s, {}), "no_culprit": why}
        recs = dataclasses.replace(recs, headers=tuple(h | {"sites": info} for h in recs.headers))
    return Loaded(recs, label, timed=True)
