"""A paced multi-process loop; the test SIGKILLs one process mid-step.

Every process sleeps `fixed(--delay-s)` before each collective, so survivors
are inside a jaxpace sleep or the collective when their peer dies.
"""

import argparse
import time

import jaxpace.launch as jl

ap = argparse.ArgumentParser()
ap.add_argument("--delay-s", type=float, default=0.5)
args = ap.parse_args()

pid, nproc = jl.init_from_env(platform="cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxpace as jp  # noqa: E402

pacer = jp.Pacer(policy=jp.fixed(args.delay_s))
mesh = jax.make_mesh((jax.device_count(),), ("data",))
f = jax.jit(
    jax.shard_map(
        lambda v: pacer.psum(v, "data", site="s"), mesh=mesh, in_specs=P("data"), out_specs=P()
    )
)
x = jax.make_array_from_process_local_data(
    NamedSharding(mesh, P("data")), jnp.ones((jax.local_device_count(), 4))
)
for step in range(10_000):
    f(x).block_until_ready()
    print(f"STEP {step} {time.monotonic():.3f}", flush=True)
