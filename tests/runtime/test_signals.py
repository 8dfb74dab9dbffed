"""One owner of SIGTERM and `atexit` (`jaxpace.runtime.signals`), beside JAX's own preemption handling.

`jax.distributed.initialize()` installs a native SIGTERM handler (XLA's preemption
notifier) that `signal.getsignal` reports as `SIG_DFL`: a SIGTERM'd process logs
"SIGTERM caught" and keeps running, so that every process can reach
`multihost_utils.reached_preemption_sync_point` and save a checkpoint. jaxpace must
deliver what it measured and neither kill that process nor hide the signal from JAX.
The single-process orders (a pacing pacer traced before or after the one with sinks, a
program handler installed before or after jaxpace's) are in tests/runtime/test_shutdown_delivery.py.
"""

import json
import re
import signal
import subprocess
import sys

import pytest
from conftest import SCRIPTS

from jaxpace.runtime import signals as _signals


@pytest.mark.multiprocess
@pytest.mark.timeout(260)
def test_a_preempted_jax_distributed_process_keeps_running_and_delivers_every_step(
    launch, tmp_path
):
    """Before: jaxpace's handler replaced JAX's, so process 1 died of the signal (-15),
    JAX never saw the notice, and its sink file was never written."""
    proc = launch(
        [
            "-n", 2, "--local-devices", 2, "--timeout", 150, "--",
            sys.executable, SCRIPTS / "preempt_job.py", "--out", tmp_path, "--at-step", 5,
        ],
        timeout_s=200,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    # JAX's notifier saw the signal (jaxpace called it) ...
    assert re.search(r"\[rank 1\] .*SIGTERM caught", out), out[-4000:]
    # ... and every process reached the same preemption sync point and ended normally.
    preempted = {int(r): int(s) for r, s in re.findall(r"\[rank (\d)\] PREEMPTED (\d+)", out)}
    assert set(preempted) == {0, 1} and len(set(preempted.values())) == 1, out[-4000:]
    last = preempted[0]
    assert last > 5  # past the step of the signal: the process went on
    # At the signal, the sink already had every step measured so far (delivered, not closed).
    [(got, expected)] = re.findall(r"\[rank 1\] DELIVERED_AT_SIGTERM (\d+) (\d+)", out)
    assert int(got) == int(expected) == 6 * 2, out[-4000:]
    # At exit, every measured step reached the sink, then it was closed.
    for p in (0, 1):
        sink = json.loads((tmp_path / f"sink-p{p}.json").read_text())
        records = json.loads((tmp_path / f"records-p{p}.json").read_text())["steps"]
        assert records == (last + 1) * 2, (p, records, last)
        assert sink == {"summaries": records, "distinct": records}, (p, sink)


def test_the_native_handler_query_sees_what_the_kernel_runs():
    """`signal.getsignal` reports only what Python installed; the sigaction query sees the
    kernel's view (the layout of `struct sigaction` is right: flags and address read)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the query is Linux-only")
    before = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        assert _signals._native_handler()[0] == 0
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        assert _signals._native_handler()[0] == 1
        signal.signal(signal.SIGTERM, lambda *_: None)
        addr, flags = _signals._native_handler()
        assert addr > 1 and not flags & _signals._SA_SIGINFO  # Python's own C handler
    finally:
        signal.signal(signal.SIGTERM, before)


IGNORED = """
import os, signal
os.environ["JAX_PLATFORMS"] = "cpu"
import jax
jax.config.update("jax_num_cpu_devices", 2)
import jax.numpy as jnp
import jaxpace as jp

got = []
signal.signal(signal.SIGTERM, signal.SIG_IGN)
pacer = jp.Pacer(policy=jp.fixed(0.001), granularity="device", sinks=[got.append])
mesh = jax.make_mesh((2,), ("d",))
f = jax.jit(jax.shard_map(lambda v: pacer.psum(v, "d"), mesh=mesh,
                          in_specs=jax.P("d"), out_specs=jax.P()))
x = jax.device_put(jnp.ones(2), jax.NamedSharding(mesh, jax.P("d")))
for _ in range(3):
    f(x).block_until_ready()
os.kill(os.getpid(), signal.SIGTERM)
pacer.close()
print("IGNORED", signal.getsignal(signal.SIGTERM) is signal.SIG_IGN, "DELIVERED", len(got))
"""


@pytest.mark.timeout(120)
def test_a_program_that_ignores_sigterm_keeps_ignoring_it():
    out = subprocess.run(
        [sys.executable, "-c", IGNORED], capture_output=True, text=True, timeout=110
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "IGNORED True DELIVERED 6" in out.stdout, out.stdout + out.stderr[-3000:]
