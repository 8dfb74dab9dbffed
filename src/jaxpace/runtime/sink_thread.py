"""The sink thread: per-step summaries delivered to user sinks off the callback threads."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

from jaxpace.runtime.probe import RateLimitedLog, Sink

__all__ = ["SinkThread"]

QUEUE_SLOTS = 10_000
CLOSE_TIMEOUT_S = 1.0

log = logging.getLogger("jaxpace")


class SinkThread:
    """A bounded queue and one daemon thread that calls every sink with each summary.

    `emit` never blocks (a full queue drops and counts); the thread starts on
    the first summary, so a `Pacer` without sinks starts no thread. `close`
    never blocks longer than its timeout, even when a sink never returns: what
    is still queued then is discarded and counted in `dropped`.

    A sink that raises an `Exception` is counted in `errors`, logged
    (rate-limited) and keeps receiving. A sink that raises any other
    `BaseException` (`SystemExit` from a `sys.exit()` in it, a custom
    subclass) would otherwise end this thread and starve every other sink: it
    is disabled instead (listed in `disabled`, counted in `errors`, logged
    once; its `close()` is still called at the end) and the others keep
    receiving every summary. Only a `KeyboardInterrupt` on the main thread
    (summaries delivered inline at interpreter shutdown) propagates.
    """

    def __init__(self, sinks: Sequence[Sink], errlog: RateLimitedLog) -> None:
        self.sinks = list(sinks)
        self.dropped = 0
        self.errors = 0
        # Sinks that raised a BaseException that is not an Exception: no longer called.
        self.disabled: list[Sink] = []
        self._errlog = errlog
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        # True when no thread could be started (interpreter shutdown: Python 3.12 refuses
        # new threads in atexit hooks): summaries are then delivered on the caller's thread.
        self._inline = False

    def emit(self, summary: dict[str, Any]) -> None:
        if self._closed:
            self.dropped += 1
            return
        if self._queue is None and not self._inline:
            with self._lock:
                if self._queue is None and not self._inline:
                    self._start()
        if self._inline:
            self._deliver(summary)
            return
        try:
            self._queue.put_nowait(summary)
        except queue.Full:
            self.dropped += 1

    def _start(self) -> None:
        self._queue = queue.Queue(maxsize=QUEUE_SLOTS)
        self._thread = threading.Thread(target=self._loop, name="jaxpace-sinks", daemon=True)
        try:
            self._thread.start()
        except RuntimeError:  # "can't create new thread at interpreter shutdown"
            self._queue, self._thread, self._inline = None, None, True

    def _deliver(self, item: dict[str, Any]) -> None:
        for sink in self.sinks:
            if self._is_disabled(sink):
                continue
            try:
                sink(item)
            except Exception as e:  # noqa: BLE001
                self.errors += 1
                self._errlog.warning("sink", "jaxpace: metrics sink %r raised %r", sink, e)
            except BaseException as e:  # noqa: BLE001 - SystemExit & co. must not end the thread
                self._disable(sink, e, "raised")

    def _is_disabled(self, sink: Sink) -> bool:
        return any(d is sink for d in self.disabled)

    def _disable(self, sink: Sink, e: BaseException, doing: str) -> None:
        """Stops calling `sink` after it raised `e`, a BaseException that is not an Exception.

        Re-raises a KeyboardInterrupt on the main thread (the user's Ctrl-C).
        """
        if (
            isinstance(e, KeyboardInterrupt)
            and threading.current_thread() is threading.main_thread()
        ):
            raise e
        self.errors += 1
        if not self._is_disabled(sink):
            self.disabled.append(sink)
        log.warning(
            "jaxpace: metrics sink %r %s %r (a BaseException, not an Exception); it is disabled "
            "and gets no more summaries, the other sinks keep receiving them. Make the sink "
            "raise an Exception (or nothing) instead of calling sys.exit() or raising %s.",
            sink,
            doing,
            e,
            type(e).__name__,
        )

    def _loop(self) -> None:
        q = self._queue
        while True:
            item = q.get()
            if item is None:
                self._close_sinks()
                q.task_done()
                return
            self._deliver(item)
            q.task_done()

    def _close_sinks(self) -> None:
        # On this thread, never a callback: e.g. jaxpace.sinks' final file write.
        for sink in self.sinks:
            try:
                close = getattr(sink, "close", None)
                if callable(close):
                    close()
            except Exception as e:  # noqa: BLE001
                self.errors += 1
                self._errlog.warning("sink", "jaxpace: closing sink %r raised %r", sink, e)
            except BaseException as e:  # noqa: BLE001 - the other sinks still get their close()
                self._disable(sink, e, "raised on close()")

    def flush(self, timeout_s: float = 5.0) -> None:
        """Waits (bounded) until queued summaries are delivered."""
        q = self._queue
        if q is None:
            return
        deadline = time.monotonic() + timeout_s
        while q.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> int:
        """Delivers what it can within `timeout_s`, ends the thread; returns `dropped`.

        Never blocks past about `timeout_s`: summaries still queued then (a
        sink that is slow or never returns) are discarded, counted in
        `dropped`, and logged once with the total. Later `emit`s are dropped.
        """
        with self._lock:
            first = not self._closed
            self._closed = True
        q = self._queue
        if q is None:
            if self._inline and first:  # everything was delivered on the caller's thread
                self._close_sinks()
            return self.dropped
        deadline = time.monotonic() + max(0.0, float(timeout_s))
        self.flush(max(0.0, deadline - time.monotonic()))
        discarded = 0
        while True:
            try:
                item = q.get_nowait()
            except queue.Empty:
                break
            q.task_done()
            if item is not None:
                discarded += 1
        self.dropped += discarded
        try:
            q.put_nowait(None)  # room now: the queue was just emptied
        except queue.Full:  # pragma: no cover - nothing puts after `_closed`
            pass
        t = self._thread
        if t is not None:
            t.join(max(0.0, deadline - time.monotonic()))
        if self.dropped and (first or discarded):
            stuck = t is not None and t.is_alive()
            log.warning(
                "jaxpace: sinks closed; %d summaries dropped (queue full or undelivered "
                "at close)%s%s",
                self.dropped,
                "; a sink is still running and was left behind (daemon thread)" if stuck else "",
                f"; {len(self.disabled)} sink(s) disabled after raising a BaseException"
                if self.disabled
                else "",
            )
        return self.dropped
