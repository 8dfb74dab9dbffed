"""Simulated multi-node training cluster that drives jaxpace's pacing policies unchanged.

Modules, in data-flow order: `_scenario` (what is simulated: `Scenario` and
its parts, presets), `_collective_cost` (alpha-beta collective costs, ECMP
contention), `_engine` (`simulate`, `compare`), `_record_writer` (a simulated run as runtime
records with its ground truth: `simulate_records`, `write_records`), and `cli` (`jaxpace
simulate`: table, JSON, HTML page). Only `cli` imports the engine for
output; nothing inside the package imports this `__init__`. The CLI names
load on first use, so `import jaxpace.sim` does not pull in rich.
"""

from jaxpace.sim._collective_cost import (
    allreduce_lower_bound_s,
    busbw_gbyte_s,
    ecmp_max_load,
    hierarchical_allreduce_s,
    rabenseifner_allreduce_s,
    recursive_doubling_allreduce_s,
    ring_allgather_s,
    ring_allreduce_s,
    ring_reduce_scatter_s,
    tree_allreduce_s,
)
from jaxpace.sim._engine import (
    Comparison,
    SimResult,
    collective_cost_s,
    compare,
    resolve_policy,
    simulate,
)
from jaxpace.sim._record_writer import (
    Faults,
    GroundTruth,
    SimRecords,
    rank_groups,
    simulate_records,
    write_records,
)
from jaxpace.sim._scenario import (
    CollectiveModel,
    ComputeModel,
    CouplingModel,
    FabricModel,
    LocalityModel,
    PacingSettings,
    Scenario,
    StragglerModel,
    ThermalModel,
    load_scenario,
    preset_names,
)

__all__ = [
    "CollectiveModel",
    "Comparison",
    "ComputeModel",
    "CouplingModel",
    "FabricModel",
    "Faults",
    "GroundTruth",
    "LocalityModel",
    "PacingSettings",
    "Scenario",
    "SimRecords",
    "SimResult",
    "StragglerModel",
    "ThermalModel",
    "allreduce_lower_bound_s",
    "busbw_gbyte_s",
    "cli_main",
    "collective_cost_s",
    "compare",
    "configure_parser",
    "ecmp_max_load",
    "hierarchical_allreduce_s",
    "load_scenario",
    "preset_names",
    "rabenseifner_allreduce_s",
    "rank_groups",
    "recursive_doubling_allreduce_s",
    "render_scaling_html",
    "resolve_policy",
    "ring_allgather_s",
    "ring_allreduce_s",
    "ring_reduce_scatter_s",
    "simulate",
    "simulate_records",
    "tree_allreduce_s",
    "write_records",
]

_CLI_NAMES = ("cli_main", "configure_parser", "render_scaling_html")


def __getattr__(name: str):
    if name in _CLI_NAMES:
        from jaxpace.sim import cli

        return getattr(cli, name)
    if name == "busbw_gbps":  # the old name; `gbps` means gigabits elsewhere in jaxpace
        import warnings

        warnings.warn(
            "`jaxpace.sim.busbw_gbps` is deprecated: it returns GB/s (bytes); "
            "use `jaxpace.sim.busbw_gbyte_s`.",
            DeprecationWarning,
            stacklevel=2,
        )
        return busbw_gbyte_s
    raise AttributeError(f"module 'jaxpace.sim' has no attribute {name!r}")
