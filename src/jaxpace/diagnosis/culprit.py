"""One definition of a culprit, shared by the report and the runtime's live view (NumPy and SciPy).

A rank is a *culprit* only when all three tests say so, and its lateness is
above the noise floor:

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
   that a healthy fleet (lognormal spread up to `HEALTHY_SIGMA`) names anybody
   with probability at most `ALPHA`, at every rank count. Below
   `FLEET_MIN_MEMBERS` ranks a robust spread means little. From 4 ranks, sorted
   latest first, each of the latest `(R - 1) // 2` is tested against the mean
   and SD of the ranks *below* it, and the latest j+1 are outliers when stage j
   (or a later one) exceeds its threshold (a one-sided generalized ESD test:
   several stragglers do not hide each other); the per-stage thresholds
   (`SMALL_JOB_THRESHOLDS`) are calibrated by simulation of normal fleets for a
   family-wise `ALPHA`. At any small R a rank is also an outlier when it is
   later than the others' median by more than `SMALL_JOB_STEP_FRACTION` of the
   median step, beyond what a healthy fleet whose devices differ by up to 5%
   (lognormal sigma, `HEALTHY_SIGMA`) reaches; at 2-3 ranks that is the only
   rule.
3. **Late throughout a short run.** Below `CONSISTENCY_MAX_STEPS` analyzed
   steps, split into `CONSISTENCY_BLOCKS` consecutive
   blocks of steps (from `CONSISTENCY_MIN_STEPS` steps per block), the rank's
   lateness is above the noise floor in every block and no block is
   significantly less late than the others (`consistent`; a persistent
   straggler fails this with probability at most `CONSISTENCY_MISS`). With
   fewer than 60 steps the batch-means error of test 1 has one step per batch,
   so a multi-step episode (a device thread descheduled for a stretch of a
   short run on a loaded host) looks like persistent evidence; and where the
   per-step noise is large against the step, the step rule of test 2 is
   passed by the noise in a short run's means alone. Neither is a straggler;
   a persistent one is late in every part of the run. From
   `CONSISTENCY_MAX_STEPS` steps batch means hold two or more steps per batch
   and test 3 is not applied, so a rank that turns slow partway through a long
   run is still named.

Groups (host, NUMA node, NIC, switch, process; `group_partitions`) take the
same three tests in `decide_groups`: test 1 on the group's per-step lateness
over the other ranks (Holm over every group of every kind), test 2 against the
spread of the groups of their kind (`fleet_test` on group means), test 3 on
that per-step lateness; `decide` (ranks) and `decide_groups` share test 1's
statistic (`_t_test`) and the rule that joins the tests (`_evidence`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
from collections.abc import Mapping

import numpy as np

from jaxpace.diagnosis.persistence import (
    CONSISTENCY_BLOCKS,
    CONSISTENCY_MAX_STEPS,
    CONSISTENCY_MIN_STEPS,
    CONSISTENCY_MISS,
    consistent,
    short_run_consistent,
)
from jaxpace.diagnosis.stats import (
    batch_means_se,
    holm,
    median_of_others,
    robust_std,
    t95,
    t_isf,
    t_sf,
)

__all__ = [
    "ALPHA",
    "WATCH_ALPHA",
    "CONSISTENCY_BLOCKS",
    "CONSISTENCY_MAX_STEPS",
    "CONSISTENCY_MIN_STEPS",
    "CONSISTENCY_MISS",
    "FLEET_MIN_MEMBERS",
    "HEALTHY_SIGMA",
    "SMALL_JOB_STEP_FRACTION",
    "Decision",
    "consistent",
    "short_run_consistent",
    "FleetTest",
    "LatestCounts",
    "LateGroup",
    "decide",
    "decide_earliness",
    "decide_groups",
    "group_partitions",
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
# The widest spread a healthy fleet has (../shared/SIMULATION.md, "A healthy fleet"):
# per-rank speed factors lognormal with sigma up to 0.05 (same-SKU devices differ by a
# few percent in steady state), no rank more than 1.2x the median. Both lines below
# are drawn for that fleet, so that naming anybody in it stays at ALPHA.
HEALTHY_SIGMA = 0.05
# Below FLEET_MIN_MEMBERS, also: later than the others' median by more than this share
# of the median step. The largest rank's lead over the others' median in a healthy
# fleet at HEALTHY_SIGMA reaches its 1 - ALPHA quantile at 23.1% of the step's compute
# at 2 ranks, 22.5% at 3 and 21.4-22.3% from 4 to 15, normal or lognormal capped at
# 1.2x (benchmarks/small_job_calibration.py); 0.24 leaves room for the per-step noise
# in a short run's means (2% a step over 20 steps widens a 5% spread to 5.02%). Drawn
# for a 2% spread the line was 10%, which healthy fleets up to 5% crossed in 2.7% of
# 8-rank runs (the accuracy benchmark).
SMALL_JOB_STEP_FRACTION = 0.24
# The small-job test's per-stage thresholds at ALPHA, R = 4..15 members
# (`python -m benchmarks.small_job_calibration`: 2,000,000 normal fleets per R,
# each stage at SMALL_JOB_MARGIN x ALPHA / stages).
SMALL_JOB_THRESHOLDS: dict[int, tuple[float, ...]] = {
    4: (47.39,),
    5: (22.73, 54.38),
    6: (13.88, 18.65),
    7: (11.41, 12.68, 19.37),
    8: (9.67, 9.24, 11.27),
    9: (8.59, 7.87, 8.54, 11.44),
    10: (8.04, 6.92, 7.09, 8.28),
    11: (7.63, 6.43, 6.36, 6.81, 8.14),
    12: (7.16, 5.97, 5.74, 5.96, 6.56),
    13: (7.05, 5.66, 5.37, 5.42, 5.79, 6.63),
    14: (6.68, 5.41, 5.04, 4.99, 5.12, 5.58),
    15: (6.59, 5.33, 4.87, 4.71, 4.85, 5.07, 5.51),
}
# A stricter level for watch's fleet line (test 2; `jaxpace.watch.decide.FLEET_LEVEL`;
# test 1 stays at ALPHA: 1e-4 was too strict for a 2nd window's 10 steps on a noisy CPU
# job). A report decides once; watch decides window after window, about 7,500 times a
# job-week at its default cadence, and the healthy fleets' static outliers that ALPHA's
# line names in 0.10-0.14% of 8-device fleets were named again and again: 9.3e-5 false
# alarms a window at 8 processes where one a job-week needed 6.6e-5 at the 0.5% cadence
# (1.3e-4 at today's 0.25%; docs/diagnostics.md, "Watch's false alarms").
WATCH_ALPHA = 1e-4
# The same thresholds at WATCH_ALPHA (`python -m benchmarks.small_job_calibration
# --alpha 1e-4 --fleets 4000000`).
SMALL_JOB_THRESHOLDS_WATCH: dict[int, tuple[float, ...]] = {
    4: (152.83,),
    5: (48.83, 167.81),
    6: (24.65, 39.22),
    7: (18.44, 22.47, 44.18),
    8: (14.22, 15.18, 19.61),
    9: (12.45, 11.70, 14.06, 20.39),
    10: (11.09, 9.74, 10.80, 13.41),
    11: (10.15, 8.59, 9.10, 9.82, 13.02),
    12: (9.20, 7.89, 7.79, 8.30, 9.52),
    13: (9.12, 7.45, 7.20, 7.41, 7.92, 9.71),
    14: (8.54, 6.67, 6.58, 6.58, 6.84, 7.79),
    15: (8.12, 6.58, 6.17, 5.98, 6.46, 6.93, 7.69),
}
# Each stage is calibrated at this share of its alpha / stages: a margin for the
# simulation's own error, so that the family-wise rate stays at or below alpha.
SMALL_JOB_MARGIN = 0.9
# Values farther than this many MAD-SDs from the median are left out of the spread.
_TRIM_SDS = 3.5
_TRIM_CONSISTENCY = 0.9914  # the SD of a standard normal truncated at +-3.5


@functools.lru_cache(maxsize=256)
def fleet_threshold(count: int, alpha: float = ALPHA) -> float:
    """Robust SDs above the fleet median beyond which one of `count` members is an outlier.

    `q = sqrt(1 + 1.571 / R) * t_isf(alpha / R, nu)` with `nu = max((R - 1) / 2, R - 33)`:
    Bonferroni over the R members, Student t for the error of the estimated
    spread (its effective degrees of freedom reduced at small R, where the
    trimming also removes good values), and the error of the median; then
    widened for the right tail of a healthy lognormal spread at `HEALTHY_SIGMA`,
    `expm1(HEALTHY_SIGMA * q) / HEALTHY_SIGMA`. `q` alone was checked by
    simulation of normal fleets (family-wise rate <= `alpha` from 16 to 4096
    members, docs/diagnostics.md); on lognormal fleets at sigma up to 0.05 it
    named somebody in 4 of 816 healthy 512-rank runs, each 4.7-4.9 SDs out.
    Range: > 0; at alpha 0.001 (the default) about 9.2 at 16 members, 5.6 at
    64, 5.3 at 512, 5.7 at 4096.

    >>> [round(fleet_threshold(r), 1) for r in (16, 64, 512, 4096)]
    [9.2, 5.6, 5.3, 5.7]
    """
    R = max(int(count), 2)
    nu = max((R - 1) / 2, R - 33.0)
    q = math.sqrt(1.0 + 1.571 / R) * t_isf(alpha / R, nu)
    # A lognormal spread's right tail is longer than a normal's: a member q SDs out in
    # log speed is expm1(sigma q) / sigma SDs out in lateness (5.3 rather than 4.7 at 512).
    return math.expm1(HEALTHY_SIGMA * q) / HEALTHY_SIGMA


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
        `"small job"` (fewer: the staged test below, or later than the others
        by a share of the step).
      center_s, spread_s: median and robust SD of the members' mean lateness.
      distance: per member, (mean - median) / robust SD: how far above the
        fleet it is, in robust SDs (any real number; inf when the spread is 0);
        for a small job, in SDs of the members below it (`_small_job`: the
        largest scaled stage statistic at or after its place, capped at the
        threshold for members below the last stage).
      threshold: the distance an outlier exceeds (`fleet_threshold`, or for a
        small job the first stage's threshold from `SMALL_JOB_THRESHOLDS`; inf
        below 4 members). A small job's member is also an outlier when it is
        later than the others' median by `SMALL_JOB_STEP_FRACTION` of the
        median step.
      over_others_s: per member, how much later than the others it is: for
        ranks (`decide`) the mean excess over the others' per-step median, for
        groups the mean minus the median of the other groups' means.
      outlier: per member, whether it passes the test.
    """

    rule: str
    center_s: float
    spread_s: float
    distance: np.ndarray
    threshold: float
    over_others_s: np.ndarray
    outlier: np.ndarray


def fleet_test(
    means: np.ndarray,
    step_s: float,
    alpha: float = ALPHA,
    over_s: np.ndarray | None = None,
    sizes: np.ndarray | None = None,
) -> FleetTest:
    """Test 2 on per-member mean lateness (`means`, seconds); `step_s` is the median step.

    `over_s`: per member, how much later than the others it is (seconds), for
    the small-job step rule; by default `means` minus the median of the others'.
    `decide` passes each rank's mean excess, which is already its lateness over
    the others' per-step median (subtracting the others' median once more would
    double a healthy difference between two ranks). `sizes`: per member, the
    ranks it averages (groups; default 1): the mean of k healthy ranks varies
    by 1/sqrt(k) of one rank's spread, so the step rule's share is divided by
    sqrt(k).
    """
    m = np.asarray(means, dtype=np.float64)
    R = m.size
    center, spread = fleet_spread(m)
    with np.errstate(divide="ignore", invalid="ignore"):
        dist = np.where(spread > 0, (m - center) / spread, np.sign(m - center) * np.inf)
    dist = np.nan_to_num(dist, nan=0.0)
    if over_s is not None:
        others = np.asarray(over_s, dtype=np.float64)
    else:
        others = m - median_of_others(m[None, :])[0] if R >= 2 else np.zeros(R)
    if R >= FLEET_MIN_MEMBERS:
        q = fleet_threshold(R, alpha)
        return FleetTest("fleet spread", center, spread, dist, q, others, dist > q)
    # Few members: each against the mean and SD of the others (exact for a normal
    # spread, Bonferroni over the members), or later than the others by a share of the step.
    t, q, out = _small_job(m, alpha)
    ok = math.isfinite(step_s) and step_s > 0
    k = np.ones(R) if sizes is None else np.maximum(np.asarray(sizes, dtype=np.float64), 1.0)
    share = SMALL_JOB_STEP_FRACTION / np.sqrt(k)
    by_step = others > share * step_s if ok else np.zeros(R, bool)
    return FleetTest("small job", center, spread, t, q, others, out | by_step)


def small_job_stages(count: int) -> int:
    """Stages of the small-job test at `count` members: at most this many are named.

    `(R - 1) // 2` from 4 members (1 at 4, 3 at 8, 7 at 15), so that at least
    half the members, plus one, are always the yardstick; 0 below 4.
    """
    R = int(count)
    return (R - 1) // 2 if 4 <= R < FLEET_MIN_MEMBERS else 0


def stage_statistics(x: np.ndarray, stages: int) -> np.ndarray:
    """(..., stages) statistics of the small-job test on rows sorted latest first.

    Stage j: the (j+1)-th latest member against the mean and SD of the members
    below it, `(x_j - mean) / (SD x sqrt(1 + 1/k))` over the k = R - j - 1
    members below (Student t with k - 1 degrees of freedom for a normal spread
    when j = 0). Removing the j latest first is what keeps several stragglers
    from hiding each other (the generalized ESD test, one-sided). An SD of 0
    gives +-inf (0 when equal).
    """
    x = np.asarray(x, dtype=np.float64)
    R = x.shape[-1]
    out = np.zeros(x.shape[:-1] + (stages,))
    for j in range(stages):
        below = x[..., j + 1 :]
        k = R - j - 1
        mu = below.mean(axis=-1)
        scale = below.std(axis=-1, ddof=1) * math.sqrt(1.0 + 1.0 / k)
        diff = x[..., j] - mu
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(scale > 0, diff / np.where(scale > 0, scale, 1.0), np.sign(diff) * np.inf)
        out[..., j] = t
    return out


def _small_job(m: np.ndarray, alpha: float) -> tuple[np.ndarray, float, np.ndarray]:
    """Per member, its distance, the threshold, and whether it is an outlier (small job).

    Sorted latest first, stage j's statistic (`stage_statistics`) is scaled by
    `q_0 / q_j` (its threshold `q_j` from `SMALL_JOB_THRESHOLDS`, calibrated
    by simulation of normal fleets: each stage exceeds it with probability
    `alpha / stages`, so a healthy fleet names anybody with probability at
    most `alpha`). The j+1 latest are outliers when some stage at or after j
    exceeds its threshold; a member's distance is the largest scaled statistic
    of the stages at or after its own, so that outlier = distance > q_0.
    Members below the last stage are capped at q_0 (not named). Below 4
    members: zeros and inf (no spread to estimate).
    """
    R = m.size
    stages = small_job_stages(R)
    if stages == 0:
        return np.zeros(R), math.inf, np.zeros(R, bool)
    q = small_job_thresholds(R, alpha)
    order = np.argsort(-m, kind="stable")
    x = m[order]
    scaled = stage_statistics(x, R - 2)  # every member with >= 2 below it
    # NaN (no spread below) is no evidence; an infinite statistic (ranks below it all equal)
    # stays infinite rather than becoming the largest float, which the scaling overflowed.
    scaled = np.nan_to_num(scaled, nan=0.0, posinf=np.inf, neginf=-np.inf)
    scaled[:stages] *= q[0] / np.asarray(q)
    dist_sorted = np.empty(R)
    dist_sorted[:stages] = np.maximum.accumulate(scaled[:stages][::-1])[::-1]
    rest = scaled[stages:]
    dist_sorted[stages : R - 2] = np.minimum(rest * q[0] / q[-1], q[0])
    # The two earliest: against the mean and SD of all the others (negative in practice).
    for j in (R - 2, R - 1):
        o = np.delete(x, j)
        sd = o.std(ddof=1) * math.sqrt(1.0 + 1.0 / o.size)
        dist_sorted[j] = min((x[j] - o.mean()) / sd if sd > 0 else 0.0, q[0])
    dist = np.empty(R)
    dist[order] = dist_sorted
    return dist, q[0], dist > q[0]


def calibrate_small_job(count: int, alpha: float, fleets: int, seed: int = 0) -> tuple:
    """Per stage, the `1 - alpha / stages` quantile of its statistic over `fleets`
    simulated normal fleets of `count` members (the statistics are location and
    scale free, so standard normal draws suffice). `benchmarks/small_job_calibration.py`
    runs it with 2,000,000 fleets and `SMALL_JOB_MARGIN x ALPHA` (seed 1) for
    `SMALL_JOB_THRESHOLDS`."""
    R = int(count)
    stages = small_job_stages(R)
    rng = np.random.default_rng([R, seed])
    stats = []
    for start in range(0, fleets, 100_000):
        x = -np.sort(-rng.standard_normal((min(100_000, fleets - start), R)), axis=1)
        stats.append(stage_statistics(x, stages))
    st = np.concatenate(stats)
    return tuple(float(v) for v in np.quantile(st, 1.0 - alpha / stages, axis=0))


@functools.lru_cache(maxsize=64)
def small_job_thresholds(count: int, alpha: float = ALPHA) -> tuple:
    """Per stage, the threshold of the small-job test at `count` (4-15) members.

    At `ALPHA` and `WATCH_ALPHA` the precomputed `SMALL_JOB_THRESHOLDS` and
    `SMALL_JOB_THRESHOLDS_WATCH`; at another level a calibration over at least
    200,000 simulated fleets, and enough that `_TAIL_FLEETS` of them lie beyond each
    stage's quantile (0.2-1.4 s a million fleets here, once per size and level).
    """
    R = int(count)
    table = {ALPHA: SMALL_JOB_THRESHOLDS, WATCH_ALPHA: SMALL_JOB_THRESHOLDS_WATCH}.get(alpha)
    if table is not None and R in table:
        return table[R]
    level = SMALL_JOB_MARGIN * alpha
    fleets = max(200_000, math.ceil(_TAIL_FLEETS * small_job_stages(R) / level))
    return calibrate_small_job(R, level, fleets)


# Simulated fleets beyond a stage's quantile, at least, when calibrating at run time:
# at 200,000 fleets a level of 5e-5 over 3 stages (watch's fleet line over two kinds of
# group) would leave 3 fleets beyond it.
_TAIL_FLEETS = 20


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
      floor_s: the noise floor.
      late: tests 1 and 2 pass, d > floor, and test 3 passes (in a run under
        `CONSISTENCY_MAX_STEPS` steps, later than the median rank by more than the
        floor in every block of consecutive steps: `short_run_consistent`).
      episode: per rank, all of `late` but test 3: late in part of a short run only.
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
    episode: np.ndarray | None = None

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


def _t_test(effect: np.ndarray, se: np.ndarray, df: int) -> tuple[np.ndarray, np.ndarray]:
    """Test 1 for ranks and groups: (z = effect / se, its one-sided Student-t p-value).

    No error (se 0) makes a positive effect infinitely significant; an unknown
    or infinite error is no evidence (z 0); below 1 degree of freedom p is 1.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(se > 0, effect / se, np.where(effect > 0, np.inf, 0.0))
    z = np.where(np.isfinite(se), z, 0.0)
    return z, (t_sf(z, df) if df >= 1 else np.ones(np.shape(z)))


def _evidence(
    significant: np.ndarray, outlier: np.ndarray, effect: np.ndarray, floor_s: float
) -> np.ndarray:
    """Tests 1 and 2 and the noise floor, for ranks and groups: what test 3 then confirms."""
    return significant & outlier & (effect > floor_s)


def decide(
    lateness: np.ndarray, step_s: float, alpha: float = ALPHA, fleet_alpha: float | None = None
) -> Decision:
    """The culprit decision on (steps, ranks) lateness (`max_j wait_j - wait_i`, seconds).

    Args:
      lateness: one row per analyzed step, one column per rank.
      step_s: the median step time (seconds; NaN when unknown), for the noise
        floor and the small-job rule.
      alpha: the family-wise error rate (test 1; test 2 too unless `fleet_alpha`).
      fleet_alpha: test 2's level (the fleet line), when stricter than test 1's:
        watch's repeated decisions (`jaxpace.watch.decide.FLEET_LEVEL`).
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
    z, p = _t_test(d, se, df)
    half = t95(df) * se if df >= 1 else np.full(R, np.inf)
    p_adj, last_p_adj = holm(p), holm(_last_arrival_p(last, R, n))
    floor = noise_floor(excess, step_s) if n else 20e-6
    fleet = fleet_test(mean_ex, step_s, fleet_alpha or alpha, over_s=mean_ex)
    evidence = _evidence((p_adj < alpha) | (last_p_adj < alpha), fleet.outlier, d, floor)
    steady = short_run_consistent(excess, floor)
    late, episode = evidence & steady, evidence & ~steady
    return Decision(
        n=n, df=df, excess=excess, mean_excess=mean_ex, d=d, se=se, ci_low=d - half,
        ci_high=d + half, z=z, p_adjusted=p_adj, last_p_adjusted=last_p_adj, fleet=fleet,
        floor_s=float(floor), late=late, last=last, last_counts=last_counts,
        top_counts=top_counts, episode=episode,
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


def group_partitions(
    ranks: np.ndarray, processes: np.ndarray, groups: Mapping[str, Mapping[int, str]]
) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(kind, labels, code per rank) of each testable grouping of the ranks.

    Processes first, then `groups` (`{kind: {rank: label}}`) by kind; a kind
    that leaves a rank out, has a single group, or only groups of one rank is
    not testable, and a grouping equal to an earlier one is left out.
    """
    out: list[tuple[str, np.ndarray, np.ndarray]] = []
    seen: list[np.ndarray] = []
    kinds: list[tuple[str, list]] = [("process", [str(int(p)) for p in processes])]
    for kind, mapping in sorted(groups.items()):
        labels = [mapping.get(int(r)) for r in ranks]
        if any(lbl is None for lbl in labels):
            continue
        kinds.append((str(kind), [str(x) for x in labels]))
    for kind, labels in kinds:
        names, codes = np.unique(np.asarray(labels, dtype=object).astype(str), return_inverse=True)
        sizes = np.bincount(codes, minlength=names.size)
        if names.size < 2 or sizes.max() < 2:
            continue
        # Canonical form of the partition: the first rank index of each rank's group.
        first = np.full(names.size, -1)
        first[codes[::-1]] = np.arange(codes.size)[::-1]
        canon = first[codes]
        if any(np.array_equal(canon, s) for s in seen):
            continue
        seen.append(canon)
        out.append((kind, names, codes))
    return out


@dataclasses.dataclass(frozen=True)
class LateGroup:
    """A group of ranks that `decide_groups` found late together.

    Attributes:
      kind, label: the grouping and the group's name in it.
      members: its ranks' column indices; late_members: those later than the
        median non-member by more than the noise floor.
      effect_s: mean over steps of (members' mean lateness minus the other ranks'), seconds.
      se_s: its standard error (batch means, plus the persistent spread of healthy ranks);
        ci_low_s/ci_high_s: effect -+ t95 x se.
      p_adjusted: test 1's p-value, Holm-adjusted over every group of every kind.
      typical_s: the median member's mean lateness minus the median non-member's.
      fleet_sd: test 2's distance above the groups of its kind, robust SDs.
    """

    kind: str
    label: str
    members: np.ndarray
    late_members: np.ndarray
    effect_s: float
    se_s: float
    ci_low_s: float
    ci_high_s: float
    p_adjusted: float
    typical_s: float
    fleet_sd: float


def decide_groups(
    lateness: np.ndarray,
    partitions: list[tuple[str, np.ndarray, np.ndarray]],
    floor_s: float,
    step_s: float = math.nan,
    alpha: float = ALPHA,
    fleet_alpha: float | None = None,
) -> tuple[LateGroup, ...]:
    """The culprit decision for groups: the late ones, most significant first.

    Args:
      lateness: (steps, ranks) as for `decide`.
      partitions: `group_partitions` of the ranks.
      floor_s: the ranks' noise floor (`Decision.floor_s`).
      step_s: the median step time (seconds; NaN when unknown).
      alpha: the family-wise error rate over every group of every kind.
      fleet_alpha: test 2's level when stricter than `alpha` (as for `decide`).

    Per kind and group, per step: the mean lateness of its members minus that
    of the other ranks. Test 1: its mean over steps against a batch-means t
    statistic, Holm over every group of every kind. Test 2: the group's mean
    lateness is an outlier of the groups of its kind (`fleet_test` at `alpha`
    over the number of kinds; the small-job rule's share of the step divided
    by the square root of the group's size), with and without its latest
    member. Test 3, in a short run: above `floor_s` in every block of steps.
    A group passing all three (and `floor_s`) is late when its median member
    is later than the median non-member by more than `floor_s` and more than
    half its members are; of two nested late groups, the one that explains
    the lateness stays (`_nested`).
    """
    n, R = lateness.shape
    cands: list[tuple[int, LateGroup]] = []  # (place in p_all, group)
    p_all: list[float] = []
    m_rank = lateness.mean(axis=0)
    total = lateness.sum(axis=1, keepdims=True)
    # Healthy ranks differ persistently too (static speed spread): a group mean of k
    # such ranks varies by tau^2 / k around the others' mean, on top of step noise.
    # tau is estimated inside the groups of each kind, so late groups do not inflate it.
    se_rank, _ = batch_means_se(lateness)
    med_se2 = float(np.median(se_rank**2)) if np.isfinite(se_rank).all() else 0.0
    level = fleet_alpha or alpha
    for kind, names, codes in partitions:
        G = names.size
        sizes = np.bincount(codes, minlength=G)
        outlier, dist = _group_outliers(codes, m_rank, sizes, step_s, level / len(partitions))
        order = np.argsort(codes, kind="stable")
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        sums = np.add.reduceat(lateness[:, order], starts, axis=1)  # (n, G)
        rest = np.maximum(R - sizes, 1)
        diff = sums / sizes - (total - sums) / rest
        eff = diff.mean(axis=0)
        se, df = batch_means_se(diff)
        if df < 1:
            continue
        resid = m_rank - (np.bincount(codes, m_rank, G) / sizes)[codes]
        inflate = float(np.mean(sizes[codes] / np.maximum(sizes[codes] - 1, 1)))
        tau2 = max(float(robust_std(resid)) ** 2 * inflate - med_se2, 0.0)
        se = np.sqrt(se**2 + tau2 * (1.0 / sizes + 1.0 / rest))
        _, p = _t_test(eff, se, df)
        p_all.extend(p.tolist())  # every group of every kind counts towards the correction
        base = len(p_all) - G
        steady = short_run_consistent(diff, floor_s, centre=False)  # test 3 (short runs)
        for g in np.flatnonzero(_evidence(p < alpha, outlier, eff, floor_s) & steady):
            members = codes == g
            if members.all():
                continue
            ref = np.median(m_rank[~members])
            half = t95(df) * float(se[g])
            cands.append((
                base + int(g),
                LateGroup(
                    kind=kind, label=str(names[g]), members=np.flatnonzero(members),
                    late_members=np.flatnonzero(members & (m_rank - ref > floor_s)),
                    effect_s=float(eff[g]), se_s=float(se[g]), ci_low_s=float(eff[g]) - half,
                    ci_high_s=float(eff[g]) + half, p_adjusted=math.nan,
                    typical_s=float(np.median(m_rank[members]) - ref), fleet_sd=float(dist[g]),
                ),
            ))  # fmt: skip
    if not cands:
        return ()
    p_adj = holm(np.array(p_all))
    out = [
        dataclasses.replace(c, p_adjusted=float(p_adj[i]))
        for i, c in cands
        if p_adj[i] < alpha and c.typical_s > floor_s and c.late_members.size > c.members.size / 2
    ]
    out = _nested(out)
    out.sort(key=lambda g: (g.p_adjusted, -g.effect_s))
    return tuple(out)


def _group_outliers(
    codes: np.ndarray, m_rank: np.ndarray, sizes: np.ndarray, step_s: float, alpha: float
) -> tuple[np.ndarray, np.ndarray]:
    """Test 2 for the groups of one kind: (outlier per group, distance in robust SDs).

    A group is an outlier of the spread of its kind's group means, and stays one
    without its latest member: one straggler does not make its NIC pair late.
    """
    G = sizes.size
    sums = np.bincount(codes, m_rank, G)
    latest = np.full(G, -np.inf)
    np.maximum.at(latest, codes, m_rank)
    without = np.where(sizes > 1, (sums - latest) / np.maximum(sizes - 1, 1), sums)
    # A group of one rank is that rank: its mean excess is already its lateness over the others.
    mean = sums / sizes
    over = np.where(sizes == 1, mean, mean - median_of_others(mean[None, :])[0]) if G > 1 else None
    fleet = fleet_test(mean, step_s, alpha, over_s=over, sizes=sizes)
    over_w = (
        np.where(sizes == 1, without, without - median_of_others(without[None, :])[0])
        if G > 1
        else None
    )
    rest = fleet_test(without, step_s, alpha, over_s=over_w, sizes=sizes)  # the group's share
    return fleet.outlier & rest.outlier, fleet.distance


def _nested(found: list[LateGroup]) -> list[LateGroup]:
    """Of two late groups where one holds the other, keeps the one that explains the lateness.

    The coarser group goes when its late members all sit in the finer one (a
    late NUMA node inside a host); the finer one goes when the coarser group has
    late members outside it too (a whole late host and its NUMA halves).
    """
    drop: set[int] = set()
    sets = [set(g.members.tolist()) for g in found]
    for a in range(len(found)):
        for b, coarse in enumerate(found):
            if a == b or not sets[a] < sets[b]:
                continue
            if set(coarse.late_members.tolist()) <= sets[a]:
                drop.add(b)
            else:
                drop.add(a)
    return [g for i, g in enumerate(found) if i not in drop]


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
