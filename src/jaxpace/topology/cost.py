"""The alpha-beta cost model that scores a device order: `CostModel`, `axis_costs_s`, `score`.

Units: bandwidths are GB/s (`*_gbyte_s`, 1e9 bytes per second); a NIC's
`link_rate_gbps` is gigabits per second and is divided by 8 here.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxpace.topology.hardware import Distance, Link
from jaxpace.topology.mesh import Placement, resolve_placement
from jaxpace.topology.model import Topology

__all__ = ["CostModel", "axis_costs_s", "score"]


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """Bandwidths (GB/s, 1e9 bytes per second) and latencies of the alpha-beta model.

    Attributes:
      nvlink_gbyte_s: GPU↔GPU over NVLink (`NV#`).
      pix_gbyte_s: through PCIe switches (`PIX`, `PXB`).
      phb_gbyte_s: through a host bridge or within a NUMA node (`PHB`, `NODE`).
      sys_gbyte_s: across sockets (`SYS`).
      nic_gbyte_s: per NIC across hosts, when its link rate is unknown.
      nic_efficiency: fraction of a known NIC link rate that carries data.
      cross_rail_factor: bandwidth factor when hosts contribute GPUs on
        different NIC rails to one group (traffic crosses the spine).
      intra_host_latency_s: per ring step inside a host.
      inter_host_latency_s: per ring step across hosts.
    """

    nvlink_gbyte_s: float = 370.0
    pix_gbyte_s: float = 25.0
    phb_gbyte_s: float = 20.0
    sys_gbyte_s: float = 10.0
    nic_gbyte_s: float = 46.0
    nic_efficiency: float = 0.92
    cross_rail_factor: float = 0.5
    intra_host_latency_s: float = 2e-6
    inter_host_latency_s: float = 8e-6

    def __post_init__(self) -> None:
        for k, v in vars(self).items():
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise ValueError(f"`CostModel.{k}` must be a positive finite number, got {v!r}")

    def link_gbyte_s(self, d: Distance) -> float:
        """Bandwidth of an intra-host link class."""
        if d.link <= Link.NV:
            return self.nvlink_gbyte_s
        if d.link <= Link.PXB:
            return self.pix_gbyte_s
        if d.link <= Link.NODE:
            return self.phb_gbyte_s
        return self.sys_gbyte_s


def axis_costs_s(
    grid: np.ndarray,
    axis_names: Sequence[str],
    traffic_bytes_per_axis: Mapping[str, float],
    topology: Topology | None,
    *,
    cost_model: CostModel | None = None,
    placement: Placement | None = None,
) -> dict[str, float]:
    """Estimated all-reduce time per axis, in seconds (see `score`)."""
    cm = cost_model or CostModel()
    names = tuple(axis_names)
    if grid.ndim != len(names):
        raise ValueError(f"`axis_names` {names} do not match a grid of {grid.ndim} axes")
    unknown = sorted(set(traffic_bytes_per_axis) - set(names))
    if unknown:
        raise ValueError(f"`traffic_bytes_per_axis` names unknown axes {unknown}; axes: {names}")
    devices = list(grid.flat)
    if topology is None or topology.is_flat:
        where = None
    else:
        where = resolve_placement(devices, topology, placement)
    out: dict[str, float] = {}
    for ax, name in enumerate(names):
        n_bytes = float(traffic_bytes_per_axis.get(name, 0.0))
        p = grid.shape[ax]
        if p == 1 or n_bytes == 0.0:
            out[name] = 0.0
            continue
        groups = np.moveaxis(grid, ax, -1).reshape(-1, p)
        out[name] = _axis_time_s(groups, n_bytes, where, cm)
    return out


def _axis_time_s(groups: np.ndarray, n_bytes: float, where: Any, cm: CostModel) -> float:
    def host_of(d: Any) -> int:
        return where[d.id][1] if where else int(d.process_index)

    def rail(d: Any) -> int | None:
        if not where:
            return None
        host, _, gpu = where[d.id]
        return host.nearest_nic(gpu)

    # NIC sharing: cross-host ring edges of all groups leave through these NICs at once.
    nic_load: Counter = Counter()
    for g in groups:
        for i, d in enumerate(g):
            e = g[(i + 1) % len(g)]
            if host_of(d) != host_of(e):
                nic_load[(host_of(d), rail(d) if rail(d) is not None else ("gpu", d.id))] += 1
    worst = 0.0
    for g in groups:
        p = len(g)
        rails_by_host: dict[int, list] = {}
        for d in g:
            rails_by_host.setdefault(host_of(d), []).append(rail(d))
        rail_sets = {tuple(sorted(map(str, r))) for r in rails_by_host.values()}
        rail_aligned = len(rail_sets) <= 1
        bw, alpha = math.inf, 0.0
        for i, d in enumerate(g):
            e = g[(i + 1) % p]
            if host_of(d) == host_of(e):
                if where:
                    host, _, a = where[d.id]
                    link = host.gpu_distance(a, where[e.id][2])
                else:
                    link = Distance(Link.PHB)
                bw = min(bw, cm.link_gbyte_s(link))
                alpha = max(alpha, cm.intra_host_latency_s)
            else:
                bw = min(bw, _nic_edge_gbyte_s(d, where, cm, nic_load, host_of, rail, rail_aligned))
                alpha = max(alpha, cm.inter_host_latency_s)
        worst = max(worst, 2 * (p - 1) / p * n_bytes / (bw * 1e9) + 2 * (p - 1) * alpha)
    return worst


def _nic_edge_gbyte_s(d, where, cm, nic_load, host_of, rail, rail_aligned) -> float:  # noqa: ANN001
    r = rail(d)
    key = (host_of(d), r if r is not None else ("gpu", d.id))
    nic_bw = cm.nic_gbyte_s
    if where and r is not None:
        host, _, gpu = where[d.id]
        rate = host.nics[r].link_rate_gbps
        if rate:
            nic_bw = rate / 8.0 * cm.nic_efficiency
        path = host.nic_distance(gpu, r)
        if path.link > Link.PXB:  # no GPUDirect path through a switch
            nic_bw = min(nic_bw, cm.link_gbyte_s(path))
    bw = nic_bw / max(1, nic_load[key])
    return bw if rail_aligned else bw * cm.cross_rail_factor


def score(
    grid: np.ndarray,
    axis_names: Sequence[str],
    traffic_bytes_per_axis: Mapping[str, float],
    topology: Topology | None,
    *,
    cost_model: CostModel | None = None,
    placement: Placement | None = None,
) -> float:
    """Estimated communication time of one step, in seconds; lower is better.

    Each axis runs one ring all-reduce of `traffic_bytes_per_axis[axis]`
    bytes per device in every group along it (groups run concurrently, so
    the slowest group counts); axes add up. A group's time is
    `2(p−1)/p · n / B + 2(p−1) · alpha`, where `B` is the bottleneck of its
    ring edges in mesh order: the intra-host link class (`CostModel`), or
    across hosts the NIC bandwidth divided among the edges that share it,
    limited by a GPU→NIC path through a host bridge or socket, and halved
    (`cross_rail_factor`) when hosts contribute GPUs on different rails.
    Range: 0 (no traffic) upward; compare orders under the same model only.

    Args:
      grid: devices shaped like the mesh (`plan_mesh(...).devices`).
      axis_names: names of the grid's axes.
      traffic_bytes_per_axis: bytes all-reduced per device per step, by axis
        name; missing axes carry none.
      topology: what is known of the hardware; None scores every intra-host
        link as `PHB` and every GPU as having its own NIC.
      cost_model: bandwidths and latencies; defaults to `CostModel()`.
      placement: as for `make_mesh`.

    Returns:
      Seconds per step.

    >>> from jaxpace.topology import default_device_grid, mock_devices
    >>> grid = default_device_grid((4,), mock_devices(1, 4))
    >>> round(score(grid, ("data",), {"data": 1e9}, None) * 1e3, 1)  # 1.5 GB over PHB
    75.0
    """
    return sum(
        axis_costs_s(
            grid,
            axis_names,
            traffic_bytes_per_axis,
            topology,
            cost_model=cost_model,
            placement=placement,
        ).values()
    )
