"""The per-host hardware model: link classes, distances, GPUs, NICs and hosts.

`Link` and `Distance` are the classes `nvidia-smi topo -m` prints; `Gpu`,
`Nic` and `Host` hold what discovery found. Nothing here reads files or runs
commands: the parsers (`jaxpace.topology.parsers`) and the JSON codec build
these objects.

Units: `Nic.link_rate_gbps` is gigabits per second (`gbps` means gigabits
everywhere in jaxpace); bandwidths in bytes say so (`*_gbyte_s`).
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Distance", "Gpu", "Host", "Link", "Nic", "nvlink_cliques"]


class Link(enum.IntEnum):
    """Distance classes of `nvidia-smi topo -m`, closest first.

    `NET` (different hosts) is jaxpace's addition; the others keep the names
    `nvidia-smi` prints. `int(link)` is the closeness rank: lower is closer.
    """

    X = 0  # the device itself
    NV = 1  # a bonded set of NVLinks (NV#)
    PIX = 2  # at most a single PCIe bridge (one PCIe switch)
    PXB = 3  # several PCIe bridges, without the host bridge
    PHB = 4  # through a PCIe host bridge (CPU root complex)
    NODE = 5  # between host bridges within one NUMA node
    SYS = 6  # across the SMP interconnect between NUMA nodes (QPI/UPI/xGMI)
    NET = 7  # different hosts, through the network


_LABEL_RE = re.compile(r"^(X|NV(\d*)|PIX|PXB|PHB|NODE|SYS|NET)$")
VALID_LABELS = "X, NV#, PIX, PXB, PHB, NODE, SYS, NET"


@functools.total_ordering
@dataclass(frozen=True)
class Distance:
    """A link class plus, for NVLink, the number of bonded links (`NV18`).

    Distances are totally ordered by closeness: `X < NV18 < NV4 < NV < PIX <
    PXB < PHB < NODE < SYS < NET` (more NVLinks is closer; `NV` with an unknown
    count sorts after every counted `NV#`).

    >>> Distance.parse("NV18") < Distance.parse("PIX") < Distance.parse("SYS")
    True
    >>> str(Distance(Link.NV, 12))
    'NV12'
    """

    link: Link
    nvlinks: int = 0

    @classmethod
    def parse(cls, label: str) -> Distance:
        """Reads an `nvidia-smi topo -m` cell such as `NV18`, `PIX` or `X`.

        Raises:
          ValueError: if `label` is not one of X, NV#, PIX, PXB, PHB, NODE, SYS, NET.
        """
        m = _LABEL_RE.match(label.strip())
        if not m:
            raise ValueError(f"unknown link class {label!r}; expected one of {VALID_LABELS}")
        if m.group(2) is not None:
            return cls(Link.NV, int(m.group(2)) if m.group(2) else 0)
        return cls(Link[m.group(1)])

    def _key(self) -> tuple[int, int]:
        # Unknown NVLink count (0) sorts after every known count.
        return (int(self.link), -self.nvlinks if self.nvlinks else 0)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Distance):
            return NotImplemented
        return self._key() < other._key()

    def __str__(self) -> str:
        if self.link is Link.NV:
            return f"NV{self.nvlinks}" if self.nvlinks else "NV"
        return self.link.name


@dataclass(frozen=True, kw_only=True)
class Gpu:
    """One physical GPU of a host.

    Attributes:
      index: physical index, as `nvidia-smi` / NVML number it (PCI bus order).
      pci_bus_id: `0000:18:00.0` style address, or None when unknown.
      numa_node: NUMA node of the GPU's PCIe root, or None when unknown.
      nvlink_clique: GPUs with the same value are NVLink-connected (None: unknown).
      pcie_switch: address of the upstream port of the GPU's nearest PCIe switch.
      pcie_path: root complex first (`pci0000:17`), then bridges, then the GPU.
      name: product name, e.g. `NVIDIA H100 80GB HBM3`.
    """

    index: int
    pci_bus_id: str | None = None
    numa_node: int | None = None
    nvlink_clique: int | None = None
    pcie_switch: str | None = None
    pcie_path: tuple[str, ...] = ()
    name: str | None = None


@dataclass(frozen=True, kw_only=True)
class Nic:
    """One network adapter of a host.

    Attributes:
      name: `mlx5_0` (RDMA device) or `eth0` (netdev).
      pci_bus_id: `0000:19:00.0` style address, or None when unknown.
      numa_node: NUMA node of the NIC's PCIe root, or None when unknown.
      pcie_switch: address of the upstream port of its nearest PCIe switch.
      pcie_path: root complex first, then bridges, then the NIC.
      link_rate_gbps: link rate in gigabits per second, as NIC datasheets quote
        it (400 for NDR InfiniBand), or None when unknown.
    """

    name: str
    pci_bus_id: str | None = None
    numa_node: int | None = None
    pcie_switch: str | None = None
    pcie_path: tuple[str, ...] = ()
    link_rate_gbps: float | None = None


def _pcie_link(path_a: Sequence[str], path_b: Sequence[str]) -> Link | None:
    """Link class between two devices from their PCIe paths (root first, device last)."""
    if not path_a or not path_b:
        return None
    if path_a[0] != path_b[0]:
        return Link.NODE  # different root complexes; caller handles NUMA
    pa, pb = list(path_a[1:-1]), list(path_b[1:-1])
    common = 0
    for x, y in zip(pa, pb, strict=False):
        if x != y:
            break
        common += 1
    if common < 2:
        return Link.PHB
    return Link.PIX if max(len(pa), len(pb)) - common <= 1 else Link.PXB


def _derived_distance(
    a_numa: int | None,
    a_path: Sequence[str],
    a_switch: str | None,
    b_numa: int | None,
    b_path: Sequence[str],
    b_switch: str | None,
) -> Distance:
    if a_numa is not None and b_numa is not None and a_numa != b_numa:
        return Distance(Link.SYS)
    link = _pcie_link(a_path, b_path)
    if link is not None:
        return Distance(link)
    if a_switch is not None and a_switch == b_switch:
        return Distance(Link.PIX)
    if a_numa is not None and a_numa == b_numa:
        return Distance(Link.NODE)
    return Distance(Link.PHB)  # nothing known: assume a shared host bridge


@dataclass(frozen=True, kw_only=True)
class Host:
    """One machine: its GPUs, NICs and, when measured, their link matrices.

    Attributes:
      name: host name (informational).
      gpus: GPUs sorted by `index`.
      nics: NICs in rail order (rail k is `nics[k]`).
      gpu_links: `len(gpus)²` matrix of distances (as `nvidia-smi topo -m`
        prints), or None to derive distances from the fields of `Gpu`.
      nic_links: `len(gpus) × len(nics)` matrix of GPU↔NIC distances, or None.
    """

    name: str = "host0"
    gpus: tuple[Gpu, ...] = ()
    nics: tuple[Nic, ...] = ()
    gpu_links: tuple[tuple[Distance, ...], ...] | None = None
    nic_links: tuple[tuple[Distance, ...], ...] | None = None

    def __post_init__(self) -> None:
        idx = [g.index for g in self.gpus]
        if len(set(idx)) != len(idx):
            raise ValueError(f"`Host.gpus` of {self.name!r} repeat a GPU index: {idx}")
        object.__setattr__(self, "gpus", tuple(sorted(self.gpus, key=lambda g: g.index)))
        n = len(self.gpus)
        if self.gpu_links is not None and (
            len(self.gpu_links) != n or any(len(r) != n for r in self.gpu_links)
        ):
            raise ValueError(f"`Host.gpu_links` of {self.name!r} must be {n}x{n}")
        if self.nic_links is not None and (
            len(self.nic_links) != n or any(len(r) != len(self.nics) for r in self.nic_links)
        ):
            raise ValueError(f"`Host.nic_links` of {self.name!r} must be {n}x{len(self.nics)}")

    def _pos(self, index: int) -> int:
        for p, g in enumerate(self.gpus):
            if g.index == index:
                return p
        raise ValueError(
            f"host {self.name!r} has no GPU with index {index}; "
            f"its GPUs are {[g.index for g in self.gpus]}"
        )

    def gpu(self, index: int) -> Gpu:
        """The GPU with physical index `index`."""
        return self.gpus[self._pos(index)]

    def gpu_distance(self, a: int, b: int) -> Distance:
        """Distance between GPUs with physical indices `a` and `b`."""
        pa, pb = self._pos(a), self._pos(b)
        if pa == pb:
            return Distance(Link.X)
        if self.gpu_links is not None:
            return self.gpu_links[pa][pb]
        ga, gb = self.gpus[pa], self.gpus[pb]
        if ga.nvlink_clique is not None and ga.nvlink_clique == gb.nvlink_clique:
            return Distance(Link.NV)
        return self.pcie_distance(a, b) or Distance(Link.PHB)

    def pcie_distance(self, a: int, b: int) -> Distance | None:
        """PCIe/NUMA distance between two GPUs ignoring NVLink; None if unknown."""
        pa, pb = self._pos(a), self._pos(b)
        if pa == pb:
            return Distance(Link.X)
        ga, gb = self.gpus[pa], self.gpus[pb]
        if self.gpu_links is not None and not (ga.pcie_path or ga.pcie_switch):
            d = self.gpu_links[pa][pb]
            return None if d.link is Link.NV else d
        return _derived_distance(
            ga.numa_node, ga.pcie_path, ga.pcie_switch, gb.numa_node, gb.pcie_path, gb.pcie_switch
        )

    def nic_distance(self, gpu_index: int, nic: int) -> Distance:
        """Distance between a GPU (physical index) and `nics[nic]`."""
        p = self._pos(gpu_index)
        if self.nic_links is not None:
            return self.nic_links[p][nic]
        g, n = self.gpus[p], self.nics[nic]
        return _derived_distance(
            g.numa_node, g.pcie_path, g.pcie_switch, n.numa_node, n.pcie_path, n.pcie_switch
        )

    def nearest_nic(self, gpu_index: int) -> int | None:
        """Rail of a GPU: position in `nics` of its closest NIC (lowest on ties)."""
        if not self.nics:
            return None
        return min(range(len(self.nics)), key=lambda k: (self.nic_distance(gpu_index, k), k))

    @property
    def has_locality(self) -> bool:
        """Whether anything distinguishes one GPU from another."""
        if self.gpu_links is not None or self.nic_links is not None:
            return True
        return any(
            g.numa_node is not None or g.nvlink_clique is not None or g.pcie_switch or g.pcie_path
            for g in self.gpus
        )


def nvlink_cliques(n: int, linked: Callable[[int, int], bool]) -> list[int | None]:
    """Connected components of `linked(i, j)` over `range(n)`; singletons get None.

    A component's id is its lowest member.

    >>> nvlink_cliques(3, lambda a, b: {a, b} == {0, 2})
    [0, None, 0]
    """
    comp: list[int | None] = [None] * n
    for i in range(n):
        if comp[i] is not None:
            continue
        members = {i}
        stack = [i]
        while stack:
            a = stack.pop()
            for b in range(n):
                if b not in members and linked(a, b):
                    members.add(b)
                    stack.append(b)
        if len(members) > 1:
            for m in members:
                comp[m] = i
    return comp
