"""Worker for `python -m benchmarks lag`: one all-reduce of one operand vs the same with a
12-float second operand (the in-band exchange's payload at 4 ranks), 4x2 processes on CPU.

XLA's CPU collectives reduce each operand of a tuple all-reduce on its own, so on this backend
the exchange's payload costs a second round trip; process 0 writes the medians to `--out`.
"""

import argparse
import json
import time

import jaxpace.launch as jl

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--rounds", type=int, default=60)
args = ap.parse_args()
pid, _ = jl.init_from_env(platform="cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

mesh = jax.make_mesh((jax.device_count(),), ("d",))
local = np.ones((jax.local_device_count(), 1024), np.float32)
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), local)


def build(body, out_specs):
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("d"), out_specs=out_specs))


fns = {
    "one operand": build(lambda v: lax.psum(v, "d"), P()),
    "plus a 12-float operand": build(lambda v: lax.psum((v, v[0, :12]), "d"), (P(), P())),
}
for f in fns.values():
    jax.block_until_ready(f(x))
times = {k: [] for k in fns}
for i in range(args.rounds):  # alternate the order each round; the same on every process
    for k in list(fns) if i % 2 else list(fns)[::-1]:
        t0 = time.perf_counter()
        jax.block_until_ready(fns[k](x))
        times[k].append(time.perf_counter() - t0)
if pid == 0:
    res = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    with open(args.out, "w") as fh:
        json.dump(res, fh)
