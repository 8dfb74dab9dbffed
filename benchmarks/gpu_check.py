"""The checks `benchmarks/gpu.sh` runs on a GPU host, each with a verdict (PASS, FAIL, or NOTE
for what this host cannot check), and an exit status that is non-zero on any FAIL.

Parts (one process each, so that XLA flags differ):
  main       measure-only (with a profiler trace), fixed delay, adaptive, one run without
             blocking per step; bitwise equality against `jax.lax` for each
  sync       measure-only with a trace under `--xla_gpu_disable_async_collectives=allreduce`
             (gpu.sh sets XLA_FLAGS): the waits must match the NCCL kernels' times
  multiproc  one process per GPU (a child per device, `jax.distributed` on localhost): bitwise
             equality across processes, and the late process waits least
  dry-run    no JAX device work: every verdict on synthetic inputs that must pass and inputs
             that must fail, and the trace reader on a synthetic trace (the CPU test runs it)

The waits are checked against the NCCL kernel times of a `jax.profiler` trace of the same
steps: per device, the mean wait per step against the NCCL kernel time per step. A wait is
measured from an event before the collective to one after it on XLA's compute stream, so it
can never be shorter than the kernel (a 5 us allowance: events and float milliseconds). With
synchronous collectives it may exceed the kernel only by the probes' own copies and events:
at most 100 us + 25 % of the kernel time. With async collectives (XLA's default) the excess is
reported: whatever XLA scheduled on the compute stream between the start and the done.

The trace is read as documented for Chrome trace JSON (`process_name` metadata naming
`/device:GPU:<ordinal>`, complete events whose name contains "nccl"); not yet run on a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile

BRACKET_SLACK_S = 5e-6  # a wait below the kernel time by more than this: the bracket leaks
SYNC_ABS_S = 100e-6  # synchronous collectives: the probes' own copies and events ...
SYNC_REL = 0.25  # ... may add at most SYNC_ABS_S + SYNC_REL * kernel time
FIXED_DELAY_S = 0.002
LATE_FRACTION = 0.8  # of steps in which the late device must wait least


@dataclasses.dataclass
class Check:
    name: str
    ok: bool | None  # None: cannot be checked on this host (a NOTE, not a failure)
    detail: str


def informational(c: Check, why: str) -> Check:
    """The check's result as a NOTE: it depends on timings that this platform does not have."""
    return Check(c.name, None, f"{why}; gave {'PASS' if c.ok else 'FAIL'}: {c.detail}")


def report(checks: list[Check]) -> int:
    """Prints one line per check; returns 1 when any failed, else 0."""
    for c in checks:
        tag = "NOTE" if c.ok is None else ("PASS" if c.ok else "FAIL")
        print(f"  {tag:4}  {c.name}: {c.detail}", flush=True)
    return 1 if any(c.ok is False for c in checks) else 0


# ---------------------------------------------------------------------- verdicts (pure)


def bitwise(name: str, got: list[bytes], want: list[bytes]) -> Check:
    same = len(got) == len(want) > 0 and all(a == b for a, b in zip(got, want, strict=True))
    return Check(f"bitwise == jax.lax ({name})", same, f"{len(got)} outputs compared as bytes")


def waits_vs_kernels(waits_s: dict, kernels_s: dict, steps: int, *, sync: bool) -> Check:
    """Per device: mean wait per step against NCCL kernel time per step (`kernels_s`: every
    NCCL kernel's duration in the traced steps, per device)."""
    name = "waits vs NCCL kernels (" + ("sync collectives" if sync else "async collectives") + ")"
    if not kernels_s:
        return Check(name, False, "no NCCL kernel found in the profiler trace")
    bad, rows = [], []
    for dev, ws in sorted(waits_s.items()):
        if dev not in kernels_s or not ws:
            bad.append(f"device {dev}: no kernels or no waits")
            continue
        w, k = statistics.fmean(ws), sum(kernels_s[dev]) / steps
        hi = k + SYNC_ABS_S + SYNC_REL * k
        rows.append(f"dev {dev} wait {w * 1e6:.0f} us, kernel {k * 1e6:.0f} us")
        if w < k - BRACKET_SLACK_S or (sync and w > hi):
            bad.append(rows[-1])
    bound = "[kernel - 5 us, kernel + 100 us + 25%]" if sync else "[kernel - 5 us, any]"
    return Check(name, not bad, f"within {bound}: " + "; ".join(bad or rows))


def delay_applied(delays_s: list[float], want_s: float) -> Check:
    """Fixed delay: most steps after the first slept it in full, none beyond the bound + 20 ms."""
    if not delays_s:
        return Check("fixed delay slept", False, "no records")
    full = sum(d >= 0.95 * want_s for d in delays_s) / len(delays_s)
    over = max(delays_s) > want_s + 0.02
    ok = full >= 0.8 and not over
    return Check(
        "fixed delay slept",
        ok,
        f"{full:.0%} of steps slept >= 95% of {want_s * 1e3:g} ms (need 80%), "
        f"max {max(delays_s) * 1e3:.2f} ms",
    )


def delays_overlap(step_paced: list[float], step_lax: list[float], delay_s: float) -> Check:
    """Each device sleeps its delay on its own stream, at the same time as the others: a step
    grows by about one delay, not one per device. CUDA may run host functions of independent
    streams one after another; this catches it."""
    grew = statistics.median(step_paced) - statistics.median(step_lax)
    ok = grew <= 1.5 * delay_s + 1e-3
    return Check(
        "delays of the devices overlap",
        ok,
        f"median step +{grew * 1e3:.2f} ms with a {delay_s * 1e3:g} ms delay per device "
        f"(at most {(1.5 * delay_s + 1e-3) * 1e3:g} ms)",
    )


def nothing_lost(recorded: int, dropped: int, expected: int, cuda_errors: int) -> Check:
    ok = recorded + dropped == expected and cuda_errors == 0
    return Check(
        "no step lost without a count (no blocking per step)",
        ok,
        f"{recorded} recorded + {dropped} dropped of {expected}; {cuda_errors} CUDA errors",
    )


def late_waits_least(by_step: dict, late: int, name: str) -> Check:
    """`by_step`: {step: {rank: wait}}; the late rank should have the least wait."""
    full = [d for d in by_step.values() if len(d) >= 2]
    hits = sum(min(d, key=d.get) == late for d in full)
    ok = bool(full) and hits >= LATE_FRACTION * len(full)
    return Check(name, ok, f"{hits}/{len(full)} steps (need {LATE_FRACTION:.0%})")


def adaptive_paces_early(delay_by_rank: dict, late: int, max_delay_s: float) -> Check:
    """Adaptive with one late rank: others paced, the late one least, nothing above the bound."""
    total = {r: sum(v) for r, v in delay_by_rank.items()}
    others = [t for r, t in total.items() if r != late]
    top = max((max(v) for v in delay_by_rank.values() if v), default=0.0)
    ok = bool(others) and max(others) > 0 and total.get(late, 0.0) <= min(others)
    ok = ok and top <= max_delay_s + 0.02
    return Check(
        "adaptive paces the early devices, not the late one",
        ok,
        f"slept per rank (ms): { ({r: round(t * 1e3, 2) for r, t in sorted(total.items())}) }",
    )


def no_delay(delays_s: list[float]) -> Check:
    ok = bool(delays_s) and max(delays_s) == 0
    return Check("adaptive, balanced (negative control): no delay", ok, f"{len(delays_s)} steps")


def nccl_kernel_times(trace_dir: str) -> dict[int, list[float]]:
    """Durations (s) of every NCCL kernel per GPU ordinal in a jax.profiler trace directory."""
    out: dict[int, list[float]] = {}
    for root, _, files in os.walk(trace_dir):
        for f in files:
            if not f.endswith(".trace.json.gz"):
                continue
            with gzip.open(os.path.join(root, f), "rt") as fh:
                events = json.load(fh).get("traceEvents", [])
            dev_of = {}
            for e in events:
                if e.get("ph") == "M" and e.get("name") == "process_name":
                    m = re.search(r"/device:GPU:(\d+)", str(e.get("args", {}).get("name", "")))
                    if m:
                        dev_of[e.get("pid")] = int(m.group(1))
            for e in events:
                if e.get("ph") == "X" and e.get("pid") in dev_of:
                    if "nccl" in str(e.get("name", "")).lower():
                        out.setdefault(dev_of[e["pid"]], []).append(float(e["dur"]) * 1e-6)
    return out


# ---------------------------------------------------------------------- GPU (or CPU) parts


def _setup(platform: str, size: int):
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    devs = jax.devices(platform)
    n = len(devs)
    mesh = jax.make_mesh((n,), ("d",), devices=devs)

    def smap(f):
        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("d"), out_specs=P()))

    x = jax.device_put(
        jnp.sin(jnp.arange(n * size, dtype=jnp.float32)).reshape(n, size),
        NamedSharding(mesh, P("d")),
    )
    return jax, devs, mesh, smap, x


def _run(fn, x, steps: int, *, block: bool = True) -> list[bytes]:
    import numpy as np

    outs = []
    for _ in range(steps):
        y = fn(x)
        if block:
            y.block_until_ready()
        outs.append(y)
    return [np.asarray(y).tobytes() for y in outs]


def _site_records(pacer, site: str) -> list[dict]:
    return [r for r in pacer.records() if r.get("site") == site and "wait_ns" in r]


def _counters(pacer, site: str) -> dict:
    """The native probe's counters of `site`; zeros on the io_callback path (no ring)."""
    from jaxpace.native import probes as _native

    native = pacer.sites[site].native
    if not native:
        return {"dropped": 0, "cuda_errors": 0}
    return _native.counters(native[0])


def _traced_waits(args, jax, devs, mesh, smap, x, *, sync: bool) -> list[Check]:
    """Measure-only steps under the profiler: the waits against the NCCL kernels."""
    from jax import lax

    import jaxpace as jp

    pacer = jp.Pacer(mesh=mesh, granularity="device")
    f = smap(lambda v: pacer.psum(v * 1.5, "d", site="trace"))
    g = smap(lambda v: lax.psum(v * 1.5, "d"))
    warm = _run(f, x, 3)
    with tempfile.TemporaryDirectory() as td:
        jax.profiler.start_trace(td)
        got = _run(f, x, args.steps)
        jax.profiler.stop_trace()
        kernels = nccl_kernel_times(td)
    checks = [bitwise("measure-only", warm + got, _run(g, x, 3 + args.steps))]
    recs = [r for r in _site_records(pacer, "trace") if r["step"] >= 3]
    stats = pacer.stats()["trace"]
    gpu = devs[0].platform == "gpu"
    want = "CUDA events" if gpu else "native"
    # "native XLA FFI probes ..." (CPU) or "..., CUDA events on XLA's stream ..." (GPU); the
    # fallback's text ("io_callback probes: native library not built") must not pass.
    native = stats.probe.startswith("native") and want in stats.probe
    checks.append(Check(f"probe path ({want})", native, stats.probe))
    if len(devs) < 2 or not gpu:
        checks.append(Check("waits vs NCCL kernels", None, "needs 2+ GPUs (no NCCL otherwise)"))
        return checks
    waits: dict[int, list[float]] = {}
    for r in recs:
        waits.setdefault(mesh.devices.flat[r["rank"]].local_hardware_id, []).append(
            r["wait_ns"] * 1e-9
        )
    checks.append(waits_vs_kernels(waits, kernels, args.steps, sync=sync))
    return checks


def _fixed(args, jax, devs, mesh, smap, x) -> list[Check]:
    from jax import lax

    import jaxpace as jp

    pacer = jp.Pacer(jp.fixed(FIXED_DELAY_S), mesh=mesh, granularity="device")
    f = smap(lambda v: pacer.psum(v * 1.5, "d", site="fixed"))
    g = smap(lambda v: lax.psum(v * 1.5, "d"))
    got = _run(f, x, args.steps)
    delays = [r["delay_ns"] * 1e-9 for r in _site_records(pacer, "fixed") if r["step"] >= 2]
    want = _run(g, x, args.steps)
    step_f, step_g = _step_times(f, x, args.steps), _step_times(g, x, args.steps)
    pacer.close()
    found = [delay_applied(delays, FIXED_DELAY_S), delays_overlap(step_f, step_g, FIXED_DELAY_S)]
    if devs[0].platform != "gpu":  # the delay lands a step later when the drain lags (host load)
        found = [informational(c, "not a GPU") for c in found]
    elif len(devs) < 2:
        found[1] = informational(found[1], "one device: nothing to serialize")
    return [bitwise("fixed delay", got, want), *found]


def _step_times(fn, x, steps: int) -> list[float]:
    import time

    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn(x).block_until_ready()
        out.append(time.perf_counter() - t0)
    return out


def _adaptive(args, jax, devs, mesh, smap, x) -> list[Check]:
    from jax import lax

    import jaxpace as jp

    n = len(devs)
    pol = jp.adaptive(threshold_s=2e-4, max_delay_s=0.005, warmup_steps=3, engage_steps=2)
    pacer = jp.Pacer(pol, mesh=mesh, granularity="device")

    def body(v, measured):
        late = lax.axis_index("d") == n - 1  # the last device computes more before the psum
        v = lax.cond(
            late,
            lambda u: lax.fori_loop(0, args.lag_iters, lambda i, a: jax.numpy.tanh(a) * 1.0001, u),
            lambda u: u,
            v,
        )  # noqa: E501
        return pacer.psum(v, "d", site="adaptive") if measured else lax.psum(v, "d")

    got = _run(smap(lambda v: body(v, True)), x, args.steps * 2)
    want = _run(smap(lambda v: body(v, False)), x, args.steps * 2)
    recs = _site_records(pacer, "adaptive")
    pacer.close()
    checks = [bitwise("adaptive", got, want)]
    delays: dict[int, list[float]] = {}
    by_step: dict[int, dict[int, int]] = {}
    for r in recs:
        delays.setdefault(r["rank"], []).append(r["delay_ns"] * 1e-9)
        by_step.setdefault(r["step"], {})[r["rank"]] = r["wait_ns"]
    if n < 2:
        return [*checks, no_delay([d for v in delays.values() for d in v])]
    paced = {r["step"] for r in recs if r["delay_ns"] > 0}
    unpaced = {s: d for s, d in by_step.items() if s >= 1 and s not in paced}
    found = [
        late_waits_least(unpaced, n - 1, "late device waits least (unpaced steps)"),
        adaptive_paces_early(delays, n - 1, 0.005),
    ]
    if devs[0].platform != "gpu":  # CPU devices share the host's cores: no stable skew
        found = [informational(c, "not a GPU") for c in found]
    return checks + found


def _unblocked(args, jax, devs, mesh, smap, x) -> list[Check]:
    from jax import lax

    import jaxpace as jp

    pacer = jp.Pacer(mesh=mesh, granularity="device")
    f = smap(lambda v: pacer.psum(v * 1.5, "d", site="unblocked"))
    g = smap(lambda v: lax.psum(v * 1.5, "d"))
    steps = args.steps * 10
    # CPU devices: XLA's CPU all-reduce needs every device's thread at once, which many queued
    # executions on a loaded host can starve (a rendezvous abort was seen here): block there.
    block = devs[0].platform != "gpu"
    got = _run(f, x, steps, block=block)
    pacer.stats()  # waits for every dispatched step
    c = _counters(pacer, "unblocked")
    recorded = len(_site_records(pacer, "unblocked"))
    return [
        bitwise(
            "no blocking per step" + (" (blocked: CPU)" if block else ""),
            got,
            _run(g, x, steps, block=block),
        ),  # fmt: skip
        nothing_lost(recorded, c["dropped"], steps * len(devs), c["cuda_errors"]),
    ]


def _overhead(args, jax, devs, mesh, smap, x) -> list[Check]:
    """Measure-only vs jax.lax, interleaved medians (information, no verdict)."""
    import time

    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jaxpace as jp

    out = []
    for size in (1024, args.size):
        pacer = jp.Pacer(mesh=mesh, granularity="device")
        xs = jax.device_put(
            jnp.full((len(devs), size), 0.5, jnp.float32), NamedSharding(mesh, P("d"))
        )
        fm = smap(lambda v, p=pacer, k=size: p.pmean(v * 1.0001, "d", site=f"o{k}"))
        fl = smap(lambda v: lax.pmean(v * 1.0001, "d"))
        ts: dict[str, list[float]] = {"m": [], "l": []}
        for fn in (fm, fl):
            _run(fn, xs, 3)
        for _ in range(args.steps * 5):
            for k, fn in (("m", fm), ("l", fl)):
                t0 = time.perf_counter()
                fn(xs).block_until_ready()
                ts[k].append(time.perf_counter() - t0)
        lax_s = float(np.median(ts["l"]))
        ratio = float(np.median(ts["m"])) / lax_s
        out.append(Check(f"overhead at {size} el/device", None,
                         f"measure-only / lax {ratio:.3f}x (lax {lax_s * 1e6:.0f} us)"))  # fmt: skip
    return out


def part_main(args) -> list[Check]:
    """Every main check; each run's lines are printed as soon as it ends (see `main`)."""
    jax, devs, mesh, smap, x = _setup(args.platform, args.size)
    print(f"jaxpace GPU checks: {len(devs)} x {devs[0].device_kind}, jax {jax.__version__}")
    checks = []
    if len(devs) < 2:
        checks.append(Check("1 device", None, "a psum over one device runs no NCCL: waits vs "
                            "NCCL, the late device and one process per GPU are not checked"))  # fmt: skip
    for part in (_traced_waits, _fixed, _adaptive, _unblocked, _overhead):
        kw = {"sync": args.sync} if part is _traced_waits else {}
        found = part(args, jax, devs, mesh, smap, x, **kw)
        report(found)
        checks += found
    return checks


def part_sync(args) -> list[Check]:
    jax, devs, mesh, smap, x = _setup(args.platform, args.size)
    if "--xla_gpu_disable_async_collectives" not in os.environ.get("XLA_FLAGS", ""):
        return [Check("sync part", False, "XLA_FLAGS lacks --xla_gpu_disable_async_collectives")]
    return _traced_waits(args, jax, devs, mesh, smap, x, sync=True)


def part_multiproc(args) -> list[Check]:
    """One child process per GPU; each checks bitwise equality and writes its waits."""
    import socket

    n = args.processes
    if n < 2:
        return [Check("one process per GPU", None, "needs 2+ GPUs")]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as td:
        procs = []
        for i in range(n):
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(i))
            cmd = [sys.executable, os.path.abspath(__file__), "child", "--steps", str(args.steps),
                   "--size", str(args.size), "--coordinator", f"127.0.0.1:{port}",
                   "--processes", str(n), "--process-id", str(i), "--out", td]  # fmt: skip
            procs.append(subprocess.Popen(cmd, env=env))
        rcs = []
        for p in procs:
            try:
                rcs.append(p.wait(timeout=args.child_timeout_s))
            except subprocess.TimeoutExpired:
                p.kill()
                rcs.append("timeout")
        outs = []
        for i in range(n):
            path = os.path.join(td, f"p{i}.json")
            outs.append(json.load(open(path)) if os.path.exists(path) else None)
    if any(o is None for o in outs) or any(rc != 0 for rc in rcs):
        return [Check("one process per GPU", False, f"child exits {rcs}")]
    by_step: dict[int, dict[int, int]] = {}
    for o in outs:
        for step, wait in o["waits"]:
            if step >= 3:
                by_step.setdefault(step, {})[o["process"]] = wait
    return [
        Check(
            "one process per GPU: bitwise == jax.lax",
            all(o["bitwise"] for o in outs),
            f"{n} processes",
        ),  # fmt: skip
        late_waits_least(by_step, n - 1, "one process per GPU: late process waits least"),
    ]


def part_child(args) -> None:
    import time

    import jax
    import numpy as np
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jaxpace as jp

    jax.distributed.initialize(args.coordinator, args.processes, args.process_id,
                               initialization_timeout=60)  # fmt: skip
    n = jax.device_count()
    mesh = jax.make_mesh((n,), ("d",))
    glob = np.sin(np.arange(n * args.size, dtype=np.float32)).reshape(n, args.size)
    x = jax.make_array_from_callback(glob.shape, NamedSharding(mesh, P("d")), lambda i: glob[i])
    pacer = jp.Pacer(mesh=mesh)  # one measuring shard per process: rank = process index

    def smap(f):
        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("d"), out_specs=P()))

    f = smap(lambda v: pacer.psum(v * 1.5, "d", site="mp"))
    g = smap(lambda v: lax.psum(v * 1.5, "d"))
    late = args.process_id == args.processes - 1
    got, want = [], []
    for _ in range(args.steps):
        if late:
            time.sleep(0.02)  # this process reaches every collective 20 ms after the others
        got.append(np.asarray(f(x)).tobytes())
        want.append(np.asarray(g(x)).tobytes())
    recs = [r for r in pacer.records() if r.get("site") == "mp" and "wait_ns" in r]
    out = {"process": args.process_id, "bitwise": got == want,
           "waits": [(r["step"], r["wait_ns"]) for r in recs]}  # fmt: skip
    with open(os.path.join(args.out, f"p{args.process_id}.json"), "w") as fh:
        json.dump(out, fh)
    jax.distributed.shutdown()


def dry_run() -> list[Check]:
    """Every verdict on inputs that must pass and inputs that must fail (no device work)."""
    cases = [
        (bitwise("x", [b"a", b"b"], [b"a", b"b"]), True),
        (bitwise("x", [b"a", b"b"], [b"a", b"c"]), False),
        (bitwise("x", [], []), False),
        (waits_vs_kernels({0: [1e-4] * 4}, {0: [9e-5] * 4}, 4, sync=True), True),
        (waits_vs_kernels({0: [1e-4] * 4}, {0: [2e-4] * 4}, 4, sync=True), False),  # below
        (waits_vs_kernels({0: [1e-3] * 4}, {0: [1e-4] * 4}, 4, sync=True), False),  # far above
        (waits_vs_kernels({0: [1e-3] * 4}, {0: [1e-4] * 4}, 4, sync=False), True),  # async
        (waits_vs_kernels({0: [1e-4]}, {}, 1, sync=False), False),  # no kernels found
        (delay_applied([0.002] * 9 + [0.0], 0.002), True),
        (delay_applied([0.0] * 5 + [0.002] * 5, 0.002), False),
        (delay_applied([0.002] * 9 + [0.05], 0.002), False),
        (delays_overlap([0.0045] * 5, [0.002] * 5, 0.002), True),
        (delays_overlap([0.018] * 5, [0.002] * 5, 0.002), False),  # 8 devices, one by one
        (nothing_lost(190, 10, 200, 0), True),
        (nothing_lost(190, 0, 200, 0), False),
        (nothing_lost(200, 0, 200, 1), False),
        (late_waits_least({s: {0: 5, 1: 1} for s in range(10)}, 1, "x"), True),
        (late_waits_least({s: {0: 1, 1: 5} for s in range(10)}, 1, "x"), False),
        (adaptive_paces_early({0: [0.001, 0.002], 1: [0.0, 0.0]}, 1, 0.005), True),
        (adaptive_paces_early({0: [0.0, 0.0], 1: [0.0, 0.0]}, 1, 0.005), False),
        (adaptive_paces_early({0: [0.0, 0.0], 1: [0.001, 0.0]}, 1, 0.005), False),
        (no_delay([0.0, 0.0]), True),
        (no_delay([0.0, 0.001]), False),
    ]
    out = []
    for i, (c, want) in enumerate(cases):
        out.append(Check(f"verdict case {i} ({c.name})", c.ok is want, f"gave {c.ok}, want {want}"))
    with tempfile.TemporaryDirectory() as td:
        path = os.path.join(td, "plugins", "profile", "run", "host.trace.json.gz")
        os.makedirs(os.path.dirname(path))
        events = [
            {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "/device:GPU:1"}},
            {"ph": "M", "name": "process_name", "pid": 3, "args": {"name": "/host:CPU"}},
            {"ph": "X", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 7, "dur": 50},
            {"ph": "X", "name": "fusion.1", "pid": 7, "dur": 9},
            {"ph": "X", "name": "ncclKernel on host", "pid": 3, "dur": 8},
        ]
        with gzip.open(path, "wt") as fh:
            json.dump({"traceEvents": events}, fh)
        got = nccl_kernel_times(td)
    ok = list(got) == [1] and math.isclose(got[1][0], 50e-6)
    return [*out, Check("trace reader finds NCCL kernels per GPU", ok, str(got))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=["main", "sync", "multiproc", "child", "dry-run"])
    ap.add_argument("--platform", default="gpu", help="gpu, or cpu to run the parts' code here")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--size", type=int, default=1 << 20, help="float32 elements per device")
    ap.add_argument("--lag-iters", type=int, default=400, help="extra work of the late device")
    ap.add_argument("--sync", action="store_true", help="collectives are synchronous (XLA_FLAGS)")
    ap.add_argument("--processes", type=int, default=0)
    ap.add_argument("--process-id", type=int, default=0)
    ap.add_argument("--coordinator", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--child-timeout-s", type=float, default=240.0)
    args = ap.parse_args(argv)
    if args.part == "child":
        part_child(args)
        return 0
    parts = {"main": part_main, "sync": part_sync, "multiproc": part_multiproc}
    if args.part == "main":  # prints its lines as it goes
        return 1 if any(c.ok is False for c in part_main(args)) else 0
    checks = dry_run() if args.part == "dry-run" else parts[args.part](args)
    return report(checks)


if __name__ == "__main__":
    sys.exit(main())
