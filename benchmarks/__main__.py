"""`python -m benchmarks`: jaxpace vs jax.lax, interleaved in one run; writes docs/benchmarks.md.

Every overhead figure is a ratio of medians against `jax.lax` measured interleaved
(every variant once per round, in a fresh random order each round) in the same
process, so machine load affects all sides alike. Absolute times
are labelled with the machine they came from.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent


def machine() -> str:
    import jax

    dev = jax.devices()[0]
    return (
        f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
        f"jax {jax.__version__}, {dev.platform}:{dev.device_kind} x{jax.device_count()}"
    )


def _interleaved(fns: dict, args, reps: int) -> dict:
    """Median and IQR seconds per call of each fn: every fn once per round, `reps` rounds.

    The order is shuffled each round (fixed seed): work a variant leaves running after its
    call returns (a pacing policy on the native drain thread) then lands on a random
    successor, not always on the same one.
    """
    import jax
    import numpy as np

    for f in fns.values():  # compile + warm
        for _ in range(3):
            jax.block_until_ready(f(*args))
    times = {k: [] for k in fns}
    names = list(fns)
    rng = np.random.default_rng(0)
    for _ in range(reps):
        for i in rng.permutation(len(names)):
            k, f = names[i], fns[names[i]]
            t0 = time.perf_counter()
            jax.block_until_ready(f(*args))
            times[k].append(time.perf_counter() - t0)
    out = {}
    for k, ts in times.items():
        a = np.array(ts)
        out[k] = {
            "median_s": float(np.median(a)),
            "p25_s": float(np.percentile(a, 25)),
            "p75_s": float(np.percentile(a, 75)),
            "times_s": ts,  # per round, in round order (paired comparisons)
        }
    return out


def _paired_pct(res: dict, name: str, base: str) -> float:
    """Median over rounds of `name`'s time / `base`'s time in the same round, as a percent."""
    import numpy as np

    a, b = np.array(res[name]["times_s"]), np.array(res[base]["times_s"])
    return float((np.median(a / b) - 1) * 100)


def single_process(sizes, leaves_list, reps) -> list[dict]:
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jaxpace as jp

    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    rows = []
    for size in sizes:
        for n_leaves in leaves_list:
            per = max(size // n_leaves, 1)
            tree = [
                jax.device_put(
                    jnp.full((jax.device_count(), per), 0.5, jnp.float32),
                    NamedSharding(mesh, P("data")),
                )
                for _ in range(n_leaves)
            ]
            specs = ([P("data")] * n_leaves,)
            pacers = {
                "measure/process": jp.Pacer(),
                "measure/device": jp.Pacer(granularity="device"),
                "adaptive(balanced)": jp.Pacer(policy=jp.adaptive()),
                "measure/sample_every=10": jp.Pacer(sample_every=10),
            }
            fns = {
                "lax": jax.jit(
                    jax.shard_map(
                        lambda t: lax.pmean(t, "data"),
                        mesh=mesh,
                        in_specs=specs,
                        out_specs=[P()] * n_leaves,
                    )
                )
            }
            for name, pc in pacers.items():
                fns[name] = jax.jit(
                    jax.shard_map(
                        lambda t, pc=pc: pc.pmean(t, "data", site="b"),
                        mesh=mesh,
                        in_specs=specs,
                        out_specs=[P()] * n_leaves,
                    )
                )
            res = _interleaved(fns, (tree,), reps)
            base = res["lax"]["median_s"]
            row = {
                "elements": per * n_leaves,
                "leaves": n_leaves,
                "lax_median_s": base,
                "ratios": {k: v["median_s"] / base for k, v in res.items() if k != "lax"},
                "raw": res,
            }
            rows.append(row)
            print(
                f"  1x{jax.device_count()} {per * n_leaves:>9,} el {n_leaves:>3} leaves: lax "
                f"{base * 1e3:7.3f} ms | "
                + " | ".join(f"{k} {v:.3f}x" for k, v in row["ratios"].items()),
                flush=True,
            )
    return rows


def callback_cost(reps=2000) -> dict:
    """Host cost of one io_callback round trip, and of jaxpace's pre/post bodies."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import io_callback

    f = jax.jit(
        lambda x: io_callback(
            lambda v: np.int32(0), jax.ShapeDtypeStruct((), jnp.int32), x, ordered=False
        )
    )
    g = jax.jit(lambda x: x + 1)
    x = jnp.int32(1)
    res = _interleaved({"callback": f, "noop": g}, (x,), reps)
    return {"io_callback_us": (res["callback"]["median_s"] - res["noop"]["median_s"]) * 1e6}


def _ab_text(ab) -> str:
    if not ab:
        return "none yet"
    verdict = "rejected pacing" if ab.get("rejected") else "kept pacing"
    return (
        f"unpaced {ab['unpaced_step_s'] * 1e3:.1f} ms vs paced {ab['paced_step_s'] * 1e3:.1f} ms"
        f" per step, {verdict}"
    )


_QUIET_THRESHOLD_S = 0.05  # above the spread of 8 CPU devices on 2 cores (a few ms)


def train_step(reps=40) -> dict:
    """The example model's forward+backward+update, lax.pmean vs jaxpace.pmean."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jaxpace as jp

    mesh = jax.make_mesh((jax.device_count(),), ("data",))

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.l1 = nnx.Linear(256, 1024, rngs=rngs)
            self.l2 = nnx.Linear(1024, 1024, rngs=rngs)
            self.l3 = nnx.Linear(1024, 1, rngs=rngs)

        def __call__(self, x):
            return self.l3(nnx.gelu(self.l2(nnx.gelu(self.l1(x)))))

    gdef, params = nnx.split(MLP(nnx.Rngs(0)), nnx.Param)
    params = jax.device_put(params, NamedSharding(mesh, P()))
    tx = optax.adam(1e-3)
    opt = jax.device_put(tx.init(params), NamedSharding(mesh, P()))
    x = jax.device_put(jnp.ones((jax.device_count() * 64, 256)), NamedSharding(mesh, P("data")))
    y = jax.device_put(jnp.ones((jax.device_count() * 64, 1)), NamedSharding(mesh, P("data")))

    def make(reduce):
        def step(params, opt, x, y):
            local = jax.tree.map(lambda p: lax.pcast(p, "data", to="varying"), params)
            g = jax.grad(lambda p: jnp.mean((nnx.merge(gdef, p)(x) - y) ** 2))(local)
            g = reduce(g)
            u, opt = tx.update(g, opt, params)
            return optax.apply_updates(params, u), opt

        return jax.jit(
            jax.shard_map(
                step, mesh=mesh, in_specs=(P(), P(), P("data"), P("data")), out_specs=(P(), P())
            )
        )

    pm, ps = jp.Pacer(), jp.Pacer(sample_every=10)
    # Device granularity: every shard is a rank, so the adaptive policy has ranks to pace
    # (with one process at process granularity it would have one rank and nothing to do).
    pd, pa = jp.Pacer(granularity="device"), jp.Pacer(policy=jp.adaptive(), granularity="device")
    pd2 = jp.Pacer(granularity="device")  # the same variant twice: the run's noise floor
    pg = jp.Pacer(policy=jp.adaptive(ab_test=True), granularity="device")
    # Balanced from the policy's view: a threshold above this machine's device spread, so it
    # measures what a disengaged `adaptive` costs (its update still runs every step).
    pq = jp.Pacer(policy=jp.adaptive(threshold_s=_QUIET_THRESHOLD_S), granularity="device")
    fns = {
        "lax": make(lambda g: lax.pmean(g, "data")),
        "measure": make(lambda g: pm.pmean(g, "data", site="t")),
        "measure/sample_every=10": make(lambda g: ps.pmean(g, "data", site="t")),
        "measure/device": make(lambda g: pd.pmean(g, "data", site="t")),
        "measure/device, again": make(lambda g: pd2.pmean(g, "data", site="t")),
        "adaptive/device, engages here": make(lambda g: pa.pmean(g, "data", site="t")),
        "adaptive/device, A/B guard on": make(lambda g: pg.pmean(g, "data", site="t")),
        "adaptive/device, not engaged": make(lambda g: pq.pmean(g, "data", site="t")),
    }
    res = _interleaved(fns, (params, opt, x, y), reps)
    base = res["lax"]["median_s"]
    n_params = sum(v.size for v in jax.tree.leaves(params))
    st, sg, sq = pa.stats().get("t"), pg.stats().get("t"), pq.stats().get("t")

    def vs_measure(name):  # percent vs measure-only at the same (device) granularity
        return (res[name]["median_s"] / res["measure/device"]["median_s"] - 1) * 100

    out = {
        "params": int(n_params),
        "lax_median_s": base,
        "overhead_pct": {k: (v["median_s"] / base - 1) * 100 for k, v in res.items() if k != "lax"},
        "adaptive_vs_measure_pct": vs_measure("adaptive/device, engages here"),
        "adaptive_steps_paced": int(st.steps_paced) if st is not None else None,
        "adaptive_steps": int(st.steps) if st is not None else None,
        "guarded_ab_effect": (sg.ab_effect if sg is not None else None),
        "guarded_vs_measure_pct": vs_measure("adaptive/device, A/B guard on"),
        "quiet_vs_measure_pct": vs_measure("adaptive/device, not engaged"),
        # Paired per round (each variant runs once per round, order shuffled): less noisy.
        "paired_vs_measure_pct": {
            k: _paired_pct(res, k, "measure/device")
            for k in res
            if k.startswith(("adaptive/device", "measure/device, again"))
        },
        "quiet_steps_paced": int(sq.steps_paced) if sq is not None else None,
        "quiet_threshold_s": _QUIET_THRESHOLD_S,
    }
    print(
        f"  train step ({n_params:,} params): lax {base * 1e3:.2f} ms | "
        + " | ".join(f"{k} {v:+.1f}%" for k, v in out["overhead_pct"].items()),
        flush=True,
    )
    return out


def _launch(args, timeout=300):
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    return subprocess.run(
        [sys.executable, "-m", "jaxpace", "launch", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )


def multi_process(out_dir: Path, reps: int) -> dict:
    proc = _launch(
        [
            "-n",
            4,
            "--local-devices",
            2,
            "--timeout",
            280,
            "--",
            sys.executable,
            HERE / "mp_overhead.py",
            "--out",
            out_dir / "mp.json",
            "--reps",
            reps,
        ]
    )
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    return json.loads((out_dir / "mp.json").read_text())


def detection(out_dir: Path, lags_ms) -> list[dict]:
    import numpy as np

    rows = []
    for lag in lags_ms:
        d = out_dir / f"det{lag}"
        proc = _launch(
            [
                "-n",
                4,
                "--local-devices",
                2,
                "--timeout",
                200,
                "--",
                sys.executable,
                REPO / "tests" / "scripts" / "mp_collective.py",
                "--lag-s",
                lag / 1e3,
                "--steps",
                60,
                "--out",
                d,
            ]
        )
        if proc.returncode != 0:
            rows.append({"lag_ms": lag, "error": proc.stderr[-500:]})
            continue
        res = [json.loads((d / f"result-p{i}.json").read_text()) for i in range(4)]
        maps = [{int(k): v for k, v in r["measure"]["waits_ns"].items()} for r in res]
        steps = sorted(set.intersection(*[set(m) for m in maps]))[5:]
        hits = [int(np.argmin([m[s] for m in maps])) == 1 for s in steps]
        rows.append({"lag_ms": lag, "steps": len(steps), "identified_share": float(np.mean(hits))})
        print(
            f"  detection: lag {lag} ms -> identified in {np.mean(hits):.0%} of steps", flush=True
        )
    return rows


BEGIN = "<!-- begin: written by `python -m benchmarks`; edits here are overwritten -->"
END = "<!-- end: written by `python -m benchmarks`; the sections below are kept as they are -->"


def write_markdown(results: dict, path: Path) -> None:
    """Rewrites the block between BEGIN and END in `path`, keeping everything else.

    The sections after END (other benchmarks' figures and their reading) are
    written by hand or by the other `python -m benchmarks <name>` commands.
    """
    block = "\n".join(_generated_lines(results))
    old = path.read_text() if path.exists() else ""
    if BEGIN in old and END in old:
        head, rest = old.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
    else:
        head, tail = "", "\n" + old
    path.write_text(f"{head}{BEGIN}\n{block}\n{END}{tail}")


def _generated_lines(results: dict) -> list[str]:
    lines = [
        "# Benchmarks",
        "",
        "The block below is produced by `python -m benchmarks`. Every overhead",
        "figure is a ratio of medians against `jax.lax.pmean` measured interleaved",
        "(each variant once per round, in a shuffled order) in the same run. Absolute",
        "times are from the machine named below.",
        "",
        f"Machine: {results['machine']}  ",
        f"Date: {results['date']}",
        "",
        "## Collective overhead, single process, 8 CPU devices",
        "",
        "The operand is a jit argument here, which the arrival tie makes XLA copy; see the",
        "native probes' section below for operands computed in the program.",
        "",
        "| elements | leaves | lax median | measure/process | measure/device | adaptive (balanced) | sample_every=10 |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["single_process"]:
        q = r["ratios"]
        lines.append(
            f"| {r['elements']:,} | {r['leaves']} | {r['lax_median_s'] * 1e3:.3f} ms | "
            f"{q['measure/process']:.3f}x | {q['measure/device']:.3f}x | "
            f"{q['adaptive(balanced)']:.3f}x | {q['measure/sample_every=10']:.3f}x |"
        )
    mp = results.get("multi_process", {})
    lines += ["", "## Collective overhead, 4 processes x 2 CPU devices (gloo)", ""]
    if "rows" in mp:
        lines += [
            "| elements | leaves | lax median | measure/process | measure/device | adaptive (balanced) |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for r in mp["rows"]:
            q = r["ratios"]
            lines.append(
                f"| {r['elements']:,} | {r['leaves']} | {r['lax_median_s'] * 1e3:.2f} ms | "
                f"{q['measure/process']:.3f}x | {q['measure/device']:.3f}x | "
                f"{q['adaptive(balanced)']:.3f}x |"
            )
        lines += [
            "",
            "On CPU, XLA runs each operand of a variadic all-reduce as its own gloo "
            "collective, so the in-band exchange payload of pacing policies costs one more "
            "small all-reduce there (about the `lax` time of a 1-leaf reduce). NCCL groups "
            "the operands of one all-reduce.",
        ]
    else:
        lines.append(f"(failed: {mp.get('error', 'not run')})")
    t = results["train_step"]
    lines += [
        "",
        "## Realistic train step (1 process, 8 CPU devices)",
        "",
        f"MLP 256-1024-1024-1 ({t['params']:,} parameters), forward + backward + Adam, "
        f"local gradients reduced by `pmean`. lax step median {t['lax_median_s'] * 1e3:.2f} ms.",
        "",
        "| variant | overhead vs lax |",
        "|---|---:|",
    ]
    for k, v in t["overhead_pct"].items():
        lines.append(f"| {k} | {v:+.2f}% |")
    if "adaptive_vs_measure_pct" in t:
        paired = t.get("paired_vs_measure_pct", {})

        def pp(name):  # paired per-round percent vs measure/device, if measured
            v = paired.get(name)
            return "n/a" if v is None else f"{v:+.2f}%"

        lines += [
            "",
            f"Adaptive pacing vs measure-only, both at device granularity, no imbalance "
            f"injected (ratio of medians; paired per-round median in brackets). Same "
            f"variant twice (the noise floor): {pp('measure/device, again')}. "
            f"Not engaged (threshold {t.get('quiet_threshold_s', float('nan')) * 1e3:.0f} ms, "
            f"above this machine's device spread; it paced {t.get('quiet_steps_paced')} "
            f"rank-steps): {t.get('quiet_vs_measure_pct', float('nan')):+.2f}% "
            f"[{pp('adaptive/device, not engaged')}]. Default settings: "
            f"{t['adaptive_vs_measure_pct']:+.2f}% [{pp('adaptive/device, engages here')}]; "
            f"it paced {t['adaptive_steps_paced']} of {t['adaptive_steps']} rank-steps, "
            f"because 8 CPU devices sharing 2 cores arrive more than its 1 ms threshold apart. "
            f"With its A/B guard on (`adaptive(ab_test=True)`, off by default): "
            f"{t.get('guarded_vs_measure_pct', float('nan')):+.2f}% "
            f"[{pp('adaptive/device, A/B guard on')}]; the guard's reading: "
            f"{_ab_text(t.get('guarded_ab_effect'))} (its step is one site exit to the next, "
            f"so here it spans the other variants' interleaved calls).",
        ]
    lines += [
        "",
        "## Per-callback cost",
        "",
        f"One `io_callback` round trip (jit, CPU): {results['callback']['io_callback_us']:.1f} us.",
    ]
    lines += [
        "",
        "## Detection (4 processes x 2 devices, lag injected on process 1)",
        "",
        "| injected lag | steps | lagging process had the smallest wait |",
        "|---:|---:|---:|",
    ]
    for r in results["detection"]:
        if "error" in r:
            lines.append(f"| {r['lag_ms']} ms | - | failed |")
        else:
            lines.append(f"| {r['lag_ms']} ms | {r['steps']} | {r['identified_share']:.0%} |")
    sims = [results[k] for k in ("sim", "sim_adaptive") if results.get(k)]
    if sims:
        lines += ["", "## Simulator throughput", ""]
        for s in sims:
            lines.append(
                f"- {s['ranks']} ranks x {s['steps']:,} steps (`{s['scenario']}`, "
                f"{s['policy'].split('(')[0]}): {s['seconds']:.2f} s wall, "
                f"{s.get('cpu_seconds', float('nan')):.2f} s CPU = "
                f"{s['rank_steps_per_s']:,.0f} rank-steps/s, load {s.get('load_1min', 0):.1f}"
                + (f" ({s['kernels']})." if s.get("kernels") else ".")
            )
        lines.append("")
        lines.append(
            "The target with `adaptive` is <= 10 s. Timed first, before this run's "
            "CPU devices and worker processes start."
        )
    return lines


def _time_simulator() -> dict:
    """`paper` at 1024 ranks x 10,000 steps, without pacing and with `adaptive`."""
    try:
        sys.path.insert(0, str(HERE))
        import bench_sim

        print("simulator:", flush=True)
        return {
            "sim": bench_sim.run(nodes=128, steps=10_000, policy=None),
            "sim_adaptive": bench_sim.run(nodes=128, steps=10_000, policy="adaptive"),
        }
    except Exception as e:  # noqa: BLE001
        return {"sim_error": repr(e)}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["peer"]:  # `python -m benchmarks peer --jax-src DIR` (benchmarks/peer.py)
        from benchmarks import peer

        return peer.main(argv[1:])
    if argv[:1] == ["watchdog"]:  # `python -m benchmarks watchdog` (benchmarks/watchdog.py)
        from benchmarks import watchdog

        return watchdog.main(argv[1:])
    if argv[:1] == ["sources"]:  # reading traces and Inspector logs (benchmarks/sources.py)
        from benchmarks import sources

        return sources.main(argv[1:])
    if argv[:1] == ["fsdp"]:  # the FSDP example's step, jaxpace vs lax (benchmarks/fsdp.py)
        from benchmarks import fsdp

        return fsdp.main(argv[1:])
    if argv[:1] == ["fsdp-parts"]:  # the FSDP overhead split (benchmarks/fsdp_parts.py)
        from benchmarks import fsdp_parts

        return fsdp_parts.main(argv[1:])
    if argv[:1] == ["tie"]:  # tying a large leaf to the arrival (benchmarks/tie.py)
        from benchmarks import tie

        return tie.main(argv[1:])
    if argv[:1] == ["lag"]:  # adaptive pacing with one late process (benchmarks/lag.py)
        from benchmarks import lag

        return lag.main(argv[1:])
    if argv[:1] == ["records"]:  # records at fleet scale: Parquet, DuckDB (benchmarks/records.py)
        from benchmarks import records

        return records.main(argv[1:])
    if argv[:1] == ["html"]:  # the HTML report's size and load time (benchmarks/html_page.py)
        from benchmarks import html_page

        return html_page.main(argv[1:])
    if argv[:1] == ["watch"]:  # a jit step under jaxpace.watch vs unwatched (benchmarks/watch.py)
        from benchmarks import watch

        return watch.main(argv[1:])
    if argv[:1] == ["watch-exchange"]:  # the watch exchange at scale (watch_exchange.py)
        from benchmarks import watch_exchange

        return watch_exchange.main(argv[1:])
    if argv[:1] == ["watch-alarms"]:  # watch's false alarms on healthy windows (watch_alarms.py)
        from benchmarks import watch_alarms

        return watch_alarms.main(argv[1:])
    if argv[:1] == ["diagnosis"]:  # labelled simulated runs vs the report (benchmarks/diagnosis.py)
        from benchmarks import diagnosis

        return diagnosis.main(argv[1:])
    if argv[:1] == ["accuracy"]:  # names right and false alarms per size (benchmarks/accuracy.py)
        from benchmarks import accuracy

        return accuracy.main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer sizes and repetitions")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--markdown", default=str(REPO / "docs" / "benchmarks.md"))
    ap.add_argument(
        "--gpu",
        action="store_true",
        help="benchmark the accelerators (single process) instead of 8 CPU devices",
    )
    args = ap.parse_args(argv)
    # The simulator first: `jaxpace.sim` needs no JAX, so it meets the machine's own load, not
    # that of this benchmark's CPU devices and worker processes (earlier runs read load 4-5).
    sims = _time_simulator()
    import jax

    if not args.gpu:
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", 8)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sizes = [1_000, 1_000_000] if args.quick else [1_000, 65_536, 1_000_000, 16_000_000]
    reps = 15 if args.quick else 40
    results = {"machine": machine(), "date": time.strftime("%Y-%m-%d")}
    print("single process:", flush=True)
    results["single_process"] = single_process(sizes, [1, 200] if not args.quick else [1], reps)
    results["callback"] = callback_cost()
    results["train_step"] = train_step(100 if args.quick else 200)
    if not args.gpu:
        print("multi process:", flush=True)
        results["multi_process"] = multi_process(out, 10 if args.quick else 20)
        results["detection"] = detection(out, [1, 3, 10] if args.quick else [1, 2, 3, 5, 10])
    else:
        results["multi_process"] = {"error": "not run on --gpu (one GPU host)"}
        results["detection"] = []
    results.update(sims)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    write_markdown(results, Path(args.markdown))
    print(f"wrote {out / 'results.json'} and {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
