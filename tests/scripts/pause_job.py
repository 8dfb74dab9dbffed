"""Under `jaxpace launch -n 4 --local-devices 2`: an Orbax checkpoint save inside the training loop.

python -m jaxpace launch -n 4 --local-devices 2 -- python tests/scripts/pause_job.py \\
    --mode announced --run-dir DIR

Every process saves a checkpoint with `orbax.checkpoint.CheckpointManager.save` at step
`SAVE_AT`; process `--slow`'s save is made `--extra-s` seconds slower (a sleep after Orbax
returns, inside the same block), so the other processes wait for it in the next measured
collective. The watchdog runs with `stall_after_s=3`, `on_stall="exit"`.

Modes:
  announced  the save is wrapped in `jp.expected_pause("checkpoint", max_s=--max-s)` (60):
             no stall; with `--max-s` below `--extra-s` the pause runs over and is named.
  stall      the same save without the announcement: the others declare a stall naming it.
Each process prints `DONE` at the end. Every step blocks (plain JAX can hang on 2 shared cores).
"""

import argparse
import contextlib
import logging
import os
import time

import jaxpace.launch as jl

ap = argparse.ArgumentParser()
ap.add_argument("--mode", required=True, choices=["announced", "stall"])
ap.add_argument("--slow", type=int, default=1)
ap.add_argument("--extra-s", type=float, default=10.0)
ap.add_argument("--max-s", type=float, default=60.0)
ap.add_argument("--run-dir", required=True)
args = ap.parse_args()
logging.basicConfig(level=logging.WARNING)
logging.getLogger("jaxpace").setLevel(logging.INFO)  # shows "waiting for processes in a pause"

pid, nproc = jl.init_from_env(platform="cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxpace as jp  # noqa: E402

STEPS, SAVE_AT = 8, 4
mesh = jax.make_mesh((jax.device_count(),), ("data",))
pacer = jp.Pacer(stall_after_s=3.0, on_stall="exit", run_dir=args.run_dir)
grads = jax.jit(
    jax.shard_map(
        lambda v: pacer.psum(jnp.tanh(v), "data", site="grads"),
        mesh=mesh,
        in_specs=P("data"),
        out_specs=P(),
    )
)
x = jax.make_array_from_process_local_data(
    NamedSharding(mesh, P("data")), np.ones((jax.local_device_count(), 4), np.float32)
)
manager = ocp.CheckpointManager(
    os.path.abspath(os.path.join(args.run_dir, "ckpt")),
    options=ocp.CheckpointManagerOptions(enable_async_checkpointing=False),
)

for step in range(STEPS):
    y = grads(x)
    jax.block_until_ready(y)
    if step == SAVE_AT:
        announce = args.mode == "announced"
        pause = (
            jp.expected_pause("checkpoint", max_s=args.max_s)
            if announce
            else contextlib.nullcontext()
        )
        with pause:
            manager.save(step, args=ocp.args.StandardSave({"w": y}))
            if pid == args.slow:
                print(f"SLOW_SAVE {time.monotonic():.3f}", flush=True)
                time.sleep(args.extra_s)  # this process's save is extra_s slower
manager.close()
pacer.close()
print(f"DONE p{pid} stalls={len(pacer.watchdog.stalls)}", flush=True)
