"""Worker for `python -m benchmarks`: lax vs jaxpace pmean, interleaved, 4x2 processes."""

import argparse
import json
import time

import jaxpace.launch as jl

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--reps", type=int, default=20)
args = ap.parse_args()
pid, _ = jl.init_from_env(platform="cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxpace as jp  # noqa: E402

mesh = jax.make_mesh((jax.device_count(),), ("data",))
rows = []
for size, n_leaves in ((1_000, 1), (1_000_000, 1), (1_000_000, 8)):
    per = size // n_leaves
    sh = NamedSharding(mesh, P("data"))
    tree = [
        jax.make_array_from_process_local_data(
            sh, np.full((jax.local_device_count(), per), 0.5, np.float32)
        )
        for _ in range(n_leaves)
    ]
    specs = ([P("data")] * n_leaves,)
    outs = [P()] * n_leaves
    pacers = {
        "measure/process": jp.Pacer(),
        "measure/device": jp.Pacer(granularity="device"),
        "adaptive(balanced)": jp.Pacer(policy=jp.adaptive()),
    }
    fns = {
        "lax": jax.jit(
            jax.shard_map(lambda t: lax.pmean(t, "data"), mesh=mesh, in_specs=specs, out_specs=outs)
        )
    }
    for name, pc in pacers.items():
        fns[name] = jax.jit(
            jax.shard_map(
                lambda t, pc=pc: pc.pmean(t, "data", site="b"),
                mesh=mesh,
                in_specs=specs,
                out_specs=outs,
            )
        )
    for f in fns.values():
        for _ in range(3):
            jax.block_until_ready(f(tree))
    times = {k: [] for k in fns}
    for _ in range(args.reps):
        for k, f in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f(tree))
            times[k].append(time.perf_counter() - t0)
    base = float(np.median(times["lax"]))
    rows.append(
        {
            "elements": size,
            "leaves": n_leaves,
            "lax_median_s": base,
            "ratios": {k: float(np.median(v)) / base for k, v in times.items() if k != "lax"},
        }
    )
    if pid == 0:
        print(
            f"  4x2 {size:>9,} el {n_leaves} leaves: lax {base * 1e3:.2f} ms | "
            + " | ".join(f"{k} {v:.3f}x" for k, v in rows[-1]["ratios"].items()),
            flush=True,
        )
if pid == 0:
    with open(args.out, "w") as f:
        json.dump({"rows": rows}, f)
