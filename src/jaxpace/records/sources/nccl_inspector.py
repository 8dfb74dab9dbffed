"""NCCL Inspector logs (`<dump_dir>/<hostname>-pid<pid>.log`) as `Records`.

NVIDIA's Inspector profiler plugin writes one JSON object a line per completed
operation per communicator rank: `header` (`id` = communicator hash,
`comm_name`, `rank`, `n_ranks`, `nnodes`), `metadata` (`hostname`, `pid`,
format version) and `coll_perf` (`coll`, `coll_sn`, `coll_exec_time_us` =
the longest channel's kernel time, `coll_timing_source`; with
`NCCL_INSPECTOR_DUMP_VERBOSE=1` also `event_trace_ts` with each channel's
kernel start and stop in microseconds) or `p2p_perf`.

One collective is matched across ranks by (communicator `id`, `coll_sn`),
never by time; a site is (communicator, collective kind) and its ranks are the
communicator's ranks. The kernel time of a rank is its wait for the others
plus the transfer, so the rank with the shortest time arrived last. Files are
read a 4 MB block at a time: lines in the plugin's own layout by one regular
expression over the block, anything else line by line through `json`. A bad
line is counted (file and line in the notes), a cut last line marks the input
partial, point-to-point lines are counted but not compared (a send waits only
for its peer).
"""

from __future__ import annotations

import json
import math
import re
from array import array
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from jaxpace.errors import RecordsError
from jaxpace.records.sources.common import Loaded, Tally, blocks, make_records
from jaxpace.records.sources.nccl_inspector_checks import lifetime_notes, lifetimes, unequal_sizes

__all__ = ["LOG_GLOB", "find_logs", "load"]

LOG_GLOB = "*-pid*.log"
_NAME = re.compile(r"^(?P<host>.+)-pid(?P<pid>\d+)\.log$")
_COLUMNS = ("comm", "rank", "coll", "sn", "exec_ns", "start_ns", "file", "msg")

# Bounds on what a line may say; a value outside them drops the line (counted, with its
# file and line), so no integer overflows or wraps on the way to nanoseconds.
MAX_RANKS = 1 << 24  # `n_ranks`, ranks
MAX_SN = 1 << 40  # `coll_sn`
MAX_EXEC_US = 3.6e9  # `coll_exec_time_us`: one hour
MAX_START_US = 9e15  # kernel start timestamps (x 1000 stays inside int64 with MAX_EXEC_US)
MAX_MSG_BYTES = 1 << 50  # `coll_msg_size_bytes`


def find_logs(path: Path) -> list[Path]:
    """The Inspector logs of `path`: the file itself, or `<host>-pid<pid>.log` files in
    the directory or one level below it (one folder per node, as collected)."""
    if path.is_file():
        return [path]
    found = [*path.glob(LOG_GLOB), *path.glob("*/" + LOG_GLOB)]
    return sorted(f for f in found if _NAME.match(f.name) and f.is_file())


class _Parsed:
    """Everything read from the logs, as compact columns (no object per line)."""

    def __init__(self) -> None:
        self.cols = {k: array("q") for k in _COLUMNS}
        self.comms: dict[str, int] = {}
        self.comm_meta: list[dict[str, Any]] = []
        self.colls: dict[str, int] = {}
        self.p2p: Counter[int] = Counter()
        self.sources: Counter[str] = Counter()
        self.file_host: list[tuple[str, int]] = []
        self.bad = Tally()
        self.cut: list[str] = []
        self.untimed = 0


def _int(d: dict[str, Any], key: str, lo: int = 0, hi: int = MAX_SN) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"`{key}` should be an integer in [{lo}, {hi}], got {_short(v)}")
    return v


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def _time_us(perf: dict[str, Any], key: str) -> float:
    v = perf.get(key)
    if (
        isinstance(v, bool)
        or not isinstance(v, int | float)
        or not math.isfinite(v)
        or not 0 <= v <= MAX_EXEC_US
    ):
        raise ValueError(
            f"`{key}` should be a number of microseconds in [0, {MAX_EXEC_US:.0f}] (one "
            f"hour), got {_short(v)}"
        )
    return float(v)


def _kernel_start_us(perf: dict[str, Any]) -> int:
    """The first channel's kernel start (verbose mode), else -1."""
    ets = perf.get("event_trace_ts")
    if not isinstance(ets, dict):
        return -1
    starts = [
        k.get("kernel_start_ts")
        for k in ets.get("kernel_events") or ()
        if isinstance(k, dict) and isinstance(k.get("kernel_start_ts"), int)
    ]
    if any(s > MAX_START_US for s in starts):
        raise ValueError(
            f"`kernel_start_ts` should be at most {MAX_START_US:.0f} microseconds, got "
            f"{_short(max(starts))}"
        )
    starts = [s for s in starts if s > 0]
    return min(starts) if starts else -1


def _register(p: _Parsed, cid: str, name: str, n_ranks: int) -> int | None:
    """The index of communicator `cid` (added if new), or None if its size changed."""
    i = p.comms.get(cid)
    if i is None:
        i = p.comms[cid] = len(p.comm_meta)
        p.comm_meta.append({"id": cid, "name": name, "n_ranks": n_ranks})
    return i if p.comm_meta[i]["n_ranks"] == n_ranks else None


def _comm(p: _Parsed, header: dict[str, Any]) -> tuple[int, int]:
    """(communicator index, rank) of a line's header; checks rank < n_ranks."""
    cid = header.get("id")
    if not isinstance(cid, str) or not cid:
        raise ValueError(f"`header.id` should be the communicator hash string, got {cid!r}")
    rank, n = _int(header, "rank", 0, MAX_RANKS), _int(header, "n_ranks", 1, MAX_RANKS)
    if rank >= n:
        raise ValueError(f"`header.rank` {rank} is not below `n_ranks` {n}")
    name = header.get("comm_name")
    i = _register(p, cid, name if isinstance(name, str) else "unknown", n)
    if i is None:
        raise ValueError(
            f"communicator {cid} has `n_ranks` {n} here and "
            f"{p.comm_meta[p.comms[cid]]['n_ranks']} before"
        )
    return i, rank


def _add(p: _Parsed, obj: Any, file_index: int) -> None:
    """One parsed line into the columns; ValueError says what is wrong with it."""
    if not isinstance(obj, dict) or not isinstance(obj.get("header"), dict):
        raise ValueError("expected a JSON object with a `header` object")
    comm, rank = _comm(p, obj["header"])
    perf = obj.get("coll_perf")
    if not isinstance(perf, dict):
        if isinstance(obj.get("p2p_perf"), dict):
            p.p2p[comm] += 1
            return
        raise ValueError("expected a `coll_perf` or `p2p_perf` object")
    coll = perf.get("coll")
    if not isinstance(coll, str) or not coll:
        raise ValueError(f"`coll_perf.coll` should name the collective, got {coll!r}")
    sn = _int(perf, "coll_sn", 0, MAX_SN)
    exec_us = _time_us(perf, "coll_exec_time_us")
    start_us = _kernel_start_us(perf)
    msg = (
        _int(perf, "coll_msg_size_bytes", 0, MAX_MSG_BYTES) if "coll_msg_size_bytes" in perf else -1
    )
    p.sources[str(perf.get("coll_timing_source", "unknown"))] += 1
    c = p.cols
    c["comm"].append(comm)
    c["rank"].append(rank)
    c["coll"].append(p.colls.setdefault(coll, len(p.colls)))
    c["sn"].append(sn)
    c["exec_ns"].append(round(exec_us * 1000))
    c["start_ns"].append(start_us * 1000 if start_us >= 0 else -1)
    c["file"].append(file_index)
    c["msg"].append(msg)
    p.untimed += start_us < 0


# One line exactly as `inspector_json.cc` writes it (compact, keys in its order):
# header id, rank, n_ranks; then the collective, `coll_sn`, exec time, timing
# source and the verbose part, or the `p2p` marker.
_FAST_LINE = re.compile(
    rb'^\{"header":\{"id":"([^"\\]+)"(?:,"comm_name":"((?:[^"\\]|\\.)*)")?,"rank":(\d{1,8}),'
    rb'"n_ranks":(\d{1,8}),"nnodes":\d+\},"metadata":\{[^{}]*\},"(?:coll_perf":\{"coll":"(\w+)",'
    rb'"coll_sn":(\d{1,12}),"coll_msg_size_bytes":(\d{1,15}),"coll_exec_time_us":(\d{1,10}),'
    rb'"coll_timing_source":"(\w+)"(?:,"coll_(?:algo|bus)bw_gbs":(?:[-\d.e+]+|"nan"|"-?inf"))*'
    rb'(,"event_trace_sn".*)?|(p2p)_perf":\{[^{}]*)\}\}$',
    re.M,
)
_KERNEL_START = re.compile(rb'"kernel_start_ts":(\d+)')


def _fast_block(p: _Parsed, block: bytes, file_index: int) -> bool:
    """Adds every line of `block` if all are in the plugin's own layout with valid
    ranks; False (nothing added but communicators) otherwise: then the block is read
    line by line, which names each bad line."""
    found = _FAST_LINE.findall(block)
    if not found or len(found) != block.count(b"\n"):
        return False
    ids, names, rank_b, n_b, coll_b, sn_b, msg_b, exec_b, src_b, verbose_b, p2p_b = zip(
        *found, strict=True
    )
    # Communicators in the order their first line comes (never a set's order: the result
    # must not depend on the hash seed); any disagreement on `n_ranks`, in the block or
    # with what came before, and the block is read line by line, which names the line.
    first: dict[bytes, tuple[bytes, int]] = {}
    for cid, name, n in zip(ids, names, n_b, strict=True):
        seen = first.setdefault(cid, (name, int(n)))
        if seen[1] != int(n) or not 1 <= seen[1] <= MAX_RANKS:
            return False
    for cid, (_, n) in first.items():
        i = p.comms.get(cid.decode())
        if i is not None and p.comm_meta[i]["n_ranks"] != n:
            return False
    known = {}
    for cid, (name, n) in first.items():
        try:
            label = json.loads(b'"' + name + b'"') or "unknown"
        except ValueError:
            return False
        known[cid] = _register(p, cid.decode(), label, n)

    has_p2p = b"p2p" in p2p_b  # (their collective fields are empty)

    def ints(col: tuple) -> np.ndarray:
        values = (x or b"0" for x in col) if has_p2p else col
        return np.fromiter(map(int, values), np.int64, len(col))

    rank = ints(rank_b)
    exec_us = ints(exec_b)
    sn = ints(sn_b)
    if (rank >= ints(n_b)).any() or (exec_us > MAX_EXEC_US).any() or (sn > MAX_SN).any():
        return False
    comm = np.fromiter(map(known.__getitem__, ids), np.int64, len(ids))
    keep = np.array(p2p_b) != b"p2p" if has_p2p else slice(None)
    if has_p2p:
        p.p2p.update(comm[~keep].tolist())
    colls = {c: p.colls.setdefault(c.decode(), len(p.colls)) for c in set(coll_b) if c}
    colls[b""] = -1  # (p2p lines)
    for src, count in Counter(src_b).items():
        if src:
            p.sources[src.decode()] += count
    if any(verbose_b):
        start = np.fromiter(map(_first_start, verbose_b), np.int64, len(ids))
        if (start > MAX_START_US).any():
            return False
    else:
        start = np.full(len(ids), -1, np.int64)
    columns = {
        "comm": comm,
        "rank": rank,
        "coll": np.fromiter(map(colls.__getitem__, coll_b), np.int64, len(ids)),
        "sn": sn,
        "exec_ns": exec_us * 1000,
        "start_ns": np.where(start >= 0, start * 1000, -1),
        "file": np.full(len(ids), file_index, np.int64),
        "msg": ints(msg_b),
    }
    for k, v in columns.items():
        p.cols[k].frombytes(np.ascontiguousarray(v[keep], np.int64).tobytes())
    p.untimed += int((start[keep] < 0).sum())
    return True


def _first_start(verbose: bytes) -> int:
    """The first channel's kernel start, -1 without one; one past `MAX_START_US` (the
    line is then read the slow way, which names it) when any is out of range."""
    starts = [int(x) for x in _KERNEL_START.findall(verbose)] if verbose else []
    if any(x > MAX_START_US for x in starts):
        return int(MAX_START_US) + 1
    starts = [x for x in starts if x > 0]
    return min(starts) if starts else -1


def _slow_block(p: _Parsed, path: Path, number: int, block: bytes, ended: bool, file_index: int):
    """Each line of `block` through `json`: a bad line is counted with its number; a
    last line that does not end in a newline and does not parse was cut short."""
    lines = block.split(b"\n")
    if ended:
        lines.pop()  # after the last newline
    first_meta = None
    for j, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError:
            if not ended:
                p.cut.append(f"{path}:{number + j}")
            else:
                p.bad.bad(path, number + j, "not JSON")
            continue
        try:
            _add(p, obj, file_index)
        except ValueError as e:
            p.bad.bad(path, number + j, str(e))
            continue
        if first_meta is None and isinstance(obj.get("metadata"), dict):
            first_meta = obj["metadata"]
    return first_meta


def _read(p: _Parsed, path: Path, file_index: int) -> None:
    m = _NAME.match(path.name)
    host, pid = (m["host"], int(m["pid"])) if m else (path.stem, -1)
    meta = None
    try:
        with path.open("rb") as f:
            for number, block, ended in blocks(f, path, p.bad):
                if not (ended and _fast_block(p, block, file_index)):
                    found = _slow_block(p, path, number, block, ended, file_index)
                    meta = meta or found
                elif meta is None:
                    meta = json.loads(block[: block.index(b"\n")]).get("metadata")
    except OSError as e:
        raise RecordsError(f"cannot read NCCL Inspector log {path}: {e.strerror or e}.") from e
    if isinstance(meta, dict):
        host = str(meta.get("hostname", host))
        pid = meta["pid"] if isinstance(meta.get("pid"), int) else pid
    p.file_host.append((host, pid))


def _arrays(p: _Parsed) -> dict[str, np.ndarray]:
    return {
        k: np.frombuffer(v, dtype=np.int64) if len(v) else np.zeros(0, np.int64)
        for k, v in p.cols.items()
    }


def _process_order(p: _Parsed, a: dict[str, np.ndarray]) -> np.ndarray:
    """Process index of each file: by the lowest rank it holds in the largest
    communicator (so one process per GPU numbers like the ranks), then host and pid."""
    n_files = len(p.file_host)
    first = np.full(n_files, np.iinfo(np.int64).max)
    if a["comm"].size:
        sizes = [m["n_ranks"] for m in p.comm_meta]
        big = a["comm"] == int(np.argmax(sizes))
        np.minimum.at(first, a["file"][big], a["rank"][big])
    order = sorted(range(n_files), key=lambda i: (int(first[i]), *p.file_host[i]))
    process = np.empty(n_files, np.int64)
    process[order] = np.arange(n_files)
    return process


def _sites(p: _Parsed, a: dict[str, np.ndarray], notes: list[str]) -> tuple[list[str], np.ndarray]:
    """Site names and each record's site index (-1: a site with fewer than 2 ranks)."""
    colls = list(p.colls)
    key = a["comm"] * len(colls) + a["coll"]
    uniq, inv = np.unique(key, return_inverse=True)
    names, index, dropped = [], np.full(uniq.size, -1), []
    for i, k in enumerate(uniq.tolist()):
        meta = p.comm_meta[k // len(colls)]
        where = meta["id"] if meta["name"] == "unknown" else f"{meta['name']} ({meta['id']})"
        name = f"{colls[k % len(colls)]} on {where}"
        if np.unique(a["rank"][inv == i]).size < 2:
            dropped.append(name)
            continue
        index[i] = len(names)
        names.append(name)
    if dropped:
        notes.append(
            f"{len(dropped)} sites with records of one rank only, not compared: "
            + ", ".join(f"`{d}`" for d in dropped[:5])
            + (" ..." if len(dropped) > 5 else "")
        )
    return names, index[inv]


def _steps(
    a: dict[str, np.ndarray], site: np.ndarray, life: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each record's step: the rank of its (lifetime, `coll_sn`) among its site's (a
    re-created communicator's collectives come after the earlier lifetime's); and a mask
    keeping the first record of each (site, step, rank)."""
    sn_span = int(a["sn"].max()) + 1 if a["sn"].size else 1
    sn = life * sn_span + a["sn"]
    span = int(sn.max()) + 1 if sn.size else 1
    uniq, inv = np.unique(site * span + sn, return_inverse=True)
    site_start = np.searchsorted(uniq, (uniq // span) * span)
    step = np.arange(uniq.size) - site_start
    r_span = int(a["rank"].max()) + 1 if a["rank"].size else 1
    _, first = np.unique(inv * r_span + a["rank"], return_index=True)
    keep = np.zeros(site.size, bool)
    keep[first] = True
    return step[inv], keep


def _gap_notes(p: _Parsed, a: dict[str, np.ndarray]) -> list[str]:
    """Records the ring dropped (gaps in `coll_sn` of a communicator rank), and
    communicators with ranks missing."""
    notes = []
    r_span = int(a["rank"].max()) + 1 if a["rank"].size else 1
    cr = a["comm"] * r_span + a["rank"]
    uniq, inv = np.unique(cr, return_inverse=True)
    if uniq.size:
        lo = np.full(uniq.size, np.iinfo(np.int64).max)
        hi = np.full(uniq.size, -1)
        np.minimum.at(lo, inv, a["sn"])
        np.maximum.at(hi, inv, a["sn"])
        sn_span = int(a["sn"].max()) + 1
        distinct = np.bincount(np.unique(inv * sn_span + a["sn"]) // sn_span, minlength=uniq.size)
        missing = int((hi - lo + 1 - distinct).sum())
        if missing:
            notes.append(
                f"{missing} collectives missing inside the `coll_sn` ranges of the "
                "communicator ranks (Inspector drops records when its ring overflows "
                "between dumps); their steps lack some ranks and compare the ranks present."
            )
    for i, meta in enumerate(p.comm_meta):
        seen = np.unique(a["rank"][a["comm"] == i]).size
        if 0 < seen < meta["n_ranks"]:
            notes.append(
                f"communicator {meta['id']} ({meta['name']}): records of {seen} of its "
                f"{meta['n_ranks']} ranks; the others' logs are missing."
            )
    return notes


def _notes(p: _Parsed) -> list[str]:
    notes = []
    bad = p.bad.note("bad lines")
    if bad:
        notes.append(bad)
    if p.cut:
        notes.append(
            f"{len(p.cut)} last line{'s' if len(p.cut) > 1 else ''} cut short (a process "
            "killed while writing?), skipped: "
            + ", ".join(p.cut[:3])
            + (" ..." if len(p.cut) > 3 else "")
        )
    if p.p2p:
        notes.append(
            f"{sum(p.p2p.values())} point-to-point records (send/recv) not compared across "
            "ranks: a point-to-point rank waits only for its peer."
        )
    cpu = sum(n for s, n in p.sources.items() if s != "kernel_gpu")
    if cpu:
        notes.append(
            f"{cpu} collectives timed on the CPU (`coll_timing_source` other than "
            "`kernel_gpu`): their times include launch and completion polling."
        )
    if p.untimed and p.untimed < len(p.cols["sn"]):
        notes.append(
            f"{p.untimed} collectives without `event_trace_ts`: kernel start times are "
            "not used for any record (set `NCCL_INSPECTOR_DUMP_VERBOSE=1` on every rank)."
        )
    return notes


def load(path: Path) -> Loaded:
    """Reads NCCL Inspector logs (a file, or a directory of `<host>-pid<pid>.log`).

    Raises:
      RecordsError: no logs, unreadable files, or no collective that two ranks report.
    """
    files = find_logs(path)
    if not files:
        raise RecordsError(f"no NCCL Inspector logs (`{LOG_GLOB}`) in {path}.")
    p = _Parsed()
    for i, f in enumerate(files):
        _read(p, f, i)
    notes = _notes(p)
    a = _arrays(p)
    if a["sn"].size == 0:
        raise RecordsError(
            f"no collective records (`coll_perf` lines) in the {len(files)} NCCL Inspector "
            f"logs under {path}. " + " ".join(notes)
        )
    notes += _gap_notes(p, a)
    sites, site = _sites(p, a, notes)
    if not sites:
        raise RecordsError(
            f"the NCCL Inspector logs under {path} hold no collective reported by two "
            "ranks of one communicator; nothing to compare. " + " ".join(notes)
        )
    life = lifetimes(a)
    notes += lifetime_notes(p, a, life)
    step, keep = _steps(a, site, life)
    keep &= site >= 0
    dups = int(((site >= 0) & ~keep).sum())
    if dups:
        notes.append(
            f"PARTIAL: {dups} duplicate records (same communicator lifetime, `coll_sn` and "
            "rank) dropped."
        )
    site_info = unequal_sizes(a, site, step, keep, sites)
    timed = p.untimed == 0
    start = np.where(a["start_ns"] >= 0, a["start_ns"], 0)
    process = _process_order(p, a)
    hosts = [""] * len(files)
    for i, (h, _) in enumerate(p.file_host):
        hosts[int(process[i])] = h
    columns = {
        "site": site[keep],
        "step": step[keep],
        "rank": a["rank"][keep],
        "process": process[a["file"]][keep],
        "device": np.full(int(keep.sum()), -1, np.int64),
        "arrive_ns": start[keep],
        "done_ns": (start + a["exec_ns"])[keep],
        "wait_ns": a["exec_ns"][keep],
    }
    label = (
        f"NCCL Inspector logs: {len(files)} files (processes) on {len(set(hosts))} hosts, "
        f"{len(p.comm_meta)} communicators"
        + ("" if timed else "; kernel times only (no start times: compute not measured)")
    )
    recs = make_records(
        columns,
        sites,
        hosts,
        notes=notes,
        partial=bool(p.cut or p.bad.count or dups),
        files=files,
        run_id=path.resolve().name,
        source="nccl_inspector",
        source_label=label,
        site_info=site_info,
        timed=timed,
    )
    return Loaded(recs, label, timed=timed)
