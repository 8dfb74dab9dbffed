"""Benchmark: the simulator at 1024 ranks x 10,000 steps (`paper`), target <= 10 s with `adaptive`.

Reports wall and CPU seconds of the `simulate` call (CPU time is less
sensitive to a loaded machine) and the load average, so that runs taken at
different times can be compared.

    python benchmarks/bench_sim.py                      # no pacing, then adaptive
    python benchmarks/bench_sim.py --policy adaptive --steps 2000
"""

from __future__ import annotations

import argparse
import os
import time

from jaxpace.native import kernels
from jaxpace.sim import simulate


def run(
    nodes: int = 128, steps: int = 10_000, policy: str | None = None, scenario: str = "paper"
) -> dict:
    """Times one `simulate` call; returns wall and CPU seconds and rank-steps per second."""
    load = os.getloadavg()[0]
    c0, t0 = time.process_time(), time.perf_counter()
    r = simulate(scenario, nodes=nodes, steps=steps, policy=policy, seed=0)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {
        "scenario": scenario,
        "policy": r.policy,
        "ranks": r.ranks,
        "steps": steps,
        "seconds": dt,
        "cpu_seconds": cpu,
        "load_1min": load,
        "rank_steps_per_s": r.ranks * steps / dt,
        "mean_step_s": r.mean_step_s,
        "total_delay_s": r.total_delay_s,
        "kernels": kernels.available()[1],  # compiled, or why NumPy ran
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--nodes", type=int, default=128, help="nodes (x8 GPUs = ranks), default 128 = 1024 ranks"
    )
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument(
        "--policy",
        action="append",
        help="none | fixed:SECONDS | adaptive (repeatable; default: none, then adaptive)",
    )
    ap.add_argument("--scenario", default="paper")
    a = ap.parse_args()
    for policy in a.policy or ["none", "adaptive"]:
        res = run(a.nodes, a.steps, None if policy == "none" else policy, a.scenario)
        name = res["policy"].split("(")[0]
        print(
            f"{res['scenario']} {name}: {res['ranks']} ranks x {res['steps']:,} steps in "
            f"{res['seconds']:.2f} s wall, {res['cpu_seconds']:.2f} s CPU "
            f"(load {res['load_1min']:.2f}) = {res['rank_steps_per_s']:,.0f} rank-steps/s; "
            f"mean step {res['mean_step_s'] * 1e3:.2f} ms, total delay "
            f"{res['total_delay_s']:,.1f} rank-s [{res['kernels']}]",
            flush=True,
        )


if __name__ == "__main__":
    main()
