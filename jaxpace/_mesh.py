"""Locality-aware device order for meshes, and the cost model that scores an order."""

from __future__ import annotations

import logging
import math
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxpace import _mesh_registry
from jaxpace._topology_parse import Distance, Host, Link, Topology

__all__ = [
    "CostModel",
    "MeshPlan",
    "MockDevice",
    "axis_costs_s",
    "default_device_grid",
    "device_grid",
    "make_mesh",
    "mock_devices",
    "physical_gpu_index",
    "plan_mesh",
    "score",
]

logger = logging.getLogger("jaxpace.topology")

Placement = Callable[[Any], tuple[int, int]]


@dataclass(frozen=True, kw_only=True)
class MockDevice:
    """A stand-in for a `jax.Device` with the attributes jaxpace reads.

    >>> MockDevice(id=3, process_index=0, local_hardware_id=3)
    MockDevice(id=3, process_index=0, local_hardware_id=3, device_kind='NVIDIA H100 80GB HBM3', platform='gpu')
    """

    id: int
    process_index: int = 0
    local_hardware_id: int | None = None
    device_kind: str = "NVIDIA H100 80GB HBM3"
    platform: str = "gpu"


def mock_devices(num_hosts: int, gpus_per_host: int) -> list[MockDevice]:
    """`num_hosts × gpus_per_host` mock GPUs, ids host-major, as JAX numbers them.

    >>> [(d.id, d.process_index, d.local_hardware_id) for d in mock_devices(2, 2)]
    [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    """
    return [
        MockDevice(id=h * gpus_per_host + k, process_index=h, local_hardware_id=k)
        for h in range(num_hosts)
        for k in range(gpus_per_host)
    ]


def physical_gpu_index(device: Any, cuda_visible_devices: str | Sequence[int] | None = None) -> int:
    """Physical GPU index (as `nvidia-smi` numbers it) of a JAX device.

    JAX's `local_hardware_id` counts the GPUs the process can see; with
    `CUDA_VISIBLE_DEVICES=4,5,6,7`, local id 0 is physical GPU 4.

    Args:
      device: a `jax.Device` (or `MockDevice`) with `local_hardware_id`.
      cuda_visible_devices: the value of `CUDA_VISIBLE_DEVICES` for the process
        that owns `device` (a string such as `"4,5,6,7"` or a list of ints);
        None or `""` means every GPU is visible in physical order.

    Raises:
      ValueError: if the device has no `local_hardware_id`, or the variable
        names GPUs by UUID or has too few entries.

    >>> physical_gpu_index(MockDevice(id=0, local_hardware_id=1), "4,5,6,7")
    5
    """
    local = getattr(device, "local_hardware_id", None)
    if local is None:
        raise ValueError(f"device {device!r} has no `local_hardware_id`")
    if cuda_visible_devices is None or cuda_visible_devices == "":
        return int(local)
    if isinstance(cuda_visible_devices, str):
        items = [s.strip() for s in cuda_visible_devices.split(",") if s.strip()]
        if not all(s.isdigit() for s in items):
            raise ValueError(
                f"`CUDA_VISIBLE_DEVICES={cuda_visible_devices}` names GPUs by UUID or MIG id; "
                "jaxpace maps only integer indices. Use indices, or pass `placement=`."
            )
        visible = [int(s) for s in items]
    else:
        visible = [int(x) for x in cuda_visible_devices]
    if not 0 <= local < len(visible):
        raise ValueError(
            f"device {device!r} has `local_hardware_id={local}` but "
            f"`CUDA_VISIBLE_DEVICES` lists only {len(visible)} GPUs: {visible}"
        )
    return visible[local]


def _validate(
    axis_shapes: Sequence[int], axis_names: Sequence[str], n_devices: int
) -> tuple[int, ...]:
    if isinstance(axis_names, str):
        raise ValueError(
            f"`axis_names` must be a sequence of names, got the string {axis_names!r}; "
            f"did you mean `({axis_names!r},)`?"
        )
    shapes = tuple(axis_shapes)
    names = tuple(axis_names)
    if not shapes:
        raise ValueError("`axis_shapes` is empty; give at least one axis, e.g. `(8,)`")
    for s in shapes:
        if isinstance(s, bool) or not isinstance(s, int | np.integer) or s < 1:
            raise ValueError(f"`axis_shapes` must be positive ints, got {shapes}")
    if len(shapes) != len(names):
        raise ValueError(
            f"`axis_shapes` {shapes} has {len(shapes)} axes but `axis_names` {names} "
            f"has {len(names)}; give one name per axis"
        )
    for nm in names:
        if not isinstance(nm, str) or not nm:
            raise ValueError(f"`axis_names` must be non-empty strings, got {names}")
    dup = sorted(n for n, c in Counter(names).items() if c > 1)
    if dup:
        raise ValueError(f"`axis_names` {names} repeat {dup}; every axis needs its own name")
    if math.prod(shapes) != n_devices:
        raise ValueError(
            f"`axis_shapes` {shapes} hold {math.prod(shapes)} devices but `devices` has "
            f"{n_devices}; the product of `axis_shapes` must equal the device count"
        )
    return tuple(int(s) for s in shapes)


def default_device_grid(axis_shapes: Sequence[int], devices: Sequence[Any]) -> np.ndarray:
    """The order `jax.make_mesh` would use (on GPU: sorted by `id`).

    >>> default_device_grid((2, 2), mock_devices(1, 4)[::-1]).tolist()[0][1].id
    1
    """
    from jax.experimental import mesh_utils

    return mesh_utils.create_device_mesh(tuple(axis_shapes), list(devices))


def _default_placement(devices: Sequence[Any], topology: Topology) -> dict[int, tuple[int, int]]:
    """Device id → (process index, physical GPU index), from global facts only."""
    by_proc: dict[int, list[Any]] = {}
    for d in devices:
        by_proc.setdefault(int(d.process_index), []).append(d)
    # CUDA_VISIBLE_DEVICES is process-local; read it only when this process
    # owns every device, so that every process computes the same placement.
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if len(by_proc) == 1 else None
    out = {}
    for p, ds in by_proc.items():
        host = topology.host_for_process(p)
        for pos, d in enumerate(sorted(ds, key=lambda d: d.id)):
            if getattr(d, "platform", "gpu") == "gpu" and d.local_hardware_id is not None:
                out[d.id] = (p, physical_gpu_index(d, visible))
            else:
                # CPU stand-ins (tests, `jaxpace topo`): the k-th device of a
                # process plays the host's k-th GPU.
                out[d.id] = (p, host.gpus[pos].index if pos < len(host.gpus) else pos)
    return out


def _placement(
    devices: Sequence[Any], topology: Topology, placement: Placement | None
) -> dict[int, tuple[Host, int, int]]:
    """Device id → (host, host key, physical GPU index); checks every GPU exists once."""
    if placement is None:
        raw = _default_placement(devices, topology)
    else:
        raw = {d.id: tuple(int(x) for x in placement(d)) for d in devices}
    out: dict[int, tuple[Host, int, int]] = {}
    seen: dict[tuple[int, int], Any] = {}
    for d in devices:
        hkey, gpu = raw[d.id]
        host = topology.host_for_process(hkey)
        host.gpu(gpu)  # raises a ValueError naming the host's GPUs
        if (hkey, gpu) in seen:
            raise ValueError(
                f"devices {seen[(hkey, gpu)]!r} and {d!r} both map to GPU {gpu} of host "
                f"{hkey}; pass `placement=` to say which physical GPU each device is"
            )
        seen[(hkey, gpu)] = d
        out[d.id] = (host, hkey, gpu)
    return out


def _partitions(host: Host) -> list[dict[int, int]]:
    """Locality domains of a host's GPUs, coarsest first: GPU index → group id."""
    idx = [g.index for g in host.gpus]

    def components(linked: Callable[[int, int], bool]) -> dict[int, int]:
        group: dict[int, int] = {}
        for a in idx:
            if a in group:
                continue
            members, stack = {a}, [a]
            while stack:
                x = stack.pop()
                for b in idx:
                    if b not in members and linked(x, b):
                        members.add(b)
                        stack.append(b)
            for m in members:
                group[m] = min(members)
        return group

    def pcie_within(limit: Link) -> Callable[[int, int], bool]:
        def f(a: int, b: int) -> bool:
            d = host.pcie_distance(a, b)
            if d is None:  # NVLink hides the PCIe class in `nvidia-smi` matrices
                na, nb = host.gpu(a).numa_node, host.gpu(b).numa_node
                return limit >= Link.NODE and na is not None and na == nb
            return d.link <= limit

        return f

    parts = [
        components(lambda a, b: host.gpu_distance(a, b).link is Link.NV),
        components(pcie_within(Link.NODE)),  # NUMA node
        components(pcie_within(Link.PHB)),  # root complex
        components(pcie_within(Link.PXB)),  # PCIe switch tree
    ]
    if host.nics:
        rails = {g: host.nearest_nic(g) for g in idx}
        parts.append({g: min(x for x in idx if rails[x] == rails[g]) for g in idx})
    # Coarse to fine; stable for ties, so NVLink outranks PCIe at equal size.
    order = sorted(range(len(parts)), key=lambda k: len(set(parts[k].values())))
    return [parts[k] for k in order]


@dataclass(frozen=True)
class MeshPlan:
    """A device order and how it was chosen.

    Attributes:
      devices: `np.ndarray` of devices shaped like `axis_shapes`.
      axis_names: the mesh axis names.
      used_topology: False when jaxpace fell back to JAX's order.
      notes: human-readable reasons (why a fallback happened, what was used).
    """

    devices: np.ndarray
    axis_names: tuple[str, ...]
    used_topology: bool
    notes: tuple[str, ...]


def plan_mesh(
    axis_shapes: Sequence[int],
    axis_names: Sequence[str],
    *,
    devices: Sequence[Any] | None = None,
    topology: Topology | str | os.PathLike[str] | None = None,
    placement: Placement | None = None,
) -> MeshPlan:
    """Orders devices for a mesh by locality and says how (see `make_mesh`).

    Returns:
      A `MeshPlan`; `plan.devices` works with mock devices too.

    >>> from jaxpace.topology import Gpu, Host, Topology
    >>> topo = Topology(hosts=(Host(gpus=tuple(Gpu(index=i, numa_node=i % 2) for i in range(4))),))
    >>> plan = plan_mesh((2, 2), ("data", "model"), devices=mock_devices(1, 4), topology=topo)
    >>> [[d.id for d in row] for row in plan.devices]
    [[0, 2], [1, 3]]
    >>> plan_mesh((4,), ("data",), devices=mock_devices(1, 4)).notes[0][:33]
    'no topology given: using JAX devi'
    """
    if devices is None:
        import jax

        devices = jax.devices()
    devices = list(devices)
    shapes = _validate(axis_shapes, axis_names, len(devices))
    names = tuple(axis_names)
    if len({d.id for d in devices}) != len(devices):
        raise ValueError("`devices` repeat a device id; pass each device once")
    if isinstance(topology, str | os.PathLike):
        topology = Topology.load(topology)

    def fallback(why: str) -> MeshPlan:
        note = f"{why}: using JAX device order (as `jax.make_mesh`), not locality"
        logger.warning("jaxpace.make_mesh: %s", note)
        return MeshPlan(default_device_grid(shapes, devices), names, False, (note,))

    if topology is None:
        return fallback("no topology given")
    if topology.is_flat:
        return fallback(f"topology from {topology.source!r} has no locality information")
    where = _placement(devices, topology, placement)
    keys = {}
    cache: dict[int, list[dict[int, int]]] = {}
    for d in devices:
        host, hkey, gpu = where[d.id]
        parts = cache.setdefault(id(host), _partitions(host))
        keys[d.id] = (hkey, *(p[gpu] for p in parts), gpu, d.id)
    ordered = sorted(devices, key=lambda d: keys[d.id])
    grid = np.empty(len(ordered), dtype=object)
    grid[:] = ordered
    notes = (
        f"ordered by topology from {topology.source!r}: hosts by process index, then "
        "NVLink clique / NUMA node / PCIe switch / NIC rail within each host",
    )
    return MeshPlan(grid.reshape(shapes), names, True, notes)


def device_grid(
    axis_shapes: Sequence[int],
    axis_names: Sequence[str],
    *,
    devices: Sequence[Any] | None = None,
    topology: Topology | str | os.PathLike[str] | None = None,
    placement: Placement | None = None,
) -> np.ndarray:
    """The device array `make_mesh` would wrap; works with `MockDevice`.

    >>> device_grid((2, 4), ("data", "model"), devices=mock_devices(2, 4)).shape
    (2, 4)
    """
    return plan_mesh(
        axis_shapes, axis_names, devices=devices, topology=topology, placement=placement
    ).devices


def make_mesh(
    axis_shapes: Sequence[int],
    axis_names: Sequence[str],
    *,
    devices: Sequence[Any] | None = None,
    topology: Topology | str | os.PathLike[str] | None = None,
    placement: Placement | None = None,
    axis_types: tuple[Any, ...] | None = None,
) -> Any:
    """A `jax.sharding.Mesh` whose busiest axis stays inside the tightest hardware.

    Axes are given in order of increasing network intensity, as for
    `jax.experimental.mesh_utils.create_hybrid_device_mesh`: the last axis
    (e.g. `model`) communicates most and is kept inside the tightest locality
    domain (NVLink clique, then PCIe switch, then NUMA node, then host); axes
    that span hosts are rail-aligned (position k of every host is the same
    physical GPU, so on the same NIC rail). The order depends only on the
    global device list and `topology`, so every process computes the same
    mesh when given the same topology.

    Without topology information (`topology=None`, or a flat topology from
    `discover()` on a machine without GPUs) it uses JAX's order and logs a
    warning on the `jaxpace.topology` logger; `plan_mesh` returns that note.

    Args:
      axis_shapes: mesh shape, e.g. `(4, 8)`; its product must equal the
        number of devices.
      axis_names: one distinct name per axis, e.g. `("data", "model")`.
      devices: defaults to `jax.devices()` (all processes' devices).
      topology: a `Topology`, a path to its JSON file, or None.
      placement: optional `device → (process index, physical GPU index)`;
        the default uses `process_index` and `local_hardware_id`
        (through `CUDA_VISIBLE_DEVICES` when one process owns every device).
      axis_types: passed to `jax.sharding.Mesh`; None means `Explicit` on
        every axis, like `jax.make_mesh`.

    Returns:
      A plain `jax.sharding.Mesh`.

    Raises:
      ValueError: naming the field, for shapes/names that do not fit the
        devices, or a topology that has no GPU for some device.

    >>> import jax
    >>> mesh = make_mesh((len(jax.devices()),), ("data",))
    >>> mesh.axis_names
    ('data',)
    """
    import jax

    grid = device_grid(
        axis_shapes, axis_names, devices=devices, topology=topology, placement=placement
    )
    if axis_types is None:
        axis_types = (jax.sharding.AxisType.Explicit,) * grid.ndim
    mesh = jax.sharding.Mesh(grid, tuple(axis_names), axis_types=axis_types)
    # Remembered so jaxpace collectives inside `shard_map(mesh=mesh)` know
    # which shard is each process's first.
    return _mesh_registry.register(mesh)


# --------------------------------------------------------------------------- cost model


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
        where = _placement(devices, topology, placement)
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
