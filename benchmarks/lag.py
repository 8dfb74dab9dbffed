"""`python -m benchmarks lag`: what adaptive pacing does to step time when one process is late.

4 processes x 2 CPU devices (`jaxpace launch`), `tests/scripts/mp_collective.py`: a measured
`pmean` next to `lax.pmean`, process 1 sleeping `--lag-ms` before every step. Each run has an
unpaced phase (measure only) and then a paced one (`adaptive`, process granularity); the same
run is repeated `--repeats` times per gain. Per run it reports the early processes' median
synchronization wait (earliness minus their own sleep) and the ratio of the median step time
paced / unpaced (median over processes of each process's median after warm-up). The phases are
sequential, not interleaved: the ratio carries the machine's drift between them, so read it
across the repeats. Writes `benchmarks/results/lag.json` and the section of
docs/benchmarks.md between the `lag` markers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks.__main__ import _launch, machine  # noqa: E402
from benchmarks.fsdp import write_section  # noqa: E402

BEGIN = "<!-- begin: lag, written by `python -m benchmarks lag` -->"
END = "<!-- end: lag -->"
WARMUP = 8
EARLY = (0, 2, 3)


def per_step(results, phase, key):
    """{step: [value of process 0..P-1]} over the steps after `WARMUP` every process
    recorded (`mp_collective.py`'s result files)."""
    maps = [{int(k): v for k, v in r[phase][key].items()} for r in results]
    steps = sorted(set.intersection(*[set(m) for m in maps]))
    return {s: [m[s] for m in maps] for s in steps if s >= WARMUP}


def sync_wait_ms(results, phase):
    """Per process, the median over steps of its synchronization wait in ms: its wait minus
    the step's smallest (its earliness), minus its own sleep."""
    import numpy as np

    waits, delays = per_step(results, phase, "waits_ns"), per_step(results, phase, "delays_ns")
    rows = [(np.array(w, float) - min(w)) - np.array(delays[s], float) for s, w in waits.items()]
    return np.median(np.array(rows), axis=0) / 1e6


def one_run(out: Path, lag_ms: float, gain: float, steps: int, threshold_s: float = 0.002) -> dict:
    import numpy as np

    proc = _launch(
        [
            *("-n", 4, "--local-devices", 2, "--timeout", 240, "--"),
            sys.executable,
            REPO / "tests" / "scripts" / "mp_collective.py",
            *("--lag-s", lag_ms / 1e3, "--lag-process", 1, "--steps", steps),
            *("--phases", "unpaced,paced", "--policy", "adaptive", "--gain", gain),
            *("--max-delay-s", 0.03, "--threshold-s", threshold_s, "--out", out),
        ]
    )
    if proc.returncode != 0:
        return {"gain": gain, "threshold_s": threshold_s, "error": proc.stderr[-1000:]}
    res = [json.loads((out / f"result-p{i}.json").read_text()) for i in range(4)]
    row = {"gain": gain, "threshold_s": threshold_s, "lag_ms": lag_ms}
    for ph in ("unpaced", "paced"):
        waits = per_step(res, ph, "waits_ns")
        row[f"{ph}_sync_wait_ms"] = sync_wait_ms(res, ph).tolist()
        row[f"{ph}_step_ms"] = float(
            np.median([np.median(r[ph]["step_times_s"][WARMUP:]) for r in res]) * 1e3
        )
        # The late process's own wait (arrive to done): how long the collective runs once it
        # is there; it grows when the early ones wake up at or after its arrival.
        row[f"{ph}_late_wait_ms"] = float(np.median([w[1] for w in waits.values()]) / 1e6)
    b, a = np.array(row["unpaced_sync_wait_ms"]), np.array(row["paced_sync_wait_ms"])
    row["early_wait_drop"] = float(np.median(1 - a[list(EARLY)] / b[list(EARLY)]))
    row["step_ratio"] = row["paced_step_ms"] / row["unpaced_step_ms"]
    row["rank_steps_paced"] = int(sum(r["paced"]["steps_paced"] for r in res))
    return row


def operand_cost(out: Path) -> dict:
    """Median ms of a one-operand all-reduce vs the same plus a 12-float operand (4x2, CPU)."""
    path = out / "operand_cost.json"
    proc = _launch(
        [
            *("-n", 4, "--local-devices", 2, "--timeout", 240, "--"),
            sys.executable,
            REPO / "benchmarks" / "operand_cost.py",
            *("--out", path),
        ]
    )
    if proc.returncode != 0:
        return {"error": proc.stderr[-1000:]}
    return json.loads(path.read_text())


def markdown(rows: list[dict], args, operands: dict) -> str:
    lines = [
        BEGIN,
        "## Adaptive pacing with one late process (`python -m benchmarks lag`)",
        "",
        f"4 processes x 2 CPU devices, process 1 sleeps {args.lag_ms:g} ms before each step, "
        f"{args.steps} steps per phase, unpaced phase then paced phase (`adaptive`, "
        "`max_delay_s=0.03`), each run repeated. Early wait drop: how much of the early "
        "processes' synchronization wait (earliness minus own sleep) pacing removed. Step "
        "ratio: median step time paced / unpaced. Late wait: the late process's arrive-to-done "
        "time, unpaced -> paced.",
        "",
        "| paced phase | run | rank-steps paced | early wait drop "
        "| step time unpaced -> paced | step ratio | late wait unpaced -> paced |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        name = (
            f"gain {r['gain']:g}"
            if r["threshold_s"] < 1
            else f"threshold {r['threshold_s']:g} s: exchange, never engages"
        )
        if "error" in r:
            lines.append(f"| {name} | {r['run']} | failed | - | - | - | - |")
            continue
        lines.append(
            f"| {name} | {r['run']} | {r['rank_steps_paced']} | {r['early_wait_drop']:.0%} | "
            f"{r['unpaced_step_ms']:.1f} -> {r['paced_step_ms']:.1f} ms | {r['step_ratio']:.2f} | "
            f"{r['unpaced_late_wait_ms']:.1f} -> {r['paced_late_wait_ms']:.1f} ms |"
        )
    if "error" in operands:
        lines += ["", "One all-reduce, one operand vs two: failed."]
    else:
        a, b = operands["one operand"], operands["plus a 12-float operand"]
        lines += [
            "",
            f"One all-reduce of f32[2, 1024] per process (`benchmarks/operand_cost.py`, same "
            f"4x2 job, alternating): one operand {a:.2f} ms, plus a 12-float second operand "
            f"(the exchange's payload at 4 ranks) {b:.2f} ms, ratio {b / a:.2f}.",
        ]
    lines += ["", f"Machine: {machine()}. Date: {time.strftime('%Y-%m-%d')}.", END]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks lag", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--lag-ms", type=float, default=20.0)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--gains", type=float, nargs="+", default=[1.0, 0.5, 0.05])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--markdown", default=str(REPO / "docs" / "benchmarks.md"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    rows = []
    # The last variant exchanges waits in-band but never engages (threshold 5 s): what the
    # exchange and the policy's bookkeeping cost without a single sleep.
    variants = [(g, 0.002) for g in args.gains] + [(1.0, 5.0)]
    for rep in range(args.repeats):
        for gain, thr in variants:
            row = one_run(
                out / f"lag-g{gain:g}-t{thr:g}-r{rep}", args.lag_ms, gain, args.steps, thr
            )
            row["run"] = rep
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if not k.endswith("sync_wait_ms")}))
    rows.sort(key=lambda r: (r["threshold_s"], -r["gain"], r["run"]))
    out.mkdir(parents=True, exist_ok=True)
    (out / "lag.json").write_text(json.dumps(rows, indent=1, sort_keys=True))
    operands = operand_cost(out)
    print(json.dumps(operands))
    text = markdown(rows, args, operands)
    print(text)
    if args.markdown:
        write_section(text, Path(args.markdown), BEGIN, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
