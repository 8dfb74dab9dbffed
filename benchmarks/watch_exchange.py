"""`python -m benchmarks watch-exchange`: the watch exchange with many processes' keys in one real
coordination service: the deciding process's read time and memory.

A stand-in for a job of N processes: one `jax.distributed` coordination service started in
this process (`jaxpace._jax_compat.coordination_service`, what process 0 of a job runs) and
two connected clients: a writer that puts every process's window summary under the same
keys the N processes' watch would (`jaxpace/watch/<run>/summary/<slot>/p<i>`, the values
serialized as `Worker._put` does), and the deciding process's client, through which the
watch `Worker` reads one slot (`Worker._get_dir` with `summary.compact`: the bounded store call and the parsing).
What the stand-in leaves out: N real connections (their heartbeats to the service) and N
writers at once; the keys, the values and the leader's read are the job's.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BEGIN = "<!-- begin: watch-exchange, written by `python -m benchmarks watch-exchange` -->"
END = "<!-- end: watch-exchange -->"


def summary_value(process: int, *, steps: int = 5, sites: int = 4, devices: int = 8) -> str:
    """A window summary as process `process` would publish it: `steps` executions of `sites`
    collectives on its `devices` devices (one row each), compact JSON."""
    rows = [
        [s, e, process * devices + d, 1000 * e + 7 * d, 300 + 11 * d]
        for s in range(sites)
        for e in range(steps)
        for d in range(devices)
    ]
    v = {
        "v": 1,
        "process": process,
        "host": f"host-{process:05d}.cluster.example",
        "window": 1,
        "first_step": 100,
        "last_step": 104,
        "sites": [f"jit_train_step/all-reduce.{i}" for i in range(sites)],
        "rows": rows,
        "notes": [],
        "partial": False,
        "costs": {"pre_block_s": 0.0312, "end_block_s": 0.0298, "start_trace_s": 0.0001},
    }
    return json.dumps(v, separators=(",", ":"))


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(
    processes: int, *, overwrites: int = 2, steps: int = 5, sites: int = 4, devices: int = 8
) -> dict:
    """Puts `processes` summaries into a fresh coordination service and reads them as the
    deciding process does. Returns the figures (seconds, MiB) and what was read back."""
    from jaxpace import _jax_compat as compat
    from jaxpace.watch import exchange, summary
    from jaxpace.watch.worker import SLOTS, Worker
    from jaxpace.watch.wrapper import Watched

    addr = f"127.0.0.1:{_free_port()}"
    rss0 = _rss_mib()
    service = compat.coordination_service(addr, 2)
    clients: list = [None, None]

    def connect(i: int) -> None:
        clients[i] = compat.coordination_client(addr, i)

    threads = [threading.Thread(target=connect, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if None in clients:
        service.shutdown()
        raise RuntimeError("the coordination clients did not connect within 60 s")
    writer, reader = clients
    try:
        w = Watched(lambda x: x)
        leader = Worker(
            w, exchange.KVExchange(reader), process=0, count=processes, host="host-00000"
        )
        slot = 1 % SLOTS
        value_bytes = 0
        t0 = time.perf_counter()
        for p in range(processes):
            v = summary_value(p, steps=steps, sites=sites, devices=devices)
            value_bytes += len(v)
            writer.key_value_set(exchange.key(w.run, "summary", p, slot), v, True)
        write_s = time.perf_counter() - t0
        rss_stored = _rss_mib()
        prefix = f"jaxpace/watch/{w.run}/summary/{slot}/"
        t0 = time.perf_counter()
        raw = leader.ex.get_dir(prefix)  # the store call alone
        get_s = time.perf_counter() - t0
        del raw
        t0 = time.perf_counter()
        got = leader._get_dir(
            prefix, summary.compact
        )  # the store call and the parsing, as the leader reads
        read_s = time.perf_counter() - t0
        ok_processes = sorted(got)
        del got
        tracemalloc.start()  # (slows Python down: a separate read for the memory)
        leader._get_dir(prefix, summary.compact)
        _cur, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        rss_read = _rss_mib()
        # Later windows overwrite the same keys: the store's memory after each.
        rss_windows = []
        for _ in range(overwrites):
            for p in range(processes):
                writer.key_value_set(
                    exchange.key(w.run, "summary", p, slot),
                    summary_value(p, steps=steps, sites=sites, devices=devices),
                    True,
                )
            rss_windows.append(_rss_mib() - rss0)
        leader.ex.close()
        return {
            "processes": processes,
            "rows_per_summary": steps * sites * devices,
            "value_bytes_mean": value_bytes / processes,
            "stored_mib": value_bytes / 2**20,
            "write_s": write_s,
            "get_s": get_s,
            "read_s": read_s,
            "read_peak_mib": peak / 2**20,
            "rss_growth_stored_mib": rss_stored - rss0,
            "rss_growth_after_read_mib": rss_read - rss0,
            "rss_growth_after_overwrites_mib": rss_windows,
            "processes_read": len(ok_processes),
            "all_read": ok_processes == list(range(processes)),
            "store_failures": leader._fails,
        }
    finally:
        for c in clients:
            try:
                c.shutdown()
            except Exception:  # noqa: BLE001, S110 - best effort at the end of a benchmark
                pass
        service.shutdown()


def markdown(rows: list[dict]) -> str:
    from benchmarks.__main__ import machine

    lines = [
        BEGIN,
        "## watch exchange at scale (`python -m benchmarks watch-exchange`)",
        "",
        "One real `jax.distributed` coordination service in this process and two connected "
        "clients: one puts every process's window summary under the keys N processes' "
        "watch would use; the deciding process's watch `Worker` reads the slot (one bounded "
        "`key_value_dir_get` and the parsing, `Worker._get_dir`). A stand-in: the N "
        "processes' own connections and concurrent writes are not simulated. Each summary: "
        "5 executions x 4 collectives x 8 devices (160 rows), what an 8-GPU host publishes "
        "for a 5-step window of a step with 4 collectives. Memory: the leader's peak "
        "Python allocation while reading and parsing (tracemalloc), and the process's RSS "
        "growth (service, both clients, leader; it includes memory the allocator keeps) "
        "after storing, after the leader's reads, and after every key was overwritten by "
        "each later window. Leader read: the store call (`get`) and the parsing into "
        "summaries with int64 row arrays (`summary.compact`).",
        "",
        "| processes | value (mean) | stored | write (one client) | leader get / read + parse | "
        "leader peak | RSS after store / read / each later window | read back |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['processes']:,} | {r['value_bytes_mean'] / 1024:.1f} KiB | "
            f"{r['stored_mib']:.1f} MiB | {r['write_s']:.2f} s | {r['get_s'] * 1e3:.0f} / "
            f"{r['read_s'] * 1e3:.0f} ms | "
            f"{r['read_peak_mib']:.0f} MiB | +{r['rss_growth_stored_mib']:.0f} / "
            f"+{r['rss_growth_after_read_mib']:.0f} / "
            + ", ".join(f"+{v:.0f}" for v in r["rss_growth_after_overwrites_mib"])
            + " MiB | "
            f"{r['processes_read']:,}{'' if r['all_read'] else ' (missing)'} |"
        )
    lines += [
        "",
        "The read is one call bounded by `KV_TIMEOUT_S` (5 s): a slower store fails the "
        "call and the window is decided partial, never waited for. A summary is capped at "
        "16 sites and 4,096 rows (about 100 KB): at that cap 8,192 processes' summaries are "
        "about 800 MB, which one read of a slot does not bound; the table's 160-row summary "
        "is the expected size.",
        "",
        f"Machine: {machine()}. Date: {time.strftime('%Y-%m-%d')}.",
        END,
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks watch-exchange", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--processes", type=int, nargs="+", default=[1024, 8192])
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--markdown", default=str(REPO / "docs" / "benchmarks.md"))
    args = ap.parse_args(argv)
    rows = []
    for n in args.processes:
        rows.append(measure(n))
        print(json.dumps(rows[-1]), flush=True)
    from benchmarks.fsdp import publish

    publish(rows, markdown(rows), args.out, "watch_exchange", args.markdown, BEGIN, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
