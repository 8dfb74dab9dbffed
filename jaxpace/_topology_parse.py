"""Topology model (hosts, GPUs, NICs, link classes) and the parsers that build it."""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import json.decoder
import json.scanner
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jaxpace.errors import TopologyError

__all__ = [
    "Distance",
    "Gpu",
    "Host",
    "Link",
    "Nic",
    "Topology",
    "parse_nvidia_smi_topo",
    "parse_sysfs",
    "parse_nvml",
]

JSON_FORMAT = "jaxpace.topology/1"

# --------------------------------------------------------------------------- model


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


@dataclass(frozen=True, kw_only=True)
class Topology:
    """Hosts of a job and what is known of their GPUs and NICs.

    A topology with one host describes every host of a homogeneous cluster
    (`host_for_process` returns it for any process); with several, host `i`
    belongs to process `i`.

    >>> t = Topology(hosts=(Host(gpus=(Gpu(index=0, numa_node=0), Gpu(index=1, numa_node=1))),))
    >>> str(t.hosts[0].gpu_distance(0, 1))
    'SYS'
    >>> Topology.from_json(t.to_json()) == t
    True
    """

    hosts: tuple[Host, ...] = ()
    source: str = "manual"

    @classmethod
    def flat(cls, *, source: str = "none") -> Topology:
        """A topology that knows nothing: `make_mesh` falls back to JAX's order."""
        return cls(hosts=(), source=source)

    @property
    def is_flat(self) -> bool:
        """True when no host carries locality information."""
        return not any(h.gpus and h.has_locality for h in self.hosts)

    def host_for_process(self, process_index: int) -> Host:
        """The host that runs `process_index` (the only host when there is one)."""
        if len(self.hosts) == 1:
            return self.hosts[0]
        if 0 <= process_index < len(self.hosts):
            return self.hosts[process_index]
        raise ValueError(
            f"topology has {len(self.hosts)} hosts but a device belongs to process "
            f"{process_index}; give one host (used for every process) or one per process"
        )

    def to_json(self, *, indent: int | None = 1) -> str:
        """Serializes to the JSON format `from_json` reads (format `jaxpace.topology/1`)."""
        return json.dumps(_topology_to_obj(self), indent=indent)

    @classmethod
    def from_json(cls, text: str, *, path: str = "<string>") -> Topology:
        """Parses the JSON format written by `to_json`.

        Args:
          text: the JSON document.
          path: file name used in error messages.

        Raises:
          TopologyError: naming `path` and the line of the offending value.
        """
        return _topology_from_json(text, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Topology:
        """Reads a topology JSON file (see `from_json`)."""
        p = os.fspath(path)
        try:
            with open(p, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise TopologyError(f"{p}: cannot read topology file: {e.strerror}") from e
        return cls.from_json(text, path=p)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes `to_json()` to `path`."""
        with open(os.fspath(path), "w", encoding="utf-8") as f:
            f.write(self.to_json() + "\n")


# --------------------------------------------------------------------------- JSON


def _dist_matrix_to_obj(m: tuple[tuple[Distance, ...], ...] | None) -> list[list[str]] | None:
    return None if m is None else [[str(d) for d in row] for row in m]


def _topology_to_obj(t: Topology) -> dict[str, Any]:
    def gpu(g: Gpu) -> dict[str, Any]:
        d = dataclasses.asdict(g)
        d["pcie_path"] = list(g.pcie_path)
        return d

    def nic(n: Nic) -> dict[str, Any]:
        d = dataclasses.asdict(n)
        d["pcie_path"] = list(n.pcie_path)
        return d

    return {
        "format": JSON_FORMAT,
        "source": t.source,
        "hosts": [
            {
                "name": h.name,
                "gpus": [gpu(g) for g in h.gpus],
                "nics": [nic(n) for n in h.nics],
                "gpu_links": _dist_matrix_to_obj(h.gpu_links),
                "nic_links": _dist_matrix_to_obj(h.nic_links),
            }
            for h in t.hosts
        ],
    }


class _LinedDict(dict):
    line: int = 0


def _lined_loads(text: str) -> Any:
    """`json.loads` whose objects remember the line they start on."""

    def parse_object(s_and_end, *args, **kwargs):  # noqa: ANN001, ANN202
        s, end = s_and_end
        obj, new_end = json.decoder.JSONObject(s_and_end, *args, **kwargs)
        lined = _LinedDict(obj)
        lined.line = s.count("\n", 0, end) + 1
        return lined, new_end

    decoder = json.JSONDecoder()
    decoder.parse_object = parse_object
    decoder.scan_once = json.scanner.py_make_scanner(decoder)
    return decoder.decode(text)


class _Reader:
    def __init__(self, path: str):
        self.path = path

    def fail(self, obj: Any, where: str, msg: str) -> TopologyError:
        line = getattr(obj, "line", 0)
        loc = f"{self.path}:{line}" if line else self.path
        return TopologyError(f"{loc}: `{where}`: {msg}")

    def obj(self, obj: Any, where: str) -> Mapping[str, Any]:
        if not isinstance(obj, dict):
            raise self.fail(obj, where, f"expected an object, got {type(obj).__name__}")
        return obj

    def field(
        self,
        o: Mapping[str, Any],
        key: str,
        where: str,
        kinds: tuple[type, ...],
        *,
        default: Any = ...,
    ) -> Any:
        if key not in o:
            if default is ...:
                raise self.fail(o, where, f"missing required field `{key}`")
            return default
        v = o[key]
        if v is None and default is not ...:
            return None
        if isinstance(v, bool) or not isinstance(v, kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise self.fail(o, f"{where}.{key}", f"expected {names}, got {v!r}")
        return v

    def matrix(self, o: Mapping[str, Any], key: str, where: str, rows: int, cols: int) -> Any:
        v = o.get(key)
        if v is None:
            return None
        if not isinstance(v, list) or len(v) != rows:
            raise self.fail(o, f"{where}.{key}", f"expected a list of {rows} rows")
        out = []
        for i, row in enumerate(v):
            if not isinstance(row, list) or len(row) != cols:
                raise self.fail(o, f"{where}.{key}[{i}]", f"expected a list of {cols} labels")
            try:
                out.append(tuple(Distance.parse(str(x)) for x in row))
            except ValueError as e:
                raise self.fail(o, f"{where}.{key}[{i}]", str(e)) from None
        return tuple(out)


def _topology_from_json(text: str, path: str) -> Topology:
    try:
        doc = _lined_loads(text)
    except json.JSONDecodeError as e:
        raise TopologyError(f"{path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
    r = _Reader(path)
    doc = r.obj(doc, "$")
    fmt = doc.get("format")
    if fmt != JSON_FORMAT:
        raise r.fail(doc, "format", f"expected {JSON_FORMAT!r}, got {fmt!r}")
    hosts = []
    for hi, h in enumerate(r.field(doc, "hosts", "$", (list,))):
        hw = f"hosts[{hi}]"
        h = r.obj(h, hw)
        gpus = []
        for gi, g in enumerate(r.field(h, "gpus", hw, (list,), default=[]) or []):
            gw = f"{hw}.gpus[{gi}]"
            g = r.obj(g, gw)
            gpus.append(
                Gpu(
                    index=r.field(g, "index", gw, (int,)),
                    pci_bus_id=r.field(g, "pci_bus_id", gw, (str,), default=None),
                    numa_node=r.field(g, "numa_node", gw, (int,), default=None),
                    nvlink_clique=r.field(g, "nvlink_clique", gw, (int,), default=None),
                    pcie_switch=r.field(g, "pcie_switch", gw, (str,), default=None),
                    pcie_path=tuple(r.field(g, "pcie_path", gw, (list,), default=[]) or []),
                    name=r.field(g, "name", gw, (str,), default=None),
                )
            )
        nics = []
        for ni, n in enumerate(r.field(h, "nics", hw, (list,), default=[]) or []):
            nw = f"{hw}.nics[{ni}]"
            n = r.obj(n, nw)
            rate = r.field(n, "link_rate_gbps", nw, (int, float), default=None)
            nics.append(
                Nic(
                    name=r.field(n, "name", nw, (str,)),
                    pci_bus_id=r.field(n, "pci_bus_id", nw, (str,), default=None),
                    numa_node=r.field(n, "numa_node", nw, (int,), default=None),
                    pcie_switch=r.field(n, "pcie_switch", nw, (str,), default=None),
                    pcie_path=tuple(r.field(n, "pcie_path", nw, (list,), default=[]) or []),
                    link_rate_gbps=None if rate is None else float(rate),
                )
            )
        try:
            hosts.append(
                Host(
                    name=r.field(h, "name", hw, (str,), default=f"host{hi}") or f"host{hi}",
                    gpus=tuple(gpus),
                    nics=tuple(nics),
                    gpu_links=r.matrix(h, "gpu_links", hw, len(gpus), len(gpus)),
                    nic_links=r.matrix(h, "nic_links", hw, len(gpus), len(nics)),
                )
            )
        except ValueError as e:
            if isinstance(e, TopologyError):
                raise
            raise r.fail(h, hw, str(e)) from None
    source = r.field(doc, "source", "$", (str,), default="json") or "json"
    return Topology(hosts=tuple(hosts), source=source)


# --------------------------------------------------------------------------- nvidia-smi

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
_DEVICE_COL_RE = re.compile(r"^(GPU\d+|NIC\d+|mlx\d*_\d+|[A-Za-z][\w.-]*\d)$")
_GPU_RE = re.compile(r"^GPU(\d+)$")


def _int_or_none(s: str | None) -> int | None:
    if s is None:
        return None
    s = s.strip()
    return int(s) if s.isdigit() else None


def _cliques(n: int, linked: Any) -> list[int | None]:
    """Connected components of `linked(i, j)`; singletons get None."""
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


def parse_nvidia_smi_topo(text: str, *, path: str = "<nvidia-smi topo -m>") -> Host:
    """Parses the output of `nvidia-smi topo -m`.

    Reads the GPU×GPU and GPU×NIC link matrices, each GPU's NUMA affinity and
    the "NIC Legend" (`NIC0: mlx5_0`). Works with tab- or space-separated
    output and with the terminal's bold/underline escape codes.

    Args:
      text: the command's output.
      path: name used in error messages.

    Returns:
      A `Host` with `gpu_links`/`nic_links` set and NVLink cliques derived
      from the `NV#` cells.

    Raises:
      TopologyError: naming `path` and line for a malformed table.

    >>> h = parse_nvidia_smi_topo('''\\
    ... \\tGPU0\\tGPU1\\tCPU Affinity\\tNUMA Affinity
    ... GPU0\\t X \\tNV4\\t0-7\\t0
    ... GPU1\\tNV4\\t X \\t0-7\\t0
    ... ''')
    >>> str(h.gpu_distance(0, 1)), h.gpus[1].nvlink_clique
    ('NV4', 0)
    """
    lines = [_ANSI_RE.sub("", ln).rstrip("\r\n") for ln in text.splitlines()]
    header_no = None
    cols: list[str] = []
    for no, ln in enumerate(lines, 1):
        toks = ln.split()
        if toks and toks[0] == "GPU0" and ln[:1] in ("\t", " "):
            header_no = no
            for t in toks:
                if t == "CPU" or not _DEVICE_COL_RE.match(t):
                    break
                cols.append(t)
            break
    if header_no is None:
        raise TopologyError(
            f"{path}:1: no `nvidia-smi topo -m` header found (a line starting with a "
            "blank cell followed by `GPU0 GPU1 ...`); pass the command's full output"
        )
    n = len(cols)
    rows: dict[str, tuple[int, list[Distance], list[str]]] = {}
    legend: dict[str, str] = {}
    in_legend = False
    for no, ln in enumerate(lines[header_no:], header_no + 1):
        stripped = ln.strip()
        if not stripped:
            continue
        if stripped.startswith("Legend") or stripped.startswith("NIC Legend"):
            in_legend = True
            continue
        if in_legend:
            m = re.match(r"^(NIC\d+)\s*:\s*(\S+)$", stripped)
            if m:
                legend[m.group(1)] = m.group(2)
            continue
        toks = stripped.split()
        name = toks[0]
        if name not in cols:
            raise TopologyError(
                f"{path}:{no}: row `{name}` is not one of the header's columns {cols}"
            )
        if len(toks) < 1 + n:
            raise TopologyError(
                f"{path}:{no}: row `{name}` has {len(toks) - 1} link cells, expected {n} "
                f"(one per column {cols})"
            )
        try:
            cells = [Distance.parse(t) for t in toks[1 : 1 + n]]
        except ValueError as e:
            raise TopologyError(f"{path}:{no}: row `{name}`: {e}") from None
        rows[name] = (no, cells, toks[1 + n :])
    gpu_cols = [c for c in cols if _GPU_RE.match(c)]
    nic_cols = [c for c in cols if not _GPU_RE.match(c)]
    for c in gpu_cols:
        if c not in rows:
            raise TopologyError(f"{path}:{header_no}: column `{c}` has no row")
    gpus = []
    gpu_links = []
    nic_links = []
    for c in gpu_cols:
        no, cells, rest = rows[c]
        numa = _int_or_none(rest[1]) if len(rest) >= 2 else None
        gpus.append(Gpu(index=int(_GPU_RE.match(c).group(1)), numa_node=numa))
        by_col = dict(zip(cols, cells, strict=True))
        if by_col[c].link is not Link.X:
            raise TopologyError(f"{path}:{no}: row `{c}` must have `X` in its own column")
        gpu_links.append(tuple(by_col[g] for g in gpu_cols))
        nic_links.append(tuple(by_col[k] for k in nic_cols))
    for i in range(len(gpu_cols)):
        for j in range(len(gpu_cols)):
            if gpu_links[i][j] != gpu_links[j][i]:
                no = rows[gpu_cols[i]][0]
                raise TopologyError(
                    f"{path}:{no}: matrix is not symmetric: {gpu_cols[i]}-{gpu_cols[j]} is "
                    f"{gpu_links[i][j]} but {gpu_cols[j]}-{gpu_cols[i]} is {gpu_links[j][i]}"
                )
    clique = _cliques(len(gpus), lambda a, b: gpu_links[a][b].link is Link.NV)
    gpus = [dataclasses.replace(g, nvlink_clique=clique[p]) for p, g in enumerate(gpus)]
    nics = []
    for k, c in enumerate(nic_cols):
        # A NIC's NUMA node: that of any GPU within the same node (PIX..NODE).
        numa = next(
            (
                g.numa_node
                for p, g in enumerate(gpus)
                if nic_links[p][k].link <= Link.NODE and g.numa_node is not None
            ),
            None,
        )
        nics.append(Nic(name=legend.get(c, c), numa_node=numa))
    return Host(
        name="localhost",
        gpus=tuple(gpus),
        nics=tuple(nics),
        gpu_links=tuple(gpu_links),
        nic_links=tuple(nic_links) if nic_cols else None,
    )


# --------------------------------------------------------------------------- sysfs

_BDF_RE = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_ROOT_RE = re.compile(r"^pci[0-9a-fA-F]{4}:[0-9a-fA-F]{2}$")
NVIDIA_VENDOR = 0x10DE
_GPU_CLASSES = (0x030200, 0x030000)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return None


def _read_int(path: str, *, base: int = 10) -> int | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return int(text, base)
    except ValueError:
        raise TopologyError(
            f"{path}:1: expected an integer{' (hex)' if base == 16 else ''}, got {text!r}"
        ) from None


def _pcie_path(device_dir: str) -> tuple[str, ...]:
    """`pci0000:17`, bridges..., device from a sysfs device's resolved path."""
    parts = os.path.realpath(device_dir).split(os.sep)
    for i, p in enumerate(parts):
        if _ROOT_RE.match(p):
            chain = [x for x in parts[i + 1 :] if _BDF_RE.match(x)]
            return (p, *chain)
    return ()


def _switch_of(path: tuple[str, ...]) -> str | None:
    parents = path[1:-1]
    if len(parents) >= 3:
        return parents[-2]
    return None


def _numa(device_dir: str) -> int | None:
    node = _read_int(os.path.join(device_dir, "numa_node"))
    return None if node is None or node < 0 else node


def _rate_gbps(text: str | None, path: str, *, mbit: bool = False) -> float | None:
    if text is None:
        return None
    m = re.match(r"^\s*(-?\d+(?:\.\d+)?)", text)
    if not m:
        raise TopologyError(f"{path}:1: expected a link rate such as `400 Gb/sec`, got {text!r}")
    v = float(m.group(1))
    if v <= 0:
        return None
    return v / 1000.0 if mbit else v


def parse_sysfs(root: str | os.PathLike[str] = "/") -> Host:
    """Reads NVIDIA GPUs and NICs from a Linux sysfs tree.

    GPUs are PCI devices of vendor 0x10de and class 0x0302 or 0x0300 under
    `<root>/sys/bus/pci/devices`; NICs come from `<root>/sys/class/infiniband/*`
    (RDMA devices, rate from `ports/1/rate`) and `<root>/sys/class/net/*` with
    a PCI `device` link (rate from `speed`, Mb/s); a netdev on the same PCI
    function as an RDMA device is the same NIC. PCIe switches are inferred from
    the resolved device paths, NUMA nodes from `numa_node`.

    Args:
      root: directory that holds `sys/` (`/` on a live machine; a fixture tree
        in tests).

    Returns:
      A `Host` (no GPUs when none were found).

    Raises:
      TopologyError: naming the file when a sysfs attribute cannot be parsed.
    """
    root = os.fspath(root)
    pci = os.path.join(root, "sys", "bus", "pci", "devices")
    gpus = []
    try:
        entries = sorted(os.listdir(pci))
    except OSError:
        entries = []
    for bdf in entries:
        d = os.path.join(pci, bdf)
        vendor = _read_int(os.path.join(d, "vendor"), base=16)
        cls = _read_int(os.path.join(d, "class"), base=16)
        if vendor != NVIDIA_VENDOR or cls is None or (cls & 0xFFFF00) not in _GPU_CLASSES:
            continue
        path = _pcie_path(d)
        gpus.append(
            Gpu(
                index=len(gpus),
                pci_bus_id=bdf.lower(),
                numa_node=_numa(d),
                pcie_switch=_switch_of(path),
                pcie_path=path,
                name=_read(os.path.join(d, "label")),
            )
        )
    nics: dict[str, Nic] = {}  # by PCI address; RDMA devices first, then netdevs
    ib = os.path.join(root, "sys", "class", "infiniband")
    for name in sorted(os.listdir(ib)) if os.path.isdir(ib) else []:
        d = os.path.join(ib, name, "device")
        if not os.path.exists(d):
            continue
        bdf = os.path.basename(os.path.realpath(d)).lower()
        rate_file = os.path.join(ib, name, "ports", "1", "rate")
        path = _pcie_path(d)
        nics[bdf] = Nic(
            name=name,
            pci_bus_id=bdf,
            numa_node=_numa(d),
            pcie_switch=_switch_of(path),
            pcie_path=path,
            link_rate_gbps=_rate_gbps(_read(rate_file), rate_file),
        )
    net = os.path.join(root, "sys", "class", "net")
    for name in sorted(os.listdir(net)) if os.path.isdir(net) else []:
        d = os.path.join(net, name, "device")
        if not os.path.exists(d):
            continue  # virtual interfaces (lo, bridges, veth) have no device
        bdf = os.path.basename(os.path.realpath(d)).lower()
        if bdf in nics or not _BDF_RE.match(bdf):
            continue
        speed_file = os.path.join(net, name, "speed")
        path = _pcie_path(d)
        nics[bdf] = Nic(
            name=name,
            pci_bus_id=bdf,
            numa_node=_numa(d),
            pcie_switch=_switch_of(path),
            pcie_path=path,
            link_rate_gbps=_rate_gbps(_read(speed_file), speed_file, mbit=True),
        )
    ib_names = set(os.listdir(ib)) if os.path.isdir(ib) else set()
    ordered = sorted(
        nics.values(), key=lambda n: (n.name not in ib_names, n.pci_bus_id or "", n.name)
    )
    return Host(
        name=_read(os.path.join(root, "etc", "hostname")) or "localhost",
        gpus=tuple(gpus),
        nics=tuple(ordered),
    )


# --------------------------------------------------------------------------- NVML

# nvmlGpuTopologyLevel_t values.
_NVML_LEVELS = {0: Link.PIX, 10: Link.PIX, 20: Link.PXB, 30: Link.PHB, 40: Link.NODE, 50: Link.SYS}


def _norm_bus_id(bus_id: Any) -> str:
    s = bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)
    s = s.lower()
    m = re.match(r"^([0-9a-f]+):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$", s)
    if not m:
        return s
    return f"{int(m.group(1), 16):04x}:{m.group(2)}:{m.group(3)}.{m.group(4)}"


def parse_nvml(nvml: Any) -> Host:
    """Reads GPUs, PCIe levels and NVLink peers through an `nvidia-ml-py` module.

    Args:
      nvml: the imported `pynvml` module (or an object with the same
        functions; tests pass a fake). `nvmlInit` is called and matched by
        `nvmlShutdown`.

    Returns:
      A `Host` with `gpu_links` from `nvmlDeviceGetTopologyCommonAncestor` and
      NVLink counts from `nvmlDeviceGetNvLinkRemotePciInfo` (links that end in
      an NVSwitch connect the GPU to every other GPU on the switch fabric).
    """
    nvml.nvmlInit()
    try:
        count = nvml.nvmlDeviceGetCount()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        bus = [_norm_bus_id(nvml.nvmlDeviceGetPciInfo(h).busId) for h in handles]
        names = []
        numas: list[int | None] = []
        for h in handles:
            name = nvml.nvmlDeviceGetName(h)
            names.append(name.decode() if isinstance(name, bytes) else str(name))
            try:
                node = int(nvml.nvmlDeviceGetNumaNodeId(h))
                numas.append(node if node >= 0 else None)
            except Exception:  # older drivers / bindings
                numas.append(None)
        max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
        peer_links = [[0] * count for _ in range(count)]
        switch_links = [0] * count
        for i, h in enumerate(handles):
            for link in range(max_links):
                try:
                    if not nvml.nvmlDeviceGetNvLinkState(h, link):
                        continue
                    remote = _norm_bus_id(nvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)
                except Exception:  # link not supported / not present
                    continue
                if remote in bus:
                    peer_links[i][bus.index(remote)] += 1
                else:
                    switch_links[i] += 1
        links = []
        for i in range(count):
            row = []
            for j in range(count):
                if i == j:
                    row.append(Distance(Link.X))
                elif peer_links[i][j]:
                    row.append(Distance(Link.NV, peer_links[i][j]))
                elif switch_links[i] and switch_links[j]:
                    row.append(Distance(Link.NV, min(switch_links[i], switch_links[j])))
                else:
                    level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j]))
                    row.append(Distance(_NVML_LEVELS.get(level, Link.SYS)))
            links.append(tuple(row))
    finally:
        nvml.nvmlShutdown()
    clique = _cliques(count, lambda a, b: links[a][b].link is Link.NV)
    gpus = tuple(
        Gpu(index=i, pci_bus_id=bus[i], numa_node=numas[i], nvlink_clique=clique[i], name=names[i])
        for i in range(count)
    )
    return Host(name="localhost", gpus=gpus, gpu_links=tuple(links))
