"""How far the amplification forecast reaches: one decision for the table, plot and advice.

Nothing is forecast beyond the rank count the analyzed samples support, and no
lognormal is extrapolated where it cannot be fitted; `tables`, `html` and
`advice` all ask `forecast_support`, so they never disagree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jaxpace.report.model import LIKELY_MODE

if TYPE_CHECKING:
    from jaxpace.report.model import Report

__all__ = ["SAMPLES_PER_RANK", "forecast_support"]

SAMPLES_PER_RANK = 4  # order statistics of N ranks: at least 4N compute samples behind them


def forecast_support(report: Report) -> tuple[int, bool, str]:
    """(largest rank count the data supports, whether the lognormal fit is shown, why).

    The empirical forecast resamples the measured per-rank compute: it is shown
    up to the rank count that the analyzed samples cover `SAMPLES_PER_RANK` times.
    The lognormal fit extrapolates a shape; it is shown only when no rank or
    group is persistently late (a straggler makes the spread bimodal, not
    lognormal) and the run has 8+ ranks to fit it on.
    """
    fc = report.forecast
    if fc is None:
        return 0, False, ""
    samples = report.analyzed_steps * report.num_ranks
    top = max((n for n in fc.ranks if n * SAMPLES_PER_RANK <= samples), default=0)
    lognormal = (
        report.culprit is None
        and report.primary_mode in ("balanced", "synchronization_amplification")
        and report.num_ranks >= 8
    )
    why = f"empirical order statistics from {samples} compute samples, shown up to {top} ranks"
    if not lognormal:
        why += (
            "; no lognormal extrapolation ("
            + (
                "a persistent straggler is not lognormal noise"
                if report.culprit is not None
                else "a rank last in most steps (likely, below the line) is not lognormal noise"
                if report.primary_mode == LIKELY_MODE
                else f"{report.num_ranks} ranks are too few to fit it"
                if report.num_ranks < 8
                else f"the primary mode is {report.primary_mode}"
            )  # fmt: skip
            + ")"
        )
    return top, lognormal, why
