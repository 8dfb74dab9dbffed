"""`python -m benchmarks fsdp-parts`: where the FSDP step's measure-only overhead goes.

The step of `examples/fsdp.py` as `python -m benchmarks fsdp` times it (one process, 8 CPU
devices, 2 x 4 mesh), in three builds, each timed against `jax.lax` in its own interleaved
pair, `--repeats` times:

- **as shipped**: every collective a jaxpace drop-in, the default pacer (measure only);
- **handlers that return at once**: the same compiled program, but every measured call names
  a site id the native handlers reject (`jaxpace.native.probes.MAX_SITES`): they return before
  reading a clock, so nothing is recorded or drained. What is left is the cost of the
  operations the measured program adds, without any of jaxpace's host work;
- **no ties (unsafe)**: the same probes, without the tie of each operand leaf to the arrival
  probe (the handler's copy of a small leaf, the select or the in-place update of a larger one). Nothing then orders a collective after its arrival probe, so the records cannot be
  trusted: this build exists only to split the cost between the probes and the ties.

The two partial builds are made by replacing `jaxpace.native.primitive`'s functions while
their steps are traced (the library has no such modes). Also counted: the operations in each
half's compiled entry computation (`tests/hlo_graph.py`). Writes
`benchmarks/results/fsdp_parts.json` and the docs/benchmarks.md section between the
`fsdp-parts` markers.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
BEGIN = "<!-- begin: fsdp-parts, written by `python -m benchmarks fsdp-parts` -->"
END = "<!-- end: fsdp-parts -->"
BUILDS = ("as shipped", "handlers that return at once", "no ties (unsafe)")
OPS = ("fusion", "custom-call", "dot", "collectives", "all")


@contextlib.contextmanager
def _build(name: str):
    """While tracing: the measured calls of build `name` (see the module's docstring)."""
    from jaxpace.native import primitive
    from jaxpace.native import probes as _native

    saved = primitive.native_collective, primitive.tie, primitive.arrive
    if name == "handlers that return at once":

        def nowhere(reduce, x, *, site_id, **kw):
            return saved[0](reduce, x, site_id=_native.MAX_SITES, **kw)

        primitive.native_collective = nowhere
    elif name == "no ties (unsafe)":
        arrive = primitive.arrive

        def untied(deps, site_id, rank, payload_size=0, firsts=(), through=()):
            # The leaves the probe would hand back (copied or selected) go to the collective
            # as they are; they stay the probe's operands.
            tag, pay, outs = arrive([*deps, *through], site_id, rank, payload_size, firsts)
            return tag, pay, [*outs, *through]

        primitive.arrive = untied
        primitive.tie = lambda leaf, never: leaf
    try:
        yield
    finally:
        primitive.native_collective, primitive.tie, primitive.arrive = saved


def _ops(text: str) -> dict:
    from hlo_graph import count_collectives, entry_ops

    ops = entry_ops(text)
    out = {k: ops.get(k, 0) for k in OPS[:3]}
    out["collectives"] = sum(count_collectives(text).values())
    out["all"] = sum(ops.values())
    return out


def run(reps: int, batch_per_replica: int, repeats: int) -> dict:
    import jax

    from benchmarks.__main__ import machine
    from benchmarks.fsdp import _pair, setup

    sys.path.insert(0, str(REPO / "tests"))
    ex, mesh, args = setup(batch_per_replica)
    params = args[0]
    steps = {"lax": ex.make_step(mesh, "lax", 0.05, donate=False)}
    for name in BUILDS:
        steps[name] = ex.make_step(mesh, "jaxpace", 0.05, donate=False)
    ops = {}
    for name, step in steps.items():
        grads_fn, update_fn = step.halves
        with _build(name):
            jax.block_until_ready(step(*args))  # traced and compiled as this build
            grads = jax.eval_shape(grads_fn, *args)[0]
            ops[name] = {
                "forward/backward": _ops(grads_fn.lower(*args).compile().as_text()),
                "reduce-scatter/update": _ops(update_fn.lower(params, grads).compile().as_text()),
            }
    runs = {
        name: [_pair(steps["lax"], steps[name], args, reps) for _ in range(repeats)]
        for name in BUILDS
    }
    return {
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "reps": reps,
        "repeats": repeats,
        "batch_per_replica": batch_per_replica,
        "ops": ops,
        "runs": runs,
    }


def markdown(r: dict) -> str:
    from benchmarks.fsdp import _spread

    lines = [
        BEGIN,
        "## Where the FSDP step's overhead goes (`python -m benchmarks fsdp-parts`)",
        "",
        f"The `fsdp` step at batch {r['batch_per_replica']} per replica, in three builds, each "
        f"timed against `jax.lax` in its own interleaved pair ({r['reps']} rounds, "
        f"{r['repeats']} repeats; median over repeats [min, max]). *Handlers that return at "
        "once*: the same compiled program, every measured call naming a site the native "
        "handlers reject, so no clock is read and nothing is recorded. *No ties*: the probes "
        "without the tie of each operand leaf to the arrival probe; unsafe (nothing orders a "
        "collective after its arrival), built only to split the cost.",
        "",
        "| build | `jax.lax` median | build median | ratio of medians | median per-round ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in BUILDS:
        runs = r["runs"][name]
        lax = sorted(x["lax_ms"] for x in runs)[len(runs) // 2]
        ours = sorted(x["other_ms"] for x in runs)[len(runs) // 2]
        lines.append(
            f"| {name} | {lax:.2f} ms | {ours:.2f} ms | "
            f"{_spread(runs, 'ratio_of_medians_pct')} | {_spread(runs, 'paired_pct')} |"
        )
    lines += [
        "",
        "Operations in each half's compiled entry computation, per device:",
        "",
        "| half | build | " + " | ".join(OPS) + " |",
        "|---|---|" + "---:|" * len(OPS),
    ]
    for half in ("forward/backward", "reduce-scatter/update"):
        for name in ("lax", *BUILDS):
            c = r["ops"][name][half]
            lines.append(f"| {half} | {name} | " + " | ".join(str(c[k]) for k in OPS) + " |")
    lines += ["", f"Machine: {r['machine']}. Date: {r['date']}.", END]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks fsdp-parts", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--reps", type=int, default=600)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-per-replica", type=int, default=8)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--markdown", default=str(REPO / "docs" / "benchmarks.md"))
    args = ap.parse_args(argv)
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", 8)
    from benchmarks.fsdp import publish

    r = run(args.reps, args.batch_per_replica, args.repeats)
    publish(r, markdown(r), args.out, "fsdp_parts", args.markdown, BEGIN, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
