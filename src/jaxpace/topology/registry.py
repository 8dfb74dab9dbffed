"""The meshes `jaxpace.make_mesh` built: a bounded, process-wide registry.

Why it exists: inside `shard_map`, a jaxpace collective sees only the
abstract mesh (axis names and sizes), not which devices back it. To measure
once per process it must know which shard is each process's first. It looks
for that, in order: `Pacer(mesh=...)`, then a concrete mesh in this registry
whose axes fit (layout `"jaxpace.make_mesh"`), then the process-contiguous
assumption. Passing `Pacer(mesh=...)` makes the registry unnecessary.

What it holds: the last `MAX_MESHES` meshes `register`ed (by `make_mesh`),
most recent first; older ones drop out, so it never grows. It is
thread-safe, and meshes built with `jax.make_mesh` are never in it.

>>> import jax
>>> from jaxpace.topology import make_mesh
>>> mesh = make_mesh((len(jax.devices()),), ("data",))
>>> recent()[0] is mesh
True
"""

from __future__ import annotations

import collections
import threading
from typing import Any

__all__ = ["MAX_MESHES", "clear", "recent", "register"]

MAX_MESHES = 16

_MESHES: collections.deque = collections.deque(maxlen=MAX_MESHES)
_LOCK = threading.Lock()


def register(mesh: Any) -> Any:
    """Remembers `mesh` (most recent first; at most `MAX_MESHES` kept) and returns it."""
    with _LOCK:
        _MESHES.appendleft(mesh)
    return mesh


def recent() -> list[Any]:
    """Registered meshes, most recent first (a copy)."""
    with _LOCK:
        return list(_MESHES)


def clear() -> None:
    """Forgets every registered mesh (for tests and long-lived processes)."""
    with _LOCK:
        _MESHES.clear()
