"""Stall watchdog at a `jaxpace.all_gather` site, under `jaxpace launch` (native probes).

Process `--process` sleeps forever before step `--at-step`; the others wait inside the
all-gather until their watchdog names it and ends the job (`on_stall="exit"`).
"""

import argparse
import time

import jaxpace.launch as jl

ap = argparse.ArgumentParser()
ap.add_argument("--process", type=int, default=1)
ap.add_argument("--at-step", type=int, default=10)
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
x = jax.make_array_from_process_local_data(
    NamedSharding(mesh, P("data")), np.ones((jax.local_device_count(), 4), np.float32) * (pid + 1)
)
pacer = jp.Pacer(stall_after_s=args.stall_after_s, on_stall="exit", run_dir=args.run_dir)
gather = jax.jit(
    jax.shard_map(
        lambda v: pacer.all_gather(jnp.tanh(v), "data", tiled=True, site="mp.gather"),
        mesh=mesh,
        in_specs=P("data"),
        out_specs=P(),
        check_vma=False,
    )
)
for step in range(args.at_step + 1):
    if step == args.at_step and pid == args.process:
        print("SLEEPING", flush=True)
        while True:
            time.sleep(3600)
    gather(x).block_until_ready()
    if step == 0:
        print(f"PROBE {(pacer.stats()['mp.gather'].probe or '?').split(' ')[0]}", flush=True)
time.sleep(120)  # stuck in the next step's all-gather: the watchdog ends the job first
