"""`python -m benchmarks.native`: native probes vs io_callback probes vs `jax.lax`, interleaved.

Ratios of medians against `lax.pmean`, calls interleaved (each variant once per round, shuffled) in one process, so load
hits every variant alike. Two operand kinds: computed in the program (`v * 1.0001`, as
gradients are) and the bare jit argument (XLA copies a non-donated argument that the arrival
tie writes into: the "jit-argument copy" case, reported separately). The io_callback variant
is forced with a custom clock (the native probes need the steady clock).

    python -m benchmarks.native            # 1 process x 8 CPU devices
    python -m benchmarks.native --mp       # also 4 processes x 2 devices (jaxpace launch)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SIZES = (1_000, 1_000_000)


def _variants(jp):
    slow_clock = lambda: time.perf_counter_ns()  # noqa: E731 - forces the io_callback probes
    return {
        "native": jp.Pacer(),
        "io_callback": jp.Pacer(clock=slow_clock),
        "native adaptive(balanced)": jp.Pacer(policy=jp.adaptive()),
        "native sample_every=10": jp.Pacer(sample_every=10),
    }


def run(reps: int, computed_only: bool = False, local=None) -> list[dict]:
    import jax
    import numpy as np
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jaxpace as jp
    from benchmarks.__main__ import _interleaved

    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    sh = NamedSharding(mesh, P("data"))
    rows = []
    for size in SIZES:
        a = np.full((jax.local_device_count(), size), 0.5, np.float32)
        x = jax.make_array_from_process_local_data(sh, a) if local else jax.device_put(a, sh)
        for computed in (True,) if computed_only else (True, False):
            pre = (lambda v: v * 1.0001) if computed else (lambda v: v)
            pacers = _variants(jp)

            def sm(f):
                return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("data"), out_specs=P()))

            fns = {"lax": sm(lambda v, pre=pre: lax.pmean(pre(v), "data"))}
            for name, pc in pacers.items():
                fns[name] = sm(lambda v, pc=pc, pre=pre: pc.pmean(pre(v), "data", site="b"))
            res = _interleaved(fns, (x,), reps)
            base = res["lax"]["median_s"]
            probes = {k: pc.stats()["b"].probe for k, pc in pacers.items()}
            rows.append(
                {
                    "elements_per_shard": size,
                    "operand": "computed" if computed else "jit argument",
                    "lax_median_s": base,
                    "ratios": {k: v["median_s"] / base for k, v in res.items() if k != "lax"},
                    "probes": probes,
                }
            )
            for pc in pacers.values():
                pc.close()
    return rows


def _print(rows, layout):
    for r in rows:
        print(
            f"  {layout} {r['elements_per_shard']:>9,} el/shard ({r['operand']}): lax "
            f"{r['lax_median_s'] * 1e3:7.3f} ms | "
            + " | ".join(f"{k} {v:.3f}x" for k, v in r["ratios"].items()),
            flush=True,
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--mp", action="store_true", help="also 4 processes x 2 devices")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.worker:  # one of the 4 processes
        import jaxpace.launch as jl

        pid, _ = jl.init_from_env(platform="cpu")
        rows = run(args.reps, computed_only=True, local=True)
        if pid == 0:
            Path(args.worker).write_text(json.dumps(rows))
        return 0
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", 8)
    results = {"load_before": os.getloadavg(), "single": run(args.reps)}
    _print(results["single"], "1x8")
    if args.mp:
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "mp.json"
            env = dict(os.environ)
            env.pop("XLA_FLAGS", None)
            cmd = [sys.executable, "-m", "jaxpace", "launch", "-n", "4", "--local-devices", "2"]
            cmd += ["--timeout", "500", "--", sys.executable, "-m", "benchmarks.native"]
            cmd += ["--worker", str(out), "--reps", str(max(args.reps // 2, 10))]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=560, env=env, cwd=REPO)
            if p.returncode == 0:
                results["mp"] = json.loads(out.read_text())
                _print(results["mp"], "4x2")
            else:
                results["mp_error"] = p.stderr[-2000:]
                print("4x2 failed:", p.stderr[-2000:])
    results["load_after"] = os.getloadavg()
    print(f"  load average before {results['load_before']}, after {results['load_after']}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
