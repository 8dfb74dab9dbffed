"""Physically consistent NCCL Inspector logs and `jax.profiler` traces, for tests,
benchmarks and docs.

Each rank arrives at each collective after its own compute (plus a set lateness
for late ranks or hosts); every rank leaves when the last has arrived plus the
transfer, so its time inside is its wait plus the transfer. Each host's clock
has its own offset, as on a real cluster. The files follow the formats as
their writers produce them: Inspector's compact JSON lines (key order of
`inspector_json.cc`, doubles as `%lf`, NaN as the string `"nan"`) and the
profiler's one-line Chrome trace JSON.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from jaxpace.records.safe_io import write_atomic

__all__ = ["Comm", "arrivals", "write_inspector_logs", "write_xprof_traces"]


@dataclasses.dataclass(frozen=True)
class Comm:
    """One communicator: its hash `id`, name, member ranks (global) and the
    collectives it runs each step, in order."""

    id: str
    name: str
    ranks: tuple[int, ...]
    colls: tuple[str, ...] = ("AllReduce",)


def arrivals(
    num_steps: int,
    num_ranks: int,
    *,
    late_ranks: Sequence[int] = (),
    late_us: float = 2000.0,
    step_us: float = 20000.0,
    jitter_us: float = 150.0,
    seed: int = 0,
) -> np.ndarray:
    """(steps, ranks) arrival times in microseconds on a common (unknown) clock."""
    rng = np.random.default_rng(seed)
    a = np.arange(num_steps)[:, None] * step_us + rng.exponential(jitter_us, (num_steps, num_ranks))
    a[:, list(late_ranks)] += late_us
    return a


def _line(comm: Comm, rank: int, n_ranks: int, nnodes: int, host: str, pid: int) -> str:
    header = json.dumps(
        {"id": comm.id, "comm_name": comm.name, "rank": rank, "n_ranks": n_ranks, "nnodes": nnodes},
        separators=(",", ":"),
    )
    meta = (
        '{"inspector_output_format_version":"v4.0","git_rev":"","rec_mechanism":'
        f'"nccl_profiler_interface","dump_timestamp_us":%d,"hostname":{json.dumps(host)},'
        f'"pid":{pid}}}'
    )
    return '{"header":' + header + ',"metadata":' + meta + ',"coll_perf":%s}'


def _perf(coll: str, sn: int, size: int, exec_us: int, bw: float, start: int | None) -> str:
    bw_s = '"nan"' if bw != bw else f"{bw:f}"
    s = (
        f'{{"coll":"{coll}","coll_sn":{sn},"coll_msg_size_bytes":{size},'
        f'"coll_exec_time_us":{exec_us},"coll_timing_source":"kernel_gpu",'
        f'"coll_algobw_gbs":{bw_s},"coll_busbw_gbs":{bw_s}'
    )
    if start is not None:
        stop = start + exec_us
        s += (
            f',"event_trace_sn":{{"coll_start_sn":1,"coll_stop_sn":2,"kernel_events":'
            f'[{{"channel_id":0,"kernel_start_sn":3,"kernel_stop_sn":4,"kernel_record_sn":4}}]}}'
            f',"event_trace_ts":{{"coll_start_ts":{start - 5},"coll_stop_ts":{start - 1},'
            f'"kernel_events":[{{"channel_id":0,"kernel_start_ts":{start},'
            f'"kernel_stop_ts":{stop},"kernel_record_ts":{stop}}}]}}'
        )
    return s + "}"


def write_inspector_logs(
    directory: str | Path,
    num_ranks: int,
    num_steps: int,
    *,
    comms: Sequence[Comm] | None = None,
    ranks_per_host: int = 8,
    verbose: bool = False,
    transfer_us: float = 400.0,
    msg_size_bytes: int = 1 << 26,
    p2p_every: int = 0,
    **arrival_kw: float | int | Sequence[int],
) -> list[Path]:
    """Writes `<host>-pid<pid>.log` per rank (one process per GPU) and returns the paths.

    Args:
      comms: the communicators; default one `AllReduce` communicator of all ranks.
      ranks_per_host: ranks on each host `node-<i>` (and `nnodes` in the headers).
      verbose: write `event_trace_ts` (kernel start/stop on each host's clock).
      p2p_every: also write a `p2p_perf` line every this many steps (0: none).
      arrival_kw: `arrivals` arguments (`late_ranks`, `late_us`, `jitter_us`, `seed`).
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    comms = comms or [Comm("0x5eed00000000a11", "world", tuple(range(num_ranks)))]
    a = arrivals(num_steps, num_ranks, **arrival_kw)  # type: ignore[arg-type]
    hosts = [f"node-{r // ranks_per_host}" for r in range(num_ranks)]
    offset_us = {h: 1_700_000_000_000_000 + 7_919_000 * i for i, h in enumerate(sorted(set(hosts)))}
    # (steps, collectives, members): every member leaves when the last has arrived.
    arr = [a[:, None, list(c.ranks)] + 50.0 * np.arange(len(c.colls))[None, :, None] for c in comms]
    exec_us = [np.rint(x.max(axis=2, keepdims=True) - x + transfer_us).astype(int) for x in arr]
    paths = []
    for r in range(num_ranks):
        p = d / f"{hosts[r]}-pid{1000 + r}.log"

        def fill(f, r=r) -> None:
            for ci, comm in enumerate(comms):
                if r in comm.ranks:
                    f.write(
                        _rank_lines(
                            comm,
                            r,
                            arr[ci],
                            exec_us[ci],
                            nnodes=len(set(hosts)),
                            host=hosts[r],
                            offset_us=offset_us[hosts[r]],
                            verbose=verbose,
                            size=msg_size_bytes,
                            p2p_every=p2p_every,
                        )
                    )

        write_atomic(p, fill, what="synthetic NCCL Inspector log")
        paths.append(p)
    return paths


def _rank_lines(
    comm: Comm,
    r: int,
    arr: np.ndarray,
    exec_us: np.ndarray,
    *,
    nnodes: int,
    host: str,
    offset_us: int,
    verbose: bool,
    size: int,
    p2p_every: int,
) -> str:
    """One rank's lines of one communicator, every step (`coll_sn` counts its collectives)."""
    i = comm.ranks.index(r)
    template = _line(comm, i, len(comm.ranks), nnodes, host, 1000 + r)
    out = []
    S, C = exec_us.shape[:2]
    for k in range(S):
        for c, coll in enumerate(comm.colls):
            t = int(exec_us[k, c, i])
            ts = int(offset_us + arr[k, c, i])
            bw = size / t / 1e3 if k % 97 else float("nan")
            out.append(
                template % (ts, _perf(coll, k * C + c, size, t, bw, ts if verbose else None))
            )
        if p2p_every and k % p2p_every == 0:
            p2p = (
                f'{{"p2p":"Send","p2p_sn":{k},"p2p_peer":{(i + 1) % len(comm.ranks)},'
                '"p2p_msg_size_bytes":4096,"p2p_exec_time_us":12,"p2p_timing_source":'
                '"kernel_gpu","p2p_algobw_gbs":0.341333,"p2p_busbw_gbs":0.341333}'
            )
            line = template % (int(offset_us + arr[k, 0, i]), "")
            out.append(line.replace('"coll_perf":}', '"p2p_perf":' + p2p + "}"))
    return "".join(line + "\n" for line in out)


def write_xprof_traces(
    directory: str | Path,
    num_processes: int,
    devices_per_process: int,
    num_steps: int,
    *,
    transfer_us: float | np.ndarray = 300.0,
    other_events: int = 6,
    arrival_us: np.ndarray | None = None,
    run_ids: bool = True,
    windows: Sequence[tuple[int, int]] | None = None,
    session: str = "2026_01_01_00_00_00",
    first_run_id: int = 90000,
    **arrival_kw: float | int | Sequence[int],
) -> list[Path]:
    """Writes `p<i>/plugins/profile/<session>/<host>.trace.json.gz` per process, as the
    CPU profiler does (global device ids `process << 11 | local`, one `run_id` per
    step shared by all processes, each process's own clock from its trace start).

    Args:
      transfer_us: the collective's transfer, or one per step (num_steps,).
      other_events: non-collective thunk events per device and step (as real traces
        hold), so reading costs what it costs on a real trace.
      arrival_us: (num_steps, ranks) arrival times in microseconds on a common
        clock, instead of drawing them with `arrivals`.
      run_ids: write `args.run_id` (False: as GPU NCCL kernels, matched by order).
      windows: per process, the steps `[start, stop)` its trace holds (default all).
      session: the profiler session folder's name.
      first_run_id: the `run_id` of step 0 (step k's is this + k).
      arrival_kw: `arrivals` arguments; `late_ranks` are global ranks.
    """
    R = num_processes * devices_per_process
    if arrival_us is not None:
        a = np.asarray(arrival_us, dtype=np.float64)
        if a.shape != (num_steps, R):
            raise ValueError(f"arrival_us has shape {a.shape}, not {(num_steps, R)}")
    else:
        a = arrivals(num_steps, R, **arrival_kw)  # type: ignore[arg-type]
    transfer = np.broadcast_to(np.asarray(transfer_us, dtype=np.float64), (num_steps,))
    paths = []
    for p in range(num_processes):
        base = 1000.0 + 37.0 * p  # the process's own trace origin
        events = ['{"ph":"M","pid":701,"name":"process_name","args":{"name":"/host:CPU"}}']
        start, stop = windows[p] if windows is not None else (0, num_steps)
        for k in range(start, stop):
            cols = slice(p * devices_per_process, (p + 1) * devices_per_process)
            arr = a[k, cols]
            dur = a[k].max() - arr + transfer[k]
            for j in range(devices_per_process):
                dev = (p << 11) | j if num_processes > 1 else j
                args = f'"device_ordinal":"{dev}","hlo_module":"jit_step"'
                args += f',"run_id":"{first_run_id + k}"' if run_ids else ""
                t0 = arr[j] - 10.0 * other_events - base
                for e in range(other_events):
                    events.append(
                        f'{{"ph":"X","pid":701,"tid":{j},"ts":{t0 + 10 * e:.3f},"dur":8.5,'
                        f'"name":"fusion.{e}","args":{{{args},"hlo_op":"fusion.{e}"}}}}'
                    )
                events.append(
                    f'{{"ph":"X","pid":701,"tid":{j},"ts":{arr[j] - base:.3f},'
                    f'"dur":{dur[j]:.3f},"name":"all-reduce","args":{{{args},'
                    '"hlo_op":"all-reduce"}}'
                )
        run = Path(directory) / f"p{p}" / "plugins" / "profile" / session
        run.mkdir(parents=True, exist_ok=True)
        path = run / f"host-{p}.trace.json.gz"
        text = '{"displayTimeUnit":"ns","metadata":{"highres-ticks":true},"traceEvents":['
        data = gzip.compress((text + ",".join(events) + "]}").encode(), compresslevel=1)
        write_atomic(path, data, what="synthetic profiler trace")
        paths.append(path)
    return paths
