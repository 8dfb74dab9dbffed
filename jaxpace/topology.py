"""Hardware topology (NUMA, PCIe, NVLink, NICs): discovery, locality-aware meshes, cost model."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shutil
import subprocess
from typing import Any, NamedTuple

from jaxpace._mesh import (
    CostModel,
    MeshPlan,
    MockDevice,
    axis_costs_s,
    default_device_grid,
    device_grid,
    make_mesh,
    mock_devices,
    physical_gpu_index,
    plan_mesh,
    score,
)
from jaxpace._topology_parse import (
    Distance,
    Gpu,
    Host,
    Link,
    Nic,
    Topology,
    parse_nvidia_smi_topo,
    parse_nvml,
    parse_sysfs,
)
from jaxpace.errors import TopologyError

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
    "Topology",
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

TOPOLOGY_ENV = "JAXPACE_TOPOLOGY"


class Discovery(NamedTuple):
    """What `discover` found: the topology and one note per source tried."""

    topology: Topology
    notes: tuple[str, ...]


def _merge(base: Host, extra: Host, notes: list[str], what: str) -> Host:
    """Adds `extra`'s link matrices and NVLink cliques to `base` (same GPUs, same order)."""
    if len(base.gpus) != len(extra.gpus):
        notes.append(
            f"{what} lists {len(extra.gpus)} GPUs but sysfs has {len(base.gpus)}; ignoring {what}"
        )
        return base
    gpus = tuple(
        dataclasses.replace(
            g,
            nvlink_clique=e.nvlink_clique,
            numa_node=g.numa_node if g.numa_node is not None else e.numa_node,
            name=g.name or e.name,
        )
        for g, e in zip(base.gpus, extra.gpus, strict=True)
    )
    nic_links = base.nic_links
    if extra.nic_links is not None and base.nics:
        cols = [n.name for n in extra.nics]
        missing = [n.name for n in base.nics if n.name not in cols]
        if missing:
            notes.append(f"{what} does not list NIC(s) {missing}; their distances come from sysfs")
        nic_links = tuple(
            tuple(
                row[cols.index(n.name)] if n.name in cols else base.nic_distance(g.index, k)
                for k, n in enumerate(base.nics)
            )
            for g, row in zip(base.gpus, extra.nic_links, strict=True)
        )
    return dataclasses.replace(base, gpus=gpus, gpu_links=extra.gpu_links, nic_links=nic_links)


def _run_nvidia_smi(notes: list[str]) -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        notes.append("`nvidia-smi` not on PATH")
        return None
    try:
        out = subprocess.run(
            [exe, "topo", "-m"], capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError) as e:
        notes.append(f"`nvidia-smi topo -m` failed: {e}")
        return None
    return out.stdout


def discover(
    *,
    root: str | os.PathLike[str] = "/",
    path: str | os.PathLike[str] | None = None,
    nvidia_smi_text: str | None = None,
    nvml: Any = "auto",
) -> Discovery:
    """Finds this host's GPUs, NICs and their distances.

    Sources, in order: a topology JSON file (`path`, else the
    `JAXPACE_TOPOLOGY` environment variable) which, when given, is used
    alone; then sysfs under `root`; then `nvidia-smi topo -m` (the text
    passed, else the command when `root` is `/`); then NVML through
    `nvidia-ml-py` when neither of those gave a link matrix. Link matrices and
    NVLink cliques are merged onto the GPUs sysfs found. When nothing knows
    of a GPU, the result is a flat topology, which `make_mesh` treats as
    "no information" and falls back to JAX's order.

    Discovery reads only this host. Give every process the same topology
    (for example a JSON file written with `Topology.save`) so that they all
    build the same mesh.

    Args:
      root: directory holding `sys/` (a fixture tree in tests).
      path: a topology JSON file to use instead of probing.
      nvidia_smi_text: saved output of `nvidia-smi topo -m`.
      nvml: the `pynvml` module or a stand-in; `"auto"` imports it when
        `root` is `/`; None skips NVML.

    Returns:
      `Discovery(topology, notes)`; the notes say what each source gave.

    Raises:
      TopologyError: when a file that was found or given is malformed.

    >>> topo, notes = discover(root="/nonexistent", nvml=None)
    >>> topo.is_flat, notes[-1][:25]
    (True, 'no GPU information found:')
    """
    notes: list[str] = []
    if path is None and os.environ.get(TOPOLOGY_ENV):
        path = os.environ[TOPOLOGY_ENV]
        notes.append(f"${TOPOLOGY_ENV}={path}")
    if path is not None:
        topo = Topology.load(path)
        n = sum(len(h.gpus) for h in topo.hosts)
        notes.append(f"read {len(topo.hosts)} host(s), {n} GPU(s) from {os.fspath(path)}")
        return Discovery(topo, tuple(notes))

    root = os.fspath(root)
    live = os.path.abspath(root) == os.path.abspath(os.sep)
    sources = []
    host = parse_sysfs(root)
    if host.gpus:
        sources.append("sysfs")
        notes.append(f"sysfs under {root}: {len(host.gpus)} NVIDIA GPU(s), {len(host.nics)} NIC(s)")
    else:
        notes.append(f"sysfs under {root}: no NVIDIA GPUs (vendor 0x10de, class 0x0300/0x0302)")

    matrix: Host | None = None
    text = (
        nvidia_smi_text
        if nvidia_smi_text is not None
        else (_run_nvidia_smi(notes) if live else None)
    )
    if text is not None:
        matrix = parse_nvidia_smi_topo(text)
        sources.append("nvidia-smi")
        notes.append(f"nvidia-smi topo -m: {len(matrix.gpus)} GPU(s), {len(matrix.nics)} NIC(s)")
        what = "nvidia-smi topo -m"
    if matrix is None and nvml is not None:
        module = nvml
        if nvml == "auto":
            module = None
            if live:
                try:
                    import pynvml as module  # type: ignore[import-not-found,no-redef]
                except ImportError:
                    notes.append("nvidia-ml-py not installed (pip install nvidia-ml-py)")
        if module is not None:
            try:
                matrix = parse_nvml(module)
                sources.append("nvml")
                notes.append(f"NVML: {len(matrix.gpus)} GPU(s)")
                what = "NVML"
            except Exception as e:  # NVMLError: no driver, no permission, ...
                notes.append(f"NVML failed: {type(e).__name__}: {e}")

    if host.gpus and matrix is not None:
        host = _merge(host, matrix, notes, what)
    elif matrix is not None:
        host = matrix
    elif host.gpus:
        notes.append("no link matrix (nvidia-smi / NVML): NVLink cliques unknown")
    if not host.gpus:
        notes.append(
            "no GPU information found: returning a flat topology; "
            "make_mesh will use JAX's device order"
        )
        return Discovery(Topology.flat(source="none"), tuple(notes))
    return Discovery(Topology(hosts=(host,), source="+".join(sources)), tuple(notes))


# --------------------------------------------------------------------------- CLI


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Adds the options of `jaxpace topo` to `parser`."""
    parser.add_argument(
        "--from",
        dest="from_file",
        metavar="FILE",
        help="topology JSON file, or saved `nvidia-smi topo -m` output (default: discover)",
    )
    parser.add_argument(
        "--sysfs-root", default="/", metavar="DIR", help="directory holding sys/ (default: /)"
    )
    parser.add_argument(
        "--mesh", metavar="SHAPE", help="mesh shape, e.g. 4,8 (default: hosts,GPUs)"
    )
    parser.add_argument("--axes", metavar="NAMES", help="axis names, e.g. data,model")
    parser.add_argument(
        "--hosts", type=int, metavar="N", help="simulate N identical hosts (default: as described)"
    )
    parser.add_argument(
        "--traffic-mb",
        default="256",
        metavar="MB",
        help="MB all-reduced per device per step, one value or one per axis (default: 256)",
    )
    parser.add_argument("--json", action="store_true", help="print the topology as JSON only")


def _load_any(path: str) -> Topology:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise TopologyError(f"{path}: cannot read: {e.strerror}") from e
    if text.lstrip().startswith("{"):
        return Topology.from_json(text, path=path)
    host = parse_nvidia_smi_topo(text, path=path)
    return Topology(hosts=(host,), source=f"nvidia-smi topo -m ({path})")


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"`{what}` must be comma-separated integers, got {text!r}") from None


def cli_main(args: argparse.Namespace) -> int:
    """Runs `jaxpace topo`; returns the exit status (2 for bad input)."""
    import sys

    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze the matrix into 80 columns
        console = Console(width=200)
    try:
        if args.from_file:
            topo, notes = _load_any(args.from_file), (f"read {args.from_file}",)
        else:
            topo, notes = discover(root=args.sysfs_root)
        if args.json:
            print(topo.to_json())
            return 0
        for n in notes:
            console.print(f"[dim]•[/dim] {n}")
        if topo.is_flat:
            console.print("No GPU topology found; `make_mesh` will use JAX's device order.")
            return 0
        _print_topology(console, topo, Table)
        _print_mesh(console, topo, args, Table)
    except (TopologyError, ValueError) as e:
        print(f"jaxpace topo: error: {e}", file=sys.stderr)
        return 2
    return 0


def _fmt(v: Any) -> str:
    return "-" if v is None or v == () else str(v)


def _print_topology(console: Any, topo: Topology, Table: Any) -> None:  # noqa: N803
    for h in topo.hosts:
        t = Table(title=f"{h.name}: GPUs ({topo.source})")
        for c in ("GPU", "PCI bus id", "NUMA", "PCIe switch", "NVLink clique", "rail (NIC)"):
            t.add_column(c)
        for g in h.gpus:
            r = h.nearest_nic(g.index)
            rail = "-" if r is None else f"{r} ({h.nics[r].name}, {h.nic_distance(g.index, r)})"
            t.add_row(
                str(g.index),
                _fmt(g.pci_bus_id),
                _fmt(g.numa_node),
                _fmt(g.pcie_switch),
                _fmt(g.nvlink_clique),
                rail,
            )
        console.print(t)
        if h.nics:
            t = Table(title=f"{h.name}: NICs")
            for c in ("rail", "name", "PCI bus id", "NUMA", "rate (Gb/s)"):
                t.add_column(c)
            for k, n in enumerate(h.nics):
                t.add_row(
                    str(k), n.name, _fmt(n.pci_bus_id), _fmt(n.numa_node), _fmt(n.link_rate_gbps)
                )
            console.print(t)
        t = Table(title=f"{h.name}: links (nvidia-smi topo -m classes)")
        t.add_column("")
        cols = [f"GPU{g.index}" for g in h.gpus] + [n.name for n in h.nics]
        for c in cols:
            t.add_column(c)
        for g in h.gpus:
            row = [str(h.gpu_distance(g.index, o.index)) for o in h.gpus]
            row += [str(h.nic_distance(g.index, k)) for k in range(len(h.nics))]
            t.add_row(f"GPU{g.index}", *row)
        console.print(t)


def _print_mesh(console: Any, topo: Topology, args: argparse.Namespace, Table: Any) -> None:  # noqa: N803
    n_hosts = args.hosts or max(1, len(topo.hosts))
    if n_hosts < 1:
        raise ValueError(f"`--hosts` must be >= 1, got {n_hosts}")
    per_host = len(topo.host_for_process(0).gpus)
    shape = _ints(args.mesh, "--mesh") if args.mesh else (n_hosts, per_host)
    names = (
        tuple(args.axes.split(","))
        if args.axes
        else (
            ("data", "model") if len(shape) == 2 else tuple(f"axis{i}" for i in range(len(shape)))
        )
    )
    traffic = [float(x) for x in str(args.traffic_mb).split(",")]
    if len(traffic) == 1:
        traffic = traffic * len(names)
    if len(traffic) != len(names):
        raise ValueError(f"`--traffic-mb` has {len(traffic)} values for {len(names)} axes")
    devices = [
        MockDevice(id=h * per_host + k, process_index=h, local_hardware_id=g.index)
        for h in range(n_hosts)
        for k, g in enumerate(topo.host_for_process(h).gpus)
    ]
    where = {d.id: (d.process_index, d.local_hardware_id) for d in devices}
    plan = plan_mesh(shape, names, devices=devices, topology=topo, placement=lambda d: where[d.id])
    default = default_device_grid(shape, devices)

    def label(d: MockDevice) -> str:
        h, g = where[d.id]
        return f"h{h}:g{g}" if n_hosts > 1 else f"g{g}"

    t = Table(title=f"suggested mesh {dict(zip(names, shape, strict=True))} (last axis busiest)")
    flat = plan.devices.reshape(-1, shape[-1])
    t.add_column(",".join(names[:-1]) or "-")
    for j in range(shape[-1]):
        t.add_column(f"{names[-1]}={j}")
    outer = [()] if len(shape) == 1 else [idx for idx in _ndindex(shape[:-1])]
    for idx, row in zip(outer, flat, strict=True):
        t.add_row(",".join(map(str, idx)) or "-", *(label(d) for d in row))
    console.print(t)
    traffic_b = {n: mb * 1e6 for n, mb in zip(names, traffic, strict=True)}
    cost_default = axis_costs_s(default, names, traffic_b, topo, placement=lambda d: where[d.id])
    cost_ours = axis_costs_s(plan.devices, names, traffic_b, topo, placement=lambda d: where[d.id])
    t = Table(title="estimated all-reduce time per step (ms, lower is better)")
    t.add_column("axis")
    t.add_column("MB")
    t.add_column("JAX default order")
    t.add_column("jaxpace order")
    for n in names:
        t.add_row(
            n,
            f"{traffic_b[n] / 1e6:g}",
            f"{cost_default[n] * 1e3:.3f}",
            f"{cost_ours[n] * 1e3:.3f}",
        )
    td, to = sum(cost_default.values()), sum(cost_ours.values())
    t.add_row("total", "", f"{td * 1e3:.3f}", f"{to * 1e3:.3f}")
    console.print(t)
    if to > 0 and not math.isclose(td, to):
        console.print(f"jaxpace order: {td / to:.2f}x faster than JAX's default (model estimate)")


def _ndindex(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    import numpy as np

    return list(np.ndindex(*shape))
