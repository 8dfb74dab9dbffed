"""A `jax.jit` job with no jaxpace in it, profiled with `jax.profiler`: the collectives
are the ones XLA inserts for the shardings.

Run alone (one process, `--devices` CPU devices) or under `jaxpace launch`; each
process writes its trace to `OUT/p{process}` (as users collect them per process).
`--kind dp`: data-parallel step (XLA inserts the gradient's all-reduce); `--kind
fsdp`: parameters sharded too (XLA inserts the weights' all-gather and, on CPU, an
all-reduce for the gradient); `--kind fsdp_manual`: the same step written with
`shard_map`, `all_gather` and `psum_scatter` (an all-gather and a reduce-scatter);
`--kind accum`: the fsdp step with gradient accumulation, a `lax.scan` over 4
microbatches (XLA's collectives run inside the loop, 4 times an execution).
Prints the compiled program's collectives as `COLLECTIVES: name,name`.
`--lag-s` seconds of host sleep before each step on `--lag-process`.
"""

import argparse
import os
import time

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--kind", choices=("dp", "fsdp", "fsdp_manual", "accum"), default="dp")
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--lag-s", type=float, default=0.0)
ap.add_argument("--lag-process", type=int, default=1)
ap.add_argument("--devices", type=int, default=8, help="CPU devices (one process only)")
ap.add_argument("--windows", type=int, default=1, help="start_trace windows")
args = ap.parse_args()

if "JAXPACE_NUM_PROCESSES" not in os.environ:
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", args.devices)

import jaxpace.launch as jl  # noqa: E402  (no jaxpace collective is used below)

pid, nproc = jl.init_from_env(platform="cpu")

import re  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

mesh = jax.make_mesh((jax.device_count(),), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
n = jax.device_count()
w_spec = P() if args.kind == "dp" else P("d")
MICRO = 4
w = jax.make_array_from_callback(
    (128, 128), NamedSharding(mesh, w_spec), lambda i: np.ones((128, 128), np.float32)[i] * 0.01
)
x = jax.make_array_from_callback(
    (8 * n, 128), NamedSharding(mesh, P("d")), lambda i: np.ones((8 * n, 128), np.float32)[i]
)


if args.kind == "accum":
    x = jax.make_array_from_callback(
        (MICRO, 8 * n, 128),
        NamedSharding(mesh, P(None, "d")),
        lambda i: np.ones((MICRO, 8 * n, 128), np.float32)[i],
    )

    @jax.jit
    def step(w, x):
        def body(g, xb):
            return g + jax.grad(lambda w: jnp.sum(jnp.tanh(xb @ w)))(w), None

        g, _ = jax.lax.scan(body, jnp.zeros_like(w), x)
        return jax.lax.with_sharding_constraint(w - 0.01 * g, NamedSharding(mesh, w_spec))

elif args.kind == "fsdp_manual":

    def local(w, x):
        wf = jax.lax.all_gather(w, "d", tiled=True)
        g = jax.grad(lambda wf: jnp.sum(jnp.tanh(x @ wf)))(wf)
        return w - 0.01 * jax.lax.psum_scatter(g, "d", scatter_dimension=0, tiled=True)

    step = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(w_spec, P("d")), out_specs=w_spec))
else:

    @jax.jit
    def step(w, x):
        def loss(w):
            return jnp.sum(jnp.tanh(x @ w))

        g = jax.grad(loss)(w)
        return jax.lax.with_sharding_constraint(w - 0.01 * g, NamedSharding(mesh, w_spec))


hlo = step.lower(w, x).compile().as_text()
kinds = "all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute"
instr = re.compile(rf"\s*(?:ROOT )?%(\S+) = .*? (?:{kinds})(?:-start)?\(")
ops = sorted({m[1] for line in hlo.splitlines() if (m := instr.match(line))})
print("COLLECTIVES: " + ",".join(ops), flush=True)
w = step(w, x)  # compile outside the trace
w.block_until_ready()
per_window = max(args.steps // args.windows, 1)
for _ in range(args.windows):
    jax.profiler.start_trace(os.path.join(args.out, f"p{pid}"))
    for _ in range(per_window):
        if pid == args.lag_process and args.lag_s > 0:
            time.sleep(args.lag_s)
        w = step(w, x)
        w.block_until_ready()
    jax.profiler.stop_trace()
    for _ in range(3):  # steps outside every window
        w = step(w, x)
        w.block_until_ready()
    time.sleep(1.1)  # the profile's run directory is named by the second
print(f"process {pid}: done", flush=True)
