"""Meshes made by `jaxpace.make_mesh`, so collectives can find their concrete devices."""

from __future__ import annotations

import collections
import threading
from typing import Any

__all__ = ["recent", "register"]

_MESHES: collections.deque = collections.deque(maxlen=16)
_LOCK = threading.Lock()


def register(mesh: Any) -> Any:
    """Remembers `mesh` (most recent first) and returns it."""
    with _LOCK:
        _MESHES.appendleft(mesh)
    return mesh


def recent() -> list[Any]:
    """Registered meshes, most recent first."""
    with _LOCK:
        return list(_MESHES)
