"""A sink that raises a BaseException (`sys.exit()`, a custom subclass) is disabled, not fatal.

Before: only `Exception` was caught, so `SystemExit` ended the sink thread
silently; the other sink got 6 of 60 summaries and `close()` blamed a full
queue. Waits are bounded (`join(timeout)`), never timed assertions.
"""

from __future__ import annotations

import logging
import sys
import threading

import pytest

import jaxpace as jp
from jaxpace.runtime.probe import RateLimitedLog
from jaxpace.runtime.sink_thread import SinkThread

N = 60


class CustomStop(BaseException):
    """A BaseException that is neither SystemExit nor KeyboardInterrupt."""


@pytest.mark.timeout(60)
def test_a_sink_calling_sys_exit_and_one_raising_a_base_exception_are_disabled(caplog):
    first, last = [], []
    calls = {"exit": 0, "custom": 0}

    def exits(summary):
        calls["exit"] += 1
        if summary["i"] == 5:
            sys.exit(3)

    def custom(summary):
        calls["custom"] += 1
        if summary["i"] == 10:
            raise CustomStop("stop")

    pacer = jp.Pacer(sinks=[first.append, exits, custom, last.append])
    with caplog.at_level(logging.WARNING, "jaxpace"):
        for i in range(N):
            pacer.sink_thread.emit({"i": i})
        pacer.close()
    # The working sinks, before and after the failing ones, received every summary.
    assert [s["i"] for s in first] == list(range(N))
    assert [s["i"] for s in last] == list(range(N))
    # Each failing sink was called until it raised, then never again.
    assert calls == {"exit": 6, "custom": 11}
    assert pacer.sink_disabled == 2 and pacer.sink_errors == 2
    assert pacer.sink_dropped == 0
    assert "queue full" not in caplog.text
    assert caplog.text.count("it is disabled") == 2
    assert "SystemExit(3)" in caplog.text and "CustomStop('stop')" in caplog.text
    t = pacer.sink_thread._thread
    t.join(10)
    assert not t.is_alive()


@pytest.mark.timeout(60)
def test_a_sink_whose_close_raises_system_exit_does_not_stop_the_others_closing():
    closed = []

    class Sink:
        def __init__(self, name, fail):
            self.name, self.fail = name, fail

        def __call__(self, summary):
            pass

        def close(self):
            if self.fail:
                raise SystemExit(1)
            closed.append(self.name)

    pacer = jp.Pacer(sinks=[Sink("a", True), Sink("b", False)])
    pacer.sink_thread.emit({"i": 0})
    pacer.close()
    assert closed == ["b"]
    assert pacer.sink_disabled == 1


@pytest.mark.timeout(60)
def test_keyboard_interrupt_propagates_only_on_the_main_thread():
    def interrupts(summary):
        raise KeyboardInterrupt

    got = []
    # Inline delivery (interpreter shutdown) runs on the caller's thread: Ctrl-C is the user's.
    inline = SinkThread([interrupts, got.append], RateLimitedLog())
    inline._inline = True
    with pytest.raises(KeyboardInterrupt):
        inline.emit({"i": 0})
    # On the sink thread it is one more sink failure: disabled, the other sink still served.
    threaded = SinkThread([interrupts, got.append], RateLimitedLog())
    worker = threading.Thread(target=lambda: threaded._deliver({"i": 1}))
    worker.start()
    worker.join(10)
    threaded._deliver({"i": 2})  # the disabled sink is skipped, even on the main thread
    assert [s["i"] for s in got] == [1, 2]
    assert threaded.disabled == [interrupts]
