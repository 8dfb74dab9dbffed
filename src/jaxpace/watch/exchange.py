"""Where processes leave their window summaries and heartbeats: the job's coordination service,
a shared directory, or (one process) memory. Every call is bounded and never raises.

Keys form a fixed set per process (`jaxpace/watch/<run>/<kind>/[<slot>/]p<process>`),
overwritten in place: the store's memory does not grow with the windows
(the coordination service does not give memory back after a delete).
"""

from __future__ import annotations

import os
import threading
import urllib.parse
from pathlib import Path
from typing import Any, Protocol

from jaxpace.records.safe_io import write_atomic
from jaxpace.runtime.bounded_kv import KV_TIMEOUT_S, BoundedKV

__all__ = ["DirExchange", "Exchange", "KVExchange", "LocalExchange", "key"]

MAX_VALUE_BYTES = 1 << 20  # a value read back larger than this is dropped (untrusted)


def key(run: str, kind: str, process: int, slot: int | None = None) -> str:
    """`jaxpace/watch/<run>/<kind>/[<slot>/]p<process>`: one slot's keys share a prefix, so
    the deciding process reads only the slot it needs."""
    where = f"{kind}/{int(slot)}" if slot is not None else kind
    return f"jaxpace/watch/{run}/{where}/p{int(process)}"


class Exchange(Protocol):
    """A small key-value store shared by the job's processes.

    `put` returns whether the value was stored; `get_dir` the `(key, value)`
    pairs under a prefix, or None when the store did not answer in time.
    Neither raises and neither waits longer than its bound.
    """

    kind: str

    def put(self, k: str, value: str) -> bool: ...

    def get_dir(self, prefix: str) -> list[tuple[str, str]] | None: ...

    def close(self) -> None: ...


class KVExchange:
    """`jax.distributed`'s coordination service (`key_value_set`, `key_value_dir_get`), each
    call bounded by `runtime.bounded_kv` (a coordinator that does not answer fails the call)."""

    kind = "coordination service"

    def __init__(self, client: Any, timeout_s: float = KV_TIMEOUT_S) -> None:
        self._kv = BoundedKV(client, timeout_s)
        self.last_error: Exception | None = None

    def put(self, k: str, value: str) -> bool:
        ok, got = self._kv.call(lambda c: c.key_value_set(k, value, True))
        self.last_error = None if ok else got
        return ok

    def get_dir(self, prefix: str) -> list[tuple[str, str]] | None:
        ok, got = self._kv.call(lambda c: c.key_value_dir_get(prefix))
        self.last_error = None if ok else got
        if not ok:
            return None
        return [(str(k), v) for k, v in got if isinstance(v, str) and len(v) <= MAX_VALUE_BYTES]

    def close(self) -> None:
        self._kv.close(join_s=KV_TIMEOUT_S)


class DirExchange:
    """A directory every process can read (`out=` on a shared filesystem): one file per key,
    each written through a temporary file and a rename."""

    kind = "shared directory"

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.last_error: Exception | None = None

    def _path(self, k: str) -> Path:
        return self.root / (urllib.parse.quote(k, safe="") + ".json")

    def put(self, k: str, value: str) -> bool:
        try:
            write_atomic(self._path(k), value, what="watch summary", make_parents=True)
            self.last_error = None
            return True
        except OSError as e:
            self.last_error = e
            return False

    def get_dir(self, prefix: str) -> list[tuple[str, str]] | None:
        out = []
        q = urllib.parse.quote(prefix, safe="")
        try:
            for f in sorted(self.root.glob(q + "*.json")):
                if f.is_symlink() or not f.is_file() or f.stat().st_size > MAX_VALUE_BYTES:
                    continue
                out.append((urllib.parse.unquote(f.name[: -len(".json")]), f.read_text()))
        except OSError as e:
            self.last_error = e
            return None
        return out

    def close(self) -> None:
        pass


class LocalExchange:
    """One process alone: a dict."""

    kind = "memory"

    def __init__(self) -> None:
        self._d: dict[str, str] = {}
        self._lock = threading.Lock()
        self.last_error: Exception | None = None

    def put(self, k: str, value: str) -> bool:
        with self._lock:
            self._d[k] = value
        return True

    def get_dir(self, prefix: str) -> list[tuple[str, str]] | None:
        with self._lock:
            return sorted((k, v) for k, v in self._d.items() if k.startswith(prefix))

    def close(self) -> None:
        pass
