"""Hardware topology (NUMA, PCIe, NVLink, NICs): discovery, locality-aware meshes, cost model.

The package follows the data flow:

- `hardware`: the per-host model (`Link`, `Distance`, `Gpu`, `Nic`, `Host`).
- `model`: `Topology`, the hosts of a job; `json_codec`: its JSON file.
- `parsers`: sysfs, `nvidia-smi topo -m` and NVML, each building a `Host`.
- `discovery`: `discover`, which runs the parsers and merges what they found.
- `mesh`: `plan_mesh` / `device_grid` / `make_mesh`, device order by locality.
- `cost`: `CostModel`, `axis_costs_s`, `score`, the alpha-beta model of an order.
- `registry`: the bounded, process-wide list of meshes `make_mesh` built.
- `cli`: `jaxpace topo`.

Everything users import is re-exported here.
"""

from jaxpace.errors import TopologyError
from jaxpace.topology.cli import cli_main, configure_parser
from jaxpace.topology.cost import CostModel, axis_costs_s, score
from jaxpace.topology.discovery import TOPOLOGY_ENV, Discovery, discover
from jaxpace.topology.hardware import Distance, Gpu, Host, Link, Nic
from jaxpace.topology.mesh import (
    MeshPlan,
    MockDevice,
    default_device_grid,
    device_grid,
    make_mesh,
    mock_devices,
    physical_gpu_index,
    plan_mesh,
)
from jaxpace.topology.model import Topology
from jaxpace.topology.parsers import parse_nvidia_smi_topo, parse_nvml, parse_sysfs

__all__ = [
    "CostModel",
    "Discovery",
    "Distance",
    "Gpu",
    "Host",
    "Link",
    "MeshPlan",
    "MockDevice",
    "Nic",
    "TOPOLOGY_ENV",
    "Topology",
    "TopologyError",
    "axis_costs_s",
    "cli_main",
    "configure_parser",
    "default_device_grid",
    "device_grid",
    "discover",
    "make_mesh",
    "mock_devices",
    "parse_nvidia_smi_topo",
    "parse_nvml",
    "parse_sysfs",
    "physical_gpu_index",
    "plan_mesh",
    "score",
]
