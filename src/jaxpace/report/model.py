"""What `analyze` returns: the result types and the failure-mode names.

`SiteData` (one site's dense step x rank arrays, which the stages, the HTML plots and the
trace read) lives with the records (`jaxpace.records.site_data`) and is re-exported here.
Nothing here computes a statistic.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from jaxpace.records.safe_io import write_atomic
from jaxpace.records.site_data import SiteData

__all__ = [
    "DEFAULT_WARMUP_STEPS",
    "FAILURE_MODES",
    "FORECAST_RANKS",
    "FailureMode",
    "Findings",
    "FleetSpread",
    "Forecast",
    "GroupFinding",
    "GroupLate",
    "IterationStats",
    "LIKELY_MODE",
    "Likely",
    "likely_subject",
    "LinkWait",
    "PacingEffect",
    "PeriodicOutliers",
    "RankStats",
    "Report",
    "RunContext",
    "RunInfo",
    "SiteData",
    "SiteRow",
    "SlowRank",
    "StepTiming",
    "WaitingCost",
    "WhatIf",
    "write_json",
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
# The primary mode of a run where no mode is detected but a rank or process is last in
# most steps below the line this size names (`Findings.likely`): never "balanced".
LIKELY_MODE = "likely_straggler"


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
      excess_lateness_s: how much later than the median rank it arrives: the
        mean over steps of (its lateness minus the median lateness of the other
        ranks at that step), minus the median over ranks of that mean (so a
        heavy tail every rank shares cancels). The quantity `z`, `p_adjusted`
        and the interval test.
      ci_low_s, ci_high_s: 95% confidence interval of `excess_lateness_s`
        (Student t with the batch-means error of `z`).
      compute_s, delay_s, sync_wait_s, transfer_s: mean phase times per step.
      late: named (the decision of `jaxpace.diagnosis.culprit`): significant against
        per-step noise (`p_adjusted` or `last_p_adjusted` below
        `stages.culprit.ALPHA`), an outlier of the fleet's own spread
        (`fleet_sd` above the fleet threshold, or the small-job rule), and above
        the noise floor.
      z: `excess_lateness_s` over its standard error (batch means over steps,
        plus the median's error); any real number, >= 5 is overwhelming
        evidence against per-step noise at any rank count.
      p_adjusted: the one-sided p-value of `z` (Student t), Holm-adjusted over
        all ranks, in [0, 1].
      fleet_sd: distance above the fleet's median in robust SDs of the per-rank
        spread (any real number; inf when the ranks do not differ at all).
      last_p_adjusted: one-sided p-value that it arrives last more often than
        1/R of steps (batch means), Holm-adjusted over all ranks, in [0, 1].
      last_count: analyzed steps in which it arrived last (>= 0).
      top1_count: analyzed steps in which it was among the latest 1% of ranks
        (the latest `ceil(R / 100)`), >= `last_count`.
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
    z: float = 0.0
    p_adjusted: float = 1.0
    fleet_sd: float = 0.0
    last_p_adjusted: float = 1.0
    last_count: int = 0
    top1_count: int = 0


@dataclasses.dataclass(frozen=True)
class SlowRank:
    """One of the slowest ranks, named or not, and what waiting for it costs.

    Attributes:
      rank, host: who.
      excess_lateness_s: later than the median rank by this much (seconds).
      fleet_sd: that in robust SDs of the fleet's per-rank spread.
      named: a culprit (both tests passed); else "slowest, within normal spread"
        when `fleet_sd` is below the threshold (on a small job: "below the line this
        job's size names", `fleet_view.below_line`).
      within_spread: not an outlier of the fleet (test 2 fails).
      saving_s, saving_fraction: step time saved (seconds, share of the mean
        step, >= 0) if its compute ran at the per-step median (the what-if
        model); NaN without compute.
    """

    rank: int
    host: str
    excess_lateness_s: float
    fleet_sd: float
    named: bool
    within_spread: bool
    saving_s: float
    saving_fraction: float


@dataclasses.dataclass(frozen=True)
class FleetSpread:
    """How the ranks differ persistently: the fleet's own per-rank spread.

    Healthy devices run persistently a few percent apart; a rank is a culprit
    only beyond that spread (`jaxpace.diagnosis.culprit`).

    Attributes:
      rule: `"fleet spread"` (>= 16 ranks: outliers beyond `threshold` robust
        SDs) or `"small job"` (fewer: beyond `threshold` SDs of the ranks below
        it, from 4 ranks, or later than the others by more than 10% of the
        median step).
      num_ranks: ranks compared; step_s: the median step time (NaN if unknown).
      median_s, p90_s, p99_s: quantiles over ranks of the per-rank mean
        lateness (seconds; lateness = ``max_j wait_j - wait_i``).
      spread_s: robust SD of the per-rank mean excess lateness (seconds, >= 0).
      threshold: robust SDs a named rank exceeds (rule "fleet spread"); for a
        small job, the staged test's threshold (SDs of the ranks below; inf
        below 4 ranks), next to the 10%-of-the-step rule; > 0.
      slowest: the slowest ranks (up to 5), latest first.
    """

    rule: str
    num_ranks: int
    step_s: float
    median_s: float
    p90_s: float
    p99_s: float
    spread_s: float
    threshold: float
    slowest: tuple[SlowRank, ...] = ()


@dataclasses.dataclass(frozen=True)
class Likely:
    """The finding below the line: a rank (or process, or group) last in most steps and
    significant against per-step noise, but below what this job's size names with
    confidence (the fleet test). Never a culprit; never "balanced" either.

    Attributes:
      kind: "process" (one rank a process, or every rank of the process is the
        latest), "rank", or a grouping (`host`, `numa`, `nic`, `leaf`, ...: a group
        whose every member is significant and that holds the last arriver in most
        steps, when no rank or process alone does).
      label: the process or rank id; for a group, its name and ranks ("node-0/numa1
        (ranks 4-7)").
      rank: the latest rank (the process's or group's latest rank).
      process: its process.
      host: its host.
      last_fraction: share in [0, 1] of analyzed steps it arrived last in (a process:
        any of its ranks).
      excess_lateness_s: its lateness over the median rank's, seconds a step.
      step_fraction: that over the median step time (NaN when unknown).
      threshold: what names with confidence at this size: for a small job the
        share of the step (0.24), else the fleet test's robust SDs.
      threshold_unit: "of the step" or "robust SDs".
      text: the sentence, e.g. "likely: process 1, last in 100% of steps, +15 ms,
        2% of the median step (850 ms); below the 24% of the step this job's size names with
        confidence" (or, where the size's test passed, the noise floor or the short
        run's consistency that held it back).
    """

    kind: str
    label: int | str
    rank: int
    process: int
    host: str
    last_fraction: float
    excess_lateness_s: float
    step_fraction: float
    threshold: float
    threshold_unit: str
    text: str


def likely_subject(likely: Likely) -> str:
    """Who a `Likely` finding is about, in words: "process 1", "rank 5", "numa node-0/numa1
    (ranks 4-7)"."""
    if likely.kind == "process":
        return f"process {likely.process}"
    if likely.kind == "rank":
        return f"rank {likely.rank}"
    return f"{likely.kind} {likely.label}"


@dataclasses.dataclass(frozen=True)
class GroupFinding:
    """A group of ranks (host, NUMA node, NIC, leaf switch, process) late together.

    Attributes:
      kind, label: the grouping (`host`, `numa`, `nic`, `leaf`, `process`, or a
        user-given kind) and the group's name in it.
      ranks: its ranks; hosts: the hosts they run on.
      excess_lateness_s: mean over steps of (members' mean excess lateness minus
        the other ranks'), seconds; ci_low_s/ci_high_s: its 95% interval.
      typical_member_s: median member's mean excess minus the median non-member's
        (a group is late only when this, not one culprit inside it, is large).
      z, p_adjusted: batch-means t statistic and its Holm-adjusted p-value over
        every group of every kind.
      late_ranks: the members later than the median non-member by more than the
        noise floor.
      fleet_sd: the group's mean lateness above the median group of its kind, in
        robust SDs of the groups' spread (any real number; inf when they do not
        differ at all).
    """

    kind: str
    label: str
    ranks: tuple[int, ...]
    hosts: tuple[str, ...]
    excess_lateness_s: float
    typical_member_s: float
    ci_low_s: float
    ci_high_s: float
    z: float
    p_adjusted: float
    late_ranks: tuple[int, ...] = ()
    fleet_sd: float = 0.0

    @property
    def name(self) -> str:
        """`kind label`, e.g. `numa node-3/1`."""
        return f"{self.kind} {self.label}"


@dataclasses.dataclass(frozen=True)
class WaitingCost:
    """What one culprit (or late group) costs the job, and what fixing it saves.

    Model as in `WhatIf`: step = ``max_i(compute_i) + transfer``; the culprit's
    (or every member's) compute is replaced by the per-step median compute.

    Attributes:
      target: `rank 200`, `host node-3`, `numa node-3/1`, or `all culprits`.
      ranks: the ranks replaced.
      saving_s: mean step time saved per step, seconds (>= 0).
      saving_fraction: `saving_s` over the measured mean step time.
      what_if_step_s: measured mean step time minus `saving_s`.
      gpu_hours_per_1000_steps: device-hours (GPU-hours on GPUs; the report
        names the unit of the run's platform, `RunContext.hours_unit`) all ranks
        spend waiting for the target per 1,000 steps,
        ``saving_s x ranks x 1000 / 3600``: what fixing it gives back.
    """

    target: str
    ranks: tuple[int, ...]
    saving_s: float
    saving_fraction: float
    what_if_step_s: float
    gpu_hours_per_1000_steps: float


@dataclasses.dataclass(frozen=True)
class FailureMode:
    """One failure mode's verdict.

    Attributes:
      name: one of `FAILURE_MODES`.
      score: strength of the evidence in [0, 1] (0 = none; see docs/diagnostics.md
        for each mode's formula).
      detected: whether the report calls this mode present.
      evidence: human-readable facts behind the score.
      cost_s: what the mode costs a step, seconds, where the report estimates it
        (a straggler: what fixing it saves; contention: the transfer time above
        its expectation, trend start or spike-free median), else NaN. Detected
        modes with a cost are ranked by it.
    """

    name: str
    score: float
    detected: bool
    evidence: tuple[str, ...]
    cost_s: float = math.nan


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
    """Expected step time if `target` computed as fast as the median rank.

    Model: step time = ``max_i(compute_i) + transfer`` per step (`model_step_s`;
    pacing delays are left out: with no late rank there is nothing to pace);
    `what_if_step_s` = measured mean minus the model's saving from replacing
    the compute of `target`'s ranks by the per-step median compute. `target` is
    `rank` ("rank 3"), or the late group it is in ("process 1") when it is late
    with that group: then the saving is that group's `WaitingCost`, the one
    figure the summary, advice, HTML and decisions all show.
    """

    rank: int
    is_culprit: bool
    measured_step_s: float
    model_step_s: float
    what_if_step_s: float
    saving_s: float
    saving_fraction: float
    target: str = ""


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
class RunContext:
    """What the runtime knew that changes what the numbers mean (the records' headers).

    Attributes:
      platform: `cpu`, `gpu`, `tpu`, or `unknown` (records without the field).
      policies: the pacing policy of each process (`no_pacing()`, `adaptive(...)`).
      pacing_ran: a pacing policy was configured, or some step was engaged: advice
        does not suggest trying pacing.
      sample_every: every k-th step was measured (1 = all).
      invariant_over: the axis the analyzed site's operand was already reduced
        over (its waits are all alike, the skew hidden: no culprit is named), or None.
      probe: which probes timed the analyzed site, as the runtime said, or None.
      policy_stopped: the policy backed off or its A/B guard rejected pacing
        on some process during the run.
      no_culprit: why the analyzed site's waits cannot name anyone late (the
        source's reader said so in the header's `sites[site]["no_culprit"]`), or None.
    """

    platform: str = "unknown"
    policies: tuple[str, ...] = ()
    pacing_ran: bool = False
    sample_every: int = 1
    invariant_over: str | None = None
    probe: str | None = None
    policy_stopped: bool = False
    no_culprit: str | None = None

    @property
    def hours_unit(self) -> str:
        """The unit of waiting costs: `GPU-h`, `TPU-h`, `CPU-rank-h`, else `device-h`."""
        return {"gpu": "GPU-h", "tpu": "TPU-h", "cpu": "CPU-rank-h"}.get(self.platform, "device-h")


@dataclasses.dataclass(frozen=True)
class PacingEffect:
    """Steps with pacing engaged vs. not, side by side (means over steps).

    `comparable` is False when the two sets are not alike (the unengaged steps
    all ran before pacing engaged: the policy's own warm-up); `caveat` says why,
    or what else limits the comparison (a CPU run, where pacing cannot shorten a
    step). The unengaged steps are those after pacing first engaged when there
    are any (interleaved with the engaged ones, like with like).
    """

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
    comparable: bool = True
    caveat: str = ""


@dataclasses.dataclass(frozen=True)
class GroupLate:
    """A rank that arrives last in its group at a site: `lead_s` is the median over steps of
    how long the others of its group had been waiting (median over them) when it arrived;
    `latest_share` the share of steps it was the latest; `p_value` the chance of that many."""

    rank: int
    group: tuple[int, ...]
    lead_s: float
    latest_share: float
    p_value: float


@dataclasses.dataclass(frozen=True)
class LinkWait:
    """One ppermute pair: the destination's median wait for its source (seconds)."""

    source: int
    destination: int
    wait_s: float


@dataclasses.dataclass(frozen=True)
class SiteRow:
    """One site of `Report.sites_table` (`stages.links.site_table`). `wait_s`: median over
    steps of the mean wait over ranks; `share`: the site's part of the sum of those over all
    sites; `order_s`: median time into the step."""

    site: str
    kind: str | None
    groups: tuple[tuple[int, ...], ...]
    steps: int
    wait_s: float
    share: float
    order_s: float
    late: tuple[GroupLate, ...]
    links: tuple[LinkWait, ...]
    slow_link: LinkWait | None


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What was analyzed: the run, its site and steps, and what the headers say of it.

    Attributes:
      run_id, site, sites, granularity: what was analyzed (`sites` lists all).
      source: where the timings came from (jaxpace records, `jax.profiler`
        traces, NCCL Inspector logs), one line.
      num_ranks, num_processes: ranks and processes that reported.
      num_steps: complete steps (every rank reported) of `site`.
      warmup_steps: steps excluded at the start.
      analyzed_steps: steps used for statistics (after warm-up, without
        periodic outliers).
      partial: input was incomplete; `notes` says how.
      notes: what the reader should know (tagged ones, `PARTIAL:`, `NO CULPRIT:`, first).
      context: what the headers say about the run (platform, policy, an
        invariant operand, sampling): `RunContext`.
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
    source: str = "jaxpace records"
    context: RunContext = dataclasses.field(default_factory=RunContext)


@dataclasses.dataclass(frozen=True)
class StepTiming:
    """How the steps ran, and what they would take otherwise.

    Attributes:
      iteration: step-time statistics.
      amplification: mean over steps of the max-rank compute, over the mean
        compute (>= 1; 1 = no rank ever waits for another); NaN without compute.
      periodic: periodic slow steps, or None.
      what_if, forecast, pacing: see their classes (None when not computable).
    """

    iteration: IterationStats
    amplification: float
    periodic: PeriodicOutliers | None
    what_if: WhatIf | None
    forecast: Forecast | None
    pacing: PacingEffect | None


@dataclasses.dataclass(frozen=True)
class Findings:
    """Who is late, what kind of trouble the run has, and what it costs.

    Attributes:
      ranks: per-rank statistics, by rank.
      ranking: ranks from most to least culpable (late ranks first, then by
        largest excess lateness).
      culprit: the persistent culprit rank, or None (never for balanced runs).
      culprit_process: its process (or a process whose ranks are late together).
      noise_floor_s: excess lateness below this is not called late.
      failure_modes: one `FailureMode` per name in `FAILURE_MODES`.
      primary_mode: the detected mode that costs the most (else with the highest score);
        with none detected, `LIKELY_MODE` ("likely_straggler") when `likely` is set, else
        "balanced".
      culprits: every individual culprit rank, latest first (`culprit` is the first).
      late_groups: groups of ranks late together (`GroupFinding`), most significant first.
      costs: GPU-hours spent waiting for each culprit and late group (`WaitingCost`).
      decisions: one line per decision (culprit, group, mode, or none), each with
        its evidence and confidence, in the order a user should act on them.
      fleet: the fleet's per-rank spread and its slowest ranks (`FleetSpread`).
      likely: with no culprit or late group, a rank or process last in most steps
        and significant, but below what the job's size names (`Likely`); else None.
        Say it plainly, never "balanced" or "nothing to fix".
    """

    ranks: tuple[RankStats, ...]
    ranking: tuple[int, ...]
    culprit: int | None
    culprit_process: int | None
    noise_floor_s: float
    failure_modes: tuple[FailureMode, ...]
    primary_mode: str
    culprits: tuple[int, ...] = ()
    late_groups: tuple[GroupFinding, ...] = ()
    costs: tuple[WaitingCost, ...] = ()
    decisions: tuple[str, ...] = ()
    fleet: FleetSpread | None = None
    likely: Likely | None = None

    @property
    def culprit_group(self) -> GroupFinding | None:
        """The late group the decision names instead of a rank: the most significant
        late group when no rank is named alone (`culprits` empty), else None. The
        culprit line names it ("host node-9, ranks 72-79") with its ranks as evidence."""
        return self.late_groups[0] if self.late_groups and not self.culprits else None

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


# The report's flat names, in the order of `to_dict()`'s keys, and the part holding each.
_FLAT: dict[str, str] = {
    **dict.fromkeys(
        ("run_id", "site", "sites", "granularity", "num_ranks", "num_processes", "num_steps",
         "warmup_steps", "analyzed_steps", "partial", "notes"), "run"),
    "iteration": "timing",
    "amplification": "timing",
    **dict.fromkeys(("ranks", "ranking", "culprit", "culprit_process", "noise_floor_s",
                     "failure_modes", "primary_mode"), "findings"),
    **dict.fromkeys(("periodic", "what_if", "forecast", "pacing"), "timing"),
    **dict.fromkeys(("culprits", "late_groups", "costs", "decisions"), "findings"),
    "source": "run",
    "fleet": "findings",
    "context": "run",
    "likely": "findings",
}  # fmt: skip


def _flat(name: str) -> property:
    part = _FLAT[name]
    return property(lambda self: getattr(getattr(self, part), name), doc=f"`{part}.{name}`.")


@dataclasses.dataclass(frozen=True)
class Report:
    """What `analyze` found, in three parts the renderers take. `to_dict()` / `to_json()`
    give everything but raw arrays, as one flat object.

    Attributes:
      run: what was analyzed (`RunInfo`).
      timing: how the steps ran, and what they would take otherwise (`StepTiming`).
      findings: who is late, the failure modes, what waiting costs (`Findings`).
      sites_table: with 2 or more sites, one `SiteRow` per site in step order
        (`stages.links.site_table`: its wait, share, the latest rank within each
        group and ppermute's slow pair); else empty. Evidence per site, not the
        culprit decision. `to_dict` adds each row's `num_groups`.
      data: the analyzed site's arrays (`SiteData`), for the plots and the trace.

    Every attribute of the parts reads from the report too (`report.culprit` is
    `report.findings.culprit`); those names are the keys of `to_dict()`.
    """

    run: RunInfo
    timing: StepTiming
    findings: Findings
    sites_table: tuple[SiteRow, ...] = ()
    data: SiteData | None = dataclasses.field(default=None, repr=False, compare=False)

    run_id = _flat("run_id")
    site = _flat("site")
    sites = _flat("sites")
    granularity = _flat("granularity")
    num_ranks = _flat("num_ranks")
    num_processes = _flat("num_processes")
    num_steps = _flat("num_steps")
    warmup_steps = _flat("warmup_steps")
    analyzed_steps = _flat("analyzed_steps")
    partial = _flat("partial")
    notes = _flat("notes")
    source = _flat("source")
    context = _flat("context")
    iteration = _flat("iteration")
    amplification = _flat("amplification")
    periodic = _flat("periodic")
    what_if = _flat("what_if")
    forecast = _flat("forecast")
    pacing = _flat("pacing")
    ranks = _flat("ranks")
    ranking = _flat("ranking")
    culprit = _flat("culprit")
    culprit_process = _flat("culprit_process")
    noise_floor_s = _flat("noise_floor_s")
    failure_modes = _flat("failure_modes")
    primary_mode = _flat("primary_mode")
    culprits = _flat("culprits")
    late_groups = _flat("late_groups")
    costs = _flat("costs")
    decisions = _flat("decisions")
    fleet = _flat("fleet")
    likely = _flat("likely")

    @property
    def culprit_group(self) -> GroupFinding | None:
        """`findings.culprit_group`: the late group named instead of a rank, or None."""
        return self.findings.culprit_group

    def mode(self, name: str) -> FailureMode:
        """The `FailureMode` called `name` (one of `FAILURE_MODES`)."""
        return self.findings.mode(name)

    def rank_stats(self, rank: int) -> RankStats:
        """The `RankStats` of `rank`."""
        return self.findings.rank_stats(rank)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (NaN becomes None); no raw per-step arrays."""
        out = {}
        for name in (*_FLAT, "sites_table"):
            v = getattr(self, name)
            out[name] = dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
            if isinstance(v, tuple) and v and dataclasses.is_dataclass(v[0]):
                out[name] = [dataclasses.asdict(x) for x in v]
        for row in out["sites_table"]:
            row["num_groups"] = len(row["groups"])
        return _jsonable(out)

    def to_json(self, indent: int | None = 2) -> str:
        """`to_dict()` as a JSON string."""
        return json.dumps(self.to_dict(), indent=indent)


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


def write_json(report: Report, path: str | os.PathLike) -> Path:
    """Writes `report.to_json()` to `path` (atomically: `safe_io.write_atomic`); returns the path."""
    p = Path(path)
    write_atomic(p, report.to_json() + "\n", what="JSON report")
    return p
