"""`python -m benchmarks sources`: how fast `jaxpace report` reads other sources, and in how much memory.

- NCCL Inspector logs: 256 ranks (one process each, 8 per host) x 10,000
  collectives of one communicator, about 1 GB of JSON lines;
- `jax.profiler` traces: 8 processes x 8 devices x 200 steps, CPU trace layout
  with 40 other thunk events per device and step beside each all-reduce.

Each is written by `jaxpace.records.sources.synthetic`, then read in a fresh
process (`load`: the files to columns; `analyze` of those columns; then the
HTML and the Perfetto trace), which reports its own wall times and peak
resident memory.
`--write-doc` puts the figures in their section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "benchmarks.md"
BEGIN = "<!-- begin: written by `python -m benchmarks sources` -->"
END = "<!-- end: written by `python -m benchmarks sources` -->"

_CHILD = """
import json, resource, sys, time
from pathlib import Path
from jaxpace.report import analyze, write_html, write_trace
from jaxpace.records.sources import load
d = Path(sys.argv[1])
c = time.process_time()
t = time.perf_counter(); loaded = load(d); load_s = time.perf_counter() - t
load_cpu_s = time.process_time() - c
rows = len(loaded.records)
t = time.perf_counter(); rep = analyze(loaded.records); analyze_s = time.perf_counter() - t
cpu_s = time.process_time() - c
t = time.perf_counter()
write_html(rep, d / "report.html"); write_trace(rep, d / "trace.json")
out_s = time.perf_counter() - t
print(json.dumps({"load_s": load_s, "analyze_s": analyze_s, "html_trace_s": out_s,
  "load_cpu_s": load_cpu_s, "cpu_s": cpu_s,
  "rows": rows, "ranks": rep.num_ranks, "steps": rep.num_steps, "culprit": rep.culprit,
  "source": rep.source,
  "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))
"""


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _read_in_child(path: Path, timeout_s: float) -> dict:
    env = dict(
        os.environ, PYTHONPATH=str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def inspector(work: Path, ranks: int, collectives: int, timeout_s: float) -> dict:
    from jaxpace.records.sources.synthetic import write_inspector_logs

    d = work / "inspector"
    t = time.perf_counter()
    write_inspector_logs(
        d, ranks, collectives, late_ranks=[ranks * 3 // 10], late_us=1500.0, seed=0
    )
    res = {"write_s": time.perf_counter() - t, "bytes": _du(d), "ranks_in": ranks}
    res.update(_read_in_child(d, timeout_s))
    return res


def xprof(work: Path, processes: int, devices: int, steps: int, timeout_s: float) -> dict:
    from jaxpace.records.sources.synthetic import write_xprof_traces

    d = work / "xprof"
    t = time.perf_counter()
    write_xprof_traces(d, processes, devices, steps, other_events=40, late_ranks=[9], seed=0)
    res = {"write_s": time.perf_counter() - t, "bytes": _du(d)}
    res.update(_read_in_child(d, timeout_s))
    return res


def markdown(res: dict) -> str:
    i, x = res["inspector"], res["xprof"]

    def row(name: str, r: dict, goal: str) -> str:
        return (
            f"| {name} | {r['bytes'] / 1e9:.2f} GB | {r['rows']:,} | {r['load_s']:.1f} s | "
            f"{r['analyze_s']:.1f} s | {r['load_s'] + r['analyze_s']:.1f} s | {r['cpu_s']:.1f} s | "
            f"{r['html_trace_s']:.1f} s | {r['peak_rss_gib']:.2f} GiB | "
            f"{goal} |"
        )

    return "\n".join(
        [
            BEGIN,
            "## Reading profiler traces and NCCL Inspector logs (`python -m benchmarks sources`)",
            "",
            f"Machine: {res['machine']}; load average {res['load']:.1f} before the run.",
            "Files written by `jaxpace.records.sources.synthetic`, read in a fresh process: "
            "`load` (files to columns), `analyze` (the whole analysis of those columns), "
            "the HTML and Perfetto files; wall times, the CPU time of load + analyze (what "
            "they take on an idle core), and the peak resident memory of that process.",
            "",
            "| input | size | records | load | analyze | load + analyze | (CPU time) "
            "| HTML + trace | peak RSS | goal (load + analyze) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
            row(
                f"NCCL Inspector, {i['ranks']} ranks x {i['steps']:,} collectives",
                i,
                "<= 60 s, <= 4 GiB",
            ),
            row(
                f"jax.profiler, {x['ranks']} devices x {x['steps']} steps (8 processes)",
                x,
                "<= 30 s",
            ),
            "",
            f"Culprit named: Inspector rank {i['culprit']} (injected {int(i['ranks_in']) * 3 // 10}), profiler rank "
            f"{x['culprit']} (injected 9).",
            END,
        ]
    )


def write_doc(text: str, doc: Path = DOC) -> None:
    """Replaces this benchmark's section of `doc` (appended at the end the first time)."""
    old = doc.read_text()
    if BEGIN in old and END in old:
        new = old[: old.index(BEGIN)] + text + old[old.index(END) + len(END) :]
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    doc.write_text(new)


def main(argv=None) -> int:
    import platform

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--collectives", type=int, default=10_000)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    ap.add_argument("--timeout", type=float, default=900.0, help="per read, seconds")
    ap.add_argument("--write-doc", action="store_true", help="update docs/benchmarks.md")
    ap.add_argument("--out", default=None, help="also write the JSON result here")
    args = ap.parse_args(argv)
    work = Path(args.dir or tempfile.mkdtemp(prefix="jaxpace-sources-"))
    try:
        res = {
            "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores",
            "load": os.getloadavg()[0],
            "xprof": xprof(work, 8, 8, args.steps, args.timeout),
            "inspector": inspector(work, args.ranks, args.collectives, args.timeout),
        }
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(res, indent=1))
    md = markdown(res)
    print(md)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    if args.write_doc:
        write_doc(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
