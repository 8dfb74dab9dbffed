"""Nothing lost at shutdown: close(), interpreter exit, SIGTERM and an exception deliver every step.

Each path runs 40 measured steps on 8 CPU devices at granularity="device" (320
rank-steps) with three sinks (a counting sink, Prometheus textfile, TensorBoard),
without calling `stats()`/`flush()` first, and counts what arrived exactly.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from psum_step import psum_step

import jaxpace as jp
from jaxpace.runtime.testing import set_fault_hook

prom_parser = pytest.importorskip("prometheus_client.parser")
pytest.importorskip("tensorboardX")

STEPS, RANKS = 40, 8
SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "shutdown_job.py"


def _prom_steps(path):
    text = Path(path).read_text()
    fams = {f.name: f for f in prom_parser.text_string_to_metric_families(text)}
    return {int(s.labels["rank"]): s.value for s in fams["jaxpace_steps_measured"].samples}


def _tb_counts(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: len(acc.Scalars(tag)) for tag in acc.Tags()["scalars"]}


def _check_sinks(out):
    got = json.loads((out / "sink-closed.json").read_text())
    assert got == {"summaries": STEPS * RANKS, "distinct": STEPS * RANKS}
    assert _prom_steps(out / "m.prom") == {r: STEPS for r in range(RANKS)}
    tb = _tb_counts(out / "tb")
    for r in range(RANKS):
        for kind in ("wait_ms", "delay_ms", "engaged"):
            assert tb[f"jaxpace/grads/{kind}/rank{r}"] == STEPS, (kind, r, tb)


def _records(out):
    return json.loads((out / "records.json").read_text())["steps"]


def _run(out, mode, timeout_s=240):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(out), mode],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
    )


@pytest.mark.timeout(300)
def test_close_delivers_every_step_to_every_sink_and_the_records(tmp_path):
    import jax

    got = []

    class Counting:
        closed_with = None

        def __call__(self, s):
            got.append((s["rank"], s["step"]))

        def close(self):
            Counting.closed_with = len(got)

    prom = jp.sinks.prometheus_textfile(tmp_path / "m.prom", write_every_s=3600)
    tb = jp.sinks.tensorboard(tmp_path / "tb", flush_secs=3600)
    pacer = jp.Pacer(granularity="device", sinks=[Counting(), prom, tb])
    f, x = psum_step(pacer, "grads", ranks=RANKS)
    for _ in range(STEPS - 1):  # one at a time (see tests/scripts/shutdown_job.py)
        jax.block_until_ready(f(x))
    y = f(x)  # dispatched, not waited for
    assert pacer.close() == 0  # no stats()/flush() first
    del y
    assert Counting.closed_with == STEPS * RANKS  # all delivered before the sinks closed
    assert len(set(got)) == STEPS * RANKS
    assert len([r for r in pacer.records() if r["type"] == "step"]) == STEPS * RANKS
    _check_sinks_in_process(tmp_path)
    assert pacer.close() == 0  # a second close returns at once, changes nothing
    assert len(got) == STEPS * RANKS


def _check_sinks_in_process(out):
    assert _prom_steps(out / "m.prom") == {r: STEPS for r in range(RANKS)}
    tb = _tb_counts(out / "tb")
    assert all(tb[f"jaxpace/grads/wait_ms/rank{r}"] == STEPS for r in range(RANKS))


@pytest.mark.timeout(300)
def test_interpreter_exit_delivers_every_step(tmp_path):
    proc = _run(tmp_path, "exit")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check_sinks(tmp_path)
    assert _records(tmp_path) == STEPS * RANKS


@pytest.mark.timeout(300)
def test_an_exception_that_ends_the_loop_delivers_every_step(tmp_path):
    proc = _run(tmp_path, "raise")
    assert proc.returncode == 1 and "ended with an exception" in proc.stderr, proc.stderr[-3000:]
    _check_sinks(tmp_path)
    assert _records(tmp_path) == STEPS * RANKS


def _sigterm(out, mode):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(out), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        ready = out / "ready"
        deadline = time.monotonic() + 240
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), proc.communicate(timeout=30)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    return proc.returncode, err


@pytest.mark.timeout(300)
def test_sigterm_with_the_default_action_delivers_every_step_then_dies_of_it(tmp_path):
    rc, err = _sigterm(tmp_path, "sigterm")
    assert rc == -signal.SIGTERM, err[-3000:]  # still killed by the signal, as before
    _check_sinks(tmp_path)


@pytest.mark.timeout(300)
def test_sigterm_with_the_programs_own_handler_delivers_every_step(tmp_path):
    rc, err = _sigterm(tmp_path, "sigterm_handled")
    assert rc == 143, err[-3000:]  # the program's handler ran (sys.exit(143))
    assert (tmp_path / "handler-calls").read_text() == f"{int(signal.SIGTERM)}\n"  # once
    _check_sinks(tmp_path)
    assert _records(tmp_path) == STEPS * RANKS


@pytest.mark.timeout(300)
def test_sigterm_with_a_handler_installed_after_jaxpaces_calls_it_once_and_delivers(tmp_path):
    rc, err = _sigterm(tmp_path, "sigterm_handled_after")
    assert rc == 143, err[-3000:]
    assert (tmp_path / "handler-calls").read_text() == f"{int(signal.SIGTERM)}\n"  # once
    _check_sinks(tmp_path)
    assert _records(tmp_path) == STEPS * RANKS


@pytest.mark.timeout(300)
def test_sigterm_with_a_native_handler_delivers_calls_it_once_and_does_not_kill(tmp_path):
    """A handler installed by native code (here `faulthandler.register`; under
    `jax.distributed`, XLA's preemption notifier: tests/runtime/test_signals.py) is invisible to
    `signal.getsignal`. Before, jaxpace's handler replaced it and killed the process."""
    rc, err = _sigterm(tmp_path, "sigterm_native")
    assert rc == 0, err[-3000:]  # the native handler ran and the program ended normally
    dump = (tmp_path / "native-dump").read_text()
    assert dump.count("most recent call first") == 1, dump  # called once
    _check_sinks(tmp_path)
    assert _records(tmp_path) == STEPS * RANKS


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["sigterm_paced_first", "sigterm_paced_after"])
def test_sigterm_delivers_every_step_whichever_pacer_traced_first(tmp_path, mode):
    """Issue 45: a pacing pacer traced before the one with sinks left 1 of 30 steps in its
    Prometheus file: two handlers each took the other for the program's own, and the
    sinks were never closed. One handler now serves every pacer, in either order."""
    rc, err = _sigterm(tmp_path, mode)
    assert rc == -signal.SIGTERM, err[-3000:]
    _check_sinks(tmp_path)


@pytest.mark.timeout(300)
def test_sigterm_while_the_main_thread_waits_on_a_step_that_never_ends(tmp_path):
    """The handler still runs (JAX's wait lets it); close waits its bound, then delivers."""
    rc, err = _sigterm(tmp_path, "sigterm_stuck")
    assert rc == -signal.SIGTERM, err[-3000:]
    _check_sinks(tmp_path)


@pytest.mark.timeout(120)
def test_close_is_bounded_when_a_step_never_finishes_and_counts_it(caplog):
    """An io_callback step that never finishes: close() returns within its bound and counts it."""
    import logging

    import jax

    release = threading.Event()
    pacer = jp.Pacer(granularity="device", sinks=[lambda s: None], stall_after_s=None)

    def hang(where, site, rank, step):  # a fault hook forces the io_callback probes
        if where == "post" and step == 1 and rank == 0:
            release.wait(60)

    set_fault_hook(pacer, hang)
    f, x = psum_step(pacer, "g", ranks=RANKS)
    jax.block_until_ready(f(x))
    y = f(x)  # step 1: rank 0's post-callback blocks
    try:
        with caplog.at_level(logging.WARNING, "jaxpace"):
            closer = threading.Thread(target=lambda: pacer.close(timeout_s=2.0), daemon=True)
            closer.start()
            closer.join(60)  # a bound, not a speed claim
            assert not closer.is_alive(), "close() did not return"
        assert pacer.in_flight_at_close == 1
        assert "still in flight" in caplog.text
    finally:
        release.set()
        jax.block_until_ready(y)
