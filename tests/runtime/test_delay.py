"""The delay stage's process-wide state: installed once, by the first pacer that can sleep."""

import gc
import subprocess
import sys
import textwrap
import threading
import weakref

import pytest

from jaxpace.runtime import delay as _delay

SCRIPT = textwrap.dedent(
    """
    import os, signal, threading
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    jax.config.update("jax_num_cpu_devices", 2)
    import jax.numpy as jnp
    import jaxpace as jp

    def state():
        names = sorted(t.name for t in threading.enumerate() if t.name.startswith("jaxpace"))
        return signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, names

    print("START", *state())
    measure_only = [jp.Pacer() for _ in range(3)]
    print("CONSTRUCTED", *state())
    f = jax.vmap(lambda v: measure_only[0].psum(v, "i"), axis_name="i")
    f(jnp.ones(2))
    print("TRACED_MEASURE_ONLY", *state())
    paced = jp.Pacer(policy=jp.fixed(0.001))
    mesh = jax.make_mesh((2,), ("d",))
    g = jax.jit(jax.shard_map(lambda v: paced.psum(v, "d"), mesh=mesh,
                              in_specs=jax.P("d"), out_specs=jax.P()))
    g(jax.device_put(jnp.ones(2), jax.NamedSharding(mesh, jax.P("d")))).block_until_ready()
    print("TRACED_PACED", *state())
    """
)


@pytest.mark.timeout(120)
def test_sigterm_release_is_installed_by_the_first_pacer_that_can_sleep_not_by_constructors():
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=110, check=True
    ).stdout
    lines = dict(line.split(" ", 1) for line in out.splitlines() if line.split(" ")[0].isupper())
    assert lines["START"] == "True []"
    assert lines["CONSTRUCTED"] == "True []"  # no handler, no thread from constructors
    # A policy that never sleeps needs no SIGTERM release (other jaxpace threads,
    # such as the stall watchdog, may start at the first trace).
    assert lines["TRACED_MEASURE_ONLY"].startswith("True")
    assert "jaxpace-sigterm" not in lines["TRACED_MEASURE_ONLY"]
    assert lines["TRACED_PACED"].startswith("False") and "jaxpace-sigterm" in lines["TRACED_PACED"]


def test_stop_registry_is_weak_and_release_all_sets_live_events(monkeypatch):
    # A registry of this test's own: the process-wide one also holds the native
    # probes' SIGTERM event, and setting that releases every native sleep for good.
    monkeypatch.setattr(_delay, "_STOPS", weakref.WeakSet())
    ev = threading.Event()
    _delay.register_stop(ev)
    gone = threading.Event()
    _delay.register_stop(gone)
    ref = weakref.ref(gone)
    assert gone in _delay._STOPS
    del gone
    gc.collect()
    assert ref() is None  # the registry holds no strong reference: collected pacers drop out
    assert ev in _delay._STOPS
    _delay.release_all()
    assert ev.is_set()


def test_interruptible_sleep_sanitizes_and_returns_early_on_stop():
    stop = threading.Event()
    for bad in (float("nan"), float("inf"), -1.0, "1", None):
        assert _delay.interruptible_sleep(bad, stop) == 0.0
    stop.set()
    assert _delay.interruptible_sleep(10.0, stop) == 0.0  # already released: no sleep at all
