"""Worker for `python -m benchmarks`: lax vs jaxpace pmean, interleaved, 4x2 processes."""

import argparse
import json
import sys
from pathlib import Path

import jaxpace.launch as jl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.__main__ import _interleaved  # noqa: E402 - same order on every process

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
    res = _interleaved(fns, (tree,), args.reps)
    base = res["lax"]["median_s"]
    rows.append(
        {
            "elements": size,
            "leaves": n_leaves,
            "lax_median_s": base,
            "ratios": {k: v["median_s"] / base for k, v in res.items() if k != "lax"},
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
