"""Diagnose a run's collective timings: phases, culprits, failure modes, what-ifs, reports.

Everything here is clock-free (docs/records.md): only durations measured on one
process are used — `wait_ns`, `delay_ns`, and differences of one rank's own
`arrive_ns`/`done_ns` — so per-process clock offsets never change a result.

Definitions, per step k and rank i (seconds):

- lateness ``max_j wait_j - wait_i`` (docs/records.md); the *excess lateness*
  subtracts the median lateness of the other ranks at that step, so a rank
  made late by L shows an excess of about L whatever the jitter of the others;
- transfer ``min_j (wait_j - delay_j)``: the collective itself, measured by
  the last rank to enter it; sync wait ``wait_i - delay_i - transfer``. These
  equal records.md's ``min_j wait_j`` and ``earliness_i - delay_i`` whenever
  the last arriver took no pacing delay (and stay non-negative when it did);
- compute ``arrive_i(k) - done_i(k-1)``; step time ``done_i(k) - done_i(k-1)``;
  iteration time of a step = the median over ranks of the step time.

Order statistics (`Forecast`): the per-rank compute of each step is divided by
that step's mean over ranks; the expected maximum of N independent draws from
this empirical distribution is computed exactly,
``E[max_N] = sum_i x_(i) ((i/M)^N - ((i-1)/M)^N)``, next to the same for a
lognormal fitted to it (numerical integration of its quantile function).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from jaxpace._report_io import Records, load_records
from jaxpace._report_synthetic import synthetic_records
from jaxpace.errors import RecordsError

__all__ = [
    "FailureMode",
    "Forecast",
    "IterationStats",
    "PacingEffect",
    "PeriodicOutliers",
    "RankStats",
    "Records",
    "Report",
    "WhatIf",
    "analyze",
    "cli_main",
    "configure_parser",
    "load_records",
    "print_summary",
    "synthetic_records",
    "write_html",
    "write_json",
    "write_trace",
]

FORECAST_RANKS = (8, 16, 32, 64, 128, 256, 512, 1024)
DEFAULT_WARMUP_STEPS = 5
FAILURE_MODES = (
    "persistent_straggler",
    "locality",
    "synchronization_amplification",
    "topology_contention",
    "balanced",
)

# Two-sided 95% Student-t critical values for 1..30 degrees of freedom.
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def _t95(df: int) -> float:
    if df < 1:
        return math.inf
    return _T95[df - 1] if df <= 30 else 1.96 + 2.4 / df


# --------------------------------------------------------------------------- results


@dataclasses.dataclass(frozen=True)
class IterationStats:
    """Iteration (step) time over the analyzed steps, seconds.

    `cv` is std/mean (dimensionless, >= 0). Mean and CV belong side by side:
    a persistent straggler slows every step yet leaves the CV small.
    """

    num_steps: int
    mean_s: float
    std_s: float
    cv: float
    p50_s: float
    p90_s: float
    p99_s: float


@dataclasses.dataclass(frozen=True)
class RankStats:
    """One rank's timing over the analyzed steps.

    Attributes:
      rank, process, host: who.
      last_fraction: share of steps in which this rank arrived last (smallest
        wait), in [0, 1].
      mean_lateness_s: mean of ``max_j wait_j - wait_i``.
      excess_lateness_s: mean lateness minus the median lateness of the other
        ranks at each step: how much later than a typical rank it arrives.
      ci_low_s, ci_high_s: 95% confidence interval of `excess_lateness_s`
        (Student t over steps; ignores autocorrelation).
      compute_s, delay_s, sync_wait_s, transfer_s: mean phase times per step.
      late: the interval excludes 0 and the excess is above the noise floor.
    """

    rank: int
    process: int
    host: str
    last_fraction: float
    mean_lateness_s: float
    excess_lateness_s: float
    ci_low_s: float
    ci_high_s: float
    compute_s: float
    delay_s: float
    sync_wait_s: float
    transfer_s: float
    late: bool


@dataclasses.dataclass(frozen=True)
class FailureMode:
    """One failure mode's verdict.

    Attributes:
      name: one of `FAILURE_MODES`.
      score: strength of the evidence in [0, 1] (0 = none; see docs/diagnostics.md
        for each mode's formula).
      detected: whether the report calls this mode present.
      evidence: human-readable facts behind the score.
    """

    name: str
    score: float
    detected: bool
    evidence: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class PeriodicOutliers:
    """Slow steps that recur with a fixed period (eval, checkpointing, logging).

    They are excluded from the culprit ranking and failure-mode classification:
    periodic extra work on one rank is not a fabric problem.
    """

    period: int
    phase: int
    steps: tuple[int, ...]
    dominant_rank: int | None
    dominant_fraction: float
    mean_extra_s: float


@dataclasses.dataclass(frozen=True)
class WhatIf:
    """Expected step time if `rank` computed as fast as the median rank.

    Model: step time = ``max_i(compute_i) + transfer`` per step (`model_step_s`;
    pacing delays are left out: with no late rank there is nothing to pace);
    `what_if_step_s` = measured mean minus the model's saving from replacing
    `rank`'s compute by the per-step median compute.
    """

    rank: int
    is_culprit: bool
    measured_step_s: float
    model_step_s: float
    what_if_step_s: float
    saving_s: float
    saving_fraction: float


@dataclasses.dataclass(frozen=True)
class Forecast:
    """Synchronization amplification forecast at larger rank counts.

    Attributes:
      method: how it was computed (see the module docstring).
      ranks: rank counts N.
      amplification: E[max of N] / E[X] from the empirical per-rank compute
        distribution (bootstrap order statistics, exact expectation).
      lognormal_amplification: the same for a fitted lognormal.
      sigma_log: the fitted lognormal's sigma.
      measured_ranks, measured_amplification: the run itself, and the forecast
        at its own rank count for comparison (`forecast_at_measured`).
    """

    method: str
    ranks: tuple[int, ...]
    amplification: tuple[float, ...]
    lognormal_amplification: tuple[float, ...]
    sigma_log: float
    measured_ranks: int
    measured_amplification: float
    forecast_at_measured: float


@dataclasses.dataclass(frozen=True)
class PacingEffect:
    """Steps with pacing engaged vs. not, side by side (means over steps)."""

    engaged_steps: int
    unengaged_steps: int
    engaged_step_s: float
    unengaged_step_s: float
    engaged_cv: float
    unengaged_cv: float
    engaged_sync_wait_s: float
    unengaged_sync_wait_s: float
    engaged_delay_s: float
    unengaged_delay_s: float


@dataclasses.dataclass(frozen=True)
class _SiteData:
    """Dense (step x rank) arrays of one site; seconds, NaN where unknown."""

    steps: np.ndarray  # (S,) step numbers, complete steps only
    ranks: np.ndarray  # (R,)
    processes: np.ndarray  # (R,) process of each rank
    hosts: tuple[str, ...]  # (R,)
    arrive: np.ndarray  # (S, R) seconds since the rank's own first arrival
    done: np.ndarray
    wait: np.ndarray
    delay: np.ndarray
    engaged: np.ndarray  # (S,) bool
    compute: np.ndarray  # (S, R)
    step_time: np.ndarray  # (S, R)
    transfer: np.ndarray  # (S,)
    sync_wait: np.ndarray  # (S, R)
    lateness: np.ndarray  # (S, R)


@dataclasses.dataclass(frozen=True)
class Report:
    """What `analyze` found. `to_dict()` / `to_json()` give everything but raw arrays.

    Attributes:
      run_id, site, sites, granularity: what was analyzed (`sites` lists all).
      num_ranks, num_processes: ranks and processes that reported.
      num_steps: complete steps (every rank reported) of `site`.
      warmup_steps: steps excluded at the start.
      analyzed_steps: steps used for statistics (after warm-up, without
        periodic outliers).
      partial: input was incomplete; `notes` says how.
      iteration: step-time statistics.
      amplification: mean over steps of the max-rank compute, over the mean
        compute (>= 1; 1 = no rank ever waits for another); NaN without compute.
      ranks: per-rank statistics, by rank.
      ranking: ranks from most to least culpable (arrived last most often,
        then largest excess lateness).
      culprit: the persistent culprit rank, or None (never for balanced runs).
      culprit_process: its process (or a process whose ranks are late together).
      noise_floor_s: excess lateness below this is not called late.
      failure_modes: one `FailureMode` per name in `FAILURE_MODES`.
      primary_mode: the detected mode with the highest score, or "balanced".
      periodic: periodic slow steps, or None.
      what_if, forecast, pacing: see their classes (None when not computable).
    """

    run_id: str | None
    site: str
    sites: tuple[str, ...]
    granularity: str
    num_ranks: int
    num_processes: int
    num_steps: int
    warmup_steps: int
    analyzed_steps: int
    partial: bool
    notes: tuple[str, ...]
    iteration: IterationStats
    amplification: float
    ranks: tuple[RankStats, ...]
    ranking: tuple[int, ...]
    culprit: int | None
    culprit_process: int | None
    noise_floor_s: float
    failure_modes: tuple[FailureMode, ...]
    primary_mode: str
    periodic: PeriodicOutliers | None
    what_if: WhatIf | None
    forecast: Forecast | None
    pacing: PacingEffect | None
    data: _SiteData | None = dataclasses.field(default=None, repr=False, compare=False)

    def mode(self, name: str) -> FailureMode:
        """The `FailureMode` called `name` (one of `FAILURE_MODES`)."""
        for m in self.failure_modes:
            if m.name == name:
                return m
        raise KeyError(f"unknown failure mode {name!r}; expected one of {FAILURE_MODES}.")

    def rank_stats(self, rank: int) -> RankStats:
        """The `RankStats` of `rank`."""
        for r in self.ranks:
            if r.rank == rank:
                return r
        raise KeyError(f"rank {rank} is not in this report; ranks: {[r.rank for r in self.ranks]}.")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (NaN becomes None); no raw per-step arrays."""
        out = {}
        for f in dataclasses.fields(self):
            if f.name == "data":
                continue
            v = getattr(self, f.name)
            out[f.name] = dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
            if isinstance(v, tuple) and v and dataclasses.is_dataclass(v[0]):
                out[f.name] = [dataclasses.asdict(x) for x in v]
        return _jsonable(out)

    def to_json(self, indent: int | None = 2) -> str:
        """`to_dict()` as a JSON string."""
        return json.dumps(self.to_dict(), indent=indent)

    def summary_table(self) -> Any:
        """The terminal summary as a `rich` renderable (a group of tables)."""
        return _summary_renderable(self)


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


# --------------------------------------------------------------------------- arrays


def pacing_table(p: PacingEffect) -> list[list[str]]:
    """The pacing-effect table as text rows (header first), for terminal and HTML."""
    return [
        ["", "steps", "step time", "CV", "sync wait", "delay"],
        [
            "not engaged",
            str(p.unengaged_steps),
            _ms(p.unengaged_step_s),
            f"{p.unengaged_cv:.3f}",
            _ms(p.unengaged_sync_wait_s),
            _ms(p.unengaged_delay_s),
        ],
        [
            "engaged",
            str(p.engaged_steps),
            _ms(p.engaged_step_s),
            f"{p.engaged_cv:.3f}",
            _ms(p.engaged_sync_wait_s),
            _ms(p.engaged_delay_s),
        ],
    ]


def _pick_site(recs: Records, site: str | None) -> str:
    """`site` if the records have it (else a clear error); by default the busiest site."""
    if site is None:
        counts = np.bincount(recs.columns["site"], minlength=len(recs.sites))
        return recs.sites[int(np.argmax(counts))]
    if site not in recs.sites:
        raise RecordsError(
            f"site `{site}` is not in the records; available sites: "
            f"{', '.join(f'`{s}`' for s in recs.sites)}."
        )
    return site


def _site_data(records: Records, site: str) -> tuple[_SiteData, list[str], bool]:
    """Dense arrays of one site; returns (data, notes, partial)."""
    notes: list[str] = []
    partial = False
    c = records.columns
    sel = c["site"] == records.sites.index(site)
    step, rank = c["step"][sel], c["rank"][sel]
    ranks = np.unique(rank)
    steps_all = np.unique(step)
    R, S = ranks.size, steps_all.size
    ri = np.searchsorted(ranks, rank)
    si = np.searchsorted(steps_all, step)
    flat = si * R + ri
    counts = np.bincount(flat, minlength=S * R)
    if counts.max() > 1:
        dup = np.flatnonzero(counts > 1)
        s_dup, r_dup = divmod(int(dup[0]), R)
        raise RecordsError(
            f"site `{site}`: {dup.size} duplicate records, e.g. step {int(steps_all[s_dup])} "
            f"of rank {int(ranks[r_dup])} appears {int(counts[dup[0]])} times. Each (site, "
            "step, rank) must appear once; did two files come from the same process?"
        )
    present = (counts > 0).reshape(S, R)
    complete = present.all(axis=1)
    if not complete.all():
        partial = True
        bad = steps_all[~complete]
        lacking = ranks[~present[~complete].all(axis=0)]
        notes.append(
            f"PARTIAL: {bad.size} of {S} steps of `{site}` lack records of some ranks "
            f"(steps {_ranges(bad)}; ranks {_ranges(lacking)}); analyzed the "
            f"{int(complete.sum())} complete steps."
        )
    if not complete.any():
        raise RecordsError(
            f"site `{site}` has no step with records from all {R} ranks ({_ranges(ranks)}); "
            "nothing to compare. Were the records of different sites or runs mixed?"
        )

    def dense(col: str) -> np.ndarray:
        a = np.zeros(S * R, np.int64)
        a[flat] = c[col][sel]
        return a.reshape(S, R)[complete]

    arrive_ns, done_ns = dense("arrive_ns"), dense("done_ns")
    origin = arrive_ns.min(axis=0, keepdims=True)  # per-rank: only differences matter
    arrive = (arrive_ns - origin) / 1e9
    done = (done_ns - origin) / 1e9
    wait = dense("wait_ns") / 1e9
    delay = dense("delay_ns") / 1e9
    eng = np.zeros(S * R, bool)
    eng[flat] = c["engaged"][sel]
    engaged = eng.reshape(S, R)[complete].any(axis=1)
    steps = steps_all[complete]

    consecutive = np.zeros(steps.size, bool)
    consecutive[1:] = np.diff(steps) == 1
    compute = np.full(arrive.shape, np.nan)
    step_time = np.full(arrive.shape, np.nan)
    compute[1:] = arrive[1:] - done[:-1]
    step_time[1:] = done[1:] - done[:-1]
    compute[~consecutive] = np.nan
    step_time[~consecutive] = np.nan
    if steps.size > 1 and not consecutive[1:].any():
        notes.append(
            "steps are not consecutive (sampled records?): compute and step time need "
            "consecutive steps, so only wait-based statistics are available."
        )
    entered = wait - delay
    transfer = np.maximum(entered.min(axis=1), 0.0)
    sync_wait = np.maximum(entered - transfer[:, None], 0.0)
    lateness = wait.max(axis=1, keepdims=True) - wait

    proc_of = records.process_of_rank()
    host_of = records.hosts()
    data = _SiteData(
        steps=steps,
        ranks=ranks,
        processes=np.array([proc_of[int(r)] for r in ranks]),
        hosts=tuple(host_of[int(r)] for r in ranks),
        arrive=arrive,
        done=done,
        wait=wait,
        delay=delay,
        engaged=engaged,
        compute=compute,
        step_time=step_time,
        transfer=transfer,
        sync_wait=sync_wait,
        lateness=lateness,
    )
    return data, notes, partial


def _ranges(values: Iterable[int], limit: int = 6) -> str:
    """'0-3, 7, 9-10' for a sorted integer sequence, truncated after `limit` runs."""
    vals = [int(v) for v in values]
    runs: list[str] = []
    i = 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        runs.append(str(vals[i]) if i == j else f"{vals[i]}-{vals[j]}")
        i = j + 1
    if len(runs) > limit:
        return ", ".join(runs[:limit]) + f", ... ({len(vals)} in all)"
    return ", ".join(runs)


def _median_of_others(x: np.ndarray) -> np.ndarray:
    """For each (row, column), the median of the row without that column."""
    S, R = x.shape
    if R < 2:
        return np.zeros_like(x)
    order = np.argsort(x, axis=1)
    v = np.take_along_axis(x, order, axis=1)
    p = np.arange(R)[None, :]  # sorted position of the removed element

    def other(k: int) -> np.ndarray:  # k-th smallest of the row without position p
        return np.where(p > k, v[:, [k]], v[:, [k + 1]])

    m = R - 1
    med_sorted = other((m - 1) // 2) if m % 2 else 0.5 * (other(m // 2 - 1) + other(m // 2))
    out = np.empty_like(x)
    np.put_along_axis(out, order, med_sorted, axis=1)
    return out


def _robust_std(x: np.ndarray, axis: int = 0) -> np.ndarray:
    med = np.median(x, axis=axis, keepdims=True)
    return 1.4826 * np.median(np.abs(x - med), axis=axis)


def _mean(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else math.nan


# --------------------------------------------------------------------------- analysis


def _periodic_outliers(
    steps: np.ndarray, iter_s: np.ndarray, wait: np.ndarray, ranks: np.ndarray
) -> PeriodicOutliers | None:
    ok = np.isfinite(iter_s)
    if ok.sum() < 12:
        return None
    x, st = iter_s[ok], steps[ok]
    med = float(np.median(x))
    mad = float(_robust_std(x))
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
            last = np.argmin(wait[rows], axis=1)
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


def _normalize_groups(
    topology_groups: Mapping[str, Any] | None, records: Records, data: _SiteData
) -> dict[str, dict[int, str]]:
    groups: dict[str, dict[int, str]] = {}
    if topology_groups:
        first = next(iter(topology_groups.values()))
        if isinstance(first, Mapping):
            for kind, m in topology_groups.items():
                groups[str(kind)] = {int(r): str(g) for r, g in m.items()}
        else:
            groups["group"] = {int(r): str(g) for r, g in topology_groups.items()}
    else:
        groups = records.rank_groups()
    if "host" not in groups and len(set(data.hosts)) > 1:
        groups["host"] = {int(r): h for r, h in zip(data.ranks, data.hosts, strict=True)}
    return groups


def _locality(
    kind: str,
    mapping: Mapping[int, str],
    data: _SiteData,
    mean_lat: np.ndarray,
    noise_floor_s: float,
) -> tuple[float, list[str]] | None:
    """(score, evidence) of one grouping, or None when it cannot be tested."""
    labels = [mapping.get(int(r)) for r in data.ranks]
    if any(lbl is None for lbl in labels):
        missing = [int(r) for r, lbl in zip(data.ranks, labels, strict=True) if lbl is None]
        return 0.0, [f"{kind}: no group label for ranks {_ranges(missing)}; not tested"]
    names, codes = np.unique(np.array(labels, dtype=object).astype(str), return_inverse=True)
    G, R = names.size, codes.size
    sizes = np.bincount(codes, minlength=G)
    if G < 2 or sizes.max() < 2:
        return None
    by_proc = {int(p): set(np.flatnonzero(data.processes == p)) for p in np.unique(data.processes)}
    by_group = [set(np.flatnonzero(codes == g)) for g in range(G)]
    if all(grp in by_proc.values() for grp in by_group):
        return None  # groups are processes: that is a persistent straggler, not locality
    onehot = np.zeros((R, G))
    onehot[np.arange(R), codes] = 1.0

    def ssb(y: np.ndarray) -> np.ndarray:
        sums = y @ onehot
        return (sums**2 / sizes).sum(axis=-1) - y.sum(axis=-1) ** 2 / R

    y = mean_lat
    sst = float(((y - y.mean()) ** 2).sum())
    if sst <= 0:
        return 0.0, [f"{kind}: all ranks equally late; nothing to explain"]
    eta2 = float(ssb(y) / sst)
    rng = np.random.default_rng(0)
    perms = np.argsort(rng.random((2000, R)), axis=1)
    null = ssb(y[perms]) / sst
    p_value = float((1 + np.count_nonzero(null >= eta2 - 1e-12)) / (1 + null.size))
    gmeans = (y @ onehot) / sizes
    diff = float(gmeans.max() - gmeans.min())
    significant = p_value < 0.05 and diff > noise_floor_s
    score = eta2 if significant else 0.0
    worst = int(np.argmax(gmeans))
    evidence = [
        f"{kind} groups explain {eta2:.0%} of the between-rank variance of mean lateness "
        f"(one-way ANOVA eta^2; permutation p = {p_value:.3f})",
        f"{kind} `{names[worst]}` (ranks {_ranges(np.sort(data.ranks[codes == worst]))}) is "
        f"{_ms(diff)} later than the earliest group; noise floor {_ms(noise_floor_s)}",
    ]
    return score, evidence


def _ms(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x * 1e3:.3g} ms"


def _lognormal_max_ratio(sigma: float, ns: Sequence[int], points: int = 4000) -> list[float]:
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


def _empirical_max_ratio(x: np.ndarray, ns: Sequence[int]) -> list[float]:
    """Exact E[max of N i.i.d. draws from the empirical distribution of x] / mean(x)."""
    x = np.sort(x)
    if x.size > 200_000:  # quantile summary keeps this fast on huge runs
        pos = (np.arange(200_000) + 0.5) / 200_000 * (x.size - 1)
        x = np.interp(pos, np.arange(x.size), x)
    M = x.size
    cdf = np.arange(1, M + 1) / M
    prev = np.arange(M) / M
    mean = float(x.mean())
    return [float((x * (cdf**n - prev**n)).sum() / mean) for n in ns]


def analyze(
    records: Records | str | os.PathLike | Iterable[Mapping[str, Any]],
    *,
    warmup_steps: int | None = None,
    site: str | None = None,
    topology_groups: Mapping[str, Any] | None = None,
    expected_transfer_s: float | None = None,
) -> Report:
    """Analyzes one site of a run's timing records.

    Args:
      records: `Records`, a run directory or JSONL path, or record dicts (as
        `Pacer.records()` returns).
      warmup_steps: steps excluded at the start (compilation, caches). Default:
        5, but at most a quarter of the steps.
      site: the collective site to analyze; default: the one with most records.
      topology_groups: rank groups for the locality test, either
        ``{kind: {rank: label}}`` (kinds like "numa", "nic", "host") or a flat
        ``{rank: label}``. Default: the headers' `topology.rank_groups`, plus
        hosts when ranks span several.
      expected_transfer_s: alpha-beta expectation of the collective's transfer
        time; transfer well above it counts as topology contention.

    Returns:
      A `Report`.

    Raises:
      RecordsError: unreadable records, or `site` not among them.

    >>> recs = synthetic_records(8, 60, late_rank=3, late_s=0.002, seed=0)
    >>> rep = analyze(recs)
    >>> rep.culprit, f"{rep.rank_stats(3).excess_lateness_s * 1e3:.0f} ms", rep.primary_mode
    (3, '2 ms', 'persistent_straggler')
    >>> analyze(synthetic_records(8, 60, seed=0)).culprit is None
    True
    """
    recs = load_records(records)
    if len(recs) == 0:
        raise RecordsError(
            f"no step records in {', '.join(recs.sources)} (headers only); the run stopped "
            "before its first measured collective."
        )
    site = _pick_site(recs, site)
    data, site_notes, site_partial = _site_data(recs, site)
    notes = list(recs.notes) + site_notes
    if len(recs.sites) > 1:
        notes.append(
            f"analyzed site `{site}`; the records also hold "
            f"{', '.join(f'`{s}`' for s in recs.sites if s != site)} (use `site=`)."
        )
    S, R = data.wait.shape
    if warmup_steps is None:
        warmup_steps = min(DEFAULT_WARMUP_STEPS, S // 4)
    if warmup_steps < 0:
        raise ValueError(f"`warmup_steps` must be >= 0, got {warmup_steps}.")
    after_warmup = data.steps >= data.steps[0] + warmup_steps
    if not after_warmup.any():
        notes.append(
            f"`warmup_steps`={warmup_steps} leaves no step of {S}; analyzed all steps instead."
        )
        after_warmup[:] = True
    iter_all = (
        np.median(data.step_time, axis=1) if R else np.full(S, np.nan)  # pragma: no cover
    )
    rows_w = np.flatnonzero(after_warmup)
    periodic = _periodic_outliers(
        data.steps[rows_w], iter_all[rows_w], data.wait[rows_w], data.ranks
    )
    use = after_warmup.copy()
    if periodic is not None:
        use &= ~np.isin(data.steps, periodic.steps)
        notes.append(
            f"{len(periodic.steps)} periodic slow steps (every {periodic.period} steps, "
            f"+{_ms(periodic.mean_extra_s)}; rank {periodic.dominant_rank} last in "
            f"{periodic.dominant_fraction:.0%} of them) look like periodic extra work "
            "(eval, checkpoint, logging), not a fabric problem; excluded from the ranking."
        )
    rows = np.flatnonzero(use)
    n = rows.size
    wait, lat = data.wait[rows], data.lateness[rows]
    comp = data.compute[rows]
    comp_rows = np.isfinite(comp).all(axis=1)
    compf = comp[comp_rows]

    # Iteration time.
    it = iter_all[rows]
    it = it[np.isfinite(it)]
    if it.size:
        mean_it, std_it = float(it.mean()), float(it.std(ddof=1)) if it.size > 1 else 0.0
        p50, p90, p99 = (float(v) for v in np.quantile(it, [0.5, 0.9, 0.99]))
    else:
        mean_it = std_it = p50 = p90 = p99 = math.nan
    iteration = IterationStats(
        num_steps=int(it.size),
        mean_s=mean_it,
        std_s=std_it,
        cv=std_it / mean_it if it.size and mean_it > 0 else math.nan,
        p50_s=p50,
        p90_s=p90,
        p99_s=p99,
    )
    amplification = (
        float(compf.max(axis=1).mean() / compf.mean())
        if compf.size and compf.mean() > 0
        else math.nan
    )

    # Culprit ranking with persistence.
    last = np.argmin(wait, axis=1)
    last_fraction = np.bincount(last, minlength=R) / max(n, 1)
    excess = lat - _median_of_others(lat)
    ex_mean = excess.mean(axis=0)
    ex_std = excess.std(axis=0, ddof=1) if n > 1 else np.zeros(R)
    half = _t95(n - 1) * ex_std / math.sqrt(n) if n > 1 else np.full(R, math.inf)
    ci_low, ci_high = ex_mean - half, ex_mean + half
    floor_terms = [20e-6]
    if math.isfinite(p50):
        floor_terms.append(0.01 * p50)
    if n > 1:
        floor_terms.append(0.25 * float(np.median(_robust_std(excess, axis=0))))
    noise_floor = max(floor_terms)
    late = (ci_low > 0) & (ex_mean > noise_floor)
    order = sorted(range(R), key=lambda i: (-last_fraction[i], -ex_mean[i], int(data.ranks[i])))
    ranking = tuple(int(data.ranks[i]) for i in order)

    def col_mean(a: np.ndarray) -> np.ndarray:
        return a.mean(axis=0) if a.shape[0] else np.full(R, np.nan)

    mean_compute = col_mean(compf)
    mean_delay = col_mean(data.delay[rows])
    mean_sync = col_mean(data.sync_wait[rows])
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
    procs = np.unique(data.processes)
    if culprit_i is None and procs.size < R and procs.size > 1:
        # Device granularity: a late process makes all its ranks late together, so
        # each of them is last only part of the time; judge the process as a unit.
        proc_idx = np.searchsorted(procs, data.processes)
        proc_last = np.bincount(proc_idx[last], minlength=procs.size) / max(n, 1)
        for pi in np.argsort(-proc_last, kind="stable"):
            members = np.flatnonzero(proc_idx == pi)
            if proc_last[pi] >= 0.5 and late[members].all():
                culprit_process = int(procs[pi])
                culprit_i = int(members[np.argmax(last_fraction[members])])
                notes.append(
                    f"process {culprit_process} is last in {proc_last[pi]:.0%} of steps: its "
                    f"ranks {_ranges(data.ranks[members])} are late together."
                )
                break
    culprit = int(data.ranks[culprit_i]) if culprit_i is not None else None

    # Failure modes.
    modes: dict[str, FailureMode] = {}
    top = order[0]
    if culprit_i is not None:
        rs = rank_stats[culprit_i]
        ev = (
            f"rank {rs.rank} ({rs.host}) arrived last in {rs.last_fraction:.0%} of {n} steps",
            f"excess lateness {_ms(rs.excess_lateness_s)} (95% CI {_ms(rs.ci_low_s)} to "
            f"{_ms(rs.ci_high_s)}); noise floor {_ms(noise_floor)}",
        )
        score = float(max(last_fraction[culprit_i], 0.5))
        modes["persistent_straggler"] = FailureMode("persistent_straggler", score, True, ev)
    else:
        lf_late = [last_fraction[i] for i in range(R) if late[i]]
        modes["persistent_straggler"] = FailureMode(
            "persistent_straggler",
            float(max(lf_late, default=0.0)) * 0.5,
            False,
            (
                f"most frequent last arriver: rank {ranking[0]} in {last_fraction[top]:.0%} of "
                f"{n} steps (uniform: {1 / max(R, 1):.0%}); needs >= 50% and a significant "
                f"excess lateness above {_ms(noise_floor)}",
            ),
        )

    groups = _normalize_groups(topology_groups, recs, data)
    mean_lat = lat.mean(axis=0) if n else np.zeros(R)
    best: tuple[float, list[str]] = (0.0, [])
    tested = []
    for kind, mapping in sorted(groups.items()):
        res = _locality(kind, mapping, data, mean_lat, noise_floor)
        if res is None:
            continue
        tested.append(kind)
        if res[0] > best[0] or not best[1]:
            best = res
    if not tested:
        if groups:
            why = (
                f"rank groups ({', '.join(sorted(groups))}) cannot separate ranks here: one "
                "group, one rank per group, or groups equal to processes"
            )
        else:
            why = (
                "no rank groups to test (pass `topology_groups=` or record "
                "`topology.rank_groups` in the headers)"
            )
        best = (0.0, [why])
    modes["locality"] = FailureMode("locality", float(best[0]), best[0] >= 0.5, tuple(best[1]))

    # Synchronization amplification: random culprits, heavy tail.
    if R >= 2 and compf.size:
        p_last = last_fraction[last_fraction > 0]
        randomness = max(float(-(p_last * np.log(p_last)).sum() / math.log(R)), 0.0)
        x = (compf / compf.mean(axis=1, keepdims=True)).ravel()
        sd = float(x.std())
        kurt = float(((x - x.mean()) ** 4).mean() / sd**4 - 3.0) if sd > 0 else 0.0
        amp_term = min(max((amplification - 1.0) / 0.2, 0.0), 1.0)
        tail_term = min(max(kurt / 3.0, 0.0), 1.0)
        score = max(amp_term * randomness * (0.5 + 0.5 * tail_term), 0.0)
        if culprit_i is not None:
            score *= 1.0 - last_fraction[culprit_i]
        detected = culprit_i is None and score >= 0.5 and amplification >= 1.1
        ev = (
            f"amplification {amplification:.3f}: the slowest rank's compute averages "
            f"{amplification - 1:.1%} above the mean",
            f"last arriver spread over ranks: normalized entropy {randomness:.2f} "
            "(1 = uniformly random)",
            f"per-rank compute excess kurtosis {kurt:.1f} (0 for a normal; large = heavy tail)",
        )
        modes["synchronization_amplification"] = FailureMode(
            "synchronization_amplification", float(score), bool(detected), ev
        )
    else:
        modes["synchronization_amplification"] = FailureMode(
            "synchronization_amplification",
            0.0,
            False,
            ("needs >= 2 ranks and consecutive steps",),
        )

    # Topology contention: transfer above alpha-beta, or growing over the run.
    tr = data.transfer[rows]
    tr_steps = data.steps[rows]
    ev_t: list[str] = []
    score_ab = score_trend = 0.0
    if n >= 2:
        med_tr = float(np.median(tr))
        ev_t.append(
            f"transfer (last arriver's wait) median {_ms(med_tr)}, "
            f"{med_tr / mean_it:.0%} of the step"
            if math.isfinite(mean_it) and mean_it > 0
            else f"transfer median {_ms(med_tr)}"
        )
        if expected_transfer_s:
            ratio = med_tr / expected_transfer_s
            score_ab = min(max(ratio - 1.0, 0.0), 1.0)
            ev_t.append(f"{ratio:.2f}x the alpha-beta expectation {_ms(expected_transfer_s)}")
        if n >= 10 and np.ptp(tr_steps) > 0 and tr.std() > 0:
            slope, icpt = np.polyfit(tr_steps.astype(float), tr, 1)
            r = float(np.corrcoef(tr_steps, tr)[0, 1])
            start = icpt + slope * tr_steps[0]
            growth = slope * float(np.ptp(tr_steps)) / start if start > 0 else 0.0
            if r * r >= 0.3:
                score_trend = min(max(growth / 0.5, 0.0), 1.0)
            ev_t.append(
                f"transfer changes {growth:+.0%} over the run (linear fit, r^2 = {r * r:.2f})"
            )
    else:
        ev_t.append("too few steps")
    score_c = float(max(score_ab, score_trend))
    modes["topology_contention"] = FailureMode(
        "topology_contention", score_c, score_c >= 0.5, tuple(ev_t)
    )
    others = [modes[k] for k in FAILURE_MODES[:-1]]
    any_detected = any(m.detected for m in others)
    modes["balanced"] = FailureMode(
        "balanced",
        float(1.0 - max(m.score for m in others)),
        not any_detected,
        (
            "no failure mode stands out"
            if not any_detected
            else "not balanced: " + ", ".join(m.name for m in others if m.detected),
        ),
    )
    failure_modes = tuple(modes[k] for k in FAILURE_MODES)
    detected = [m for m in others if m.detected]
    primary = max(detected, key=lambda m: m.score).name if detected else "balanced"

    # What-if and forecast.
    what_if = None
    if compf.size and R >= 2 and math.isfinite(mean_it):
        wi = culprit_i if culprit_i is not None else top
        t = data.transfer[rows][comp_rows]
        model = compf.max(axis=1) + t
        alt = compf.copy()
        alt[:, wi] = np.median(compf, axis=1)
        alt_step = alt.max(axis=1) + t
        saving = float(model.mean() - alt_step.mean())
        what_if = WhatIf(
            rank=int(data.ranks[wi]),
            is_culprit=culprit_i is not None,
            measured_step_s=mean_it,
            model_step_s=float(model.mean()),
            what_if_step_s=mean_it - saving,
            saving_s=saving,
            saving_fraction=saving / mean_it if mean_it > 0 else math.nan,
        )
    forecast = None
    if compf.size and R >= 2 and np.all(compf > 0):
        x = (compf / compf.mean(axis=1, keepdims=True)).ravel()
        emp = _empirical_max_ratio(x, (*FORECAST_RANKS, R))
        sigma = float(np.log(x).std())
        logn = _lognormal_max_ratio(sigma, FORECAST_RANKS)
        forecast = Forecast(
            method=(
                "exact expected maximum of N i.i.d. draws from the empirical per-rank "
                "compute distribution (each step normalized by its mean); lognormal fit "
                "alongside"
            ),
            ranks=FORECAST_RANKS,
            amplification=tuple(emp[:-1]),
            lognormal_amplification=tuple(logn),
            sigma_log=sigma,
            measured_ranks=R,
            measured_amplification=amplification,
            forecast_at_measured=emp[-1],
        )
        if culprit is not None:
            notes.append(
                f"the forecast treats culprit rank {culprit} as one draw in {R} of the "
                "compute distribution (a chance per rank), so it can sit below the "
                "measured amplification; fix the culprit first."
            )

    # Pacing effect.
    pacing = None
    base = after_warmup & ~(np.isin(data.steps, periodic.steps) if periodic else False)
    eng_rows = np.flatnonzero(base & data.engaged)
    un_rows = np.flatnonzero(base & ~data.engaged)
    if eng_rows.size and un_rows.size:

        def cv(x: np.ndarray) -> float:
            x = x[np.isfinite(x)]
            return float(x.std(ddof=1) / x.mean()) if x.size > 1 and x.mean() > 0 else math.nan

        pacing = PacingEffect(
            engaged_steps=int(eng_rows.size),
            unengaged_steps=int(un_rows.size),
            engaged_step_s=_mean(iter_all[eng_rows]),
            unengaged_step_s=_mean(iter_all[un_rows]),
            engaged_cv=cv(iter_all[eng_rows]),
            unengaged_cv=cv(iter_all[un_rows]),
            engaged_sync_wait_s=float(data.sync_wait[eng_rows].mean()),
            unengaged_sync_wait_s=float(data.sync_wait[un_rows].mean()),
            engaged_delay_s=float(data.delay[eng_rows].mean()),
            unengaged_delay_s=float(data.delay[un_rows].mean()),
        )

    return Report(
        run_id=recs.run_id,
        site=site,
        sites=recs.sites,
        granularity=recs.granularity,
        num_ranks=R,
        num_processes=int(procs.size),
        num_steps=S,
        warmup_steps=int(warmup_steps),
        analyzed_steps=int(n),
        partial=bool(recs.partial or site_partial),
        notes=tuple(notes),
        iteration=iteration,
        amplification=amplification,
        ranks=rank_stats,
        ranking=ranking,
        culprit=culprit,
        culprit_process=culprit_process,
        noise_floor_s=float(noise_floor),
        failure_modes=failure_modes,
        primary_mode=primary,
        periodic=periodic,
        what_if=what_if,
        forecast=forecast,
        pacing=pacing,
        data=data,
    )


# --------------------------------------------------------------------------- outputs


def _summary_renderable(report: Report, max_ranks: int = 12) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = []
    title = f"jaxpace report: run `{report.run_id}`, site `{report.site}`"
    if report.partial:
        parts.append(Text("PARTIAL REPORT: input was incomplete (see notes)", style="bold red"))
    it = report.iteration
    t = Table(title=title, show_header=False)
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("ranks / processes", f"{report.num_ranks} / {report.num_processes}")
    t.add_row(
        "steps (complete / warm-up / analyzed)",
        f"{report.num_steps} / {report.warmup_steps} / {report.analyzed_steps}",
    )
    t.add_row("iteration mean (CV)", f"{_ms(it.mean_s)} ({it.cv:.3f})")
    t.add_row("iteration p50 / p90 / p99", f"{_ms(it.p50_s)} / {_ms(it.p90_s)} / {_ms(it.p99_s)}")
    t.add_row("synchronization amplification", f"{report.amplification:.3f}")
    t.add_row("primary failure mode", report.primary_mode)
    if report.culprit is not None:
        rs = report.rank_stats(report.culprit)
        t.add_row(
            "culprit",
            f"rank {rs.rank} (process {rs.process}, {rs.host}): +{_ms(rs.excess_lateness_s)}, "
            f"last in {rs.last_fraction:.0%}",
        )
    else:
        t.add_row("culprit", "none (no persistent straggler)")
    if report.what_if is not None:
        w = report.what_if
        t.add_row(
            f"what if rank {w.rank} were median",
            f"{_ms(w.what_if_step_s)} per step ({w.saving_fraction:.1%} faster)",
        )
    parts.append(t)

    rt = Table(title="Culprit ranking (after warm-up; times in ms)")
    for col in ("rank", "host", "last", "excess", "95% CI", "compute", "sync wait", "delay"):
        rt.add_column(col, justify="left" if col == "host" else "right")
    by_rank = {r.rank: r for r in report.ranks}

    def ms(x: float) -> str:
        return f"{x * 1e3:.3g}" if math.isfinite(x) else "n/a"

    for rank in report.ranking[:max_ranks]:
        r = by_rank[rank]
        rt.add_row(
            f"{r.rank}{' *' if r.late else ''}",
            r.host,
            f"{r.last_fraction:.0%}",
            ms(r.excess_lateness_s),
            f"[{ms(r.ci_low_s)}, {ms(r.ci_high_s)}]",
            ms(r.compute_s),
            ms(r.sync_wait_s),
            ms(r.delay_s),
        )
    rt.caption = "* = significantly late (CI excludes 0, above the noise floor)"
    if len(report.ranking) > max_ranks:
        rt.caption += f"; {len(report.ranking) - max_ranks} more ranks in the JSON/HTML report"
    parts.append(rt)

    ft = Table(title="Failure modes")
    ft.add_column("mode")
    ft.add_column("score", justify="right")
    ft.add_column("detected")
    ft.add_column("evidence")
    for m in report.failure_modes:
        ft.add_row(m.name, f"{m.score:.2f}", "yes" if m.detected else "", "\n".join(m.evidence))
    parts.append(ft)

    if report.forecast is not None:
        fc = report.forecast
        st = Table(title="Amplification forecast (order statistics)")
        st.add_column("ranks", justify="right")
        st.add_column("empirical", justify="right")
        st.add_column("lognormal", justify="right")
        for n, a, b in zip(fc.ranks, fc.amplification, fc.lognormal_amplification, strict=True):
            st.add_row(str(n), f"{a:.3f}", f"{b:.3f}")
        st.caption = (
            f"measured {fc.measured_amplification:.3f} at {fc.measured_ranks} ranks "
            f"(forecast there {fc.forecast_at_measured:.3f})"
        )
        parts.append(st)
    if report.pacing is not None:
        p = report.pacing
        pt = Table(title="Pacing effect")
        header, *rows = pacing_table(p)
        for i, col in enumerate(header):
            pt.add_column(col, justify="right" if i else "left")
        for row in rows:
            pt.add_row(*row)
        parts.append(pt)
    if report.notes:
        parts.append(Text("Notes:\n" + "\n".join(f"- {n}" for n in report.notes)))
    return Group(*parts)


def print_summary(report: Report, console: Any = None) -> None:
    """Prints the summary tables to `console` (a `rich.console.Console`; default stdout).

    >>> import io
    >>> from rich.console import Console
    >>> buf = io.StringIO()
    >>> print_summary(analyze(synthetic_records(4, 20)), Console(file=buf, width=120))
    >>> "Culprit ranking" in buf.getvalue()
    True
    """
    if console is None:
        from rich.console import Console

        console = Console()
    console.print(report.summary_table())


def write_json(report: Report, path: str | os.PathLike) -> Path:
    """Writes `report.to_json()` to `path` and returns the path."""
    p = Path(path)
    p.write_text(report.to_json() + "\n")
    return p


def write_html(report: Report, path: str | os.PathLike) -> Path:
    """Writes a self-contained HTML report (inline SVG plots, no scripts) to `path`.

    Plots: per-rank lateness heat map, phase breakdown per rank, step-time
    histogram, amplification forecast.
    """
    from jaxpace._report_html import render_html

    p = Path(path)
    p.write_text(render_html(report), encoding="utf-8")
    return p


def write_trace(
    records_or_report: Report | Records | str | os.PathLike | Iterable[Mapping[str, Any]],
    path: str | os.PathLike,
    *,
    site: str | None = None,
    max_steps: int | None = None,
) -> Path:
    """Writes a Perfetto / Chrome trace-event JSON, one track per rank.

    Each rank's steps show `compute`, `pacing sleep`, `sync wait` and
    `transfer`. Clocks of different processes are never compared: every rank is
    placed on a common axis on which step k's collective exit (`done`) happens at
    the same instant for all ranks, namely the cumulative median (over ranks)
    step time; each rank's phases are laid out backwards from that instant using
    its own durations. Open it at ui.perfetto.dev or chrome://tracing.

    Args:
      records_or_report: a `Report` (uses its site) or anything `load_records` reads.
      path: output file.
      site: site to draw (records input only; default: the one with most records).
      max_steps: draw at most this many steps (the first ones). Default: as
        many as keep the trace near 400k events (all steps of small runs).

    Returns:
      The path written.
    """
    from jaxpace._report_trace import trace_events

    if isinstance(records_or_report, Report):
        data = records_or_report.data
        if data is None:
            raise ValueError("this `Report` has no per-step data (was it loaded from JSON?).")
        label = records_or_report.site
    else:
        recs = load_records(records_or_report)
        if len(recs) == 0:
            raise RecordsError("no step records to draw (headers only).")
        site = _pick_site(recs, site)
        data, _, _ = _site_data(recs, site)
        label = site
    p = Path(path)
    with open(p, "w") as f:
        json.dump(trace_events(data, label, max_steps=max_steps), f, separators=(",", ":"))
    return p


# --------------------------------------------------------------------------- command line


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Adds the `jaxpace report` arguments to `parser`."""
    parser.add_argument("run_dir", help="run directory of `records-p*.jsonl` files, or one file")
    parser.add_argument("--html", help="HTML report path (default: RUN_DIR/report.html)")
    parser.add_argument("--trace", help="Perfetto trace path (default: RUN_DIR/trace.json)")
    parser.add_argument("--json", help="also write the report as JSON to this path")
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        help=f"steps to skip at the start (default {DEFAULT_WARMUP_STEPS}, at most a quarter)",
    )
    parser.add_argument("--site", help="collective site to analyze (default: the busiest)")
    parser.add_argument(
        "--expected-transfer-ms",
        type=float,
        default=None,
        help="alpha-beta expectation of the collective's transfer time, for contention",
    )


def cli_main(args: argparse.Namespace) -> int:
    """Runs `jaxpace report`; returns the exit code (2 for unusable records)."""
    try:
        report = analyze(
            args.run_dir,
            warmup_steps=args.warmup,
            site=args.site,
            expected_transfer_s=(
                args.expected_transfer_ms / 1e3
                if getattr(args, "expected_transfer_ms", None)
                else None
            ),
        )
        print_summary(report)
        base = Path(args.run_dir)
        out_dir = base if base.is_dir() else base.parent
        html = write_html(report, args.html or out_dir / "report.html")
        trace = write_trace(report, args.trace or out_dir / "trace.json")
        written = [html, trace]
        if args.json:
            written.append(write_json(report, args.json))
    except (RecordsError, ValueError) as e:
        print(f"jaxpace report: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(
            f"jaxpace report: error: cannot write output ({e.strerror or e}: "
            f"{e.filename}). Pass writable paths with --html/--trace/--json.",
            file=sys.stderr,
        )
        return 2
    print("wrote " + ", ".join(str(w) for w in written))
    return 0
