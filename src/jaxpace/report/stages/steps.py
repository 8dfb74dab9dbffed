"""Stage 2: which steps to analyze (warm-up, periodic outliers); iteration statistics."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxpace._validate import check_number
from jaxpace.diagnosis.stats import robust_std
from jaxpace.errors import ConfigError
from jaxpace.report.model import DEFAULT_WARMUP_STEPS, IterationStats, PeriodicOutliers, SiteData
from jaxpace.report.render.text import format_ms

__all__ = [
    "StepSelection",
    "amplification",
    "iteration_stats",
    "periodic_outliers",
    "select_steps",
]


@dataclasses.dataclass(frozen=True)
class StepSelection:
    """The steps the statistics use.

    Attributes:
      warmup_steps: steps excluded at the start.
      after_warmup: (S,) bool, steps after the warm-up.
      iter_all: (S,) iteration time of every step (median over ranks), NaN where unknown.
      periodic: periodic slow steps (excluded), or None.
      rows: indices of the analyzed steps (after warm-up, without periodic outliers).
      compute: (n', R) compute of the analyzed steps where every rank's is known.
      compute_rows: (n,) bool, which analyzed steps `compute` holds.
      notes: remarks for the report.
    """

    warmup_steps: int
    after_warmup: np.ndarray
    iter_all: np.ndarray
    periodic: PeriodicOutliers | None
    rows: np.ndarray
    compute: np.ndarray
    compute_rows: np.ndarray
    notes: tuple[str, ...]

    @property
    def n(self) -> int:
        """Number of analyzed steps."""
        return int(self.rows.size)


def select_steps(data: SiteData, warmup_steps: int | None) -> StepSelection:
    """Drops the warm-up (default: 5, at most a quarter) and periodic slow steps."""
    notes: list[str] = []
    S = data.steps.size
    if warmup_steps is None:
        warmup_steps = min(DEFAULT_WARMUP_STEPS, S // 4)
    check_number("warmup_steps", warmup_steps, lo=0, hi=math.inf, integer=True, error=ConfigError)
    warmup_steps = int(warmup_steps)
    after_warmup = data.steps >= data.steps[0] + warmup_steps
    if not after_warmup.any():
        notes.append(
            f"`warmup_steps`={warmup_steps} leaves no step of {S}; analyzed all steps instead."
        )
        after_warmup[:] = True
    iter_all = np.median(data.step_time, axis=1)
    rows_w = np.flatnonzero(after_warmup)
    periodic = periodic_outliers(
        data.steps[rows_w], iter_all[rows_w], data.lateness[rows_w], data.ranks
    )
    use = after_warmup.copy()
    if periodic is not None:
        use &= ~np.isin(data.steps, periodic.steps)
        notes.append(
            f"{len(periodic.steps)} periodic slow steps (every {periodic.period} steps, "
            f"+{format_ms(periodic.mean_extra_s)}; rank {periodic.dominant_rank} last in "
            f"{periodic.dominant_fraction:.0%} of them) look like periodic extra work "
            "(eval, checkpoint, logging), not a fabric problem; excluded from the ranking."
        )
    rows = np.flatnonzero(use)
    comp = data.compute[rows]
    comp_rows = np.isfinite(comp).all(axis=1)
    return StepSelection(
        warmup_steps=int(S - after_warmup.sum()),  # the steps actually excluded, not asked for
        after_warmup=after_warmup,
        iter_all=iter_all,
        periodic=periodic,
        rows=rows,
        compute=comp[comp_rows],
        compute_rows=comp_rows,
        notes=tuple(notes),
    )


def periodic_outliers(
    steps: np.ndarray, iter_s: np.ndarray, lateness: np.ndarray, ranks: np.ndarray
) -> PeriodicOutliers | None:
    """Slow steps (above median + max(6 MAD, 10%)) that recur with one period, or None.

    The dominant rank is the one latest most often in those steps: the largest `lateness`
    (measured within each rank's group at a site with groups; with one group, the rank
    that waited least)."""
    ok = np.isfinite(iter_s)
    if ok.sum() < 12:
        return None
    x, st = iter_s[ok], steps[ok]
    med = float(np.median(x))
    mad = float(robust_std(x))
    out_mask = x > med + max(6.0 * mad, 0.10 * med)
    out_steps = st[out_mask]
    if out_steps.size < 3:
        return None
    span = int(st[-1] - st[0] + 1)
    for d in range(2, span // 3 + 1):
        counts = np.bincount(out_steps % d, minlength=d)
        phase = int(np.argmax(counts))
        n_hit = int(counts[phase])
        n_phase = int(np.count_nonzero(st % d == phase))
        if n_hit >= 3 and n_hit >= 0.8 * n_phase and n_hit >= 0.6 * out_steps.size:
            hit = out_steps[out_steps % d == phase]
            rows = np.flatnonzero(ok)[out_mask][out_steps % d == phase]
            last = np.argmax(lateness[rows], axis=1)
            cnt = np.bincount(last, minlength=ranks.size)
            dom = int(np.argmax(cnt))
            return PeriodicOutliers(
                period=d,
                phase=phase,
                steps=tuple(int(s) for s in hit),
                dominant_rank=int(ranks[dom]),
                dominant_fraction=float(cnt[dom] / rows.size),
                mean_extra_s=float(iter_s[rows].mean() - med),
            )
    return None


def iteration_stats(iter_s: np.ndarray) -> IterationStats:
    """Mean, std, CV and quantiles of the finite iteration times (seconds)."""
    it = iter_s[np.isfinite(iter_s)]
    if it.size:
        mean_it, std_it = float(it.mean()), float(it.std(ddof=1)) if it.size > 1 else 0.0
        p50, p90, p99 = (float(v) for v in np.quantile(it, [0.5, 0.9, 0.99]))
    else:
        mean_it = std_it = p50 = p90 = p99 = math.nan
    return IterationStats(
        num_steps=int(it.size),
        mean_s=mean_it,
        std_s=std_it,
        cv=std_it / mean_it if it.size and mean_it > 0 else math.nan,
        p50_s=p50,
        p90_s=p90,
        p99_s=p99,
    )


def amplification(compute: np.ndarray) -> float:
    """Mean over steps of the max-rank compute over the mean compute; NaN without compute."""
    if compute.size and compute.mean() > 0:
        return float(compute.max(axis=1).mean() / compute.mean())
    return math.nan
