"""What to do next: actions derived from the report's failure mode and its evidence.

`next_steps(report)` returns plain sentences; the terminal and the HTML render
the same list (`tables.next_steps_rows`).

>>> from jaxpace.report import analyze, synthetic_records
>>> rep = analyze(synthetic_records(8, 60, late_rank=3, late_s=0.01, seed=1))
>>> rep.primary_mode, rep.culprit
('persistent_straggler', 3)
>>> print(next_steps(rep)[0][:39])
Rank 3 (process 3, host node-3) arrives
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from jaxpace.report.text import format_ms

if TYPE_CHECKING:
    from jaxpace.report.model import Report

__all__ = ["next_steps"]


def _saving(report: Report) -> str:
    w = report.what_if
    if w is None or not math.isfinite(w.saving_s) or w.saving_s <= 0:
        return ""
    return (
        f" Expected saving if it ran like the median rank: {format_ms(w.saving_s)} per step "
        f"({w.saving_fraction:.1%})."
    )


def _straggler(report: Report) -> list[str]:
    rs = report.rank_stats(report.culprit)
    out = [
        f"Rank {rs.rank} (process {rs.process}, host {rs.host}) arrives "
        f"{format_ms(rs.excess_lateness_s)} later than a typical rank, last in "
        f"{rs.last_fraction:.0%} of steps: look at that process and its device first."
        + _saving(report),
        f"On {rs.host}, check the device's clocks, thermals and throttling: "
        "`nvidia-smi -q -d CLOCK,TEMPERATURE,PERFORMANCE` (clocks below the others', "
        "'HW Slowdown' or 'Thermal' active).",
        "Check its PCIe link: `nvidia-smi -q | grep -A2 'Link Width'` and "
        "`lspci -vv | grep LnkSta` (a link trained below x16 or below its generation).",
        f"Check for other work on {rs.host}: `nvidia-smi` (other processes on the GPU), "
        "`top` (CPU contention on the input pipeline), and the data loader's time per step.",
    ]
    if rs.compute_s > 0 and math.isfinite(rs.compute_s):
        out.append(
            f"Its compute averages {format_ms(rs.compute_s)} per step; if the device is "
            "healthy, compare its batch size / sequence lengths with the other ranks'."
        )
    return out


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
            "rest waiting): the fabric, not one rank, sets the pace."
        )
    lines += [
        "See what more nodes would cost: `jaxpace simulate --nodes 8,16,32,64 --scenario "
        "paper` (with and without pacing), then fit your measured numbers into a scenario.",
        "Overlap or shrink the collective: gradient accumulation, fewer/larger all-reduces, "
        "or reduce-scatter + all-gather (ZeRO-style) over the slow axis.",
    ]
    return lines


def _amplification(report: Report) -> list[str]:
    fc = report.forecast
    lines = [
        f"Random per-step noise across ranks costs {report.amplification - 1:.1%} of compute "
        "here (synchronization amplification); no single rank is to blame."
    ]
    if fc is not None and fc.ranks:
        n, a = fc.ranks[-1], fc.amplification[-1]
        lines.append(
            f"It grows with scale: about {a:.2f}x at {n} ranks (empirical forecast). "
            "Reduce variance at its source (data loading, garbage collection, host jitter), "
            "or try pacing: `jp.configure(policy=jp.adaptive(max_delay_s=0.005))`."
        )
    return lines


def _balanced(report: Report) -> list[str]:
    amp = report.amplification
    eff = 1.0 / amp if amp and math.isfinite(amp) and amp >= 1 else math.nan
    line = "Nothing to fix: arrivals are balanced and no rank or group is persistently late."
    if math.isfinite(eff):
        line += f" Scaling efficiency lost to waiting at this size: {1 - eff:.1%}."
    lines = [line]
    fc = report.forecast
    if fc is not None and fc.ranks:
        n, a = fc.ranks[-1], fc.amplification[-1]
        lines.append(f"Expect about {1 / a:.0%} scaling efficiency at {n} ranks (forecast).")
    return lines


def next_steps(report: Report) -> list[str]:
    """What to do next, most useful first, from the primary failure mode and its evidence."""
    if report.num_ranks < 2:
        return [
            "One rank: nothing to compare. Time each device with "
            "`jp.Pacer(granularity='device')`, or run several processes (`jaxpace launch -n N`)."
        ]
    mode = report.primary_mode
    if mode == "persistent_straggler" and report.culprit is not None:
        return _straggler(report)
    if mode == "locality":
        return _locality(report)
    if mode == "topology_contention":
        return _contention(report)
    if mode == "synchronization_amplification":
        return _amplification(report)
    if report.culprit is not None:
        return _straggler(report)
    return _balanced(report)
