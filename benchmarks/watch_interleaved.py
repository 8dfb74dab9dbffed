"""`python -m benchmarks watch --interleaved`: watch's average-step cost, both arms in each process.

Why a second design. The pairs of `python -m benchmarks watch` compare fresh processes, and
runs of the same code differ by about 6% here from process to process, so 6 pairs leave a
95% interval about 3.5% wide: too wide to decide a 1% target. Inside one process, blocks
of the same calls differ far less (the demo's step timed before and after a profiler
session: 0.98-1.00 in six processes, with or without the session).

So each process runs both arms, in chunks that alternate: at least `CHUNK` calls of the
step under `jaxpace.watch` at its defaults, then `CHUNK` calls of the same step unwatched,
then the other way round, and so on. A period is the watched calls from `TAIL` calls after
one window's end to `TAIL` calls after the next one's: one window, the blocks at its edges,
its collection, summary and decision (a watched chunk never ends inside a window, nor
before that window's decision is made: `decided_in_block`), and the calls between windows,
each through the wrapper. A period's ratio is the watched calls' mean over the unwatched
calls' mean.

Two things the design must not get wrong, both measured:
- **One compiled step for both arms.** In one process, two compilations of the same program
  (two builds of the demo's step, or the step with and without `measure.pass_through` in
  the jit cache key) ran 2.0-2.7% apart, the later-compiled one slower, in every one of six
  comparisons. So both arms call the same jitted step on the same state, the unwatched arm
  under `pass_through(True)`: the executable watch runs between windows (a drop-in program's
  drop-ins then trace as their `jax.lax` calls).
- **Watch's clock sees only its own calls.** Watch spaces windows by its time per step (from
  one window's end to the next window's blocking call) and times the calls after a window;
  unwatched chunks in between would double both, and the windows would come twice as often
  as in a run without them. Each unwatched chunk's duration is taken out of that clock
  (`hide`).

What the alternation does not charge by itself: watch's thread between windows (its ticks,
heartbeats and reads of them) runs during the unwatched chunks too. Its CPU time during
them (`/proc/self/task/TID/stat`) is added to the watched arm, as if every second of it
were taken from the step: `charged`.

The sample unit of the interval is the process (the mean of its periods' ratios), so
periods that share a process are not counted as independent.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BEGIN = "<!-- begin: watch interleaved, written by `python -m benchmarks watch --interleaved` -->"
END = "<!-- end: watch interleaved -->"
TAIL = 500  # calls after a window's end where a watched block starts and ends
CHUNK = 250  # calls of each arm in turn
WAIT = 5000  # calls after a window's end a chunk waits at most for its decision


def _thread_cpu_s(name: str = "jaxpace-watch") -> float:
    """CPU seconds (user + system) of the live threads called `name` (Linux `/proc`)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for t in threading.enumerate():
        if t.name != name or t.native_id is None:
            continue
        try:
            stat = Path(f"/proc/self/task/{t.native_id}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime (fields 14, 15)
    return total


def child(workload: str, periods: int, out: str, index: int = 0) -> None:
    """One process: `periods` whole periods of the watched step, in chunks, each chunk
    followed by as many calls of the unwatched step (see the module docstring)."""
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", 8)
    import jaxpace
    from benchmarks.watch import _build
    from jaxpace.collectives.measure import pass_through

    # One step and one state for both arms: two builds of the same step in one process
    # differ by about 2% (module docstring), which would be charged to watch.
    step, state = _build(workload, "watch")  # (demo-dropin: jaxpace's pmean, else lax's)
    with pass_through(True):  # (the form watch runs outside windows, compiled before)
        for _ in range(3):
            state = jax.block_until_ready(step(*state))
    fn = jaxpace.watch(step)
    sched = fn.schedule
    k = 0  # the watched calls so far (the wrapper's own count)

    def plain(n: int) -> float:
        """`n` unwatched calls: the step as watch runs it between windows, without watch
        (a drop-in program passed through: each drop-in traces as its `jax.lax` call)."""
        nonlocal state
        t = time.perf_counter()
        with pass_through(True):
            for _ in range(n):
                state = step(*state)
        jax.block_until_ready(state)
        return time.perf_counter() - t

    def hide(d: float) -> None:
        """Takes `d` seconds of unwatched calls out of watch's own clock: its time per step
        (from the last window's end to the next window's blocking call) and its timing of
        the calls after a window, which space the windows, count watched calls only, as
        in a run without the unwatched ones (else the windows come twice as often)."""
        if fn._mark is not None:
            fn._mark = (fn._mark[0], fn._mark[1] + d)
        if fn._after is not None:
            a = fn._after
            fn._after = (a[0], a[1], a[2] + d, a[3])

    turn = [0]  # chunks so far: the order of the two arms alternates chunk by chunk

    def unwatched(row: dict, n: int) -> None:
        cpu0 = _thread_cpu_s()
        d = plain(n)
        hide(d)
        row["thread_cpu_in_plain_s"] += _thread_cpu_s() - cpu0
        row["chunk_log"].append(["p", n, d, 0])

    def period() -> dict:
        """Calls of `fn` to `TAIL` calls after the next window's end, in chunks of at least
        `CHUNK` calls, and a chunk of `CHUNK` unwatched calls beside each, before it and
        after it in turn (so neither arm is always the one after the other). A watched
        chunk never ends inside a window (its blocking call before it to its last call),
        nor before the decision of a window it ended is made (at most `WAIT` calls
        later)."""
        nonlocal k, state
        decided0 = len(fn.history())
        end_at, pending = None, False
        row = {"thread_cpu_in_plain_s": 0.0, "chunk_log": []}
        while end_at is None or k < end_at:
            turn[0] += 1
            if turn[0] % 2:
                unwatched(row, CHUNK)
            c0, t = k, time.perf_counter()
            near = 0  # (the chunk holds a window's calls, or calls while one is analyzed)
            while True:
                # (The loop's own bookkeeping, attribute reads, is kept as light as the
                # unwatched loop's: its cost would be charged to watch.)
                e = sched.edge(k)
                state = fn(*state)
                k += 1
                if e.end:
                    end_at, pending = k + TAIL, True
                if e.busy:
                    near = True
                if pending:  # (until the window's decision is made)
                    pending = len(fn.history()) == decided0
                    near = True
                if end_at is None and k - c0 < CHUNK:
                    continue
                done = end_at is not None and k >= end_at
                if done or (k - c0 >= CHUNK and not sched.edge(k).busy and (
                        not pending or k - (end_at - TAIL) >= WAIT)):  # fmt: skip
                    break
            jax.block_until_ready(state)
            # Each chunk: arm, calls, seconds, whether a window or its analysis fell in it.
            row["chunk_log"].append(["w", k - c0, time.perf_counter() - t, int(near)])
            if not turn[0] % 2:
                unwatched(row, CHUNK)
        for arm, name in (("w", "watch"), ("p", "plain")):  # (the period's totals)
            mine = [c for c in row["chunk_log"] if c[0] == arm]
            row[f"{name}_s"] = sum(c[2] for c in mine)
            row[f"{name}_calls"] = sum(c[1] for c in mine)
        row["chunks"] = sum(c[0] == "w" for c in row["chunk_log"])
        row["decided_in_block"] = len(fn.history()) - decided0
        v = list(fn._worker._verdicts)[-1:] if fn._worker is not None else []
        # What watch measured of the window and spaced the next one by.
        c = (v[0].get("cost_s") or {}) if v else {}
        row["window_cost_s"] = c.get("window_cost_s")
        row["after_prev_s"] = c.get("max_after_prev_s")
        return row

    # Warm: the first window (call 100, with the profiler's and the first decision's
    # warm-up) and TAIL calls after it, unwatched calls as many.
    warm = period()
    blocks = [period() for _ in range(periods)]
    fn.close()
    res = {"workload": workload, "blocks": blocks, "warm": warm,
           "every": sched.every, "window": sched.window}  # fmt: skip
    Path(out).write_text(json.dumps(res))


def pair_ratios(run: dict) -> tuple[list[float], list[float]]:
    """`(ratios, charged)` of a process's periods: the watched calls' mean over the
    unwatched calls' mean; `charged` also adds watch's thread CPU time during the
    unwatched calls (per call) to the watched calls' mean."""
    ratios, charged = [], []
    for b in run["blocks"]:
        p = b["plain_s"] / b["plain_calls"]
        w = b["watch_s"] / b["watch_calls"]
        extra = b["thread_cpu_in_plain_s"] / b["plain_calls"]
        ratios.append(w / p)
        charged.append((w + extra) / p)
    return ratios, charged


def where_it_goes(block: dict) -> dict | None:
    """A period split by its chunks (`chunk_log`): `far_ratio`, the watched chunks with no
    window and no analysis in them over the unwatched chunks' mean call; `near_extra_s`
    and `far_extra_s`, the seconds the watched chunks with a window (or its analysis) and
    those without took beyond the unwatched chunks' mean call. None without a log."""
    log = block.get("chunk_log")
    if not log:
        return None
    plain = [c for c in log if c[0] == "p"]
    per_call = sum(c[2] for c in plain) / sum(c[1] for c in plain)
    near = [c for c in log if c[0] == "w" and c[3]]
    far = [c for c in log if c[0] == "w" and not c[3]]

    def extra(cs):
        return sum(c[2] for c in cs) - per_call * sum(c[1] for c in cs)

    far_calls = sum(c[1] for c in far)
    return {
        "far_ratio": (sum(c[2] for c in far) / far_calls) / per_call if far_calls else math.nan,
        "near_extra_s": extra(near),
        "far_extra_s": extra(far),
    }


def _run_child(workload: str, periods: int, tmp: str, i: int) -> dict:
    from benchmarks.watch import run_child

    out = os.path.join(tmp, f"{workload}-{i}.json")
    return run_child(["--interleaved-child", workload, str(periods), out, str(i)], out, 1800)


def run(
    processes: int, pairs: int, workloads, previous: dict | None = None, more: bool = False
) -> dict:
    """`processes` fresh processes a step in `workloads`; `more`: added to the step's
    processes already in `previous` (the same code run again), the interval over all."""
    import numpy as np

    from benchmarks.watch import WORKLOADS, _machine, interval

    out: dict = {k: v for k, v in (previous or {}).items() if k in WORKLOADS}
    out["date"] = time.strftime("%Y-%m-%d")
    with tempfile.TemporaryDirectory() as tmp:
        for wl in workloads:
            runs = list(out.get(wl, {}).get("runs", [])) if more else []
            earlier = len(runs)  # (from earlier invocations, `more`)
            if more and any(r["blocks"] and len(r["blocks"]) != pairs for r in runs):
                raise SystemExit(f"--more: {wl}'s processes so far ran other --pairs")
            for i in range(len(runs), len(runs) + processes):
                r = _run_child(wl, pairs, tmp, i)
                ratios, charged = pair_ratios(r)
                r["ratios"], r["charged"] = ratios, charged
                runs.append(r)
                print(f"  {wl} process {i}: " + ", ".join(f"{(x - 1) * 100:+.2f}%" for x in ratios),
                      flush=True)  # fmt: skip
            blocks = [b for r in runs for b in r["blocks"]]
            fig = {
                "runs": runs,
                "by_process": interval([float(np.mean(r["ratios"])) for r in runs]),
                "by_process_charged": interval([float(np.mean(r["charged"])) for r in runs]),
                "by_pair": interval([x for r in runs for x in r["ratios"]]),
                "plain_call_ms": float(np.median([b["plain_s"] / b["plain_calls"] for b in blocks]) * 1e3),
                "watch_call_ms": float(np.median([b["watch_s"] / b["watch_calls"] for b in blocks]) * 1e3),
                "period_calls": [min(b["watch_calls"] for b in blocks), max(b["watch_calls"] for b in blocks)],
                "period_s": [min(b["watch_s"] for b in blocks), max(b["watch_s"] for b in blocks)],
                "decided_in_block": [b["decided_in_block"] for b in blocks],
                "window_cost_s": [b.get("window_cost_s") for b in blocks],
                "where": [w for w in map(where_it_goes, blocks) if w is not None],
                "thread_cpu_between_ms_per_s": float(
                    1e3 * sum(b["thread_cpu_in_plain_s"] for b in blocks)
                    / sum(b["plain_s"] for b in blocks)
                ),
                "load": [round(x, 2) for x in os.getloadavg()],
                "processes": len(runs),
                "earlier": earlier,
                "earlier_load": out.get(wl, {}).get("load") if earlier else None,
                "pairs": pairs,
            }  # fmt: skip
            out[wl] = fig
    out["machine"] = _machine()
    return out


def _median_ms(v) -> str:
    v = [x for x in (v or []) if isinstance(x, int | float)]
    return "n/a" if not v else f"{sorted(v)[len(v) // 2] * 1e3:.0f} ms"


def markdown(res: dict) -> str:
    from benchmarks.watch import NAMES, WORKLOADS, _verdict

    lines = [
        BEGIN,
        "## watch, both arms in one process (`python -m benchmarks watch --interleaved`)",
        "",
        "`python -m benchmarks watch --interleaved --processes N --pairs M --workloads STEP` "
        "(N and M in the table): N fresh processes a step, each one process with 8 CPU "
        "devices running M periods of the step under `jaxpace.watch` at its defaults "
        '(`every="auto"`, `window=5`) and as many calls of the same jitted step unwatched, '
        f"in chunks of {CHUNK} calls that alternate (which arm goes first alternates too). "
        f"A period: from {TAIL} calls after one window's end to {TAIL} calls after the next "
        "one's, so one window, its edge blocks, collection, summary and decision (made "
        "inside the period: the column), and the calls between windows through the wrapper. "
        "The unwatched chunks are taken out of watch's own clock, so it spaces its windows "
        "as in a run without them. Ratio: the watched calls' mean over the unwatched calls' "
        "mean; the interval's unit is the process (the mean of its periods). Charged adds "
        "watch's thread's CPU time during the unwatched chunks (its ticks and heartbeats, "
        "which run in both arms) to the watched arm, as if taken from the step. Window cost: "
        "what watch measured and spaced the windows by.",
        "",
        "| step | processes x periods | unwatched call (median) | watched call, a period's "
        "mean (median) | a period (calls; s) | window cost (median) | decided in the period | "
        "watched / unwatched, by process [95%] | charged, by process [95%] | within 1% "
        "(charged) | by period [95%] | watch's thread between windows | load average |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    for wl in WORKLOADS:
        if wl not in res:
            continue
        f = res[wl]
        bp, bc, bq = f["by_process"], f["by_process_charged"], f["by_pair"]
        pc, ps = f["period_calls"], f["period_s"]
        dec = f["decided_in_block"]
        load = " / ".join(f"{x:.1f}" for x in f["load"])

        def iv(x):
            return f"{x['mean_pct']:+.2f}% [{x['ci95_pct'][0]:+.2f}, {x['ci95_pct'][1]:+.2f}]"

        lines.append(
            f"| {NAMES[wl]} | {f['processes']} x {f['pairs']} | {f['plain_call_ms']:.2f} ms"
            f" | {f['watch_call_ms']:.2f} ms | {pc[0]:,}-{pc[1]:,}; {ps[0]:.0f}-{ps[1]:.0f} s | "
            f"{_median_ms(f.get('window_cost_s'))} | "
            f"{sum(d >= 1 for d in dec)} of {len(dec)} | {iv(bp)} | {iv(bc)} | "
            f"{_verdict(*bc['ci95_pct'])} | {iv(bq)} | "
            f"{f['thread_cpu_between_ms_per_s']:.2f} ms CPU a second | {load} |"
        )
    for wl in WORKLOADS:
        f = res.get(wl, {})
        if f.get("earlier"):
            lines += ["", f"{wl}: {f['earlier']} of the {f['processes']} processes ran in an "
                      "earlier invocation of the same code (`--more` added the others; load "
                      f"average then {' / '.join(f'{x:g}' for x in f.get('earlier_load') or [])})."]  # fmt: skip
        got = f.get("where") or []
        if got:
            far = [w["far_ratio"] for w in got]
            near = [w["near_extra_s"] * 1e3 for w in got]
            lines += ["", f"{wl}, by chunk: the watched chunks with no window and no analysis "
                      f"in them took {(min(far) - 1) * 100:+.2f}% to {(max(far) - 1) * 100:+.2f}% "
                      "a call against the unwatched chunks beside them; the chunks with the "
                      f"window or its analysis {min(near):.0f}-{max(near):.0f} ms more a "
                      f"period ({len(got)} periods)."]  # fmt: skip
    lines += ["", f"Machine: {res['machine']}. Date: {res['date']}.", END]
    return "\n".join(lines)


def main(args) -> int:
    """`python -m benchmarks watch --interleaved [--processes N] [--pairs N]`."""
    from benchmarks.fsdp import publish

    processes = args.processes or 6
    pairs = args.pairs or 1
    if processes < (1 if args.more else 2) or pairs < 1:
        raise SystemExit("--processes must be >= 2 (an interval; >= 1 with --more), --pairs >= 1")
    prev = Path(args.out) / "watch_interleaved.json"
    res = run(
        processes,
        pairs,
        args.workloads,
        json.loads(prev.read_text()) if prev.exists() else None,
        more=args.more,
    )
    publish(res, markdown(res), args.out, "watch_interleaved", args.markdown, BEGIN, END)
    return 0
