"""Multi-process check run under `jaxpace launch`: measured psum/pmean with an injected lag.

Each process writes `result-p{i}.json` (bitwise checks, step times, waits) and
its JSONL records into `--out`.
"""

import argparse
import json
import os
import time

import jaxpace.launch as jl

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--warmup", type=int, default=5)
ap.add_argument("--lag-s", type=float, default=0.0)
ap.add_argument("--lag-process", type=int, default=1)
ap.add_argument("--policy", default="none")
ap.add_argument("--max-delay-s", type=float, default=0.03)
ap.add_argument("--gain", type=float, default=0.9)
ap.add_argument("--threshold-s", type=float, default=0.002, help="adaptive's engage threshold")
ap.add_argument("--granularity", default="process")
ap.add_argument("--size", type=int, default=1024)
ap.add_argument("--out", required=True)
ap.add_argument("--phases", default="measure", help="comma list: unpaced,paced or measure")
ap.add_argument("--enable-checks", action="store_true", help="jax_enable_checks=True")
args = ap.parse_args()

pid, nproc = jl.init_from_env(platform="cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxpace as jp  # noqa: E402

if args.enable_checks:
    jax.config.update("jax_enable_checks", True)

mesh = jax.make_mesh((jax.device_count(),), ("data",))
sharding = NamedSharding(mesh, P("data"))
n = args.size
local = np.stack(
    [
        np.linspace(-1, 1, n, dtype=np.float32) * (pid + 1 + d)
        for d in range(jax.local_device_count())
    ]
)
x = jax.make_array_from_process_local_data(sharding, local)


def make_policy(name):
    if name == "adaptive":
        return jp.adaptive(
            threshold_s=args.threshold_s,
            max_delay_s=args.max_delay_s,
            gain=args.gain,
            warmup_steps=3,
            engage_steps=4,
            window=8,
        )
    if name == "none":
        return jp.no_pacing()
    raise SystemExit(f"unknown policy {name}")


def run_phase(policy_name, tag):
    pacer = jp.Pacer(policy=make_policy(policy_name), granularity=args.granularity)

    def body(v):
        g = jnp.tanh(v) * 1.0001
        return pacer.pmean(g, "data", site="grads"), lax.pmean(g, "data")

    step = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=(P(), P())))
    out = step(x)
    jax.block_until_ready(out)
    same = True
    times = []
    for _ in range(args.steps):
        if pid == args.lag_process and args.lag_s > 0:
            time.sleep(args.lag_s)
        t0 = time.perf_counter()
        a, b = step(x)
        a.block_until_ready()
        times.append(time.perf_counter() - t0)
        same &= bool(
            np.asarray(a.addressable_data(0)).tobytes()
            == np.asarray(b.addressable_data(0)).tobytes()
        )
    pacer.export(os.path.join(args.out, tag, f"records-p{pid}.jsonl"))
    # Also gather every process's records to process 0 (no shared filesystem needed).
    pacer.export_all(os.path.join(args.out, tag + "-gathered"), timeout_s=60, format="jsonl")
    st = pacer.stats()["grads"]
    recs = [r for r in pacer.records() if r["type"] == "step"]
    return {
        "bitwise_equal": same,
        "step_times_s": times,
        "waits_ns": {r["step"]: r["wait_ns"] for r in recs},
        "delays_ns": {r["step"]: r["delay_ns"] for r in recs},
        "engaged": st.engaged,
        "steps_paced": st.steps_paced,
        "total_delay_s": st.total_delay_s,
        "errors": st.errors,
        "run_id": pacer.run_id,
        "measured": st.measured,
        "unmeasured_reason": st.unmeasured_reason,
        "steps": st.steps,
        "probe": getattr(st, "probe", None),
        "enable_checks": bool(jax.config.jax_enable_checks),
    }


result = {"process": pid, "nproc": nproc}
for phase in args.phases.split(","):
    result[phase] = run_phase("none" if phase in ("unpaced", "measure") else args.policy, phase)
os.makedirs(args.out, exist_ok=True)
with open(os.path.join(args.out, f"result-p{pid}.json"), "w") as f:
    json.dump(result, f)
print(f"process {pid} done", flush=True)
