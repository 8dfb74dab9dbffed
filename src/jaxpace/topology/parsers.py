"""Parsers that build a `Host`: sysfs, `nvidia-smi topo -m` text, and NVML.

Each reads one source and returns a `Host` of `jaxpace.topology.hardware`;
`discover` merges them. Errors are `TopologyError`s naming the file (or the
text's name) and line. The topology JSON file is read by `json_codec`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

from jaxpace.errors import TopologyError
from jaxpace.topology.hardware import Distance, Gpu, Host, Link, Nic, nvlink_cliques

__all__ = ["parse_nvidia_smi_topo", "parse_nvml", "parse_sysfs"]

# --------------------------------------------------------------------------- nvidia-smi

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
_DEVICE_COL_RE = re.compile(r"^(GPU\d+|NIC\d+|mlx\d*_\d+|[A-Za-z][\w.-]*\d)$")
_GPU_RE = re.compile(r"^GPU(\d+)$")
_LEGEND_RE = re.compile(r"^(NIC\d+)\s*:\s*(\S+)$")

_Rows = dict[str, tuple[int, list[Distance], list[str]]]


def _int_or_none(s: str | None) -> int | None:
    if s is None:
        return None
    s = s.strip()
    return int(s) if s.isdigit() else None


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
    header_no, cols = _smi_header(lines, path)
    rows, legend = _smi_rows(lines, header_no, cols, path)
    gpu_cols = [c for c in cols if _GPU_RE.match(c)]
    nic_cols = [c for c in cols if not _GPU_RE.match(c)]
    for c in gpu_cols:
        if c not in rows:
            raise TopologyError(f"{path}:{header_no}: column `{c}` has no row")
    gpus, gpu_links, nic_links = [], [], []
    for c in gpu_cols:
        no, cells, rest = rows[c]
        numa = _int_or_none(rest[1]) if len(rest) >= 2 else None
        gpus.append(Gpu(index=int(_GPU_RE.match(c).group(1)), numa_node=numa))
        by_col = dict(zip(cols, cells, strict=True))
        if by_col[c].link is not Link.X:
            raise TopologyError(f"{path}:{no}: row `{c}` must have `X` in its own column")
        gpu_links.append(tuple(by_col[g] for g in gpu_cols))
        nic_links.append(tuple(by_col[k] for k in nic_cols))
    _check_symmetric(gpu_links, gpu_cols, rows, path)
    clique = nvlink_cliques(len(gpus), lambda a, b: gpu_links[a][b].link is Link.NV)
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


def _smi_header(lines: list[str], path: str) -> tuple[int, list[str]]:
    """Line number of the matrix header (a blank cell, then `GPU0 GPU1 ...`) and its columns."""
    for no, ln in enumerate(lines, 1):
        toks = ln.split()
        if toks and toks[0] == "GPU0" and ln[:1] in ("\t", " "):
            cols: list[str] = []
            for t in toks:
                if t == "CPU" or not _DEVICE_COL_RE.match(t):
                    break
                cols.append(t)
            return no, cols
    raise TopologyError(
        f"{path}:1: no `nvidia-smi topo -m` header found (a line starting with a "
        "blank cell followed by `GPU0 GPU1 ...`); pass the command's full output"
    )


def _smi_rows(
    lines: list[str], header_no: int, cols: list[str], path: str
) -> tuple[_Rows, dict[str, str]]:
    """The matrix rows after the header (name -> line, cells, trailing tokens) and the NIC legend."""
    n = len(cols)
    rows: _Rows = {}
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
            m = _LEGEND_RE.match(stripped)
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
    return rows, legend


def _check_symmetric(
    gpu_links: list[tuple[Distance, ...]], gpu_cols: list[str], rows: _Rows, path: str
) -> None:
    for i in range(len(gpu_cols)):
        for j in range(len(gpu_cols)):
            if gpu_links[i][j] != gpu_links[j][i]:
                no = rows[gpu_cols[i]][0]
                raise TopologyError(
                    f"{path}:{no}: matrix is not symmetric: {gpu_cols[i]}-{gpu_cols[j]} is "
                    f"{gpu_links[i][j]} but {gpu_cols[j]}-{gpu_cols[i]} is {gpu_links[j][i]}"
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
    nics = _sysfs_nics(root)
    return Host(
        name=_read(os.path.join(root, "etc", "hostname")) or "localhost",
        gpus=_sysfs_gpus(root),
        nics=nics,
    )


def _sysfs_gpus(root: str) -> tuple[Gpu, ...]:
    """NVIDIA GPUs under `<root>/sys/bus/pci/devices`, numbered in PCI address order."""
    pci = os.path.join(root, "sys", "bus", "pci", "devices")
    gpus: list[Gpu] = []
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
    return tuple(gpus)


def _sysfs_nic(name: str, d: str, rate_gbps: float | None) -> Nic:
    bdf = os.path.basename(os.path.realpath(d)).lower()
    path = _pcie_path(d)
    return Nic(
        name=name,
        pci_bus_id=bdf,
        numa_node=_numa(d),
        pcie_switch=_switch_of(path),
        pcie_path=path,
        link_rate_gbps=rate_gbps,
    )


def _sysfs_nics(root: str) -> tuple[Nic, ...]:
    """RDMA devices, then netdevs on other PCI functions, in rail order."""
    nics: dict[str, Nic] = {}  # by PCI address; RDMA devices first, then netdevs
    ib = os.path.join(root, "sys", "class", "infiniband")
    ib_names = sorted(os.listdir(ib)) if os.path.isdir(ib) else []
    for name in ib_names:
        d = os.path.join(ib, name, "device")
        if not os.path.exists(d):
            continue
        rate_file = os.path.join(ib, name, "ports", "1", "rate")
        nic = _sysfs_nic(name, d, _rate_gbps(_read(rate_file), rate_file))
        nics[nic.pci_bus_id] = nic
    net = os.path.join(root, "sys", "class", "net")
    for name in sorted(os.listdir(net)) if os.path.isdir(net) else []:
        d = os.path.join(net, name, "device")
        if not os.path.exists(d):
            continue  # virtual interfaces (lo, bridges, veth) have no device
        bdf = os.path.basename(os.path.realpath(d)).lower()
        if bdf in nics or not _BDF_RE.match(bdf):
            continue
        speed_file = os.path.join(net, name, "speed")
        nics[bdf] = _sysfs_nic(name, d, _rate_gbps(_read(speed_file), speed_file, mbit=True))
    return tuple(
        sorted(
            nics.values(),
            key=lambda n: (n.name not in ib_names, n.pci_bus_id or "", n.name),
        )
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
    clique = nvlink_cliques(count, lambda a, b: links[a][b].link is Link.NV)
    gpus = tuple(
        Gpu(index=i, pci_bus_id=bus[i], numa_node=numas[i], nvlink_clique=clique[i], name=names[i])
        for i in range(count)
    )
    return Host(name="localhost", gpus=gpus, gpu_links=tuple(links))
