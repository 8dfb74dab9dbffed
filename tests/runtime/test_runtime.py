"""Pacer runtime on one process: sinks, stats fields, records, configure rules."""

import threading

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from psum_step import run_psum

import jaxpace as jp
from jaxpace.runtime.testing import set_fault_hook

MESH = jax.make_mesh((8,), ("data",))


def _run(pacer, steps=4, site="s"):
    run_psum(pacer, site, steps)


def test_sink_receives_one_summary_per_rank_step_off_the_callback_thread():
    got, threads = [], set()

    def sink(summary):
        got.append(summary)
        threads.add(threading.current_thread().name)

    pacer = jp.Pacer(granularity="device", sinks=[sink])
    _run(pacer, steps=3)
    pacer.flush()
    assert len(got) == 3 * 8
    assert {g["site"] for g in got} == {"s"}
    assert sorted({g["rank"] for g in got}) == list(range(8))
    assert all(g["wait_s"] >= 0 and g["delay_s"] == 0 for g in got)
    assert threads == {"jaxpace-sinks"}
    pacer.close()


def test_raising_sink_is_counted_and_does_not_disturb_the_step():
    def bad(summary):
        raise RuntimeError("logger down")

    pacer = jp.Pacer(sinks=[bad])
    _run(pacer, steps=3)
    pacer.flush()
    assert pacer.sink_errors == 3
    assert pacer.stats()["s"].errors == 0
    pacer.close()


def test_gather_single_process_returns_own_records():
    pacer = jp.Pacer()
    _run(pacer, steps=2)
    recs = pacer.gather()
    assert recs[0]["type"] == "header" and len(recs) == 3


def test_export_all_writes_per_process_files(tmp_path):
    pacer = jp.Pacer(granularity="device")
    _run(pacer, steps=2)
    d = pacer.export_all(tmp_path / "run")
    files = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert d is not None and files == ["records-p0.parquet"]
    rep = jp.report.analyze(tmp_path / "run", warmup_steps=0)
    assert rep.num_ranks == 8


def test_sample_every_records_only_sampled_steps():
    pacer = jp.Pacer(sample_every=3)
    _run(pacer, steps=7)
    steps = [r["step"] for r in pacer.records() if r["type"] == "step"]
    assert steps == [0, 3, 6]


def test_capacity_bounds_records():
    pacer = jp.Pacer(capacity=4)
    _run(pacer, steps=10)
    steps = [r["step"] for r in pacer.records() if r["type"] == "step"]
    assert steps == [6, 7, 8, 9]


def test_configure_default_pacer_rules():
    p = jp.default_pacer()
    if not p.traced:
        jp.configure(policy=jp.no_pacing())
    jax.vmap(lambda v: jp.psum(v, "i"), axis_name="i")(jnp.ones(2))
    with pytest.raises(jp.errors.TracedConfigChangeError):
        jp.configure(policy=jp.adaptive())


def test_stats_say_how_measuring_shards_were_found(monkeypatch):
    from jaxpace.topology import registry

    monkeypatch.setattr(registry, "_MESHES", type(registry._MESHES)(maxlen=16))
    pacer = jp.Pacer()
    _run(pacer, steps=1)
    assert "process-contiguous" in pacer.stats()["s"].layout
    pacer = jp.Pacer(mesh=MESH)
    _run(pacer, steps=1)
    assert pacer.stats()["s"].layout == "Pacer(mesh=...)"
    mesh = jp.make_mesh((8,), ("data",))
    pacer = jp.Pacer()
    f = jax.jit(
        jax.shard_map(
            lambda v: pacer.psum(v, "data", site="m"), mesh=mesh, in_specs=P("data"), out_specs=P()
        )
    )
    f(jax.device_put(jnp.ones((8, 2)), NamedSharding(mesh, P("data")))).block_until_ready()
    assert pacer.stats()["m"].layout == "jaxpace.make_mesh"


def test_two_measuring_shards_in_one_process_are_reported(caplog):
    """A mesh whose layout disagrees with reality gives a clear warning, not bad silence."""
    import dataclasses

    import numpy as np

    @dataclasses.dataclass(frozen=True)
    class FakeDevice:
        id: int
        process_index: int

    class FakeMesh:
        axis_names = ("data",)
        devices = np.array([FakeDevice(i, i % 2) for i in range(8)], dtype=object)

    pacer = jp.Pacer(mesh=FakeMesh())
    with caplog.at_level("WARNING", logger="jaxpace"):
        _run(pacer, steps=2, site="wrong")
        pacer.stats()  # native probes: the drain (here, or within 50 ms) reports overlaps
    assert "two measured arrivals at wrong overlap" in caplog.text


def test_rank_groups_reach_the_report_and_name_locality():
    """Ranks 4-7 (one 'NUMA node') arrive late together: the report says locality.

    The lateness comes from an injected clock (tests/virtual_clock.py), not a sleep."""
    from virtual_clock import StepClock, jitter_ns

    groups = {"numa": {r: ("node0" if r < 4 else "node1") for r in range(8)}}
    # 50 ms steps, as the sleeping version had: a NUMA node 20 ms (40% of a step) late is
    # locality; 20 ms of a 1 s step would be within a healthy fleet's spread (docs/diagnostics.md).
    clock = StepClock(
        lambda rank, step: (20_000_000 if rank >= 4 else 0) + jitter_ns(rank, step),
        step_ns=50_000_000,
        done_ns=30_000_000,
    )
    pacer = jp.Pacer(granularity="device", rank_groups=groups, clock=clock)
    set_fault_hook(pacer, clock.hook)  # called just before each arrival is read
    _run(pacer, steps=30, site="loc")
    header = pacer.records()[0]
    assert header["topology"]["rank_groups"]["numa"]["5"] == "node1"
    assert set(header["topology"]["rank_groups"]["host"]) == {str(r) for r in range(8)}
    rep = jp.report.analyze(pacer.records())
    assert rep.mode("locality").detected, rep.mode("locality").evidence


@pytest.mark.timeout(120)
@pytest.mark.parametrize("threads", [True, False], ids=["helper-thread", "no-new-thread"])
def test_records_wait_for_a_step_still_running(monkeypatch, threads):
    """The last step of a loop may still run when the records are read. At interpreter exit,
    Python 3.12 starts no new thread, and the wait (then on a helper thread) used to be
    skipped there: the exit of a loop ended by an exception lost the step dispatched just
    before it (seen once, 312 of 320 rank-steps delivered). The wait now polls on the
    calling thread, with threads or without."""
    import time

    import numpy as np

    mesh = jax.make_mesh((8,), ("data",), devices=jax.devices()[:8])
    pacer = jp.Pacer(granularity="device", mesh=mesh)

    def slow(a):
        time.sleep(0.3)
        return a

    def body(x):
        x = jax.pure_callback(slow, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        return pacer.psum(x, "data", site="late")

    step = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=P()))
    x = jax.device_put(np.ones((8, 4), np.float32), NamedSharding(mesh, P("data")))
    try:
        jax.block_until_ready(step(x))
        y = step(x)  # dispatched, not waited for: its collective runs after the 0.3 s sleep
        if not threads:  # as at interpreter exit on Python 3.12

            def refuse(self):
                raise RuntimeError("can't create new thread at interpreter shutdown")

            monkeypatch.setattr(threading.Thread, "start", refuse)
        steps = [r for r in pacer.records() if r.get("type") == "step"]
        assert len(steps) == 2 * 8, len(steps)
        del y
    finally:
        pacer.close()
