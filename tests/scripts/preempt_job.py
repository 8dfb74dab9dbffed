"""A preempted `jax.distributed` job, run under `jaxpace launch` (tests/runtime/test_signals.py).

python tests/scripts/preempt_job.py --out DIR [--at-step N] [--max-steps M]

Two pacers per process: one that paces (`fixed`, no sinks) traced first, then one
with a counting sink (granularity "device"). After step `--at-step`, process 1
sends itself SIGTERM, as a scheduler's preemption notice would. JAX's preemption
notifier (installed by `jax.distributed.initialize`, invisible to
`signal.getsignal`) is meant to keep it running: every process polls
`multihost_utils.reached_preemption_sync_point(step)` after each step and, once
it is reached, prints `PREEMPTED <step>` (where a program saves its preemption
checkpoint) and ends normally.

Process 1 prints `DELIVERED_AT_SIGTERM <summaries the sink had> <expected>` right
after its signal. At exit the sink writes OUT/sink-p{i}.json at its `close()`; an
atexit hook registered before the first trace (so it runs after jaxpace's own)
writes how many step records the sink pacer holds (OUT/records-p{i}.json).
"""

import argparse
import atexit
import json
import os
import signal
import time

import jaxpace.launch as jl

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--at-step", type=int, default=5)
ap.add_argument("--max-steps", type=int, default=3000)
args = ap.parse_args()

pid, nproc = jl.init_from_env(platform="cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxpace as jp  # noqa: E402


class CountingSink:
    def __init__(self) -> None:
        self.pairs = set()
        self.n = 0

    def __call__(self, s) -> None:
        self.n += 1
        self.pairs.add((s["rank"], s["step"]))

    def close(self) -> None:
        with open(os.path.join(args.out, f"sink-p{pid}.json"), "w") as f:
            json.dump({"summaries": self.n, "distinct": len(self.pairs)}, f)


counting = CountingSink()
paced = jp.Pacer(policy=jp.fixed(0.001))
measured = jp.Pacer(granularity="device", sinks=[counting])


def count_records() -> None:
    steps = [r for r in measured.records() if r.get("type") == "step"]
    with open(os.path.join(args.out, f"records-p{pid}.json"), "w") as f:
        json.dump({"steps": len(steps)}, f)


atexit.register(count_records)  # before the first trace: runs after jaxpace's close

mesh = jax.make_mesh((jax.device_count(),), ("data",))
x = jax.make_array_from_process_local_data(
    NamedSharding(mesh, P("data")), np.ones((jax.local_device_count(), 4), np.float32)
)


def body(v):
    w = paced.psum(v, "data", site="paced")  # traced first
    return measured.psum(v, "data", site="grads"), w


step_fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=(P(), P())))
step = 0
while step < args.max_steps:
    jax.block_until_ready(step_fn(x))
    if pid == 1 and step == args.at_step:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)  # a Python handler runs at the next instruction; this is one
        expected = (step + 1) * jax.local_device_count()
        print(f"DELIVERED_AT_SIGTERM {counting.n} {expected}", flush=True)
    if multihost_utils.reached_preemption_sync_point(step):
        print(f"PREEMPTED {step}", flush=True)
        break
    step += 1
    time.sleep(0.01)
print(f"ENDED {step}", flush=True)
