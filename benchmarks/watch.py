"""`python -m benchmarks watch`: a jit step under `jaxpace.watch` (its defaults) vs the same step unwatched.

Two steps, each a jit program with no jaxpace collective, on one process with 8 CPU
devices: the FSDP example's step (`examples/fsdp.py`, `jax.lax` collectives, 2 x 4 mesh)
and the demo's model (`jaxpace.examples.train`'s MLP, `lax.pmean` of the gradients).
Each arm runs in its own process (so watch's background thread, its summaries and its
decision are charged to the watch arm only); a pair is one unwatched run and one watched
run back to back, the order alternating from pair to pair. A run calls the step for a fixed
time (`--seconds`), so a watched run holds the windows `every="auto"` places in that time
(the first at call 100). Per run: the average step over the timed calls (all of them,
windows included). The figure is the 95% interval (t) of the mean over pairs of watched /
unwatched, with the number of pairs. From the watched runs: the time per call inside
windows, the two edge blocks, `start_trace` / `stop_trace`, the analysis (summary +
decision) per window, and the cost watch measured per window and the spacing it chose.
Writes `benchmarks/results/watch.json` and the "watch" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BEGIN = "<!-- begin: watch, written by `python -m benchmarks watch` -->"
END = "<!-- end: watch -->"
WORKLOADS = ("fsdp", "demo", "demo-dropin")
WARM_S = 15.0  # untimed at the start of each run: the first window (call 100) and its decision
# `--between`: the watched arm with no window at all (its first window this far away), so
# the pairs measure what watch costs between windows: the wrapper and its thread alone.
NEVER = 10**9
BEGIN_BETWEEN = (
    "<!-- begin: watch between windows, written by `python -m benchmarks watch --between` -->"
)
END_BETWEEN = "<!-- end: watch between windows -->"
BEGIN_OUTSIDE = "<!-- begin: watch outside, written by `python -m benchmarks watch --outside` -->"
END_OUTSIDE = "<!-- end: watch outside -->"


# ----------------------------------------------------------------- one run (a child process)


def _build(workload: str, arm: str = "plain"):
    """`(step, state)` with `state = step(*state)` shaped so it can be fed back.

    `demo-dropin`: the demo's model with `jaxpace.pmean` (a `Pacer`, measure only) in the
    watched arm, `jax.lax.pmean` in the unwatched one."""
    import jax

    if workload == "fsdp":
        from benchmarks.fsdp import setup

        ex, mesh, (params, x, y) = setup(8)
        f = ex.make_step(mesh, "lax", 0.05, donate=False)

        def step(params, x, y):
            p, _loss = f(params, x, y)
            return p, x, y

        return step, (params, x, y)
    from jaxpace.examples.train import _Model

    dropin = workload == "demo-dropin" and arm in ("watch", "between")
    args = argparse.Namespace(
        hidden=256, seed=0, batch_per_device=32, lr=3e-3, collective="jaxpace" if dropin else "lax"
    )
    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    m = _Model(args, mesh)
    import jaxpace

    f = m.make_step(jaxpace.Pacer() if dropin else None)
    x, y = m.batch(0)
    opt = jax.device_put(m.tx.init(m.params0), m.replicated)

    def step(params, opt, x, y):
        # Blocking each step as the FSDP example does: 8 CPU devices on 2 cores deadlocked
        # in XLA's in-process all-reduce rendezvous with steps queued unblocked.
        p, o, _loss = jax.block_until_ready(f(params, opt, x, y))
        return p, o, x, y

    return step, (m.params0, opt, x, y)


def child(workload: str, arm: str, seconds: float, out: str) -> None:
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", 8)
    import jaxpace

    step, state = _build(workload, arm)
    from jaxpace.collectives.measure import pass_through

    # Compile and warm: in the watched arm, the form watch runs outside windows (as in a job
    # watched from its first step), so the timed calls hold no compilation but the measured
    # form's at the first window of a program with jaxpace collectives.
    watched = arm in ("watch", "between")
    with pass_through(watched):
        for _ in range(3):
            state = jax.block_until_ready(step(*state))
    if arm == "between":
        fn = jaxpace.watch(step, every=NEVER)
    else:
        fn = jaxpace.watch(step) if watched else step
    spans: list[float] = []
    sched = getattr(fn, "schedule", None)
    t_pre = None
    t0 = time.perf_counter()
    t_warm, calls, warm_calls = t0 + WARM_S, 0, None
    # Each timed call's time, and where it fell: in a window (its blocking call before it
    # included), or how many calls after the last window's end (-1: none yet).
    call_s: list[float] = []
    since: list[int] = []
    last_end = None
    while time.perf_counter() - t_warm < seconds:
        k, calls = calls, calls + 1
        if warm_calls is None and time.perf_counter() >= t_warm:
            jax.block_until_ready(state)
            t_warm, warm_calls = time.perf_counter(), k
        t_call = time.perf_counter()
        state = fn(*state)
        t_done = time.perf_counter()
        e = sched.edge(k) if sched is not None else None
        if e is not None:  # timestamps only (the wrapper itself blocks at the edges)
            if e.pre_block:
                t_pre = t_done
            elif e.end and t_pre is not None:
                spans.append(t_done - t_pre)
        if warm_calls is not None:
            call_s.append(t_done - t_call)
            inside = e is not None and (e.window or e.pre_block)
            since.append(-2 if inside else (-1 if last_end is None else k - last_end))
        if e is not None and e.end:
            last_end = k
    jax.block_until_ready(state)
    end = time.perf_counter()
    res: dict = {
        "workload": workload,
        "arm": arm,
        "calls": calls - warm_calls,
        "step_s": (end - t_warm) / (calls - warm_calls),  # after the first WARM_S
        "step_all_s": (end - t0) / calls,  # every call, the first window's included
        "by_distance": _by_distance(call_s, since),
    }
    if arm == "between":
        fn.close()
        res["windows_decided"] = len(fn.history())
    elif arm == "watch":
        fn.close()
        w = fn._worker
        res["window"] = fn.schedule.window
        res["every"] = fn.schedule.every
        res["window_span_s"] = spans
        verdicts = list(w._verdicts) if w is not None else []
        res["costs"] = [v.get("cost_s", {}) for v in verdicts]
        res["announced"] = [
            [v["first_step"], (v.get("next_window") or {}).get("first_step")] for v in verdicts
        ]
        res["analyzed_steps"] = [v.get("analyzed_steps") for v in verdicts]
        res["windows_decided"] = len(fn.history())
        res["dropins"] = bool(fn._dropins)
    Path(out).write_text(json.dumps(res))


# Calls after a window's end, in these bands (the last one open): where an after-effect of a
# window (the profiler's, the analysis thread's, the garbage collector's) would show.
BANDS = ((1, 20), (21, 100), (101, 500), (501, 2000), (2001, None))


def _by_distance(call_s: list[float], since: list[int]) -> dict:
    """`{band: [calls, mean ms]}` of the timed calls: `in window` (the blocking call before a
    window and its calls), `before any window`, and each band of `BANDS` after a window."""
    import numpy as np

    t, d = np.asarray(call_s), np.asarray(since, np.int64)
    out: dict = {}
    masks = {"in window": d == -2, "before any window": d == -1}
    for lo, hi in BANDS:
        masks[f"{lo}-{hi}" if hi else f"{lo}+"] = (d >= lo) & ((d <= hi) if hi else True)
    for name, m in masks.items():
        if m.any():
            out[name] = [int(m.sum()), float(t[m].mean() * 1e3)]
    return out


def window_share(by: dict, window: int) -> dict | None:
    """What the windows cost within the watched runs themselves (no run-to-run spread): each
    band's calls beyond the mean call 2001+ calls after a window, summed, as a share of the
    runs' time and per window (a window is `window` calls and the blocking call before)."""
    if "2001+" not in by or "in window" not in by:
        return None
    far = by["2001+"][1]
    near = [v for band, v in by.items() if band not in ("2001+", "before any window")]
    extra = sum(n * (ms - far) for n, ms in near)
    total = sum(n * ms for n, ms in by.values())
    windows = round(by["in window"][0] / (window + 1))
    return {
        "pct": 100 * extra / total,
        "windows": windows,
        "per_window_ms": extra / max(windows, 1),
    }


def _pooled_distance(runs: list[dict]) -> dict:
    """`_by_distance` over several runs: each band's calls and their mean ms."""
    tot: dict = {}
    for r in runs:
        for band, (n, ms) in r.get("by_distance", {}).items():
            c = tot.setdefault(band, [0, 0.0])
            c[0] += n
            c[1] += n * ms
    return {band: [n, s / n] for band, (n, s) in tot.items() if n}


# ----------------------------------------------------------------- the pairs


def _child_env() -> dict:
    """This process's environment with the repository (and its `src`) on `PYTHONPATH`,
    for a child that imports `benchmarks` and `jaxpace`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), str(REPO / "src"), *filter(None, [env.get("PYTHONPATH")])]
    )
    return env


def run_child(args: list[str], out: str, timeout_s: float = 900) -> dict:
    """`python -m benchmarks watch ARGS` in a fresh process (no inherited `XLA_FLAGS`: its
    own 8 CPU devices); the JSON it wrote to `out`."""
    env = _child_env()
    env.pop("XLA_FLAGS", None)
    cmd = [sys.executable, "-m", "benchmarks", "watch", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=REPO)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{p.stderr[-3000:]}")
    return json.loads(Path(out).read_text())


def _run_child(workload: str, arm: str, seconds: float, tmp: str, i: int) -> dict:
    out = os.path.join(tmp, f"{workload}-{arm}-{i}.json")
    return run_child(["--child", workload, arm, str(seconds), out], out)


def _run_wrapper_cost() -> dict:
    """`wrapper_cost` in a fresh process (its own JAX on 8 CPU devices' worth of nothing)."""
    env = _child_env()
    cmd = [sys.executable, "-c", "import json; from benchmarks.watch import wrapper_cost; "
           "print(json.dumps(wrapper_cost()))"]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=REPO)
    if p.returncode != 0:
        raise RuntimeError(f"wrapper_cost failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def t95(n: int) -> float:
    """The two-sided 95% t quantile for n - 1 degrees of freedom."""
    from scipy import stats

    return float(stats.t.ppf(0.975, n - 1))


def interval(ratios) -> dict:
    """`{n, mean_pct, ci95_pct}`: the mean of `ratios` as a percent change, with its 95% t
    interval."""
    import numpy as np

    r = np.asarray(ratios, float)
    n = int(r.size)
    mean = float(r.mean())
    half = t95(n) * float(r.std(ddof=1)) / math.sqrt(n) if n > 1 else math.nan
    return {"n": n, "mean_pct": (mean - 1) * 100,
            "ci95_pct": [(mean - half - 1) * 100, (mean + half - 1) * 100]}  # fmt: skip


def paired(plain: list[dict], watched: list[dict], key: str = "step_s") -> dict:
    import numpy as np

    r = [w[key] / p[key] for p, w in zip(plain, watched, strict=True)]
    return {
        **interval(r),
        "ratios": r,
        "plain_step_ms": float(np.median([p["step_s"] for p in plain]) * 1e3),
        "watch_step_ms": float(np.median([w["step_s"] for w in watched]) * 1e3),
    }


def _window_figures(watched: list[dict], plain_step_ms: float) -> dict:
    import numpy as np

    spans = [s for w in watched for s in w["window_span_s"]]
    win = watched[0]["window"]
    per_call = [s / win * 1e3 for s in spans]  # the span also holds the end block's wait
    costs = [c for w in watched for c in w["costs"]]

    def rng(key):
        v = [c[key] * 1e3 for c in costs if isinstance(c.get(key), int | float)]
        return [float(np.min(v)), float(np.median(v)), float(np.max(v))] if v else None

    gaps = [  # (calls from a window's start to the next announced, that time in seconds)
        (b - a, (b - a) * w["step_s"])
        for w in watched
        for a, b in w.get("announced", [])
        if isinstance(b, int)
    ]
    return {
        "windows": len(spans),
        "window_cost_ms": rng("window_cost_s"),
        "gap_calls": [min(g[0] for g in gaps), max(g[0] for g in gaps)] if gaps else None,
        "gap_s": [min(g[1] for g in gaps), max(g[1] for g in gaps)] if gaps else None,
        "analyzed_steps": sorted({a for w in watched for a in w.get("analyzed_steps", [])}),
        "decided": sum(w["windows_decided"] for w in watched),
        "in_window_call_ms": [
            float(np.min(per_call)),
            float(np.median(per_call)),
            float(np.max(per_call)),
        ]
        if per_call
        else None,
        "in_window_extra_ms": (float(np.median(per_call)) - plain_step_ms) if per_call else None,
        **{
            k: rng(k)
            for k in (
                "max_pre_block_s",
                "max_end_block_s",
                "max_start_trace_s",
                "max_stop_trace_s",
                "max_summarize_s",
                "analysis_s",
            )
        },
    }


def _pairs(wl: str, arm: str, pairs: int, seconds: float, tmp: str) -> tuple[list, list]:
    """`pairs` runs unwatched and as many in `arm`, one of each back to back, the order
    alternating; `(unwatched runs, the arm's runs)`."""
    plain, watched = [], []
    for i in range(pairs):
        for a in ("plain", arm) if i % 2 == 0 else (arm, "plain"):
            r = _run_child(wl, a, seconds, tmp, i)
            (plain if a == "plain" else watched).append(r)
        print(
            f"  {wl} pair {i}: plain {plain[-1]['step_s'] * 1e3:.2f} ms, "
            f"{arm} {watched[-1]['step_s'] * 1e3:.2f} ms",
            flush=True,
        )
    return plain, watched


def _machine() -> str:
    import jax

    from benchmarks.__main__ import machine

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", 8)
    return machine()


def run(pairs: int, seconds: float, workloads=WORKLOADS, previous: dict | None = None) -> dict:
    out: dict = {k: v for k, v in (previous or {}).items() if k in WORKLOADS}
    out.update(pairs=pairs, seconds=seconds, date=time.strftime("%Y-%m-%d"))
    with tempfile.TemporaryDirectory() as tmp:
        for wl in workloads:
            plain, watched = _pairs(wl, "watch", pairs, seconds, tmp)
            fig = paired(plain, watched)
            whole = paired(plain, watched, "step_all_s")
            fig["whole_run"] = {k: whole[k] for k in ("mean_pct", "ci95_pct")}
            fig.update(_window_figures(watched, fig["plain_step_ms"]))
            fig["by_distance"] = _pooled_distance(watched)
            fig["plain_call_ms"] = _pooled_distance(plain).get("before any window")
            fig["every"], fig["window"] = watched[0]["every"], watched[0]["window"]
            fig["pairs"], fig["seconds"] = pairs, seconds
            fig["load"] = [round(x, 2) for x in os.getloadavg()]
            out[wl] = fig
    out["machine"] = _machine()
    return out


def run_between(pairs: int, seconds: float, workloads=WORKLOADS) -> dict:
    """`--between`: pairs of unwatched runs and runs under `watch(step, every=NEVER)`: the
    wrapper on every call and watch's thread (heartbeats, the leader's gathers), no window."""
    out: dict = {"pairs": pairs, "seconds": seconds, "date": time.strftime("%Y-%m-%d")}
    with tempfile.TemporaryDirectory() as tmp:
        for wl in workloads:
            plain, watched = _pairs(wl, "between", pairs, seconds, tmp)
            fig = paired(plain, watched)
            fig["windows_decided"] = sum(w.get("windows_decided", 0) for w in watched)
            fig["load"] = [round(x, 2) for x in os.getloadavg()]
            out[wl] = fig
    out["machine"] = _machine()
    return out


def wrapper_cost(blocks: int = 20, calls: int = 2000) -> dict:
    """What `watch` adds to a call between windows, in one process (no run-to-run spread):
    a small jit step called `calls` times unwatched, then as many times under
    `watch(step, every=NEVER)` (never a window: the wrapper on every call, its thread
    idle), blocks alternating; per call, the mean difference of the paired blocks and its
    95% interval. Dispatch only (the step is not blocked on): what the wrapper costs the
    calling thread."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_platforms", "cpu")
    import jaxpace

    f = jax.jit(lambda x: x + 1.0)
    x = jnp.zeros(4)
    w = jaxpace.watch(f, every=NEVER)
    for g in (f, w, f, w):  # (compiled in both forms: `w` runs `f` passed through)
        for _ in range(200):
            x = g(x)
        jax.block_until_ready(x)
    plain, watched = [], []
    for b in range(blocks):
        for arm in ("plain", "watch") if b % 2 == 0 else ("watch", "plain"):
            g = f if arm == "plain" else w
            t = time.perf_counter()
            for _ in range(calls):
                x = g(x)
            jax.block_until_ready(x)
            (plain if arm == "plain" else watched).append((time.perf_counter() - t) / calls)
    w.close()
    d = (np.array(watched) - np.array(plain)) * 1e6
    half = t95(d.size) * float(d.std(ddof=1)) / math.sqrt(d.size)
    return {
        "blocks": blocks,
        "calls": calls,
        "plain_us": float(np.median(plain) * 1e6),
        "watch_us": float(np.median(watched) * 1e6),
        "extra_us": float(d.mean()),
        "ci95_us": [float(d.mean() - half), float(d.mean() + half)],
    }


def outside_cost(rounds: int = 30, calls: int = 250) -> dict:
    """What the wrapper costs where it runs: the demo's step (8 CPU devices, blocked on
    each call) called `calls` times in one held `pass_through(True)` context, then as many
    times under `watch(step, every=NEVER)`, chunks alternating; per call, the time outside
    the step (the call's wall time less the step's own, timed inside it). On this 2-core
    machine the step's device threads and the calling thread share the cores, so the
    wrapper's Python costs more here than in `wrapper_cost`'s tight loop."""
    import jax
    import numpy as np

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", 8)
    import jaxpace
    from jaxpace.collectives.measure import pass_through

    step0, state = _build("demo", "watch")
    inner = [0.0]
    pc = time.perf_counter

    def step(*s):
        t = pc()
        out = step0(*s)
        inner[0] += pc() - t
        return out

    with pass_through(True):
        for _ in range(3):
            state = step(*state)
    w = jaxpace.watch(step, every=NEVER)

    def chunk(arm: str) -> float:
        nonlocal state
        inner[0], t = 0.0, pc()
        if arm == "held":
            with pass_through(True):
                for _ in range(calls):
                    state = step(*state)
        else:
            for _ in range(calls):
                state = w(*state)
        return (pc() - t - inner[0]) / calls

    chunk("held"), chunk("watch")
    got: dict[str, list[float]] = {"held": [], "watch": []}
    for r in range(rounds):
        for arm in ("held", "watch") if r % 2 else ("watch", "held"):
            got[arm].append(chunk(arm))
    w.close()
    d = (np.array(got["watch"]) - np.array(got["held"])) * 1e6
    half = t95(d.size) * float(d.std(ddof=1)) / math.sqrt(d.size)
    return {
        "rounds": rounds,
        "calls": calls,
        "held_us": float(np.mean(got["held"]) * 1e6),
        "watch_us": float(np.mean(got["watch"]) * 1e6),
        "extra_us": float(d.mean()),
        "ci95_us": [float(d.mean() - half), float(d.mean() + half)],
    }


def _run_outside_cost(processes: int = 3) -> list[dict]:
    """`outside_cost` in `processes` fresh processes, one after the other."""
    env = _child_env()
    cmd = [sys.executable, "-c", "import json; from benchmarks.watch import outside_cost; "
           "print(json.dumps(outside_cost()))"]  # fmt: skip
    out = []
    for _ in range(processes):
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=REPO)
        if p.returncode != 0:
            raise RuntimeError(f"outside_cost failed:\n{p.stderr[-3000:]}")
        out.append(json.loads(p.stdout.strip().splitlines()[-1]))
    return out


def markdown_between(res: dict, command: str) -> str:
    lines = [
        BEGIN_BETWEEN,
        f"`{command}`: as above, but the watched arm is `jaxpace.watch(step, "
        f"every={NEVER:.0e})`: no window in the run, so what it measures is watch between "
        "windows alone (the wrapper on every call, watch's thread with its heartbeats and "
        "the deciding process's reads of them). Windows decided in the watched runs: "
        + ", ".join(f"{wl} {res[wl]['windows_decided']}" for wl in WORKLOADS if wl in res)
        + " (0: none ran).",
        "",
        "| step | pairs | unwatched step (median) | watched, no window (median) | watched / "
        "unwatched, mean [95% interval] | load average |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for wl, f, lo, hi, load in _rows(res):
        lines.append(
            f"| {NAMES[wl]} | {f['n']} | {f['plain_step_ms']:.2f} ms | "
            f"{f['watch_step_ms']:.2f} ms | {f['mean_pct']:+.2f}% [{lo:+.2f}, {hi:+.2f}] | "
            f"{load} |"
        )
    wc = res.get("wrapper")
    if wc:
        lo, hi = wc["ci95_us"]
        lines += [
            "",
            f"The wrapper alone, in one process (`wrapper_cost`: a jit `x + 1` dispatched "
            f"{wc['calls']:,} times a block, {wc['blocks']} blocks alternating unwatched and "
            f"under `watch(every={NEVER:.0e})`): {wc['plain_us']:.1f} us a call unwatched, "
            f"{wc['watch_us']:.1f} us watched; the wrapper adds {wc['extra_us']:.2f} us a "
            f"call [{lo:.2f}, {hi:.2f}] (95%), "
            + ", ".join(
                f"{wc['extra_us'] / (res[wl]['plain_step_ms'] * 1e3):.3%} of the {wl} step"
                for wl in WORKLOADS
                if wl in res
            )
            + ".",
        ]
    lines += ["", f"Machine: {res['machine']}. Date: {res['date']}.", END_BETWEEN]
    return "\n".join(lines)


def markdown_outside(runs: list[dict], machine: str) -> str:
    o0 = runs[0]
    return "\n".join([
        BEGIN_OUTSIDE,
        "`python -m benchmarks watch --outside` (`outside_cost`, the wrapper where it runs): "
        f"{len(runs)} fresh processes, each the demo's step (8 CPU devices, blocked on each "
        f"call) in {o0['rounds']} chunks of {o0['calls']} calls in one held "
        "`pass_through(True)` context alternating with as many through "
        f"`watch(step, every={NEVER:.0e})` (no window); per call, the time outside the step "
        "(the call's wall time less the step's own, timed inside it), and what the wrapper "
        "adds, the mean of the paired chunks [95%]:",
        "",
        "| process | held context | watched | the wrapper adds |",
        "|---:|---:|---:|---:|",
        *(
            f"| {i} | {o['held_us']:.0f} us | {o['watch_us']:.0f} us | {o['extra_us']:+.1f} us "
            f"[{o['ci95_us'][0]:+.1f}, {o['ci95_us'][1]:+.1f}] |"
            for i, o in enumerate(runs)
        ),
        "",
        "The step's 8 device threads share the two cores with the calling thread, so even "
        "the held context's calls spend over a hundred microseconds outside the step, and "
        "the wrapper's Python costs more here than in the tight loop above.",
        "",
        f"Machine: {machine}. Date: {time.strftime('%Y-%m-%d')}.",
        END_OUTSIDE,
    ])  # fmt: skip


# ----------------------------------------------------------------- the docs


NAMES = {
    "fsdp": "FSDP example's step (`examples/fsdp.py`, lax, 2 x 4 mesh, batch 8 per replica)",
    "demo": "demo's model (`jaxpace.examples.train` MLP, hidden 256, 32 rows per device, Adam)",
    "demo-dropin": "the same with `jaxpace` `pmean` under watch (measured in windows only) vs "
    "`jax.lax.pmean` unwatched",
}


def _rows(res: dict):
    """`(workload, figures, interval low, high, load average text)` of each workload in
    `res`, in `WORKLOADS` order: what every table row of both sections starts from."""
    for wl in WORKLOADS:
        if wl in res:
            f = res[wl]
            load = " / ".join(f"{x:.1f}" for x in f.get("load", [])) or "n/a"
            yield wl, f, *f["ci95_pct"], load


def _r(v) -> str:
    return "n/a" if not v else f"{v[1]:.1f} ms ({v[0]:.1f}-{v[2]:.1f})"


def _verdict(lo: float, hi: float) -> str:
    """Whether the 95% interval puts the average step within 1% of unwatched."""
    if hi <= 1.0:
        return "met"
    if lo > 1.0:
        return "not met"
    return "undecided at this n"


def markdown(res: dict, command: str) -> str:
    from jaxpace.watch.schedule import BUDGET

    lines = [
        BEGIN,
        "## watch (`python -m benchmarks watch`)",
        "",
        f"`{command}`: one process, 8 CPU devices; each run a fresh process calling the "
        f"step for {WARM_S:g} s untimed (the first window, at call 100, and its decision) "
        f"then {res['seconds']:g} s timed, after 3 warm-up calls, unwatched or under "
        '`jaxpace.watch` at its defaults (`every="auto"`, `window=5`); a pair is one run '
        "of each, back to back, the order alternating. The average step is every timed "
        "call's share of the run's wall time, windows included; the figure is the mean over "
        "pairs of watched / unwatched with its 95% t interval (target: within 1%). Window "
        "figures are median (min-max) over the watched runs' windows.",
        "",
        "| step | pairs | unwatched step (median) | watched step (median) | watched / unwatched, "
        "mean [95% interval] | within 1% | windows | window cost (watch's measure) | "
        "next window after (calls; s) | call inside a window | `stop_trace` (collection) | "
        "edge blocks (before / last call) | summary | decision | load average |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for wl, f, lo, hi, load in _rows(res):
        gc, gs = f.get("gap_calls"), f.get("gap_s")
        gap = f"{gc[0]:,}-{gc[1]:,}; {gs[0]:.0f}-{gs[1]:.0f} s" if gc and gs else "n/a"
        lines.append(
            f"| {NAMES[wl]} | {f['n']} | {f['plain_step_ms']:.2f} ms | {f['watch_step_ms']:.2f} ms"
            f" | {f['mean_pct']:+.2f}% [{lo:+.2f}, {hi:+.2f}] | {_verdict(lo, hi)} | "
            f"{f['windows']} | {_r(f.get('window_cost_ms'))} | {gap} | "
            f"{_r(f['in_window_call_ms'])} | {_r(f['max_stop_trace_s'])} | "
            f"{_r(f['max_pre_block_s'])} / {_r(f['max_end_block_s'])} | "
            f"{_r(f['max_summarize_s'])} | {_r(f['analysis_s'])} | {load} |"
        )
    dist = [wl for wl in WORKLOADS if wl in res and res[wl].get("by_distance")]
    if dist:
        bands = ["in window", *(f"{lo}-{hi}" if hi else f"{lo}+" for lo, hi in BANDS)]
        lines += [
            "",
            "Where the watched runs' time went: the mean call (ms, with the number of calls) "
            "inside windows (the blocking call before each included) and by how many calls "
            "after the last window's end it came, against the unwatched runs' mean call.",
            "",
            "| step | unwatched | "
            + " | ".join(b if b == "in window" else f"{b} after" for b in bands)
            + " |",
            "|---|" + "---:|" * (len(bands) + 1),
        ]
        for wl in dist:
            f = res[wl]
            plain = f.get("plain_call_ms")
            cells = [
                f"{f['by_distance'][b][1]:.2f} ({f['by_distance'][b][0]:,})"
                if b in f["by_distance"]
                else "n/a"
                for b in bands
            ]
            p = f"{plain[1]:.2f} ({plain[0]:,})" if plain else "n/a"
            lines.append(f"| {wl} | {p} | " + " | ".join(cells) + " |")
        for wl in dist:
            share = window_share(res[wl]["by_distance"], res[wl]["window"])
            if share is None:
                continue
            plain = res[wl].get("plain_call_ms")
            far = res[wl]["by_distance"]["2001+"][1]
            lines += [
                "",
                f"{wl}: within the watched runs, the calls in windows and after them cost "
                f"{share['pct']:.2f}% of the runs' time more than calls 2001+ after a window "
                f"would have ({share['per_window_ms']:.0f} ms a window, over "
                f"{share['windows']} windows); calls 2001+ after a window took {far:.2f} ms, "
                + (f"against {plain[1]:.2f} ms in the unwatched runs." if plain else "."),
            ]
    lines += [
        "",
        "Window cost is what watch measured and spaced the next window by: the extra time "
        "on the step's thread (from the return of the blocking call before the window to "
        "the end of the trace's collection, less the window's calls at the step time "
        "outside windows, plus that block) and the background thread's CPU time for the "
        "window (writing and reading the trace; the decision's added on process 0). The "
        f"next window is placed where that cost is {BUDGET:.2%} of the time between window "
        "starts "
        "(at least 10 s after the announcement). A call inside a window is the window's "
        "wall time over its calls; `stop_trace` is the collection on the step's thread "
        "(the conversion to files runs on watch's thread). Summary and decision are wall "
        "times on watch's background thread (nice 5), which shares the cores "
        "with the step. With the first window (call 100, which also pays the profiler's "
        "and the first decision's warm-up) and the untimed start included, the watched / "
        "unwatched ratio was: "
        + "; ".join(
            f"{w} {res[w]['whole_run']['mean_pct']:+.2f}% "
            f"[{res[w]['whole_run']['ci95_pct'][0]:+.2f}, {res[w]['whole_run']['ci95_pct'][1]:+.2f}]"
            for w in WORKLOADS
            if w in res and "whole_run" in res[w]
        )
        + ".",
        "",
        f"Machine: {res['machine']} (2 cores shared with other jobs; load average 1 / 5 / "
        f"15 min at the end of each row's runs in the table). Date: {res['date']}.",
        END,
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--child"]:
        child(argv[1], argv[2], float(argv[3]), argv[4])
        return 0
    if argv[:1] == ["--interleaved-child"]:
        from benchmarks import watch_interleaved

        watch_interleaved.child(argv[1], int(argv[2]), argv[3], int(argv[4]))
        return 0
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks watch", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--quick", action="store_true", help="4 pairs of 40 s timed runs per step")
    ap.add_argument(
        "--pairs",
        type=int,
        default=None,
        help="pairs per step (default 8; --interleaved: pairs a process, default 1)",
    )
    ap.add_argument("--seconds", type=float, default=None, help="seconds per run (default 90)")
    ap.add_argument(
        "--workloads",
        nargs="+",
        choices=WORKLOADS,
        default=list(WORKLOADS),
        help="steps to run (the others' figures are kept from OUT/watch.json)",
    )
    ap.add_argument(
        "--between",
        action="store_true",
        help="the watched arm without any window: what watch costs between windows",
    )
    ap.add_argument(
        "--wrapper",
        action="store_true",
        help="only the wrapper's cost per call, added to OUT/watch_between.json's section",
    )
    ap.add_argument(
        "--outside",
        action="store_true",
        help="the wrapper's time outside the demo's step per call, in 3 fresh processes",
    )
    ap.add_argument(
        "--interleaved",
        action="store_true",
        help="both arms in each process, chunks alternating (benchmarks/watch_interleaved.py)",
    )
    ap.add_argument(
        "--processes", type=int, default=None, help="--interleaved: processes a step (default 6)"
    )
    ap.add_argument(
        "--more",
        action="store_true",
        help="--interleaved: add the processes to the step's processes in the results so far "
        "(the same code again); the interval over all of them",
    )
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--markdown", default=str(REPO / "docs" / "benchmarks.md"))
    args = ap.parse_args(argv)
    if args.interleaved:
        from benchmarks import watch_interleaved

        return watch_interleaved.main(args)
    if args.outside:
        from benchmarks.fsdp import publish

        runs = _run_outside_cost()
        publish(runs, markdown_outside(runs, _machine()), args.out, "watch_outside",
                args.markdown, BEGIN_OUTSIDE, END_OUTSIDE)  # fmt: skip
        return 0
    prev_path = Path(args.out) / "watch.json"
    previous = json.loads(prev_path.read_text()) if prev_path.exists() else None
    pairs = args.pairs or (4 if args.quick else 8)
    seconds = args.seconds or (40.0 if args.quick else 75.0)
    if pairs < 2 or seconds < 5:
        ap.error("--pairs must be >= 2 (an interval) and --seconds >= 5")
    from benchmarks.fsdp import publish

    if args.between or args.wrapper:
        if args.wrapper:  # (the pairs from the last `--between` run)
            res = json.loads((Path(args.out) / "watch_between.json").read_text())
            pairs, seconds = res["pairs"], res["seconds"]
        else:
            res = run_between(pairs, seconds, args.workloads)
        res["wrapper"] = _run_wrapper_cost()
        cmd = f"python -m benchmarks watch --between --pairs {pairs} --seconds {seconds:g}"
        if list(args.workloads) != list(WORKLOADS):
            cmd += " --workloads " + " ".join(args.workloads)
        if args.wrapper:
            cmd += "`, then `python -m benchmarks watch --wrapper"
        text = markdown_between(res, cmd)
        publish(res, text, args.out, "watch_between", args.markdown, BEGIN_BETWEEN, END_BETWEEN)
        return 0
    res = run(pairs, seconds, args.workloads, previous)

    cmd = "python -m benchmarks watch" + (" --quick" if args.quick else "")
    if args.pairs or args.seconds:
        cmd += f" --pairs {pairs} --seconds {seconds:g}"
    if list(args.workloads) != list(WORKLOADS):
        cmd += " --workloads " + " ".join(args.workloads) + " (the other rows: an earlier run)"
    publish(res, markdown(res, cmd), args.out, "watch", args.markdown, BEGIN, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
