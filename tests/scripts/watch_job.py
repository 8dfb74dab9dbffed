"""A `jax.jit` job with no jaxpace collective, under `jaxpace.watch` (run by `jaxpace launch`).

The step's collectives are the ones XLA inserts (a data-parallel gradient all-reduce).
Every step blocks on its output (plain JAX on CPU deadlocks here otherwise).
`--lag-s` seconds of host sleep before each step on `--lag-process`; `--stuck-at N`:
`--stuck-process` sleeps `--stuck-s` before call N (alive, stuck); `--pause-at M`: it
sleeps `--pause-s` inside `jaxpace.expected_pause` before call M; `--kill-at K`:
`--kill-process` SIGKILLs itself before call K. Each process writes
`OUT/result-p{i}.json`: its `history()` and `stalls()`.
"""

import argparse
import dataclasses
import json
import math
import os
import time

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--steps", type=int, default=45)
ap.add_argument("--every", type=int, default=10)
ap.add_argument("--window", type=int, default=5)
ap.add_argument("--lag-s", type=float, default=0.0)
ap.add_argument("--lag-process", type=int, default=2)
ap.add_argument("--stuck-at", type=int, default=-1)
ap.add_argument("--stuck-process", type=int, default=2)
ap.add_argument("--stuck-s", type=float, default=60.0)
ap.add_argument("--pause-at", type=int, default=-1, help="call before which it pauses")
ap.add_argument("--pause-s", type=float, default=0.0, help="inside jaxpace.expected_pause")
ap.add_argument("--kill-at", type=int, default=-1, help="call before which it is SIGKILLed")
ap.add_argument("--kill-process", type=int, default=2)
ap.add_argument("--stall-after-s", type=float, default=None)
ap.add_argument("--on-stall", default="log")
args = ap.parse_args()

import jaxpace.launch as jl  # noqa: E402

pid, nproc = jl.init_from_env(platform="cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxpace  # noqa: E402

mesh = jax.make_mesh((jax.device_count(),), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
n = jax.device_count()
w = jax.make_array_from_callback(
    (128, 128), NamedSharding(mesh, P()), lambda i: np.ones((128, 128), np.float32)[i] * 0.01
)
x = jax.make_array_from_callback(
    (8 * n, 128), NamedSharding(mesh, P("d")), lambda i: np.ones((8 * n, 128), np.float32)[i]
)


@jax.jit
def step(w, x):
    g = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)
    return jax.lax.with_sharding_constraint(w - 0.01 * g, NamedSharding(mesh, P()))


collected = []  # process 0's sink: what the exporters would receive
watched = jaxpace.watch(
    step,
    every=args.every,
    window=args.window,
    stall_after_s=args.stall_after_s,
    on_stall=args.on_stall,
    out=os.path.join(args.out, "watch") if pid == 0 else None,
    sinks=[collected.append] if pid == 0 else (),
)
assert watched.__wrapped__ is step and watched.__name__ == step.__name__
step_s = []
for k in range(args.steps):
    if k == args.pause_at and pid == args.stuck_process:
        with jaxpace.expected_pause("checkpoint", max_s=60):
            time.sleep(args.pause_s)
    if k == args.stuck_at and pid == args.stuck_process:
        print(f"process {pid}: stuck before call {k} at wall time {time.time():.3f}", flush=True)
        time.sleep(args.stuck_s)
    if k == args.kill_at and pid == args.kill_process:
        print(f"process {pid}: killing itself before call {k}", flush=True)
        os.kill(os.getpid(), 9)
    if pid == args.lag_process and args.lag_s > 0:
        time.sleep(args.lag_s)
    t0 = time.perf_counter()
    w = watched(w, x)
    w.block_until_ready()
    step_s.append(time.perf_counter() - t0)
watched.close()


def plain(r):
    d = dataclasses.asdict(r)
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


result = {
    "process": pid,
    "history": [plain(r) for r in watched.history()],
    "stalls": list(watched.stalls()),
    "sink_items": len(collected),
    "sink_sites": sorted({c["site"] for c in collected}),
    "sink_ranks": sorted({c["rank"] for c in collected}),
    # Median call time (s) inside windows and outside them, after the first window.
    "in_window_s": float(
        np.median(
            [t for k, t in enumerate(step_s) if k >= args.every and k % args.every < args.window]
        )
    ),
    "outside_s": float(
        np.median(
            [t for k, t in enumerate(step_s) if k >= args.every and k % args.every >= args.window]
        )
    ),
}
with open(os.path.join(args.out, f"result-p{pid}.json"), "w") as f:
    json.dump(result, f)
print(f"process {pid}: done", flush=True)
