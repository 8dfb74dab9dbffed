"""The topology JSON format (`jaxpace.topology/1`): writing it, and reading it with line numbers.

`Topology.to_json` / `Topology.from_json` call `dumps` / `loads`; errors name
the file, the line and the field (`t.json:3: `hosts[0].gpus[1].numa_node``).
"""

from __future__ import annotations

import dataclasses
import json
import json.decoder
import json.scanner
from collections.abc import Mapping, Sequence
from typing import Any

from jaxpace.errors import TopologyError
from jaxpace.topology.hardware import Distance, Gpu, Host, Nic

__all__ = ["JSON_FORMAT", "dumps", "loads"]

JSON_FORMAT = "jaxpace.topology/1"


def _dist_matrix_to_obj(m: tuple[tuple[Distance, ...], ...] | None) -> list[list[str]] | None:
    return None if m is None else [[str(d) for d in row] for row in m]


def _to_obj(hosts: Sequence[Host], source: str) -> dict[str, Any]:
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
        "source": source,
        "hosts": [
            {
                "name": h.name,
                "gpus": [gpu(g) for g in h.gpus],
                "nics": [nic(n) for n in h.nics],
                "gpu_links": _dist_matrix_to_obj(h.gpu_links),
                "nic_links": _dist_matrix_to_obj(h.nic_links),
            }
            for h in hosts
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


def dumps(hosts: Sequence[Host], source: str, *, indent: int | None = 1) -> str:
    """The JSON document (format `jaxpace.topology/1`) of `hosts` and `source`."""
    return json.dumps(_to_obj(hosts, source), indent=indent)


def loads(text: str, path: str = "<string>") -> tuple[tuple[Host, ...], str]:
    """Parses a document written by `dumps`; returns `(hosts, source)`.

    Raises:
      TopologyError: naming `path` and the line of the offending value.
    """
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
    return tuple(hosts), source
