"""Stage 3: rank the ranks by culpability and name a persistent culprit."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxpace.report.model import IterationStats, RankStats, SiteData
from jaxpace.report.stages.stats import col_mean, median_of_others, robust_std, t95
from jaxpace.report.stages.steps import StepSelection
from jaxpace.report.text import ranges

__all__ = ["CulpritRanking", "noise_floor", "rank_culprits"]


@dataclasses.dataclass(frozen=True)
class CulpritRanking:
    """Who arrives last, by how much, and whether one rank (or process) is to blame.

    Indices (`order`, `culprit_index`) are positions in `SiteData.ranks`.
    """

    rank_stats: tuple[RankStats, ...]
    ranking: tuple[int, ...]  # rank ids, most culpable first
    order: tuple[int, ...]  # the same as indices
    last_fraction: np.ndarray  # (R,)
    late: np.ndarray  # (R,) bool
    noise_floor_s: float
    culprit_index: int | None
    culprit: int | None
    culprit_process: int | None
    notes: tuple[str, ...]


def noise_floor(excess: np.ndarray, p50_s: float) -> float:
    """Excess lateness below this is not called late: max(20 us, 1% of p50, MAD term)."""
    terms = [20e-6]
    if math.isfinite(p50_s):
        terms.append(0.01 * p50_s)
    if excess.shape[0] > 1:
        terms.append(0.25 * float(np.median(robust_std(excess, axis=0))))
    return max(terms)


def rank_culprits(data: SiteData, sel: StepSelection, iteration: IterationStats) -> CulpritRanking:
    """Per-rank statistics, the ranking, and the persistent culprit (if any)."""
    rows, n, R = sel.rows, sel.n, data.ranks.size
    wait, lat = data.wait[rows], data.lateness[rows]
    last = np.argmin(wait, axis=1)
    last_fraction = np.bincount(last, minlength=R) / max(n, 1)
    excess = lat - median_of_others(lat)
    ex_mean = excess.mean(axis=0)
    ex_std = excess.std(axis=0, ddof=1) if n > 1 else np.zeros(R)
    half = t95(n - 1) * ex_std / math.sqrt(n) if n > 1 else np.full(R, math.inf)
    ci_low, ci_high = ex_mean - half, ex_mean + half
    floor = noise_floor(excess, iteration.p50_s)
    late = (ci_low > 0) & (ex_mean > floor)
    order = sorted(range(R), key=lambda i: (-last_fraction[i], -ex_mean[i], int(data.ranks[i])))
    mean_compute = col_mean(sel.compute, R)
    mean_delay = col_mean(data.delay[rows], R)
    mean_sync = col_mean(data.sync_wait[rows], R)
    mean_transfer = float(data.transfer[rows].mean()) if n else math.nan
    rank_stats = tuple(
        RankStats(
            rank=int(data.ranks[i]),
            process=int(data.processes[i]),
            host=data.hosts[i],
            last_fraction=float(last_fraction[i]),
            mean_lateness_s=float(lat[:, i].mean()) if n else math.nan,
            excess_lateness_s=float(ex_mean[i]),
            ci_low_s=float(ci_low[i]),
            ci_high_s=float(ci_high[i]),
            compute_s=float(mean_compute[i]),
            delay_s=float(mean_delay[i]),
            sync_wait_s=float(mean_sync[i]),
            transfer_s=mean_transfer,
            late=bool(late[i]),
        )
        for i in range(R)
    )
    cands = [i for i in order if late[i] and last_fraction[i] >= 0.5]
    culprit_i = cands[0] if cands else None
    culprit_process = int(data.processes[culprit_i]) if culprit_i is not None else None
    notes: list[str] = []
    if culprit_i is None:
        found = _late_process(data, last, last_fraction, late, n)
        if found is not None:
            culprit_i, culprit_process, note = found
            notes.append(note)
    return CulpritRanking(
        rank_stats=rank_stats,
        ranking=tuple(int(data.ranks[i]) for i in order),
        order=tuple(order),
        last_fraction=last_fraction,
        late=late,
        noise_floor_s=float(floor),
        culprit_index=culprit_i,
        culprit=int(data.ranks[culprit_i]) if culprit_i is not None else None,
        culprit_process=culprit_process,
        notes=tuple(notes),
    )


def _late_process(
    data: SiteData, last: np.ndarray, last_fraction: np.ndarray, late: np.ndarray, n: int
) -> tuple[int, int, str] | None:
    """(culprit index, process, note) when one process's ranks are late together, else None.

    Device granularity: a late process makes all its ranks late together, so each
    of them is last only part of the time; judge the process as a unit.
    """
    procs = np.unique(data.processes)
    if not (1 < procs.size < data.ranks.size):
        return None
    proc_idx = np.searchsorted(procs, data.processes)
    proc_last = np.bincount(proc_idx[last], minlength=procs.size) / max(n, 1)
    for pi in np.argsort(-proc_last, kind="stable"):
        members = np.flatnonzero(proc_idx == pi)
        if proc_last[pi] >= 0.5 and late[members].all():
            process = int(procs[pi])
            note = (
                f"process {process} is last in {proc_last[pi]:.0%} of steps: its "
                f"ranks {ranges(data.ranks[members])} are late together."
            )
            return int(members[np.argmax(last_fraction[members])]), process, note
    return None
