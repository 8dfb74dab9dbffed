"""Discovery: which GPUs and NICs this host has, and how far apart they are.

`discover` reads a topology JSON file when one is given (argument or
`$JAXPACE_TOPOLOGY`), else sysfs, `nvidia-smi topo -m` and NVML (see
`jaxpace.topology.parsers`), and merges what they found.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from typing import Any, NamedTuple

from jaxpace.topology.hardware import Host
from jaxpace.topology.model import Topology
from jaxpace.topology.parsers import parse_nvidia_smi_topo, parse_nvml, parse_sysfs

__all__ = ["TOPOLOGY_ENV", "Discovery", "discover"]

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
    matrix, what = _link_matrix(live, nvidia_smi_text, nvml, notes)
    if matrix is not None:
        sources.append(what)
    if host.gpus and matrix is not None:
        host = _merge(host, matrix, notes, _WHAT[what])
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


_WHAT = {"nvidia-smi": "nvidia-smi topo -m", "nvml": "NVML"}


def _link_matrix(
    live: bool, nvidia_smi_text: str | None, nvml: Any, notes: list[str]
) -> tuple[Host | None, str]:
    """The GPU link matrix from `nvidia-smi topo -m`, else NVML; and its source's name."""
    text = (
        nvidia_smi_text
        if nvidia_smi_text is not None
        else (_run_nvidia_smi(notes) if live else None)
    )
    if text is not None:
        matrix = parse_nvidia_smi_topo(text)
        notes.append(f"nvidia-smi topo -m: {len(matrix.gpus)} GPU(s), {len(matrix.nics)} NIC(s)")
        return matrix, "nvidia-smi"
    if nvml is None:
        return None, ""
    module = nvml
    if nvml == "auto":
        module = None
        if live:
            try:
                import pynvml as module  # type: ignore[import-not-found,no-redef]
            except ImportError:
                notes.append("nvidia-ml-py not installed (pip install nvidia-ml-py)")
    if module is None:
        return None, ""
    try:
        matrix = parse_nvml(module)
    except Exception as e:  # NVMLError: no driver, no permission, ...
        notes.append(f"NVML failed: {type(e).__name__}: {e}")
        return None, ""
    notes.append(f"NVML: {len(matrix.gpus)} GPU(s)")
    return matrix, "nvml"
