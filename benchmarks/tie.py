"""`python -m benchmarks tie`: what tying a large operand leaf to the arrive probe costs.

One process, 8 CPU devices: `psum` of a matmul's result (the shape a large gradient has)
through `jax.lax`, through jaxpace (measure only, each device its own rank) and through
jaxpace with the previous form of the large-leaf tie (`_tie.tie`: a slice of the first
element, a never-true select and the update, which XLA fuses into one kernel), interleaved
(each once per round, shuffled order). Figures: median time and the ratio of medians
against lax, per leaf size. Writes `benchmarks/results/tie.json` and the `tie` section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.fsdp import publish  # noqa: E402

BEGIN = "<!-- begin: tie, written by `python -m benchmarks tie` -->"
END = "<!-- end: tie -->"
ROWS = 256  # per device: the matmul is (ROWS x 256) @ (256 x cols)


def _steps(mesh, cols: int) -> tuple[dict, tuple]:
    """`{name: jitted step}` and its arguments for a leaf of `ROWS x cols` float32 per device."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jaxpace
    from jaxpace.native import primitive

    pacer = jaxpace.Pacer(mesh=mesh, granularity="device")

    def make(m, site=None):
        def body(a, b):
            h = jnp.dot(a, b)
            return lax.psum(h, "i") if m is lax else m.psum(h, "i", site=site)

        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("i"), P()), out_specs=P()))

    n = mesh.devices.size
    a = jax.device_put(jnp.ones((n * ROWS, 256)), NamedSharding(mesh, P("i")))
    b = jax.device_put(jnp.ones((256, cols)), NamedSharding(mesh, P()))
    steps = {"lax": make(lax), "jaxpace": make(pacer, f"tie-{cols}")}
    jax.block_until_ready(steps["jaxpace"](a, b))  # traced with the current tie
    real = primitive._large
    primitive._large = lambda leaf: False  # every leaf through `_tie.tie`: the previous form
    try:
        steps["previous tie"] = make(pacer, f"tie-prev-{cols}")
        jax.block_until_ready(steps["previous tie"](a, b))
    finally:
        primitive._large = real
    return steps, (a, b)


def run(cols: int, reps: int) -> dict:
    import jax
    import numpy as np

    from benchmarks.__main__ import _interleaved

    mesh = jax.make_mesh((8,), ("i",))
    steps, args = _steps(mesh, cols)
    want = np.asarray(steps["lax"](*args)).tobytes()
    bitwise = all(np.asarray(f(*args)).tobytes() == want for f in steps.values())
    res = _interleaved(steps, args, reps)
    base = res["lax"]["median_s"]
    return {
        "leaf_mib": ROWS * cols * 4 / 2**20,
        "reps": reps,
        "bitwise": bitwise,
        "median_ms": {k: v["median_s"] * 1e3 for k, v in res.items()},
        "ratio_pct": {k: (v["median_s"] / base - 1) * 100 for k, v in res.items()},
    }


def markdown(rows: list[dict]) -> str:
    from benchmarks.__main__ import machine

    lines = [
        BEGIN,
        "## Tying a large leaf to the arrival (`python -m benchmarks tie`)",
        "",
        "`psum` of a matmul's result on 8 CPU devices (one process), measured at device "
        "granularity, against `jax.lax` in the same interleaved rounds. *previous tie*: the "
        "first element sliced, selected and written back in one kernel (`_tie.tie`, still the "
        "`io_callback` path's form); *jaxpace*: the arrive probe hands the first element back "
        "in the same buffer and a one-element update writes it in place.",
        "",
        "| leaf per device | rounds | `jax.lax` | jaxpace | previous tie | bitwise |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        m, p = r["median_ms"], r["ratio_pct"]
        lines.append(
            f"| {r['leaf_mib']:.3g} MiB | {r['reps']} | {m['lax']:.2f} ms "
            f"| {m['jaxpace']:.2f} ms ({p['jaxpace']:+.1f}%) "
            f"| {m['previous tie']:.2f} ms ({p['previous tie']:+.1f}%) "
            f"| {'yes' if r['bitwise'] else 'NO'} |"
        )
    lines += ["", f"Machine: {machine()}. Date: {time.strftime('%Y-%m-%d')}.", END]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks tie", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--cols", type=int, nargs="+", default=[128, 256, 512, 1024, 8192])
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--markdown", default=str(REPO / "docs" / "benchmarks.md"))
    args = ap.parse_args(argv)
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", 8)
    rows = [run(c, args.reps) for c in args.cols]
    publish(rows, markdown(rows), args.out, "tie", args.markdown, BEGIN, END)
    return 0 if all(r["bitwise"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
