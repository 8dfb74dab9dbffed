"""`jaxpace topo`: print this host's topology, the suggested mesh and both orders' cost."""

from __future__ import annotations

import argparse
import math
from typing import Any

from jaxpace.errors import TopologyError
from jaxpace.topology.cost import axis_costs_s
from jaxpace.topology.discovery import discover
from jaxpace.topology.mesh import MockDevice, default_device_grid, plan_mesh
from jaxpace.topology.model import Topology
from jaxpace.topology.parsers import parse_nvidia_smi_topo

__all__ = ["cli_main", "configure_parser"]


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
        out = tuple(int(x) for x in text.split(","))
    except ValueError:
        out = ()
    if not out or any(v < 1 for v in out):
        raise ValueError(
            f"`{what}` must be comma-separated positive integers (e.g. 4,8), got {text!r}"
        )
    return out


def cli_main(args: argparse.Namespace) -> int:
    """Runs `jaxpace topo`; returns the exit status (2 for bad input)."""
    import sys

    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze the matrix into 80 columns
        console = Console(width=200)
    try:
        if args.mesh:  # checked first: a bad shape is an error even with no GPU to plan
            _ints(args.mesh, "--mesh")
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
