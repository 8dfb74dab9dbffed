"""Under `jaxpace launch -n 4 --local-devices 2`: a `shard_map` step with 8 drop-in
`psum` sites of equal counts (issue 47, tied site counts). Each site's operand varies
over "data" (so none is invariant) and depends on the site before, so they run in
the order written: `w-first`, `x-1` ... `x-6`, `a-last` (the alphabetical first runs
last). Process `--lag-process` sleeps `--lag-s` before each step, blocking each step;
its lateness shows where the step starts, at `w-first`.

python -m jaxpace launch -n 4 --local-devices 2 -- python tests/scripts/tied_sites_job.py OUT
"""

import argparse
import time

import jaxpace as jp

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--lag-s", type=float, default=0.015)
ap.add_argument("--lag-process", type=int, default=1)
args = ap.parse_args()

pid, nproc = jp.launch.init_from_env(platform="cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

mesh = jax.make_mesh((jax.device_count(),), ("data",))
pacer = jp.Pacer(mesh=mesh)
SITES = ["w-first", *(f"x-{i}" for i in range(1, 7)), "a-last"]


def local(x):
    h = jnp.zeros((), x.dtype)
    for i, name in enumerate(SITES):
        h = pacer.psum(jnp.sum(x) * (i + 1) + h, "data", site=name)
    return h


step = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P("data"), out_specs=P()))
x = jax.make_array_from_process_local_data(
    NamedSharding(mesh, P("data")), np.ones((jax.local_device_count() * 2, 3), np.float32)
)
for _ in range(args.steps):
    if pid == args.lag_process:
        time.sleep(args.lag_s)
    jax.block_until_ready(step(x))
pacer.export(args.out + "/")
pacer.close(timeout_s=10.0)
print(f"p{pid} exported", flush=True)
