"""Locality-aware device order for meshes: `plan_mesh`, `device_grid`, `make_mesh`.

The order depends only on the global device list and the `Topology`, so every
process computes the same mesh. `make_mesh` registers the mesh it builds in
`jaxpace.topology.registry`, where jaxpace collectives look up which shard is
each process's first. The cost model that scores an order is `cost`.
"""

from __future__ import annotations

import logging
import math
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxpace.topology import registry
from jaxpace.topology.hardware import Host, Link
from jaxpace.topology.model import Topology

__all__ = [
    "MeshPlan",
    "MockDevice",
    "Placement",
    "default_device_grid",
    "device_grid",
    "make_mesh",
    "mock_devices",
    "physical_gpu_index",
    "plan_mesh",
    "resolve_placement",
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


def resolve_placement(
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
    where = resolve_placement(devices, topology, placement)
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
    # which shard is each process's first (see `jaxpace.topology.registry`).
    return registry.register(mesh)
