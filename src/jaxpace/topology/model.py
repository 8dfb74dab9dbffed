"""The topology of a job: its hosts, and the JSON file that describes them.

`Topology` is what `discover` returns and `make_mesh` reads. The per-host
classes live in `jaxpace.topology.hardware` and are re-exported here, so the
whole data model is importable from this module.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from jaxpace.errors import TopologyError
from jaxpace.topology import json_codec
from jaxpace.topology.hardware import Distance, Gpu, Host, Link, Nic

__all__ = ["Distance", "Gpu", "Host", "Link", "Nic", "Topology"]


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
        return json_codec.dumps(self.hosts, self.source, indent=indent)

    @classmethod
    def from_json(cls, text: str, *, path: str = "<string>") -> Topology:
        """Parses the JSON format written by `to_json`.

        Args:
          text: the JSON document.
          path: file name used in error messages.

        Raises:
          TopologyError: naming `path` and the line of the offending value.
        """
        hosts, source = json_codec.loads(text, path)
        return cls(hosts=hosts, source=source)

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
