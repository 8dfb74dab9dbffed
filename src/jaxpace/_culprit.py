"""One definition of a culprit, shared by the report and the runtime's live view (NumPy only).

A rank is a *culprit* only when both tests say so, and its lateness is above
the noise floor:

1. **Late against per-step noise.** `d`, its mean excess lateness minus the
   median rank's, divided by the batch-means error of that mean (`z`), is
   significant (one-sided Student t, Holm over every rank, family-wise
   `ALPHA`); or, for jobs of a few ranks with heavy-tailed noise, it arrives
   last significantly more often than the 1/R of chance (same correction).
   Over hundreds of steps any persistent difference passes this test.
2. **An outlier of the fleet.** Healthy devices differ persistently by a few
   percent, so the fleet's own per-rank spread is the yardstick: the rank's
   mean lateness is more than `fleet_threshold(R)` robust standard deviations
   (`fleet_spread`) above the fleet's median. The threshold grows with R so
   that a healthy, normally spread fleet names anybody with probability at
   most `ALPHA`, at every rank count. Below `FLEET_MIN_MEMBERS` ranks a robust
   spread means little; a rank must then be an outlier of the others' mean
   and SD (a leave-one-out t test, from 4 ranks) or later than the median of
   the others by more than `SMALL_JOB_STEP_FRACTION` of the median step
   (healthy devices of one kind differ by 0.5-3%).

Groups (host, NUMA node, NIC, switch, process) take test 2 against the spread
of the groups of their kind (`fleet_test` on group means).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading

import numpy as np

from jaxpace._stats import batch_means_se, holm, median_of_others, robust_std, t95, t_isf, t_sf

__all__ = [
    "ALPHA",
    "FLEET_MIN_MEMBERS",
    "SMALL_JOB_STEP_FRACTION",
    "Decision",
    "FleetTest",
    "LatestCounts",
    "decide",
    "decide_earliness",
    "fleet_spread",
    "fleet_test",
    "fleet_threshold",
    "last_arrivals",
    "lateness_from_earliness",
    "noise_floor",
]

# Family-wise error rate of one report: the chance, on a healthy run, that any
# rank (or, separately, any group) is named.
ALPHA = 1e-3
# Fewest ranks (or groups) whose spread the fleet test estimates.
FLEET_MIN_MEMBERS = 16
# Below that: later than the others' median by more than this share of the median step.
SMALL_JOB_STEP_FRACTION = 0.05
# Values farther than this many MAD-SDs from the median are left out of the spread.
_TRIM_SDS = 3.5
_TRIM_CONSISTENCY = 0.9914  # the SD of a standard normal truncated at +-3.5


@functools.lru_cache(maxsize=256)
def fleet_threshold(count: int, alpha: float = ALPHA) -> float:
    """Robust SDs above the fleet median beyond which one of `count` members is an outlier.

    `sqrt(1 + 1.571 / R) * t_isf(alpha / R, nu)` with `nu = max((R - 1) / 2, R - 33)`:
    Bonferroni over the R members, Student t for the error of the estimated
    spread (its effective degrees of freedom reduced at small R, where the
    trimming also removes good values), and the error of the median. Checked
    by simulation of normal fleets: family-wise rate <= `alpha` from 16 to
    4096 members (docs/diagnostics.md). Range: > 0; at alpha 0.001 (the
    default) about 7.6 at 16 members, 4.9 at 64, 4.7 at 512, 5.0 at 4096.

    >>> [round(fleet_threshold(r), 1) for r in (16, 64, 512, 4096)]
    [7.6, 4.9, 4.7, 5.0]
    """
    R = max(int(count), 2)
    nu = max((R - 1) / 2, R - 33.0)
    return math.sqrt(1.0 + 1.571 / R) * t_isf(alpha / R, nu)


def fleet_spread(values: np.ndarray) -> tuple[float, float]:
    """(median, robust standard deviation) of per-member values, seconds.

    The SD of the values within 3.5 MAD-SDs of the median (so that a few
    stragglers do not widen it), divided by 0.9914 (the SD of a normal
    truncated there); the MAD-SD itself when that leaves fewer than 3 values.
    """
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return math.nan, math.nan
    med = float(np.median(v))
    mad = float(robust_std(v))
    keep = v[np.abs(v - med) <= _TRIM_SDS * mad] if mad > 0 else v[v == med]
    if keep.size < 3:
        return med, mad
    return med, float(keep.std(ddof=1)) / _TRIM_CONSISTENCY


@dataclasses.dataclass(frozen=True)
class FleetTest:
    """Test 2: which members are outliers of the fleet's own spread.

    Attributes:
      rule: `"fleet spread"` (at least `FLEET_MIN_MEMBERS` members) or
        `"small job"` (fewer: later than the others by a share of the step).
      center_s, spread_s: median and robust SD of the members' mean lateness.
      distance: per member, (mean - median) / robust SD: how far above the
        fleet it is, in robust SDs (any real number; inf when the spread is 0);
        for a small job, in SDs of the other members (leave one out).
      threshold: the distance an outlier exceeds (`fleet_threshold`, or for a
        small job the leave-one-out t test's Bonferroni threshold; inf below 4
        members). A small job's member is also an outlier when it is later than
        the others' median by `SMALL_JOB_STEP_FRACTION` of the median step.
      over_others_s: per member, its mean minus the median of the others'.
      outlier: per member, whether it passes the test.
    """

    rule: str
    center_s: float
    spread_s: float
    distance: np.ndarray
    threshold: float
    over_others_s: np.ndarray
    outlier: np.ndarray


def fleet_test(means: np.ndarray, step_s: float, alpha: float = ALPHA) -> FleetTest:
    """Test 2 on per-member mean lateness (`means`, seconds); `step_s` is the median step."""
    m = np.asarray(means, dtype=np.float64)
    R = m.size
    center, spread = fleet_spread(m)
    with np.errstate(divide="ignore", invalid="ignore"):
        dist = np.where(spread > 0, (m - center) / spread, np.sign(m - center) * np.inf)
    dist = np.nan_to_num(dist, nan=0.0)
    others = m - median_of_others(m[None, :])[0] if R >= 2 else np.zeros(R)
    if R >= FLEET_MIN_MEMBERS:
        q = fleet_threshold(R, alpha)
        return FleetTest("fleet spread", center, spread, dist, q, others, dist > q)
    # Few members: each against the mean and SD of the others (exact for a normal
    # spread, Bonferroni over the members), or later than the others by a share of the step.
    t, q = _leave_one_out(m, alpha)
    ok = math.isfinite(step_s) and step_s > 0
    by_step = others > SMALL_JOB_STEP_FRACTION * step_s if ok else np.zeros(R, bool)
    return FleetTest("small job", center, spread, t, q, others, (t > q) | by_step)


def _leave_one_out(m: np.ndarray, alpha: float) -> tuple[np.ndarray, float]:
    """Per member, (m_i - mean of the others) / (SD of the others x sqrt(1 + 1/(R-1))), which
    is Student t with R - 2 degrees of freedom for a normal spread; and its Bonferroni
    threshold. Below 4 members: zeros and inf (no spread to estimate)."""
    R = m.size
    if R < 4:
        return np.zeros(R), math.inf
    s1, s2 = m.sum(), (m * m).sum()
    mu = (s1 - m) / (R - 1)
    var = np.maximum((s2 - m * m - (R - 1) * mu * mu) / (R - 2), 0.0)
    scale = np.sqrt(var * (1.0 + 1.0 / (R - 1)))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(scale > 0, (m - mu) / scale, np.sign(m - mu) * np.inf)
    return np.nan_to_num(t, nan=0.0), _t_isf_cached(alpha / R, R - 2)


@functools.lru_cache(maxsize=256)
def _t_isf_cached(p: float, df: float) -> float:
    return t_isf(p, df)


def noise_floor(excess: np.ndarray, p50_s: float) -> float:
    """Excess lateness below this is not called late: max(20 us, 1% of p50, MAD term)."""
    terms = [20e-6]
    if math.isfinite(p50_s):
        terms.append(0.01 * p50_s)
    if excess.shape[0] > 1:
        terms.append(0.25 * float(np.median(robust_std(excess, axis=0))))
    return max(terms)


def _last_arrival_p(last: np.ndarray, R: int, n: int) -> np.ndarray:
    """Per rank, the one-sided p-value that it is last more often than chance (1/R).

    The indicator "rank i arrived last" is averaged in batches of consecutive
    steps (as for the mean excess), so an episode that keeps one rank last for
    several steps widens the error instead of faking persistence.
    """
    if n < 2 or R < 2:
        return np.ones(R)
    hits = np.zeros((n, R))
    hits[np.arange(n), last] = 1.0
    se, df = batch_means_se(hits)
    if df < 1:
        return np.ones(R)
    # A floor on the error: the binomial one of a rank last by chance.
    se = np.maximum(se, math.sqrt((1.0 / R) * (1.0 - 1.0 / R) / n))
    return t_sf((hits.mean(axis=0) - 1.0 / R) / se, df)


def last_arrivals(lateness: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(last rank index per step, steps each rank arrived last, steps it was in the latest 1%).

    The last arriver has the largest lateness. The latest 1% of a step is its
    `max(1, ceil(R / 100))` latest ranks; NaN (a rank not measured) never counts.
    """
    n, R = lateness.shape
    if n == 0 or R == 0:
        return np.zeros(0, int), np.zeros(R, np.int64), np.zeros(R, np.int64)
    lat = np.where(np.isfinite(lateness), -lateness, np.inf)  # smallest first = latest
    last = np.argmin(lat, axis=1)
    k = max(1, math.ceil(R / 100))
    top = np.argpartition(lat, k - 1, axis=1)[:, :k] if k < R else np.tile(np.arange(R), (n, 1))
    ok = np.isfinite(np.take_along_axis(lateness, top, axis=1))
    top_counts = np.bincount(top[ok], minlength=R).astype(np.int64)
    seen = np.isfinite(lat[np.arange(n), last])
    return last, np.bincount(last[seen], minlength=R).astype(np.int64), top_counts


def lateness_from_earliness(earliness: np.ndarray) -> np.ndarray:
    """(steps, R) lateness `max_j w_j - w_i` from the exchanged earliness `w_i - min_j w_j`."""
    e = np.asarray(earliness, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return np.nanmax(np.where(np.isfinite(e), e, -np.inf), axis=1, keepdims=True) - e


@dataclasses.dataclass(frozen=True)
class Decision:
    """Who is late, per rank (arrays of length R, in the order of the input's columns).

    Attributes:
      n: steps analyzed; df: degrees of freedom of the batch-means t test.
      excess: (n, R) per-step excess lateness (lateness minus the median of the others').
      mean_excess: per rank, its mean over steps, seconds.
      d: mean excess minus the median rank's, seconds (the tested lateness).
      se: the batch-means standard error of `d`, seconds; ci_low/ci_high: d -+ t95 x se.
      z: d / se (test 1's statistic; any real number, >= 5 is overwhelming).
      p_adjusted: test 1's one-sided p-value from `z`, Holm-adjusted over ranks, in [0, 1].
      last_p_adjusted: the last-arrival test's, Holm-adjusted, in [0, 1].
      fleet: test 2 (`FleetTest`) on the per-rank mean excess.
      floor_s: the noise floor; late: both tests pass and d > floor.
      last, last_counts, top_counts: `last_arrivals` of the analyzed steps.
    """

    n: int
    df: int
    excess: np.ndarray
    mean_excess: np.ndarray
    d: np.ndarray
    se: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    z: np.ndarray
    p_adjusted: np.ndarray
    last_p_adjusted: np.ndarray
    fleet: FleetTest
    floor_s: float
    late: np.ndarray
    last: np.ndarray
    last_counts: np.ndarray
    top_counts: np.ndarray

    @property
    def culprits(self) -> tuple[int, ...]:
        """Column indices of the late ranks, latest (largest `d`) first."""
        idx = np.flatnonzero(self.late)
        return tuple(int(i) for i in idx[np.argsort(-self.d[idx], kind="stable")])


def _lateness_test(excess: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Test 1: (d, its standard error, degrees of freedom) against per-step noise.

    `d_i` = mean excess of rank i minus the median over ranks of the mean
    excess (so a heavy tail shared by every rank cancels). Its variance is the
    batch-means error of rank i plus the error of the median itself; the
    between-rank spread is test 2's business.
    """
    n, R = excess.shape
    m = excess.mean(axis=0)
    d = m - np.median(m)
    se, df = batch_means_se(excess)
    if df < 1:
        return d, np.full(R, np.inf), 0
    med_se2 = float(np.median(se**2))
    return d, np.sqrt(se**2 + 1.571 * med_se2 / R), df


def decide(lateness: np.ndarray, step_s: float, alpha: float = ALPHA) -> Decision:
    """The culprit decision on (steps, ranks) lateness (`max_j wait_j - wait_i`, seconds).

    Args:
      lateness: one row per analyzed step, one column per rank.
      step_s: the median step time (seconds; NaN when unknown), for the noise
        floor and the small-job rule.
      alpha: the family-wise error rate.
    """
    lat = np.asarray(lateness, dtype=np.float64)
    n, R = lat.shape
    excess = lat - median_of_others(lat) if n and R else np.zeros((n, R))
    mean_ex = excess.mean(axis=0) if n else np.zeros(R)
    last, last_counts, top_counts = last_arrivals(lat)
    if n >= 2 and R >= 2:
        d, se, df = _lateness_test(excess)
    else:
        d, se, df = mean_ex - (np.median(mean_ex) if R else 0.0), np.full(R, np.inf), 0
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(se > 0, d / se, np.where(d > 0, np.inf, 0.0))
    z = np.where(np.isfinite(se), z, 0.0)
    p = t_sf(z, df) if df >= 1 else np.ones(R)
    half = t95(df) * se if df >= 1 else np.full(R, np.inf)
    p_adj, last_p_adj = holm(p), holm(_last_arrival_p(last, R, n))
    floor = noise_floor(excess, step_s) if n else 20e-6
    fleet = fleet_test(mean_ex, step_s, alpha)
    late = ((p_adj < alpha) | (last_p_adj < alpha)) & fleet.outlier & (d > floor)
    return Decision(
        n=n, df=df, excess=excess, mean_excess=mean_ex, d=d, se=se, ci_low=d - half,
        ci_high=d + half, z=z, p_adjusted=p_adj, last_p_adjusted=last_p_adj, fleet=fleet,
        floor_s=float(floor), late=late, last=last, last_counts=last_counts,
        top_counts=top_counts,
    )  # fmt: skip


def decide_earliness(
    earliness: np.ndarray, step_times_s: np.ndarray, alpha: float = ALPHA
) -> Decision | None:
    """`decide` over a window of exchanged earliness vectors: the runtime's live view.

    Args:
      earliness: (steps, R) rows of `w_i - min_j w_j` in step order, as the
        in-band exchange delivers them; rows missing a rank (NaN) are left out,
        as the report analyzes complete steps only.
      step_times_s: (steps,) the exchanged median step time of each row (NaN
        when unknown).
      alpha: the family-wise error rate.

    Returns:
      The decision, or None with fewer than 2 complete rows.
    """
    e = np.asarray(earliness, dtype=np.float64)
    if e.ndim != 2 or e.shape[1] == 0:
        return None
    ok = np.isfinite(e).all(axis=1)
    if ok.sum() < 2:
        return None
    st = np.asarray(step_times_s, dtype=np.float64).reshape(-1)[ok]
    step = float(np.median(st[np.isfinite(st)])) if np.isfinite(st).any() else math.nan
    return decide(lateness_from_earliness(e[ok]), step, alpha)


class LatestCounts:
    """Per rank, exchanged steps in which it arrived last and among the latest 1%, over a run.

    `add` takes each step's earliness vector once (later calls for the same or
    an older step, from a process's other ranks, are ignored); thread-safe.
    """

    def __init__(self, num_slots: int) -> None:
        self.last = np.zeros(int(num_slots), np.int64)
        self.top = np.zeros(int(num_slots), np.int64)
        self.steps = 0
        self._step = -1
        self._lock = threading.Lock()

    def add(self, step: int, earliness: np.ndarray) -> None:
        """Counts `step`'s last arrivers from its earliness (the last arriver has 0)."""
        with self._lock:
            if step <= self._step:
                return
            self._step = int(step)
            e = np.asarray(earliness, dtype=np.float64).reshape(-1)
            fin = np.isfinite(e)
            if not fin.any():
                return
            e = np.where(fin, e, np.inf)  # the last arriver has the smallest earliness
            i = int(np.argmin(e))
            self.last[i] += 1
            k = max(1, math.ceil(e.size / 100))
            if k == 1:
                self.top[i] += 1
            else:
                idx = np.argpartition(e, k - 1)[:k]
                self.top[idx[fin[idx]]] += 1
            self.steps += 1
