"""`python -m benchmarks fsdp`: the FSDP example's step with jaxpace (measure only) vs `jax.lax`.

One process, 8 CPU devices, the 2 x 4 (`data`, `model`) mesh of `examples/fsdp.py`: the same
step built with every collective a `jaxpace` drop-in (the default pacer: measure only; and a
`Pacer(sample_every=10)`) or the `jax.lax` call. Each jaxpace variant is timed against lax in
its own interleaved pair (each once per round, shuffled order), `--repeats` times; the figures
are the ratio of medians and the median over rounds of the paired ratio jaxpace / lax.
Then the same comparison in the example's own layout, 4 processes x 2 devices under
`jaxpace launch` (gloo collectives over loopback; `benchmarks/fsdp_mp.py` on each process,
process 0's timings), unless `--processes 1`. Writes `benchmarks/results/fsdp.json` and the
section of docs/benchmarks.md between the `fsdp` markers (below the generated block).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BEGIN = "<!-- begin: fsdp, written by `python -m benchmarks fsdp` -->"
END = "<!-- end: fsdp -->"


def _example():
    spec = importlib.util.spec_from_file_location("fsdp_example", REPO / "examples" / "fsdp.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _pair(base, other, args, reps: int) -> dict:
    """One interleaved run of `base` ("lax") and `other` alone: two programs, nothing else."""
    from benchmarks.__main__ import _interleaved, _paired_pct

    res = _interleaved({"lax": base, "other": other}, args, reps)
    return {
        "lax_ms": res["lax"]["median_s"] * 1e3,
        "other_ms": res["other"]["median_s"] * 1e3,
        "lax_iqr_ms": [res["lax"]["p25_s"] * 1e3, res["lax"]["p75_s"] * 1e3],
        "other_iqr_ms": [res["other"]["p25_s"] * 1e3, res["other"]["p75_s"] * 1e3],
        "ratio_of_medians_pct": (res["other"]["median_s"] / res["lax"]["median_s"] - 1) * 100,
        "paired_pct": _paired_pct(res, "other", "lax"),
    }


def setup(batch_per_replica: int):
    """`(example module, mesh, (params, x, y))`: the example's 2 x 4 mesh (set as JAX's mesh),
    its weights placed on it and one batch of `batch_per_replica` per `data` replica."""
    import jax
    from jax.sharding import NamedSharding

    ex = _example()
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    jax.set_mesh(mesh)
    shardings = [{n: NamedSharding(mesh, s) for n, s in d.items()} for d in ex.param_specs()]
    params = ex._place(ex.init_params(jax.random.key(0)), shardings)
    x, y = ex.make_data(mesh, batch_per_replica, 1)[0]
    return ex, mesh, (params, x, y)


def run(reps: int, batch_per_replica: int, repeats: int) -> dict:
    """`repeats` interleaved pairs per variant: (lax, jaxpace) and (lax, sample_every=10).

    Each comparison interleaves two programs only: a third one in the same rounds (another
    pacer's program, its drain) moved both jaxpace variants by several percent here.
    """
    import numpy as np

    from benchmarks.__main__ import machine

    ex, mesh, (params, x, y) = setup(batch_per_replica)
    import jaxpace

    sampled = jaxpace.Pacer(sample_every=10, mesh=mesh)
    lax_step = ex.make_step(mesh, "lax", 0.05, donate=False)
    variants = {
        "jaxpace": ex.make_step(mesh, "jaxpace", 0.05, donate=False),
        "sample_every=10": ex.make_step(mesh, sampled, 0.05, donate=False),
    }
    runs = {
        name: [_pair(lax_step, step, (params, x, y), reps) for _ in range(repeats)]
        for name, step in variants.items()
    }
    sampled.close()
    out = {
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "reps": reps,
        "repeats": repeats,
        "batch_per_replica": batch_per_replica,
        "runs": runs,
    }
    st = jaxpace.default_pacer().stats()
    out["sites_measured"] = sum(1 for s in st.values() if s.measured and s.steps > 0)
    out["steps_per_site"] = int(np.median([s.steps for s in st.values() if s.measured]))
    return out


def run_processes(reps: int, batch_per_replica: int, repeats: int, n: int) -> dict:
    """The (lax, jaxpace) pairs of `benchmarks/fsdp_mp.py` on `n` processes of 8 // n devices."""
    import tempfile

    from benchmarks.__main__ import _launch, machine

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "fsdp_mp.json"
        # 2 x 75 ms a round here: the bound leaves the run twice that.
        limit = int(60 + 2 * 2 * 0.075 * reps * repeats * 2)
        proc = _launch(
            ["-n", n, "--local-devices", 8 // n, "--timeout", limit, "--", sys.executable,
             REPO / "benchmarks" / "fsdp_mp.py", "--out", out, "--reps", reps,
             "--repeats", repeats, "--batch-per-replica", batch_per_replica],
            timeout=limit + 30,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"fsdp_mp.py failed under jaxpace launch:\n{proc.stderr[-2000:]}")
        res = json.loads(out.read_text())
    res.update(machine=machine(), reps=reps, repeats=repeats, batch_per_replica=batch_per_replica)
    return res


def _spread(runs: list[dict], key: str) -> str:
    """`median [min, max]` over the repeats of `key` (a percent)."""
    import numpy as np

    v = np.array([r[key] for r in runs])
    return f"{np.median(v):+.1f}% [{v.min():+.1f}, {v.max():+.1f}]"


def markdown(results: list[dict], mp: dict | None = None) -> str:
    r0 = results[0]
    lines = [
        BEGIN,
        "## FSDP + tensor parallelism step (`python -m benchmarks fsdp`)",
        "",
        "The step of `examples/fsdp.py` (two jitted halves: all-gathers, forward and "
        "backward with the tensor-parallel sums; reduce-scatters and the update) on one "
        "process with 8 CPU devices as a 2 x 4 (`data`, `model`) mesh, every collective a "
        "jaxpace drop-in (default pacer: measure only) vs the same step with `jax.lax`. "
        f"Each comparison interleaves the two programs alone, {r0['reps']} rounds, repeated "
        f"{r0['repeats']} times (median over repeats [min, max]); {r0['sites_measured']} sites "
        "measured. The weights are the example's (2 layers, width 64); a larger batch per "
        "`data` replica makes the step longer without changing its collectives.",
        "",
        "| batch per replica | `jax.lax` median | jaxpace median | ratio of medians | "
        "median per-round ratio | `sample_every=10`, ratio of medians |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        jp_runs, sm_runs = r["runs"]["jaxpace"], r["runs"]["sample_every=10"]
        lax = sorted(x["lax_ms"] for x in jp_runs)[len(jp_runs) // 2]
        jp = sorted(x["other_ms"] for x in jp_runs)[len(jp_runs) // 2]
        lines.append(
            f"| {r['batch_per_replica']} | {lax:.2f} ms | {jp:.2f} ms | "
            f"{_spread(jp_runs, 'ratio_of_medians_pct')} | {_spread(jp_runs, 'paired_pct')} | "
            f"{_spread(sm_runs, 'ratio_of_medians_pct')} |"
        )
    if mp is not None:
        lines += ["", *_processes_table(mp)]
    lines += ["", f"Machine: {r0['machine']}. Date: {r0['date']}.", END]
    return "\n".join(lines)


def _processes_table(mp: dict) -> list[str]:
    """The run in the example's own layout: its medians, their spread within a run (IQR)."""
    runs = mp["runs"]

    def mid(key):
        return sorted(x[key] for x in runs)[len(runs) // 2]

    def iqr(key):
        lo, hi = sorted(runs, key=lambda x: x[key.replace("_iqr", "")])[len(runs) // 2][key]
        return f"{lo:.1f} to {hi:.1f} ms"

    n, d = mp["processes"], mp["local_devices"]
    return [
        f"The example's own layout: {n} processes x {d} CPU devices (`jaxpace launch -n {n} "
        f"--local-devices {d}`; gloo collectives over loopback, on the same 2 cores), batch "
        f"{mp['batch_per_replica']} per replica, the same pairs ({mp['reps']} rounds, "
        f"{mp['repeats']} repeats) timed on process 0; {mp['sites_measured']} sites measured.",
        "",
        "| `jax.lax` median (IQR) | jaxpace median (IQR) | ratio of medians | "
        "median per-round ratio |",
        "|---:|---:|---:|---:|",
        f"| {mid('lax_ms'):.2f} ms ({iqr('lax_iqr_ms')}) | {mid('other_ms'):.2f} ms "
        f"({iqr('other_iqr_ms')}) | {_spread(runs, 'ratio_of_medians_pct')} | "
        f"{_spread(runs, 'paired_pct')} |",
    ]


def write_section(text: str, path: Path, begin: str = BEGIN, end: str = END) -> None:
    """Replace the section between `begin` and `end` in `path` (or add it below the block
    `python -m benchmarks` writes)."""
    doc = path.read_text()
    if begin in doc and end in doc:
        doc = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: text, doc, flags=re.S)
    else:
        marker = "<!-- end: written by `python -m benchmarks`"
        i = doc.index(marker)
        j = doc.index("\n", i) + 1
        doc = doc[:j] + "\n" + text + "\n" + doc[j:]
    path.write_text(doc)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks fsdp", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--reps", type=int, default=600)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-per-replica", type=int, nargs="+", default=[8, 64])
    ap.add_argument(
        "--processes",
        type=int,
        choices=(1, 2, 4, 8),
        default=4,
        help="also time the step on this many processes of 8/N devices (1: skip)",
    )
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--markdown", default=str(REPO / "docs" / "benchmarks.md"))
    args = ap.parse_args(argv)
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", 8)
    results = [run(args.reps, b, args.repeats) for b in args.batch_per_replica]
    mp = None
    if args.processes > 1:
        b = args.batch_per_replica[0]
        mp = run_processes(args.reps, b, args.repeats, args.processes)
    data = {"in_process": results, "processes": mp}
    publish(data, markdown(results, mp), args.out, "fsdp", args.markdown)
    return 0


def publish(data, text: str, out_dir, name: str, markdown_path, begin=BEGIN, end=END) -> None:
    """Writes `data` to `out_dir/name.json`, prints `text` and puts it between `begin` and
    `end` in `markdown_path` (unless that is empty)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=1, sort_keys=True))
    print(text)
    if markdown_path:
        write_section(text, Path(markdown_path), begin, end)


if __name__ == "__main__":
    sys.exit(main())
