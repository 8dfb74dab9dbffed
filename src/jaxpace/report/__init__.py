"""Diagnose a run's collective timings: phases, culprits, failure modes, what-ifs, reports.

The package reads records (`records`), runs the `analyze` pipeline of named
`stages` into a `Report` (`model`), and renders it: `terminal` (rich tables),
`html` (self-contained page), `trace` (Perfetto), `cli` (`jaxpace report`).
`synthetic` makes physically consistent records for tests and docs. Nothing
here imports the runtime (`jaxpace.runtime`, `jaxpace.collectives.measure`).
"""

from jaxpace.records.reader import Records, load_records
from jaxpace.records.synthetic import synthetic_records
from jaxpace.report.analyze import analyze
from jaxpace.report.cli import cli_main, configure_parser
from jaxpace.report.model import (  # noqa: F401  (constants and SiteData: importable, not in __all__)
    DEFAULT_WARMUP_STEPS,
    FAILURE_MODES,
    FORECAST_RANKS,
    FailureMode,
    Forecast,
    IterationStats,
    PacingEffect,
    PeriodicOutliers,
    RankStats,
    Report,
    SiteData,
    WhatIf,
    write_json,
)
from jaxpace.report.render.html import write_html
from jaxpace.report.render.tables import pacing_table  # noqa: F401
from jaxpace.report.render.terminal import print_summary
from jaxpace.report.render.trace import write_trace
from jaxpace.report.stages.outlook import empirical_max_ratio as _empirical_max_ratio  # noqa: F401
from jaxpace.report.stages.outlook import lognormal_max_ratio as _lognormal_max_ratio  # noqa: F401

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
