"""What to do next: actions derived from the report's failure mode and its evidence.

`next_steps(report)` returns plain sentences; the terminal and the HTML render
the same list (`tables.next_steps_rows`).

>>> from jaxpace.report import analyze, synthetic_records
>>> rep = analyze(synthetic_records(8, 60, late_rank=3, late_s=0.01, seed=1))
>>> rep.primary_mode, rep.culprit
('persistent_straggler', 3)
>>> print(next_steps(rep)[0][:49])
Rank 3 (process 3, host node-3): look at that pro
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from jaxpace.report.model import likely_subject
from jaxpace.report.reach import forecast_support
from jaxpace.report.render.text import format_ms

if TYPE_CHECKING:
    from jaxpace.report.model import Report

__all__ = ["advice_blocks", "next_steps", "scope_notes"]

# Collectives whose ranks do not finish together: their waits are evidence, not a verdict.
EVIDENCE_ONLY_KINDS = {
    "collective-permute": "point-to-point",
    "collective-broadcast": "broadcast",
    "all-to-all": "all-to-all",
}
_NAME_HINTS = {  # words in a site's name when no source gave its kind
    "ppermute": "point-to-point",
    "permute": "point-to-point",
    "send": "point-to-point",
    "recv": "point-to-point",
    "broadcast": "broadcast",
    "all-to-all": "all-to-all",
    "all_to_all": "all-to-all",
    "alltoall": "all-to-all",
}


def _saving(report: Report) -> str:
    w = report.what_if
    if w is None or not math.isfinite(w.saving_s) or w.saving_s <= 0:
        return ""
    return (
        f" Expected saving if {_target(w)} ran like the median rank: "
        f"{format_ms(w.saving_s)} per step "
        f"({w.saving_fraction:.1%})."
    )


def _target(w) -> str:
    """What a `WhatIf` fixes: "it" for the culprit alone, else its late group."""
    return "it" if not w.target or w.target == f"rank {w.rank}" else f"{w.target} (all its ranks)"


def _site_kinds(report: Report) -> dict[str, str]:
    """Each site's collective as far as the report knows it (the sites table, else its name)."""
    out = {r.site: r.kind for r in report.sites_table if r.kind}
    return {s: out.get(s) or "" for s in (report.sites or (report.site,))}


def scope_notes(report: Report) -> tuple[str, ...]:
    """Where the clock-free rule holds, said for the sites of this run (docs/concepts.md).

    The rule (lateness = the last arriver's wait minus one's own) needs a collective
    whose ranks all finish together. A broadcast's root, a send's sender and an
    all-to-all rank with less to move leave early; on GPU an asynchronous collective's
    kernel runs beside compute, so its time holds compute too. Empty when no such
    site is present.
    """
    odd: dict[str, list[str]] = {}
    for site, kind in _site_kinds(report).items():
        what = EVIDENCE_ONLY_KINDS.get(kind) or next(
            (w for hint, w in _NAME_HINTS.items() if hint in site.lower()), None
        )
        if what:
            odd.setdefault(what, []).append(site)
    out = []
    if odd:
        listed = "; ".join(
            f"{what}: "
            + ", ".join(f"`{s}`" for s in sites[:4])
            + (" ..." if len(sites) > 4 else "")
            for what, sites in sorted(odd.items())
        )
        here = report.site in {s for sites in odd.values() for s in sites}
        out.append(
            f"SCOPE: the clock-free rule needs a collective whose ranks finish together; at "
            f"these sites they do not ({listed}): a broadcast's root and a sender leave before "
            "the receivers, and an all-to-all with unequal sizes ends each rank's part at its "
            "own time, so a long wait there does not by itself mean the others were late. "
            + (
                "The analyzed site is one of them: treat its culprit as evidence and check it "
                "at an all-reduce, all-gather or reduce-scatter (`--site`)."
                if here
                else "They are evidence only; the verdict rests on the other sites."
            )
        )
    ctx = getattr(report, "context", None)
    asyncs = [s for s in _site_kinds(report) if "-start" in s or "async" in s.lower()]
    if ctx is not None and ctx.platform == "gpu" and asyncs:
        out.append(
            "SCOPE: on GPU, "
            + ", ".join(f"`{s}`" for s in asyncs[:4])
            + (" ..." if len(asyncs) > 4 else "")
            + " run asynchronously beside compute: the kernel starts at launch and shares "
            "the GPU with the compute it overlaps, so its time inside is waiting plus "
            "overlapped compute, not waiting alone; a rank's lateness there is an upper "
            "bound, and its compute is understated by the overlap."
        )
    return tuple(out)


def _device_checks(host: str, platform: str) -> list[str]:
    """Where to look on `host` for a slow rank, for the run's platform."""
    if platform == "cpu":
        return [
            f"On {host}, look for other work on its cores: `top` or `ps -eo pid,pcpu,comm "
            "--sort=-pcpu | head` (processes competing for CPU), its CPU binding "
            "(`taskset -cp PID`), and frequency scaling (`grep MHz /proc/cpuinfo`).",
            "Compare that process's own per-step work with the others' (input pipeline, "
            "extra work such as logging or sleeps on that process only).",
        ]
    if platform == "tpu":
        return [
            f"On {host}, check for other work on the host (`top`: the input pipeline and "
            "host callbacks run on its CPUs) and the data loader's time per step.",
            "Check the TPU host's health in your cloud's TPU monitoring (duty cycle, HBM use) "
            "against the other hosts'.",
        ]
    gpu = [
        f"On {host}, check the device's clocks, thermals and throttling: "
        "`nvidia-smi -q -d CLOCK,TEMPERATURE,PERFORMANCE` (clocks below the others', "
        "'HW Slowdown' or 'Thermal' active).",
        "Check its PCIe link: `nvidia-smi -q | grep -A2 'Link Width'` and "
        "`lspci -vv | grep LnkSta` (a link trained below x16 or below its generation).",
        f"Check for other work on {host}: `nvidia-smi` (other processes on the GPU), "
        "`top` (CPU contention on the input pipeline), and the data loader's time per step.",
    ]
    if platform == "gpu":
        return gpu
    return [  # records without a platform (older versions): say which checks fit which
        f"On {host}, check for other work (`top`: CPU contention on the input pipeline; the "
        "data loader's time per step) and, on a GPU, the device's clocks and throttling: "
        "`nvidia-smi -q -d CLOCK,TEMPERATURE,PERFORMANCE`.",
        gpu[1],
    ]


def _straggler(report: Report) -> list[str]:
    rs = report.rank_stats(report.culprit)
    out = [  # the evidence is the decision's sentence; the advice says where to look
        f"Rank {rs.rank} (process {rs.process}, host {rs.host}): look at that process and its "
        "device first." + _saving(report),
        *_device_checks(rs.host, _platform(report)),
    ]
    if rs.compute_s > 0 and math.isfinite(rs.compute_s):
        out.append(
            f"Its compute averages {format_ms(rs.compute_s)} per step; if the device is "
            "healthy, compare its batch size / sequence lengths with the other ranks'."
        )
    return out


def _platform(report: Report) -> str:
    ctx = getattr(report, "context", None)
    return ctx.platform if ctx is not None else "unknown"


def _pacing_ran(report: Report) -> bool:
    ctx = getattr(report, "context", None)
    return bool(ctx is not None and ctx.pacing_ran)


def _forecast_line(report: Report) -> tuple[int, float] | None:
    """(ranks, amplification) at the largest rank count the data supports, or None.

    The same bound as the forecast table and plot (`tables.forecast_support`):
    nothing is forecast where the report says it cannot fit one.
    """
    fc = report.forecast
    if fc is None or not fc.ranks:
        return None
    top, _, _ = forecast_support(report)
    pts = [(n, a) for n, a in zip(fc.ranks, fc.amplification, strict=True) if n <= top]
    return pts[-1] if pts else None


def _locality(report: Report) -> list[str]:
    groups = getattr(report, "late_groups", ()) or ()
    g = next((g for g in groups if g.kind != "process"), None)
    what = (
        f"{g.kind} group '{g.label}' (ranks {', '.join(map(str, g.ranks[:8]))}"
        f"{'...' if len(g.ranks) > 8 else ''}) arrives {format_ms(g.excess_lateness_s)} late"
        if g is not None
        else "a locality group (NUMA node / NIC / host) arrives late together"
    )
    return [
        f"{what[0].upper()}{what[1:]}: the cause is shared by that group, not one device."
        + _saving(report),
        "Pin each process to the NUMA node of its GPU and NIC (`numactl --cpunodebind=N "
        "--membind=N`, or your launcher's CPU binding); `jaxpace topo` shows which node that is.",
        "Reorder the mesh so the busiest axis stays inside fast links: "
        "`jaxpace.make_mesh(shape, axes)` instead of `jax.make_mesh` (`jaxpace topo --mesh "
        "SHAPE` prints the suggested order and its cost).",
    ]


def _collective_share(report: Report) -> tuple[float, float]:
    ranks = report.ranks
    it = report.iteration.mean_s
    if not ranks or not (it > 0):
        return math.nan, math.nan
    coll = sum(r.sync_wait_s + r.transfer_s for r in ranks) / len(ranks)
    transfer = sum(r.transfer_s for r in ranks) / len(ranks)
    return coll / it, transfer / it


def _contention(report: Report) -> list[str]:
    share, transfer = _collective_share(report)
    lines = []
    if math.isfinite(share):
        lines.append(
            f"The collective takes {share:.0%} of the step ({transfer:.0%} moving data, the "
            "rest waiting)"
            + (
                ": the fabric, not one rank, sets the pace."
                if report.culprit is None
                else f"; besides rank {report.culprit}, the fabric costs time too."
            )
        )
    lines += [
        "See what more nodes would cost: `jaxpace simulate --nodes 8,16,32,64 --scenario "
        "paper` (with and without pacing), then fit your measured numbers into a scenario.",
        "Overlap or shrink the collective: gradient accumulation, fewer/larger all-reduces, "
        "or reduce-scatter + all-gather (ZeRO-style) over the slow axis.",
    ]
    return lines


def _amplification(report: Report) -> list[str]:
    lines = [
        f"Random per-step noise across ranks costs {report.amplification - 1:.1%} of compute "
        "here (synchronization amplification); no single rank is to blame."
    ]
    fc = _forecast_line(report)
    grow = (
        f"It grows with scale: about {fc[1]:.2f}x at {fc[0]} ranks (empirical forecast). "
        if fc
        else ""
    )
    lines.append(
        grow
        + "Reduce variance at its source (data loading, garbage collection, host jitter)"
        + (
            "; pacing already ran here, so see its table for what it changed."
            if _pacing_ran(report)
            else ", or try pacing: `jp.configure(policy=jp.adaptive(max_delay_s=0.005))`."
        )
    )
    return lines


def _balanced(report: Report) -> list[str]:
    amp = report.amplification
    eff = 1.0 / amp if amp and math.isfinite(amp) and amp >= 1 else math.nan
    likely = getattr(report, "likely", None)
    if likely is not None:
        # Below what this job's size names with confidence, but last in most steps: said
        # plainly, with its figure and the threshold, never called balanced.
        who = likely_subject(likely)
        line = (
            f"Not named with confidence, but {likely.text}. Look at {who} (host "
            f"{likely.host}) first; more steps (a longer run, or pooled windows) can name it."
        )
    else:
        line = "Nothing to fix: arrivals are balanced and no rank or group is persistently late."
    if math.isfinite(eff):
        line += f" Scaling efficiency lost to waiting at this size: {1 - eff:.1%}."
    lines = [line]
    fc = _forecast_line(report)
    if fc is not None:
        lines.append(
            f"Expect about {1 / fc[1]:.0%} scaling efficiency at {fc[0]} ranks (forecast)."
        )
    return lines


def _invariant(report: Report) -> list[str]:
    axis = report.context.invariant_over
    return [
        f"Make the operand of `{report.site}` vary over `{axis}` before timing it: "
        f"`local = jax.tree.map(lambda p: jax.lax.pcast(p, '{axis}', to='varying'), params)`, "
        "then `jax.grad(loss)(local, ...)`. As run, JAX reduced the gradients before "
        "jaxpace saw them, so every rank waited alike and no straggler can be named.",
    ]


_ADVICE = {
    "locality": _locality,
    "topology_contention": _contention,
    "synchronization_amplification": _amplification,
}


def next_steps(report: Report) -> list[str]:
    """What to do next, most useful first: every detected mode, costliest first.

    The primary mode's actions come first; a culprit named with confidence is
    always covered (with the other detected modes' first actions after it).
    """
    return [line for block in advice_blocks(report) for line in block]


def advice_blocks(report: Report) -> list[list[str]]:
    """`next_steps` grouped by what each block is about (primary mode first)."""
    if report.num_ranks < 2:
        return [
            [
                "One rank: nothing to compare. Time each device with "
                "`jp.Pacer(granularity='device')`, or run several processes "
                "(`jaxpace launch -n N`)."
            ]
        ]
    ctx = getattr(report, "context", None)
    if ctx is not None and ctx.invariant_over:
        return [_invariant(report)]
    detected = [m.name for m in report.failure_modes if m.detected and m.name != "balanced"]
    order = [report.primary_mode] + [m for m in detected if m != report.primary_mode]
    if report.culprit is not None and "persistent_straggler" not in order:
        order.append("persistent_straggler")
    out: list[list[str]] = []
    for mode in order:
        if mode == "persistent_straggler" and report.culprit is not None:
            lines = _straggler(report)
        elif mode in _ADVICE:
            lines = _ADVICE[mode](report)
        else:
            continue
        out.append(lines if not out else lines[:2])
    return out or [_balanced(report)]
