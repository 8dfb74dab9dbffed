"""Stage 5: what-if (the culprit at median speed), the amplification forecast, pacing effect."""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

from jaxpace.diagnosis.stats import mean_finite
from jaxpace.report.model import (
    FORECAST_RANKS,
    Forecast,
    PacingEffect,
    RunContext,
    SiteData,
    WaitingCost,
    WhatIf,
)
from jaxpace.report.reach import SAMPLES_PER_RANK
from jaxpace.report.stages.culprit import CulpritRanking
from jaxpace.report.stages.steps import StepSelection

__all__ = [
    "empirical_max_ratio",
    "forecast",
    "lognormal_max_ratio",
    "pacing_effect",
    "waiting_costs",
    "what_if",
]


def what_if(data: SiteData, sel: StepSelection, c: CulpritRanking, mean_it: float) -> WhatIf | None:
    """Step time if the culprit (or the top-ranked rank) computed at the per-step median.

    A culprit late with its late group (a process, a host) is fixed with it: the saving
    is then the group's, as `waiting_costs` computes it, so the report states one figure.
    """
    compf = sel.compute
    R = data.ranks.size
    if not (compf.size and R >= 2 and math.isfinite(mean_it)):
        return None
    wi = c.culprit_index if c.culprit_index is not None else c.order[0]
    rank = int(data.ranks[wi])
    target, idx = f"rank {rank}", np.array([wi])
    if c.culprit_index is not None:
        group = next((g for g in c.groups if rank in g.ranks), None)
        if group is not None:
            target, idx = group.name, np.flatnonzero(np.isin(data.ranks, group.ranks))
    t = data.transfer[sel.rows][sel.compute_rows]
    model = float((compf.max(axis=1) + t).mean())
    saving = model - _fixed_step_s(compf, t, idx)
    return WhatIf(
        rank=rank,
        is_culprit=c.culprit_index is not None,
        measured_step_s=mean_it,
        model_step_s=model,
        what_if_step_s=mean_it - saving,
        saving_s=saving,
        saving_fraction=saving / mean_it if mean_it > 0 else math.nan,
        target=target,
    )


def _fixed_step_s(compf: np.ndarray, t: np.ndarray, idx: np.ndarray) -> float:
    """Mean modelled step time with the compute of columns `idx` at the per-step median."""
    keep = np.ones(compf.shape[1], bool)
    keep[idx] = False
    med = np.median(compf, axis=1)
    rest = compf[:, keep].max(axis=1) if keep.any() else np.full(med.shape, -np.inf)
    return float((np.maximum(rest, med) + t).mean())


def waiting_costs(
    data: SiteData, sel: StepSelection, c: CulpritRanking, mean_it: float
) -> tuple[WaitingCost, ...]:
    """GPU-hours spent waiting for each culprit and late group, and what fixing saves.

    Same model as `what_if`: per step ``max_i(compute_i) + transfer``, with the
    target's compute replaced by the per-step median. Empty without compute.
    """
    compf = sel.compute
    R = data.ranks.size
    targets: list[tuple[str, np.ndarray]] = []
    for i in c.culprit_indices[:20]:
        targets.append((f"rank {int(data.ranks[i])}", np.array([i])))
    for g in c.groups[:20]:
        targets.append((g.name, np.flatnonzero(np.isin(data.ranks, g.ranks))))
    if len(targets) > 1:
        idx = np.unique(np.concatenate([t[1] for t in targets]))
        targets.append(("all of the above", idx))
    if not (targets and compf.size and R >= 2 and math.isfinite(mean_it) and mean_it > 0):
        return ()
    t = data.transfer[sel.rows][sel.compute_rows]
    model = float((compf.max(axis=1) + t).mean())
    out = []
    for name, idx in targets:
        saving = max(model - _fixed_step_s(compf, t, idx), 0.0)
        out.append(
            WaitingCost(
                target=name,
                ranks=tuple(int(r) for r in data.ranks[idx]),
                saving_s=saving,
                saving_fraction=saving / mean_it,
                what_if_step_s=mean_it - saving,
                gpu_hours_per_1000_steps=saving * R * 1000.0 / 3600.0,
            )
        )
    return tuple(out)


def forecast(
    compute: np.ndarray, amp: float, culprit: int | None, *, analyzed_steps: int | None = None
) -> tuple[Forecast | None, str]:
    """Order-statistics forecast at `FORECAST_RANKS`; returns (forecast, note or "").

    With `analyzed_steps`, the note about a culprit is left out when the data
    supports no forecast at all (`reach.forecast_support`): nothing to qualify.
    """
    R = compute.shape[1] if compute.ndim == 2 else 0
    if not (compute.size and R >= 2 and np.all(compute > 0)):
        return None, ""
    x = (compute / compute.mean(axis=1, keepdims=True)).ravel()
    emp = empirical_max_ratio(x, (*FORECAST_RANKS, R))
    sigma = float(np.log(x).std())
    fc = Forecast(
        method=(
            "exact expected maximum of N i.i.d. draws from the empirical per-rank "
            "compute distribution (each step normalized by its mean); lognormal fit "
            "alongside"
        ),
        ranks=FORECAST_RANKS,
        amplification=tuple(emp[:-1]),
        lognormal_amplification=tuple(lognormal_max_ratio(sigma, FORECAST_RANKS)),
        sigma_log=sigma,
        measured_ranks=R,
        measured_amplification=amp,
        forecast_at_measured=emp[-1],
    )
    note = ""
    shown = analyzed_steps is None or FORECAST_RANKS[0] * SAMPLES_PER_RANK <= analyzed_steps * R
    if culprit is not None and shown:
        note = (
            f"the forecast treats culprit rank {culprit} as one draw in {R} of the "
            "compute distribution (a chance per rank), so it can sit below the "
            "measured amplification; fix the culprit first."
        )
    return fc, note


def lognormal_max_ratio(sigma: float, ns: Sequence[int], points: int = 4000) -> list[float]:
    """E[max of N lognormal(0, sigma)] / E[X], by integrating the quantile function."""
    if sigma <= 0:
        return [1.0] * len(ns)
    nd = NormalDist()
    u = (np.arange(points) + 0.5) / points
    out = []
    for n in ns:
        v = u ** (1.0 / n)
        z = np.array([nd.inv_cdf(min(max(float(t), 1e-15), 1 - 1e-15)) for t in v])
        out.append(float(np.exp(sigma * z).mean() / math.exp(sigma**2 / 2)))
    return out


def empirical_max_ratio(x: np.ndarray, ns: Sequence[int]) -> list[float]:
    """Exact E[max of N i.i.d. draws from the empirical distribution of x] / mean(x).

    >>> [round(v, 3) for v in empirical_max_ratio(np.array([1.0, 3.0]), (1, 2))]
    [1.0, 1.25]
    """
    x = np.sort(x)
    if x.size > 200_000:  # quantile summary keeps this fast on huge runs
        pos = (np.arange(200_000) + 0.5) / 200_000 * (x.size - 1)
        x = np.interp(pos, np.arange(x.size), x)
    M = x.size
    cdf = np.arange(1, M + 1) / M
    prev = np.arange(M) / M
    mean = float(x.mean())
    return [float((x * (cdf**n - prev**n)).sum() / mean) for n in ns]


def _cv(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(x.std(ddof=1) / x.mean()) if x.size > 1 and x.mean() > 0 else math.nan


def pacing_effect(
    data: SiteData, sel: StepSelection, ctx: RunContext | None = None
) -> PacingEffect | None:
    """Engaged vs. unengaged steps after warm-up (periodic outliers excluded), like with like.

    The unengaged steps compared are those after pacing first engaged
    (interleaved with engaged ones); when every unengaged step came before (the
    policy's own warm-up), the effect is marked not comparable and says why.
    None unless both kinds of step exist.
    """
    periodic = np.isin(data.steps, sel.periodic.steps) if sel.periodic else False
    base = sel.after_warmup & ~periodic
    eng_rows = np.flatnonzero(base & data.engaged)
    un_all = np.flatnonzero(base & ~data.engaged)
    if not (eng_rows.size and un_all.size):
        return None
    un_rows = un_all[un_all > eng_rows[0]]
    caveats, comparable = [], True
    if un_rows.size and un_rows.size < un_all.size:
        caveats.append(
            f"{un_all.size - un_rows.size} unengaged steps before pacing first engaged (the "
            "policy's warm-up) are left out: only steps after it are compared"
        )
    elif not un_rows.size:
        un_rows, comparable = un_all, False
        first, last = int(data.steps[un_all[0]]), int(data.steps[un_all[-1]])
        caveats.append(
            f"not comparable: every unengaged step (steps {first}-{last}) ran before pacing "
            "first engaged, in the policy's warm-up while compilation and caches still slow "
            "steps, so the difference is not pacing's effect; compare with a run without "
            "pacing, interleaved step by step (`jaxpace demo` does)"
        )
    if ctx is not None and ctx.platform == "cpu":
        caveats.append(
            "on CPU nothing is shared that early ranks could free: pacing moves waiting into "
            "sleeps and cannot shorten a step (docs/concepts.md)"
        )
    it = sel.iter_all
    return PacingEffect(
        engaged_steps=int(eng_rows.size),
        unengaged_steps=int(un_rows.size),
        engaged_step_s=mean_finite(it[eng_rows]),
        unengaged_step_s=mean_finite(it[un_rows]),
        engaged_cv=_cv(it[eng_rows]),
        unengaged_cv=_cv(it[un_rows]),
        engaged_sync_wait_s=float(data.sync_wait[eng_rows].mean()),
        unengaged_sync_wait_s=float(data.sync_wait[un_rows].mean()),
        engaged_delay_s=float(data.delay[eng_rows].mean()),
        unengaged_delay_s=float(data.delay[un_rows].mean()),
        comparable=comparable,
        caveat="; ".join(caveats) + ("." if caveats else ""),
    )
