"""`python -m benchmarks records`: records at fleet scale (issue 46), on this machine.

For each size (ranks x sites x steps, one late rank, 8 ranks a process), the run
is written by `jaxpace.records.format.write_columns` as JSONL and as Parquet (the
runtime's and the simulator's writer; its time per million rows and bytes per
row are the export's cost), then each of these runs in a fresh process that
reports its own wall time and peak resident memory:

- `report-jsonl`: `jaxpace report` on the JSONL run (load, analyze, HTML, trace);
- `convert`: `jaxpace convert` of the JSONL run to Parquet;
- `report-parquet`: `jaxpace report` on the converted run;
- `engine-jsonl`, `engine-parquet`: the DuckDB reduction alone (`records.engine`:
  per (site, step), lateness per (step, rank), per-rank statistics; 2 threads);
- `lost`: 1% (or `--loss`) of the step lines dropped at random: the culprit named
  and the share of steps analyzed.

A size ending in `p` (`8192x32x1000p`) is written only as Parquet, natively, and only
`report-parquet` runs on it (its JSONL would not fit the disk). Each child's line
carries the machine's 1-minute load average when it started (other jobs share the
cores). Peak memory is the child's own `ru_maxrss`.

`--write-doc` puts the table in its section of docs/benchmarks.md.
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
BEGIN = "<!-- begin: written by `python -m benchmarks records` -->"
END = "<!-- end: written by `python -m benchmarks records` -->"
LATE = 37

_CHILD = r"""
import json, resource, sys, time
from pathlib import Path
what, src, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
t = time.perf_counter()
res = {}
if what == "report":
    from jaxpace.report import analyze, write_html, write_trace
    rep = analyze(src)
    write_html(rep, out / "r.html"); write_trace(rep, out / "t.json")
    res.update(culprit=rep.culprit, analyzed=rep.analyzed_steps, steps=rep.num_steps,
               warmup=rep.warmup_steps, partial=rep.partial)
elif what == "convert":
    from jaxpace.records.convert import convert
    convert(src, out / "converted", progress=False)
elif what == "engine":
    from jaxpace.records.engine import Engine
    with Engine(threads=2, memory_limit="1GB") as e:
        scan = e.open_steps(src); red = e.reduce()
    i = int(red.ranks["mean_excess_ns"].argmax())
    res.update(rows=scan.rows, culprit=int(red.ranks["rank"][i]))
res["wall_s"] = time.perf_counter() - t
res["peak_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
print(json.dumps(res))
"""


def write_run(d: Path, ranks: int, sites: int, steps: int, fmt: str, loss: float = 0.0) -> dict:
    """Writes the run (one file per process of 8 ranks); returns rows, seconds, bytes."""
    import numpy as np

    from jaxpace.records.format import header_record, records_filename, write_columns

    rng = np.random.default_rng(0)
    rpp = 8
    P = ranks // rpp
    d.mkdir(parents=True, exist_ok=True)
    names = [f"model.py:{10 * j}:layer{j}" for j in range(sites)]
    rows = secs = 0.0
    step_i, site_i, r_i = np.meshgrid(np.arange(steps), np.arange(sites), np.arange(rpp))
    step_i, site_i, r_i = step_i.ravel(), site_i.ravel(), r_i.ravel()
    for p in range(P):
        rank = p * rpp + r_i
        compute = 0.050 + 0.0005 * rng.standard_normal(rank.size) + 0.004 * (rank == LATE)
        # Everyone leaves together 0.3 ms after the last arrival (about 0.050 + 4 ms).
        wait_s = 0.0543 + 0.0003 - compute + 0.00001 * rng.random(rank.size)
        arrive = (10**12 + p * 10**9 + (step_i * 0.06 + site_i * 0.001) * 1e9).astype(np.int64)
        wait = np.maximum(np.round(wait_s * 1e9), 0).astype(np.int64)
        keep = rng.random(rank.size) >= loss
        cols = {
            "site": site_i[keep],
            "step": step_i[keep],
            "rank": rank[keep],
            "process": np.full(int(keep.sum()), p),
            "arrive_ns": arrive[keep],
            "done_ns": (arrive + wait)[keep],
            "wait_ns": wait[keep],
            "delay_ns": np.zeros(int(keep.sum()), np.int64),
            "engaged": np.zeros(int(keep.sum()), bool),
            "device": rank[keep],
        }
        head = header_record(
            run_id="bench", process_index=p, process_count=P, host=f"node-{p}", pid=p,
            granularity="device", jaxpace_version="bench", policy="no_pacing()",
            local_devices=list(range(p * rpp, (p + 1) * rpp)), rank_groups=None,
        )  # fmt: skip
        t = time.perf_counter()
        write_columns(d / records_filename(p, fmt), head, cols, names, fmt)
        secs += time.perf_counter() - t
        rows += int(keep.sum())
    size = sum(f.stat().st_size for f in d.iterdir())
    return {"rows": int(rows), "write_s": secs, "bytes": size}


def export_cost(reps: int = 3) -> dict:
    """`Pacer.export`'s Parquet path at exit (`runtime.export._columns` then
    `format.write_parquet`) on 8 ranks x 32 sites x 4096 steps of ring rows (1.05M rows,
    the default `capacity`), random timings; the best of `reps`, per million rows."""
    import numpy as np

    from jaxpace.records import format as fmt
    from jaxpace.runtime import export as ex
    from jaxpace.runtime.probe import RECORD_DTYPE

    rng = np.random.default_rng(0)
    parts = []
    for s in range(32):
        for r in range(8):
            rows = np.zeros(4096, RECORD_DTYPE)
            rows["step"] = np.arange(4096)
            rows["arrive_ns"] = 10**15 + np.cumsum(rng.integers(5 * 10**7, 6 * 10**7, 4096))
            rows["done_ns"] = rows["arrive_ns"] + rng.integers(10**5, 10**7, 4096)
            parts.append((f"model.py:{10 * s}:layer{s}", r, rows))
    head = fmt.header_record(
        run_id="bench", process_index=0, process_count=1, host="h", pid=1,
        granularity="device", jaxpace_version="bench", policy="no_pacing()",
        local_devices=list(range(8)), rank_groups=None,
    )  # fmt: skip
    d = Path(tempfile.mkdtemp(prefix="jaxpace-bench-export-"))
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        cols, sites = ex._columns(parts, 0)
        path = fmt.write_parquet(d / "records-p0.parquet", head, cols, sites)
        times.append(time.perf_counter() - t)
    n = int(cols["step"].size)
    out = {
        "rows": n,
        "s_per_m_rows": min(times) / n * 1e6,
        "bytes_per_row": Path(path).stat().st_size / n,
    }
    shutil.rmtree(d)
    return out


def _child(what: str, src: Path, out: Path, timeout: float) -> dict:
    load = os.getloadavg()[0]
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, what, str(src), str(out)],
            capture_output=True, text=True, timeout=timeout, cwd=REPO,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish in {timeout:.0f} s", "load": load}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        return {"error": last[:200], "load": load}
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "load": load}


def native_size(base: Path, ranks: int, sites: int, steps: int, timeout: float) -> dict:
    """A size written only as Parquet (the synthetic writer, natively): the report on it."""
    res: dict = {"ranks": ranks, "sites": sites, "steps": steps, "native": True}
    pq = base / "parquet"
    res["write_parquet"] = write_run(pq, ranks, sites, steps, "parquet")
    out = base / "out"
    out.mkdir(exist_ok=True)
    res["report-parquet"] = _child("report", pq, out, timeout)
    shutil.rmtree(base)
    return res


def one_size(base: Path, ranks: int, sites: int, steps: int, loss: float, timeout: float) -> dict:
    res: dict = {"ranks": ranks, "sites": sites, "steps": steps}
    js, pq = base / "jsonl", base / "parquet"
    res["write_jsonl"] = write_run(js, ranks, sites, steps, "jsonl")
    res["write_parquet"] = write_run(pq, ranks, sites, steps, "parquet")
    out = base / "out"
    out.mkdir(exist_ok=True)
    res["report-jsonl"] = _child("report", js, out, timeout)
    res["convert"] = _child("convert", js, out, timeout)
    res["report-parquet"] = _child("report", out / "converted", out, timeout)
    res["engine-jsonl"] = _child("engine", js, out, timeout)
    res["engine-parquet"] = _child("engine", pq, out, timeout)
    shutil.rmtree(js)
    lost = base / "lost"
    res["lost_loss"] = loss
    write_run(lost, ranks, sites, steps, "parquet", loss=loss)
    res["lost"] = _child("report", lost, out, timeout)
    shutil.rmtree(base)
    return res


def _fmt(r: dict) -> str:
    if "error" in r:
        return f"error: {r['error']}"
    return f"{r['wall_s']:.1f} s, {r['peak_gib']:.2f} GiB (load {r.get('load', float('nan')):.1f})"


def markdown(results: list[dict], export: dict) -> str:
    lines = [
        BEGIN,
        f"`Pacer.export` (Parquet) at exit, {export['rows'] / 1e6:.2f}M ring rows (8 ranks x 32 "
        f"sites x 4096 steps): {export['s_per_m_rows']:.2f} s per million rows, "
        f"{export['bytes_per_row']:.1f} bytes a row on disk.",
        "",
        "| ranks x sites x steps | rows | JSONL write | Parquet write | bytes/row JSONL / Parquet "
        "| report JSONL | convert | report Parquet | engine JSONL | engine Parquet | lines lost: "
        "culprit, steps analyzed |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r.get("native"):
            wp = r["write_parquet"]
            lines.append(
                f"| {r['ranks']} x {r['sites']} x {r['steps']} (Parquet only) "
                f"| {wp['rows'] / 1e6:.2f}M | - | {wp['write_s'] / wp['rows'] * 1e6:.2f} s/M rows "
                f"| - / {wp['bytes'] / wp['rows']:.1f} | - | - | {_fmt(r['report-parquet'])} "
                "| - | - | - |"
            )
            continue
        wj, wp = r["write_jsonl"], r["write_parquet"]
        lost = r["lost"]
        lost_s = (
            f"{r['lost_loss']:.1%}: rank {lost.get('culprit')} (late rank {LATE}), "
            f"{lost.get('analyzed')}/{lost.get('steps', 0) - lost.get('warmup', 0)}"
            if "error" not in lost
            else f"error: {lost['error']}"
        )
        lines.append(
            f"| {r['ranks']} x {r['sites']} x {r['steps']} | {wj['rows'] / 1e6:.2f}M "
            f"| {wj['write_s'] / wj['rows'] * 1e6:.2f} s/M rows "
            f"| {wp['write_s'] / wp['rows'] * 1e6:.2f} s/M rows "
            f"| {wj['bytes'] / wj['rows']:.0f} / {wp['bytes'] / wp['rows']:.1f} "
            f"| {_fmt(r['report-jsonl'])} | {_fmt(r['convert'])} | {_fmt(r['report-parquet'])} "
            f"| {_fmt(r['engine-jsonl'])} | {_fmt(r['engine-parquet'])} | {lost_s} |"
        )
    lines.append(END)
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--sizes",
        default="1024x16x100,8192x4x50",
        help="comma-separated RANKSxSITESxSTEPS (default: 1024x16x100,8192x4x50)",
    )
    ap.add_argument("--loss", default="0.01,0.001", help="share of lines lost, per size")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--write-doc", action="store_true")
    ap.add_argument("--dir", default=None, help="where the runs are written (default: /tmp)")
    ap.add_argument("--no-export", action="store_true", help="skip the export cost")
    args = ap.parse_args(argv)
    sizes = [
        (*(int(x) for x in s.rstrip("p").split("x")), s.endswith("p"))
        for s in args.sizes.split(",")
    ]
    losses = [float(x) for x in args.loss.split(",")]
    losses += [losses[-1]] * (len(sizes) - len(losses))
    export = {"rows": 0, "s_per_m_rows": float("nan"), "bytes_per_row": float("nan")}
    if not args.no_export:
        export = export_cost()
    print(json.dumps({"export": export}), flush=True)
    results = []
    for (ranks, sites, steps, native), loss in zip(sizes, losses, strict=False):
        base = Path(tempfile.mkdtemp(prefix="jaxpace-bench-records-", dir=args.dir))
        if native:
            r = native_size(base, ranks, sites, steps, args.timeout)
        else:
            r = one_size(base, ranks, sites, steps, loss, args.timeout)
        print(json.dumps(r), flush=True)
        results.append(r)
    text = markdown(results, export)
    print(text)
    if args.write_doc:
        doc = DOC.read_text()
        if BEGIN in doc:
            head, rest = doc.split(BEGIN, 1)
            doc = head + text + rest.split(END, 1)[1]
        else:
            doc += "\n" + text + "\n"
        DOC.write_text(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
