"""Key-value store calls with a bounded wait: a hung coordinator never hangs the watchdog."""

from __future__ import annotations

import queue
import threading
from typing import Any

__all__ = ["KV_TIMEOUT_S", "BoundedKV"]

KV_TIMEOUT_S = 5.0  # a store call that takes longer means the coordinator does not answer


class BoundedKV:
    """Runs key-value store calls on one helper thread; each caller waits at most `timeout_s`.

    A call still pending (a hung coordinator) makes the next ones fail at once.
    """

    def __init__(self, client: Any, timeout_s: float = KV_TIMEOUT_S) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._pending = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while True:
            fn, box, done = self._q.get()
            if fn is None:
                return
            try:
                box.append((True, fn(self.client)))
            except Exception as e:  # noqa: BLE001 - reported to the caller
                box.append((False, e))
            self._pending.clear()
            done.set()

    def call(self, fn, wait_s: float | None = None) -> tuple[bool, Any]:
        """`(True, result)`, or `(False, exception)` on an error or no answer in time.

        Waits at most `wait_s` (default `timeout_s`).
        """
        wait_s = self.timeout_s if wait_s is None else min(wait_s, self.timeout_s)
        if self._pending.is_set():
            return False, TimeoutError("an earlier key-value store call never returned")
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="jaxpace-watchdog-kv", daemon=True
            )
            self._thread.start()
        box: list = []
        done = threading.Event()
        self._pending.set()
        self._q.put((fn, box, done))
        if not done.wait(wait_s):
            return False, TimeoutError(f"no answer within {wait_s:g} s")
        return box[0]

    def close(self, join_s: float = 0.0) -> None:
        """Ends the helper thread; with `join_s`, waits that long for a call in flight."""
        if self._thread is not None and not self._pending.is_set():
            self._q.put((None, None, None))
        if join_s > 0 and self._thread is not None:
            self._thread.join(join_s)
