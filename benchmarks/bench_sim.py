"""Benchmark: simulated rank-steps per second for 1024 ranks x 10,000 steps (target <= 10 s)."""

from __future__ import annotations

import argparse
import time

from jaxpace.sim import simulate


def run(
    nodes: int = 128, steps: int = 10_000, policy: str | None = None, scenario: str = "paper"
) -> dict:
    """Times one `simulate` call; returns seconds and rank-steps per second."""
    t0 = time.perf_counter()
    r = simulate(scenario, nodes=nodes, steps=steps, policy=policy, seed=0)
    dt = time.perf_counter() - t0
    return {
        "scenario": scenario,
        "policy": r.policy,
        "ranks": r.ranks,
        "steps": steps,
        "seconds": dt,
        "rank_steps_per_s": r.ranks * steps / dt,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "--nodes", type=int, default=128, help="nodes (x8 GPUs = ranks), default 128 = 1024 ranks"
    )
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--policy", default="none", help="none | fixed:SECONDS | adaptive")
    ap.add_argument("--scenario", default="paper")
    a = ap.parse_args()
    res = run(a.nodes, a.steps, None if a.policy == "none" else a.policy, a.scenario)
    print(
        f"{res['scenario']} {res['policy']}: {res['ranks']} ranks x {res['steps']} steps in "
        f"{res['seconds']:.2f} s = {res['rank_steps_per_s']:,.0f} rank-steps/s"
    )


if __name__ == "__main__":
    main()
