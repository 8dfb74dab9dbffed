"""Stage 3b: what the runtime knew that changes what the numbers mean (docs/records.md).

The headers carry the platform, the pacing policy, the sampling, and per site
the probes that timed it and whether its operand was already invariant over the
reduced axis. An invariant operand means JAX reduced it before the measured
call: every rank leaves that earlier reduction together, so the waits measured
here do not say who was late, and the report names no culprit from them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from jaxpace.records.reader import Records
from jaxpace.records.site_data import SiteEvidence
from jaxpace.report.model import RunContext, SiteData
from jaxpace.report.stages.culprit import CulpritRanking

__all__ = ["PACING_POLICIES", "context_notes", "refuse_invariant", "run_context"]

# Header `policy` names of the policies that pace (`jaxpace.adaptive`, `jaxpace.fixed`).
PACING_POLICIES = ("adaptive(", "fixed(")


def _platform(header: Mapping) -> str:
    """A header's platform; NCCL Inspector logs come from GPUs whatever the header lacks."""
    p = str(header.get("platform", "unknown")).lower()
    return "gpu" if p == "unknown" and header.get("source") == "nccl_inspector" else p


def run_context(records: Records, site: str, data: SiteData | SiteEvidence) -> RunContext:
    """The `RunContext` of `site` from every header (fields missing in older records:
    defaults); of `data`, only whether some step was paced (`engaged`)."""
    headers = records.headers
    platforms = sorted({_platform(h) for h in headers})
    platforms = [{"cuda": "gpu", "rocm": "gpu"}.get(p, p) for p in platforms]
    known = [p for p in platforms if p != "unknown"]
    platform = known[0] if len(set(known)) == 1 else ("mixed" if known else "unknown")
    policies = tuple(sorted({str(h.get("policy", "")) for h in headers if h.get("policy")}))
    paced = any(p.startswith(PACING_POLICIES) for p in policies) or bool(np.any(data.engaged))
    sample = max((_int(h.get("sample_every"), 1) for h in headers), default=1)
    invariant = probe = no_culprit = None
    stopped = False
    for h in headers:
        info = (h.get("sites") or {}).get(site) if isinstance(h.get("sites"), Mapping) else None
        if not isinstance(info, Mapping):
            continue
        invariant = invariant or (
            str(info["invariant_over"]) if info.get("invariant_over") else None
        )
        probe = probe or (str(info["probe"]) if info.get("probe") else None)
        no_culprit = no_culprit or (str(info["no_culprit"]) if info.get("no_culprit") else None)
        stopped = stopped or bool(info.get("backed_off")) or bool(info.get("ab_rejected"))
    return RunContext(
        platform=platform,
        policies=policies,
        pacing_ran=paced,
        sample_every=sample,
        invariant_over=invariant,
        probe=probe,
        policy_stopped=stopped,
        no_culprit=no_culprit,
    )


def _int(v: object, default: int) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else default


def context_notes(ctx: RunContext, site: str) -> list[str]:
    """Remarks for the report's notes: sampling, a policy that stopped pacing."""
    notes = []
    if ctx.sample_every > 1:
        notes.append(
            f"SAMPLED: every {ctx.sample_every}th step was measured (`sample_every`); step "
            "numbers count measured steps, and per-1,000-step costs are per 1,000 measured steps."
        )
    if ctx.policy_stopped:
        notes.append(
            f"the pacing policy stopped pacing at `{site}` during the run on some process "
            "(it backed off a skew beyond its bounds, or its A/B guard rejected pacing)."
        )
    return notes


def refuse_invariant(c: CulpritRanking, ctx: RunContext, site: str) -> tuple[CulpritRanking, str]:
    """No culprit, late rank or late group from a site whose operand was invariant, or
    whose reader could not match its executions across processes; and why."""
    if ctx.invariant_over is None and ctx.no_culprit is None:
        return c, ""
    top = c.rank_stats[c.order[0]].rank if c.rank_stats and c.order else None
    not_evidence = f" (the ranking's top, rank {top}, is not evidence)" if top is not None else ""
    if ctx.invariant_over is None:
        return _no_culprit(c), f"NO CULPRIT at `{site}`: {ctx.no_culprit}{not_evidence}."
    why = (
        f"NO CULPRIT: the operand of `{site}` was already invariant over "
        f"`{ctx.invariant_over}` when jaxpace timed it (JAX had reduced it first, e.g. "
        "`jax.grad` with respect to replicated parameters), so every rank left that earlier "
        "reduction together and these waits do not say who was late"
        + not_evidence
        + ". Differentiate a varying copy: `jax.lax.pcast(params, "
        f"'{ctx.invariant_over}', to='varying')` before `jax.grad` (README, 'Use it')."
    )
    return _no_culprit(c), why


def _no_culprit(c: CulpritRanking) -> CulpritRanking:
    """`c` with nobody late: no culprit, late rank or late group (the ranking stays)."""
    stats = tuple(dataclasses.replace(r, late=False) for r in c.rank_stats)
    return dataclasses.replace(
        c,
        rank_stats=stats,
        late=np.zeros_like(c.late),
        culprit_index=None,
        culprit=None,
        culprit_process=None,
        culprit_indices=(),
        groups=(),
        likely=None,
    )
