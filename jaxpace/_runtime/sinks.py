"""The sink thread: per-step summaries delivered to user sinks off the callback threads."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

from jaxpace._probe import RateLimitedLog, Sink

__all__ = ["SinkThread"]

QUEUE_SLOTS = 10_000


class SinkThread:
    """A bounded queue and one daemon thread that calls every sink with each summary.

    `emit` never blocks (a full queue drops and counts); the thread starts on
    the first summary, so a `Pacer` without sinks starts no thread.
    """

    def __init__(self, sinks: Sequence[Sink], errlog: RateLimitedLog) -> None:
        self.sinks = list(sinks)
        self.dropped = 0
        self.errors = 0
        self._errlog = errlog
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def emit(self, summary: dict[str, Any]) -> None:
        if self._queue is None:
            with self._lock:
                if self._queue is None:
                    self._queue = queue.Queue(maxsize=QUEUE_SLOTS)
                    self._thread = threading.Thread(
                        target=self._loop, name="jaxpace-sinks", daemon=True
                    )
                    self._thread.start()
        try:
            self._queue.put_nowait(summary)
        except queue.Full:
            self.dropped += 1

    def _loop(self) -> None:
        q = self._queue
        while True:
            item = q.get()
            if item is None:
                return
            for sink in self.sinks:
                try:
                    sink(item)
                except Exception as e:  # noqa: BLE001
                    self.errors += 1
                    self._errlog.warning("sink", "jaxpace: metrics sink %r raised %r", sink, e)
            q.task_done()

    def flush(self, timeout_s: float = 5.0) -> None:
        """Waits (bounded) until queued summaries are delivered."""
        q = self._queue
        if q is None:
            return
        deadline = time.monotonic() + timeout_s
        while q.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)

    def close(self) -> None:
        """Flushes briefly and ends the thread."""
        if self._queue is not None:
            self.flush(1.0)
            self._queue.put(None)
