"""On a GPU host: a watched jit step; what watch's trace reader takes as each device's time
inside the collective (the NCCL kernels on GPU) against the native probes' waits.

    python benchmarks/gpu_watch_check.py [--platform cuda] [--windows 3] [--lag-iters 400]

One process, every local device: a `shard_map` data-parallel step whose gradient all-reduce is
a `jaxpace.Pacer(granularity="device").pmean` (native probes), device 0 doing extra work
before it (so it arrives last and waits least). Under `jaxpace.watch(every=10, window=5,
out=DIR)` the pmean is measured inside windows only, and the same windows are profiled: watch's
trace reader (kept as records in `DIR/windows`) and the probes (`Pacer.records()`) then time the
same executions. Verdicts (PASS/FAIL; NOTE on CPU, where there is no NCCL kernel):
- both sources hold every device, the probes only the windows' executions;
- both name device 0 as the one that waits least (in the median over the window executions);
- per device, the median wait of the trace reader is within `--tol-ms` + `--tol-frac` of the
  probes' (the kernel time includes the transfer, the probe's wait does not: a bounded gap).
Exit code 0 when every verdict passes (or is a NOTE), 1 otherwise. Unverified until run on a
GPU: the docs say so.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

_LAX = False


def _median_by_device(rows) -> dict[int, float]:
    import numpy as np

    by: dict[int, list[float]] = {}
    for dev, wait_ns in rows:
        by.setdefault(int(dev), []).append(wait_ns / 1e6)
    return {d: float(np.median(v)) for d, v in sorted(by.items())}


def run(platform: str, windows: int, lag_iters: int, every: int = 10, window: int = 5) -> dict:
    import jax

    if platform == "cpu":
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", 8)
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jaxpace
    from jaxpace.records.reader import load_records

    n = jax.device_count()
    mesh = jax.make_mesh((n,), ("d",))
    pc = jaxpace.Pacer(granularity="device")

    def local(w, x):
        def heavy(v):
            return lax.fori_loop(0, lag_iters, lambda i, a: jnp.tanh(a @ w) * 0.5 + v, v)

        x = lax.cond(lax.axis_index("d") == 0, heavy, lambda v: v, x)
        wv = lax.pcast(w, "d", to="varying")
        g = jax.grad(lambda w_: jnp.sum(jnp.tanh(x @ w_)))(wv)
        if _LAX:
            return w - 1e-3 * lax.pmean(g, "d")
        return w - 1e-3 * pc.pmean(g, "d", site="grads")

    step = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P("d")), out_specs=P()))
    w = jax.device_put(jnp.full((256, 256), 0.01, jnp.float32), NamedSharding(mesh, P()))
    x = jax.device_put(jnp.ones((8 * n, 256), jnp.float32), NamedSharding(mesh, P("d")))
    with tempfile.TemporaryDirectory() as tmp:
        watched = jaxpace.watch(step, every=every, window=window, out=tmp)
        for _ in range(every * (windows + 1)):
            w = watched(w, x)
            w.block_until_ready()
        watched.close()
        trace_rows, trace_steps = [], []
        if (Path(tmp) / "windows").is_dir():  # absent when no window could be read
            c = load_records(Path(tmp) / "windows").columns
            trace_rows = list(zip(c["device"].tolist(), c["wait_ns"].tolist(), strict=True))
            trace_steps = sorted(set(c["step"].tolist()))
    probe_recs = [r for r in pc.records() if "wait_ns" in r and r.get("site") == "grads"]
    ids = [d.id for d in mesh.devices.flat]  # a device-granularity rank is its mesh position
    probe_rows = [(ids[r["rank"]], r["wait_ns"]) for r in probe_recs]
    probe_steps = sorted({r["step"] for r in probe_recs})
    pc.close()
    return {
        "devices": n,
        "late_device": ids[0],
        "device_ids": ids,
        "trace": _median_by_device(trace_rows),
        "probes": _median_by_device(probe_rows),
        "trace_steps": len(trace_steps),
        "probe_steps": len(probe_steps),
        "expected_steps": windows * window,
        "history": [h.mode for h in watched.history()],
        "notes": sorted({n for h in watched.history() for n in h.notes}),
    }


def verdicts(res: dict, tol_ms: float, tol_frac: float, nccl: bool) -> list[tuple[str, str]]:
    """`(PASS|FAIL|NOTE, text)` for each check; the trace reader's and the timing checks are
    NOTEs off GPU (no NCCL kernel)."""
    soft = "FAIL" if nccl else "NOTE"
    tr, pr, ids = res["trace"], res["probes"], sorted(res["device_ids"])
    out = [
        (
            "PASS" if sorted(pr) == ids else "FAIL",
            f"every device in the probes' records {sorted(pr)}",
        )
    ]
    why = "" if sorted(tr) == ids else f" (watch's notes: {'; '.join(res['notes'])[:600]})"
    out.append(
        (
            "PASS" if not why else soft,
            f"every device in the trace reader's windows {sorted(tr)}{why}",
        )
    )
    ok = res["probe_steps"] == res["expected_steps"]
    out.append(
        (
            "PASS" if ok else "FAIL",
            f"probes only in windows: {res['probe_steps']} measured executions for "
            f"{res['expected_steps']} window calls (trace reader: {res['trace_steps']})",
        )
    )
    timing = "PASS" if nccl else "NOTE"
    common = sorted(set(tr) & set(pr))
    if common:
        late = res["late_device"]
        least_t = min(common, key=tr.get)
        least_p = min(common, key=pr.get)
        ok = least_t == late and least_p == late
        out.append(
            (
                timing if ok else soft,
                f"device {late} (late) waits least: trace reader {least_t}, probes {least_p}",
            )
        )
        worst = max(abs(tr[d] - pr[d]) - (tol_ms + tol_frac * pr[d]) for d in common)
        out.append(
            (
                timing if worst <= 0 else soft,
                "trace-reader wait within tolerance of the probes' per device (median ms): "
                + ", ".join(f"{d}: {tr[d]:.3f} vs {pr[d]:.3f}" for d in common),
            )
        )
    return out  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--platform", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--lag-iters", type=int, default=400)
    ap.add_argument("--tol-ms", type=float, default=0.2)
    ap.add_argument("--tol-frac", type=float, default=0.25)
    args = ap.parse_args(argv)
    res = run(args.platform, args.windows, args.lag_iters)
    print(f"{res['devices']} devices; windows decided: {res['history']}")
    failed = False
    for kind, text in verdicts(res, args.tol_ms, args.tol_frac, nccl=args.platform == "cuda"):
        print(f"{kind}  {text}")
        failed |= kind == "FAIL"
    if args.platform == "cpu":
        print("NOTE  CPU devices: no NCCL kernel; the timing verdicts are information only")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
