"""`analyze`: the report's pipeline, from records to a `Report`, one named stage at a time.

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

import dataclasses
import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

import jaxpace.records.sources as sources
import jaxpace.report.stages as stages
from jaxpace._validate import check_number
from jaxpace.errors import ConfigError, RecordsError
from jaxpace.records.by_site import SiteRecords
from jaxpace.records.reader import Records, without_foreign_ranks
from jaxpace.report.model import DEFAULT_WARMUP_STEPS, Findings, Report, RunInfo, StepTiming

__all__ = ["analyze", "load_step_records"]


def load_step_records(
    records: Records | str | os.PathLike | Iterable[Mapping[str, Any]],
) -> Records:
    """`load_records`, raising when the input holds headers but no step record."""
    recs = without_foreign_ranks(sources.load(records).records)
    _refuse_empty(recs)
    return recs


def _refuse_empty(recs: Records | SiteRecords) -> None:
    if len(recs) == 0:
        raise RecordsError(
            f"no step records in {', '.join(recs.sources)} (headers only); the run stopped "
            "before its first measured collective."
        )


def _load(records: Records | str | os.PathLike | Iterable[Mapping[str, Any]]) -> sources.Loaded:
    """Any source's records, one site at a time (`sources.load_by_site`), raising when
    they hold no step record."""
    loaded = sources.load_by_site(records)
    try:
        recs = loaded.records.without_foreign_ranks()  # (a corrupt record: dropped, noted)
        _refuse_empty(recs)
    except BaseException:
        loaded.records.close()
        raise
    return dataclasses.replace(loaded, records=recs)


def _step_data(recs: SiteRecords, site: str | None, table: stages.SiteTable | None = None):
    """`(site label, SiteData, notes, partial)`: the whole step (every site folded into
    program executions) unless `site` narrows to one, or no site is evidence (then the
    busiest one says why: its refusal). The whole step hands each site it reads to
    `table` (the sites table), so the run is read once."""
    whole = len(recs.sites) > 1 or recs.has_execution
    if whole and set(stages.refused_sites(recs)) >= set(recs.sites):
        whole = False
    if site is None and whole:
        data, notes, partial = stages.whole_step(recs, table.add if table else None)
        return stages.WHOLE_STEP, data, notes, partial
    site = stages.pick_site(recs, site)
    data, notes, partial = stages.site_data(recs.site(site), site)
    return site, data, notes, partial


def analyze(
    records: Records | str | os.PathLike | Iterable[Mapping[str, Any]],
    *,
    warmup_steps: int | None = None,
    site: str | None = None,
    topology_groups: Mapping[str, Any] | None = None,
    expected_transfer_s: float | None = None,
    alpha: float = stages.ALPHA,
    fleet_alpha: float | None = None,
) -> Report:
    """Analyzes a run's timing records: the whole step, or one site.

    Args:
      records: `Records`, a run directory or JSONL path, or record dicts (as
        `Pacer.records()` returns); or a directory or file of `jax.profiler`
        traces or NCCL Inspector logs (`jaxpace.records.sources`).
      warmup_steps: steps excluded at the start (compilation, caches). Default:
        5, but at most a quarter of the steps.
      site: one collective site to analyze; default: the whole step, every site
        folded into program executions (`stages.whole`); `RunInfo.site` is then
        `stages.WHOLE_STEP`.
      topology_groups: rank groups for the locality test, either
        ``{kind: {rank: label}}`` (kinds like "numa", "nic", "host") or a flat
        ``{rank: label}``. Default: the headers' `topology.rank_groups`, plus
        hosts when ranks span several.
      expected_transfer_s: alpha-beta expectation of the collective's transfer
        time; transfer well above it counts as topology contention.
      alpha: the family-wise level of the culprit decision: the chance that a healthy
        run names anybody (ranks; groups apart). Default `ALPHA` (0.001), which
        `jaxpace.watch` uses too; `WATCH_ALPHA` (0.0001) is a stricter level measured
        for watch's repeated decisions. A stricter level names fewer marginal
        stragglers.
      fleet_alpha: the level of the fleet line alone (test 2: outside the fleet's own
        spread), when stricter than `alpha`; None (the default): `alpha`. Watch
        decides at `alpha=ALPHA, fleet_alpha=WATCH_ALPHA`.

    Returns:
      A `Report`.

    Raises:
      RecordsError: unreadable records, or `site` not among them.
      ConfigError: `warmup_steps` not an integer >= 0, `expected_transfer_s`
        not a number >= 0, or `alpha` or `fleet_alpha` not in (0, 0.5].

    >>> from jaxpace.report import synthetic_records
    >>> recs = synthetic_records(8, 60, late_rank=3, late_s=0.002, seed=0)
    >>> rep = analyze(recs)
    >>> rep.culprit, f"{rep.rank_stats(3).excess_lateness_s * 1e3:.0f} ms", rep.primary_mode
    (3, '2 ms', 'persistent_straggler')
    >>> analyze(synthetic_records(8, 60, seed=0)).culprit is None
    True
    """
    if expected_transfer_s is not None:
        check_number(
            "expected_transfer_s", expected_transfer_s, lo=0.0, hi=math.inf, error=ConfigError
        )
    check_number("alpha", alpha, lo=0.0, hi=0.5, lo_open=True, error=ConfigError)
    if fleet_alpha is not None:
        check_number("fleet_alpha", fleet_alpha, lo=0.0, hi=0.5, lo_open=True, error=ConfigError)
        fleet_alpha = float(fleet_alpha)
    loaded = _load(records)
    with loaded.records:
        return _analyze(
            loaded, warmup_steps, site, topology_groups, expected_transfer_s, float(alpha),
            fleet_alpha,
        )  # fmt: skip


def _analyze(
    loaded: sources.Loaded,
    warmup_steps: int | None,
    site: str | None,
    topology_groups: Mapping[str, Any] | None,
    expected_transfer_s: float | None,
    alpha: float = stages.ALPHA,
    fleet_alpha: float | None = None,
) -> Report:
    """`analyze` of records already loaded (`Loaded.records`: `SiteRecords`)."""
    recs = loaded.records
    table = _sites_table(loaded, warmup_steps)
    site, data, site_notes, site_partial = _step_data(recs, site, table)
    if not loaded.timed:
        data, untimed_note = sources.untimed(data)
        site_notes.append(untimed_note)
    notes = [*recs.notes, *site_notes, *_other_sites_note(recs, site)]
    sel = stages.select_steps(data, warmup_steps)
    notes += sel.notes
    iteration = stages.iteration_stats(sel.iter_all[sel.rows])
    amplification = stages.amplification(sel.compute)
    groups = stages.normalize_groups(topology_groups, recs, data)
    culprits = stages.rank_culprits(data, sel, iteration, groups, alpha, fleet_alpha)
    notes += culprits.notes
    ctx = stages.run_context(recs, site, data)
    culprits, refused = stages.refuse_invariant(culprits, ctx, site)
    notes += ([refused] if refused else []) + stages.context_notes(ctx, site)
    costs = stages.waiting_costs(data, sel, culprits, iteration.mean_s)
    cost_s = costs[0].saving_s if costs else math.nan
    failure_modes, primary = stages.assess_modes(
        data, sel, culprits, iteration, amplification, groups, expected_transfer_s, refused,
        straggler_cost_s=cost_s,
    )  # fmt: skip
    forecast, forecast_note = stages.forecast(
        sel.compute, amplification, culprits.culprit, analyzed_steps=sel.n
    )
    notes += [forecast_note] if forecast_note else []
    run = RunInfo(
        run_id=recs.run_id,
        source=loaded.source,
        site=site,
        sites=recs.sites,
        granularity=recs.granularity,
        num_ranks=int(data.ranks.size),
        num_processes=int(np.unique(data.processes).size),
        num_steps=int(data.steps.size),
        warmup_steps=sel.warmup_steps,
        analyzed_steps=sel.n,
        partial=bool(recs.partial or site_partial),
        notes=tuple(notes),
        context=ctx,
    )
    timing = StepTiming(
        iteration=iteration,
        amplification=amplification,
        periodic=sel.periodic,
        what_if=stages.what_if(data, sel, culprits, iteration.mean_s),
        forecast=forecast,
        pacing=stages.pacing_effect(data, sel, ctx),
    )
    findings = Findings(
        ranks=culprits.rank_stats,
        ranking=culprits.ranking,
        culprit=culprits.culprit,
        culprit_process=culprits.culprit_process,
        noise_floor_s=culprits.noise_floor_s,
        failure_modes=failure_modes,
        primary_mode=primary,
        culprits=culprits.culprits,
        late_groups=culprits.groups,
        costs=costs,
        decisions=((refused,) if refused else ())
        + stages.decisions(culprits, failure_modes, primary, costs, sel.periodic, ctx.hours_unit),
        fleet=culprits.fleet,
        likely=culprits.likely,
    )
    sites_table = _site_rows(loaded, table)
    return Report(run, timing, findings, sites_table=sites_table, data=data)


def _other_sites_note(recs: SiteRecords, site: str) -> list[str]:
    if len(recs.sites) < 2:
        return []
    if site == stages.WHOLE_STEP:
        return [
            f"analyzed the whole step: its {len(recs.sites)} sites together (the sites table "
            "is the evidence per site; `site=` narrows to one)."
        ]
    others = ", ".join(f"`{s}`" for s in recs.sites if s != site)
    return [f"analyzed site `{site}`; the records also hold {others} (use `site=`)."]


def _sites_table(loaded: sources.Loaded, warmup_steps: int | None) -> stages.SiteTable | None:
    """The sites table to fill (`stages.links.SiteTable`), with 2 or more sites; else None."""
    if len(loaded.records.sites) < 2:
        return None
    warmup = DEFAULT_WARMUP_STEPS if warmup_steps is None else warmup_steps
    return stages.SiteTable(loaded.records, warmup)


def _site_rows(
    loaded: sources.Loaded, table: stages.SiteTable | None
) -> tuple[stages.links.SiteRow, ...]:
    """Every site in step order (`stages.links.site_table`), with 2 or more sites; else ().
    A source without arrival times has no step order: `order_s` is NaN, in the records' order."""
    if table is None:
        return ()
    rows = table.rows()
    if not loaded.timed:
        rows = [dataclasses.replace(r, order_s=math.nan) for r in rows]
    return tuple(rows)
