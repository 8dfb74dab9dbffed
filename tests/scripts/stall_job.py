"""Multi-process stall-watchdog cases, run under `jaxpace launch` (tests/runtime/test_watchdog.py).

Modes:
  sleep        process `--process` sleeps forever before the collective of step `--at-step`.
  skip         two collectives per step (mp.grads, mp.loss); process `--process` skips
               mp.grads at step `--at-step`, so the others end up waiting where it never comes.
  healthy      `--steps` steps; `--stall-after-s 0` means "3.5 x the p90 step time measured
               with plain jax.lax first" (just above 3 step times).
  coordinator  process 0 (it hosts the jax.distributed key-value service) freezes itself
               (SIGSTOP) before the collective of step `--at-step`.
`--probes python` (default) passes a Python clock, which keeps the io_callback probes; `native`
leaves the default (the native XLA FFI probes on CPU), whose marks the watchdog reads from the
library. Each process prints `PROBE <site> <path>` after its first step.
Every step blocks (`block_until_ready`): plain JAX can hang on 2 shared cores otherwise.
"""

import argparse
import os
import signal
import time

import jaxpace.launch as jl

ap = argparse.ArgumentParser()
ap.add_argument("--mode", required=True, choices=["sleep", "skip", "healthy", "coordinator"])
ap.add_argument("--process", type=int, default=1)
ap.add_argument("--at-step", type=int, default=20)
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--stall-after-s", type=float, default=3.0)
ap.add_argument("--on-stall", default="exit")
ap.add_argument("--run-dir", required=True)
ap.add_argument("--probes", default="python", choices=["python", "native"])
args = ap.parse_args()

pid, nproc = jl.init_from_env(platform="cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxpace as jp  # noqa: E402

mesh = jax.make_mesh((jax.device_count(),), ("data",))
spec = dict(mesh=mesh, in_specs=P("data"), out_specs=P())
x = jax.make_array_from_process_local_data(
    NamedSharding(mesh, P("data")), np.ones((jax.local_device_count(), 4), np.float32) * (pid + 1)
)


def sleep_forever():
    print(f"SLEEPING_AT {time.monotonic():.3f}", flush=True)
    while True:
        time.sleep(3600)


stall_after_s = args.stall_after_s
if args.mode == "healthy" and stall_after_s == 0:
    plain = jax.jit(jax.shard_map(lambda v: lax.psum(jnp.tanh(v), "data"), **spec))
    plain(x).block_until_ready()
    times = []
    for _ in range(30):
        t0 = time.perf_counter()
        plain(x).block_until_ready()
        times.append(time.perf_counter() - t0)
    stall_after_s = 3.5 * float(np.quantile(times, 0.9))
    print(f"STALL_AFTER_S {stall_after_s:.4f}", flush=True)

# A Python clock keeps the io_callback probes; without one the native probes time the sites.
clock = {"clock": lambda: time.perf_counter_ns()} if args.probes == "python" else {}
pacer = jp.Pacer(stall_after_s=stall_after_s, on_stall=args.on_stall, run_dir=args.run_dir, **clock)
grads = jax.jit(jax.shard_map(lambda v: pacer.psum(jnp.tanh(v), "data", site="mp.grads"), **spec))
loss = jax.jit(jax.shard_map(lambda v: pacer.psum(v * 2, "data", site="mp.loss"), **spec))

steps = args.steps
for step in range(steps):
    if step == args.at_step:
        if args.mode == "sleep" and pid == args.process:
            sleep_forever()
        if args.mode == "coordinator" and pid == 0:
            print("FREEZING", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
    if not (args.mode == "skip" and pid == args.process and step == args.at_step):
        grads(x).block_until_ready()
    if args.mode == "skip":
        loss(x).block_until_ready()
    if step == 0:
        for name, st in sorted(pacer.stats().items()):
            print(f"PROBE {name} {(st.probe or '?').split(' ')[0]}", flush=True)
print(f"{args.mode.upper()}_DONE {steps}", flush=True)
if args.mode != "healthy":
    time.sleep(120)  # the others are stuck: let their watchdogs end the job
pacer.close()
# Leave together: a process exiting while a peer still tears down its backend makes
# that peer's exit fail ("Gloo all-reduce failed ... Connection reset by peer").
from jax.experimental import multihost_utils  # noqa: E402

multihost_utils.sync_global_devices("stall_job_done")
