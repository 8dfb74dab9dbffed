"""The stages of `jaxpace.report.analyze`, in pipeline order.

1. `whole` (default): every site folded into program executions, one (step x rank)
   `SiteData` of the whole step; `site`: one site's dense `SiteData` (`site=`);
2. `steps`: drop the warm-up and periodic slow steps; iteration statistics;
3. `culprit`: per-rank statistics, the ranking, the persistent culprit;
   `context`: what the headers say (platform, policy, an invariant operand: no culprit);
4. `modes`: score each failure mode, pick the primary one;
5. `outlook`: what-if, waiting costs, the amplification forecast, the pacing effect;
6. `decide`: one line per decision with its evidence and confidence;
7. `links` (2 or more sites): every site in step order, the latest rank within each group.
"""

from jaxpace.records.site_data import pick_site, site_data
from jaxpace.report.stages.context import context_notes, refuse_invariant, run_context
from jaxpace.report.stages.culprit import (
    ALPHA,
    CulpritRanking,
    late_groups,
    noise_floor,
    rank_culprits,
)
from jaxpace.report.stages.decide import decisions
from jaxpace.report.stages.links import SiteTable, format_site_table, site_table
from jaxpace.report.stages.modes import (
    amplification_mode,
    assess_modes,
    classify,
    contention_mode,
    locality_mode,
    locality_score,
    normalize_groups,
    straggler_mode,
)
from jaxpace.report.stages.outlook import (
    empirical_max_ratio,
    forecast,
    lognormal_max_ratio,
    pacing_effect,
    waiting_costs,
    what_if,
)
from jaxpace.report.stages.steps import (
    StepSelection,
    amplification,
    iteration_stats,
    periodic_outliers,
    select_steps,
)
from jaxpace.report.stages.whole import WHOLE_STEP, execution_of, refused_sites, whole_step

__all__ = [
    "WHOLE_STEP",
    "execution_of",
    "refused_sites",
    "whole_step",
    "ALPHA",
    "CulpritRanking",
    "StepSelection",
    "amplification",
    "amplification_mode",
    "assess_modes",
    "classify",
    "context_notes",
    "contention_mode",
    "decisions",
    "empirical_max_ratio",
    "forecast",
    "format_site_table",
    "iteration_stats",
    "late_groups",
    "locality_mode",
    "locality_score",
    "lognormal_max_ratio",
    "noise_floor",
    "normalize_groups",
    "pacing_effect",
    "periodic_outliers",
    "pick_site",
    "rank_culprits",
    "refuse_invariant",
    "run_context",
    "select_steps",
    "site_data",
    "SiteTable",
    "site_table",
    "straggler_mode",
    "waiting_costs",
    "what_if",
]
