"""A process that leaves the job early, run under `jaxpace launch` (tests/runtime/test_watchdog_exited.py).

Process `--process` runs `--at-step` steps, prints `LEFT_AFTER <step>`, closes its pacer
(its watchdog publishes its last position) and exits 0 through `sys.exit`. The others go on
into the next step's collective and stall there; their watchdog says who left, where and when.
"""

import argparse
import sys
import time

import jaxpace.launch as jl

ap = argparse.ArgumentParser()
ap.add_argument("--process", type=int, default=1)
ap.add_argument("--at-step", type=int, default=20)
ap.add_argument("--stall-after-s", type=float, default=3.0)
ap.add_argument("--run-dir", required=True)
args = ap.parse_args()

pid, nproc = jl.init_from_env(platform="cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxpace as jp  # noqa: E402

mesh = jax.make_mesh((jax.device_count(),), ("data",))
spec = dict(mesh=mesh, in_specs=P("data"), out_specs=P())
x = jax.make_array_from_process_local_data(
    NamedSharding(mesh, P("data")), np.ones((jax.local_device_count(), 4), np.float32)
)
pacer = jp.Pacer(
    stall_after_s=args.stall_after_s,
    on_stall="exit",
    run_dir=args.run_dir,
    clock=lambda: time.perf_counter_ns(),
)
grads = jax.jit(jax.shard_map(lambda v: pacer.psum(jnp.tanh(v), "data", site="mp.grads"), **spec))
for step in range(10_000):
    if step == args.at_step and pid == args.process:
        print(f"LEFT_AFTER {step - 1}", flush=True)
        pacer.close()
        sys.exit(0)
    grads(x).block_until_ready()
