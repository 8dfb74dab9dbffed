"""Start-up consensus: every process agrees on the settings that shape the program, and a run id."""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from typing import Any

from jaxpace import _jax_compat
from jaxpace.errors import ConfigMismatchError

__all__ = ["KeyGenerations", "KEY_GENERATIONS", "agree", "fingerprint"]


class KeyGenerations:
    """Process-wide counters that make key-value store keys unique per use.

    Every process makes the same sequence of consensus (or gather) calls, so
    the n-th call has the same key everywhere and never collides with an
    earlier one. One instance per process (`KEY_GENERATIONS`); documented in
    docs/architecture.md as jaxpace's only process-wide counter.
    """

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def next(self, kind: str) -> int:
        with self._lock:
            n = self._counts.get(kind, 0)
            self._counts[kind] = n + 1
            return n


KEY_GENERATIONS = KeyGenerations()


def fingerprint(settings: dict[str, Any]) -> str:
    """The canonical text of the settings every process must share."""
    return json.dumps(settings, sort_keys=True)


def agree(mine: str, timeout_s: float) -> str:
    """Agrees on `mine` and a run id with every other process; returns the run id.

    Uses the `jax.distributed` key-value store at trace time (never inside a
    callback). A mismatch raises the same `ConfigMismatchError` on every
    process; a peer that never answers raises after `timeout_s`.
    """
    import jax

    nproc = jax.process_count()
    if nproc == 1:
        return uuid.uuid4().hex[:12]
    client = _jax_compat.distributed_client()
    if client is None:
        return "multi-" + hashlib.sha1(mine.encode()).hexdigest()[:8]
    gen = KEY_GENERATIONS.next("consensus")
    me = jax.process_index()
    prefix = f"jaxpace/consensus/{gen}"
    if me == 0:
        client.key_value_set(f"{prefix}/run_id", uuid.uuid4().hex[:12])
    client.key_value_set(f"{prefix}/p{me}", mine)
    timeout_ms = int(timeout_s * 1000)
    got: dict[int, str] = {}
    try:
        for p in range(nproc):
            got[p] = client.blocking_key_value_get(f"{prefix}/p{p}", timeout_ms)
        run_id = client.blocking_key_value_get(f"{prefix}/run_id", timeout_ms)
    except Exception as e:  # noqa: BLE001
        missing = [p for p in range(nproc) if p not in got]
        raise ConfigMismatchError(
            f"jaxpace could not agree on settings with process(es) {missing} within "
            f"`consensus_timeout_s`={timeout_s}s ({type(e).__name__}). "
            "Every process must build its Pacer and trace the same jaxpace collectives."
        ) from None
    differ = {p: v for p, v in got.items() if v != got[0]}
    if differ:
        lines = "\n".join(f"  process {p}: {v}" for p, v in sorted(got.items()))
        raise ConfigMismatchError(
            "jaxpace settings differ between processes, so their traced programs would "
            f"differ and collectives could pair the wrong operands:\n{lines}\n"
            "Build the Pacer from the same settings (and environment) on every process."
        )
    return run_id
