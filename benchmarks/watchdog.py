"""`python -m benchmarks watchdog`: the stall watchdog's cost as a ratio vs measure-only.

Interleaved calls (each variant once per round, shuffled) of one measured pmean on 8 CPU devices, once with the
native probes (the watchdog reads their progress counters with one library call per
site and scan) and once with the io_callback probes (forced with a Python clock; the
watchdog reads their arrival marks): measure-only with the watchdog off (`stall_after_s=None`), on at the default
(300 s: one scan per second), and on with a 1 s threshold (one scan per 0.1 s).
Single process: no key-value store traffic (that is one write and one read per
second per process, on the watchdog's own thread).
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def run(reps: int, size: int, rounds: int, probe: str = "native") -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jaxpace as jp
    from benchmarks.__main__ import _interleaved, machine

    def py_clock():
        return time.perf_counter_ns()

    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    x = jax.device_put(
        jnp.full((jax.device_count(), size), 0.5, jnp.float32), NamedSharding(mesh, P("data"))
    )
    kw = {"clock": py_clock} if probe == "io_callback" else {}
    pacers = {
        "watchdog off": jp.Pacer(stall_after_s=None, **kw),
        "watchdog 300 s": jp.Pacer(**kw),
        "watchdog 1 s": jp.Pacer(stall_after_s=1.0, **kw),
    }
    fns = {
        k: jax.jit(
            jax.shard_map(
                lambda v, pc=pc: pc.pmean(v, "data", site="w"),
                mesh=mesh,
                in_specs=P("data"),
                out_specs=P(),
            )
        )
        for k, pc in pacers.items()
    }
    ratios: dict[str, list[float]] = {"watchdog 300 s": [], "watchdog 1 s": []}
    for _ in range(rounds):
        res = _interleaved(fns, (x,), reps)
        base = res["watchdog off"]["median_s"]
        for k in ratios:
            ratios[k].append(res[k]["median_s"] / base)
    running = {k: pc.watchdog.running for k, pc in pacers.items()}
    paths = {k: pc.stats()["w"].probe for k, pc in pacers.items()}
    for pc in pacers.values():
        pc.close()
    out = {
        "machine": machine(),
        "probe": probe,
        "probe_paths": paths,
        "elements": size,
        "reps": reps,
        "rounds": rounds,
        "median_off_s": base,
        "ratios_vs_measure_only": {k: float(np.median(v)) for k, v in ratios.items()},
        "ratios_per_round": ratios,
        "watchdog_running": running,
    }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--size", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--probe", choices=["native", "io_callback", "both"], default="both")
    ap.add_argument("--out", default=None, help="write the JSON result here")
    args = ap.parse_args(argv)
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", 8)
    probes = ["native", "io_callback"] if args.probe == "both" else [args.probe]
    res = {p: run(args.reps, args.size, args.rounds, p) for p in probes}
    text = json.dumps(res, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
