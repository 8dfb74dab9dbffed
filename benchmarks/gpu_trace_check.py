"""On a GPU host: profile a `jax.jit` data-parallel step (XLA inserts the all-reduce),
run `jaxpace report` on the trace, and check it read every GPU's NCCL kernels.

    python benchmarks/gpu_trace_check.py [--steps 30] [--keep DIR]

Exit code 0 when the report covers every local GPU and an all-reduce site with
complete steps; 1 otherwise (the reason, and what the trace's GPU lines hold,
are printed: the GPU trace reader was built from the format's documentation);
0 with `SKIPPED` and the reason when fewer than 2 GPUs are visible.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def capture(out: Path, steps: int) -> int:
    """Traces `steps` jit steps on every local GPU into `out`; returns the GPU count."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    n = jax.local_device_count()
    mesh = jax.make_mesh((n,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
    w = jax.device_put(jnp.full((1024, 1024), 0.01), NamedSharding(mesh, P()))
    x = jax.device_put(jnp.ones((64 * n, 1024)), NamedSharding(mesh, P("d")))

    @jax.jit
    def step(w, x):
        g = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)
        return w - 1e-3 * g

    w = step(w, x).block_until_ready()
    with jax.profiler.trace(str(out)):
        for _ in range(steps):
            w = step(w, x)
        w.block_until_ready()
    return n


def describe(out: Path) -> str:
    """What the GPU lines of the trace hold: process names, kernel names, arg keys."""
    lines = []
    for f in sorted(out.rglob("*.trace.json.gz")):
        events = json.load(gzip.open(f, "rt"))["traceEvents"]
        procs = {e.get("pid"): e["args"]["name"] for e in events if e.get("name") == "process_name"}
        lines.append(f"{f}: processes {sorted(set(procs.values()))[:12]}")
        gpu = [e for e in events if "GPU" in procs.get(e.get("pid"), "") and e.get("ph") == "X"]
        names = Counter(str(e.get("name"))[:60] for e in gpu)
        lines.append(f"  GPU events {len(gpu)}; most common: {names.most_common(8)}")
        nccl = [e for e in gpu if str(e.get("name", "")).lower().startswith("nccl")]
        if nccl:
            lines.append(f"  a NCCL kernel event: {json.dumps(nccl[0])[:600]}")
    return "\n".join(lines)


def check(out: Path, n: int, steps: int) -> list[str]:
    """Runs `jaxpace report` on `out`; returns what is wrong (empty: all good)."""
    proc = subprocess.run(
        [sys.executable, "-m", "jaxpace", "report", str(out), "--json", str(out / "r.json")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(proc.stdout[-4000:])
    if proc.returncode != 0:
        return [f"`jaxpace report` exited {proc.returncode}: {proc.stderr.strip()[-2000:]}"]
    rep = json.loads((out / "r.json").read_text())
    problems = []
    if rep["num_ranks"] != n:
        problems.append(f"{rep['num_ranks']} ranks in the report, {n} GPUs traced")
    if not any("all-reduce" in s for s in rep["sites"]):
        problems.append(f"no all-reduce site among {rep['sites']}")
    if rep["num_steps"] < steps // 2:
        problems.append(f"{rep['num_steps']} complete steps of {steps}")
    if not rep["source"].startswith("jax.profiler traces"):
        problems.append(f"source {rep['source']!r}")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--keep", default=None, help="write the trace here and keep it")
    args = ap.parse_args(argv)
    import jax

    gpus = [d for d in jax.local_devices() if d.platform == "gpu"]
    if len(gpus) < 2:
        print(f"SKIPPED: needs 2 or more GPUs for an NCCL all-reduce; found {len(gpus)}.")
        return 0
    out = Path(args.keep or tempfile.mkdtemp(prefix="jaxpace-gpu-trace-"))
    n = capture(out, args.steps)
    problems = check(out, n, args.steps)
    if problems:
        print("FAILED: " + "; ".join(problems))
        print(describe(out))
        return 1
    print(f"OK: `jaxpace report` read the NCCL kernels of {n} GPUs from {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
