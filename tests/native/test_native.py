"""Native probes (jaxpace/native/probes): effect-free primitives lowered to XLA FFI handlers.

Runs when the native library was built by `pip install` (a C++17 compiler at install time);
otherwise every test here is skipped with the loader's reason, and the io_callback fallback is
what the rest of the suite covers.
"""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxpace.native import primitive as prim
from jaxpace.native import probes as nat

OK, WHY = nat.available()
pytestmark = pytest.mark.skipif(not OK, reason=f"native probes unavailable: {WHY}")


def new_site(num_slots=8, **kw):
    """A fresh native site id, registered."""
    sid = nat.allocate_site_id()
    nat.register_site(sid, num_slots, **kw)
    return sid


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((8,), ("d",))


def sharded(mesh, a):
    return jax.device_put(a, NamedSharding(mesh, P("d")))


def measured(kind, sid, payload_size=0, axis="d"):
    """A measured lax.psum/pmean on axis `axis` through the native probes."""
    lax_fn = {"psum": lax.psum, "pmean": lax.pmean}[kind]

    def f(t):
        rank = lax.axis_index(axis)
        if payload_size:
            out, _ = prim.native_collective(
                lambda u: lax_fn(u, axis), t, site_id=sid, rank=rank, payload_size=payload_size
            )
        else:
            out, _ = prim.native_collective(lambda u: lax_fn(u, axis), t, site_id=sid, rank=rank)
        return out

    return f


def all_records(sid, payload_len=0, num_slots=8):
    """The site's records, once every measured arrival has its done record (bounded wait):
    a program's result can be ready a few microseconds before its done probes have run."""
    deadline = time.monotonic() + 10.0
    while nat.in_collective(sid, num_slots) and time.monotonic() < deadline:
        time.sleep(0.001)
    recs, pays = nat.drain(sid, payload_len=payload_len)
    return recs, pays


@pytest.mark.parametrize("kind", ["psum", "pmean"])
@pytest.mark.parametrize("payload", [0, 24])
def test_bitwise_identical_to_lax_under_jit_shard_map(mesh, kind, payload):
    sid = new_site(payload_len=payload)
    lax_fn = {"psum": lax.psum, "pmean": lax.pmean}[kind]
    x = sharded(mesh, jnp.sin(jnp.arange(8 * 33, dtype=jnp.float32)).reshape(8, 33) * 1e3)
    tree = {"a": x, "b": sharded(mesh, jnp.arange(8 * 5, dtype=jnp.float32).reshape(8, 5) / 7)}
    spec = {"a": P("d"), "b": P("d")}
    f = jax.jit(
        jax.shard_map(
            lambda t: measured(kind, sid, payload)(jax.tree.map(lambda v: v * 3.0, t)),
            mesh=mesh,
            in_specs=(spec,),
            out_specs={"a": P(), "b": P()},
        )
    )
    ref = jax.jit(
        jax.shard_map(
            lambda t: lax_fn(jax.tree.map(lambda v: v * 3.0, t), "d"),
            mesh=mesh,
            in_specs=(spec,),
            out_specs={"a": P(), "b": P()},
        )
    )
    for _ in range(3):
        got, want = jax.block_until_ready((f(tree), ref(tree)))
        for k in ("a", "b"):
            assert np.asarray(got[k]).tobytes() == np.asarray(want[k]).tobytes()
    recs, _ = all_records(sid, payload)
    assert len(recs) == 3 * 8  # one record per shard and step
    assert sorted(set(recs["rank"].tolist())) == list(range(8))
    hlo = f.lower(tree).compile().as_text()
    assert hlo.count("jaxpace_arrive_cpu") >= 1 and hlo.count("jaxpace_done_cpu") >= 1


def test_records_are_ordered_and_plausible(mesh):
    sid = new_site()
    x = sharded(mesh, jnp.ones((8, 1000), jnp.float32))
    f = jax.jit(jax.shard_map(measured("psum", sid), mesh=mesh, in_specs=P("d"), out_specs=P()))
    t0 = nat.now_ns()
    for _ in range(5):
        f(x).block_until_ready()
    t1 = nat.now_ns()
    recs, _ = all_records(sid)
    assert len(recs) == 40
    assert (recs["arrive_ns"] <= recs["done_ns"]).all()
    assert (recs["wait_ns"] == recs["done_ns"] - recs["arrive_ns"]).all()
    assert (recs["arrive_ns"] >= t0).all() and (recs["done_ns"] <= t1).all()
    for s in range(5):
        step = recs[recs["step"] == s]
        assert sorted(step["rank"].tolist()) == list(range(8))
        # A collective completes only after every shard arrived.
        assert step["arrive_ns"].max() <= step["done_ns"].min()
        if s:
            prev = recs[recs["step"] == s - 1]
            assert prev["done_ns"].max() <= step["arrive_ns"].max()


def test_remat_inside_grad_is_measured_once_per_step_and_bitwise(mesh):
    sid = new_site()
    x = sharded(mesh, jnp.linspace(-2, 3, 8 * 16, dtype=jnp.float32).reshape(8, 16))

    def loss(red):
        return lambda t: jax.checkpoint(lambda u: jnp.sum(red(jnp.sin(u)) ** 2))(t)

    g = jax.jit(
        jax.shard_map(
            jax.grad(loss(measured("psum", sid))), mesh=mesh, in_specs=P("d"), out_specs=P("d")
        )
    )
    gref = jax.jit(
        jax.shard_map(
            jax.grad(loss(lambda v: lax.psum(v, "d"))), mesh=mesh, in_specs=P("d"), out_specs=P("d")
        )
    )
    for _ in range(3):
        assert np.asarray(g(x)).tobytes() == np.asarray(gref(x)).tobytes()
    recs, _ = all_records(sid)
    # Measured (records exist) and deduplicated: exactly one per (rank, step), steps 0..2.
    assert len(recs) == 3 * 8
    keys = set(zip(recs["rank"].tolist(), recs["step"].tolist(), strict=True))
    assert keys == {(r, s) for r in range(8) for s in range(3)}
    hlo = g.lower(x).compile().as_text()
    assert hlo.count('custom_call_target="jaxpace_arrive_cpu"') == 1


def test_enable_checks_with_custom_jvp_and_grad(mesh):
    sid = new_site()
    x = sharded(mesh, jnp.arange(8 * 4, dtype=jnp.float32).reshape(8, 4))
    red = measured("pmean", sid)

    @jax.custom_jvp
    def cj(t):
        return red(t)

    @cj.defjvp
    def cj_jvp(p, tt):
        return cj(p[0]), lax.pmean(tt[0], "d")

    prev = jax.config.jax_enable_checks
    jax.config.update("jax_enable_checks", True)
    try:
        gg = jax.jit(
            jax.shard_map(
                jax.grad(lambda t: jnp.sum(cj(t) ** 2)),
                mesh=mesh,
                in_specs=P("d"),
                out_specs=P("d"),
            )
        )
        got = gg(x)
        want = jax.jit(
            jax.shard_map(
                jax.grad(lambda t: jnp.sum(lax.pmean(t, "d") ** 2)),
                mesh=mesh,
                in_specs=P("d"),
                out_specs=P("d"),
            )
        )(x)
        # And a remat'ed one under checks.
        gr = jax.jit(
            jax.shard_map(
                jax.grad(lambda t: jax.checkpoint(lambda u: jnp.sum(red(u * 2.0) ** 2))(t)),
                mesh=mesh,
                in_specs=P("d"),
                out_specs=P("d"),
            )
        )(x)
        gr_ref = jax.jit(
            jax.shard_map(
                jax.grad(
                    lambda t: jax.checkpoint(lambda u: jnp.sum(lax.pmean(u * 2.0, "d") ** 2))(t)
                ),
                mesh=mesh,
                in_specs=P("d"),
                out_specs=P("d"),
            )
        )(x)
    finally:
        jax.config.update("jax_enable_checks", prev)
    assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
    assert np.asarray(gr).tobytes() == np.asarray(gr_ref).tobytes()
    recs, _ = all_records(sid)
    assert len(recs) == 2 * 8  # measured, not passed through


def test_pmap_is_measured(mesh):
    sid = new_site()
    f = jax.pmap(measured("psum", sid, axis="i"), axis_name="i")
    x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    got = jax.block_until_ready(f(x))
    want = jax.pmap(lambda v: lax.psum(v, "i"), axis_name="i")(x)
    assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
    recs, _ = all_records(sid)
    assert len(recs) == 8


def test_inactive_rank_and_unknown_site_are_noops(mesh):
    sid = new_site()
    x = sharded(mesh, jnp.ones((8, 8), jnp.float32))

    def f(t):
        r = lax.axis_index("d")
        rank = jnp.where(r == 3, r, -1)  # only shard 3 measures (a "leader")
        a, _ = prim.native_collective(lambda u: lax.psum(u, "d"), t, site_id=sid, rank=rank)
        b, _ = prim.native_collective(lambda u: lax.psum(u, "d"), t, site_id=4000, rank=r)
        return a + b

    g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("d"), out_specs=P()))
    np.testing.assert_array_equal(np.asarray(g(x)), np.full((1, 8), 16.0))
    recs, _ = all_records(sid)
    assert recs["rank"].tolist() == [3]


def test_fixed_rank_records_the_process_slot(mesh):
    sid = new_site(num_slots=2, fixed_rank=1, payload_len=6)
    x = sharded(mesh, jnp.ones((8, 8), jnp.float32))

    def f(t):
        r = lax.axis_index("d")
        rank = jnp.where(r == 0, r, -1)
        out, red = prim.native_collective(
            lambda u: lax.psum(u, "d"), t, site_id=sid, rank=rank, payload_size=6
        )
        return out, red

    g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("d"), out_specs=(P(), P())))
    for _ in range(3):
        _, red = jax.block_until_ready(g(x))
    recs, pays = all_records(sid, payload_len=6)
    assert recs["rank"].tolist() == [1, 1, 1]
    # Slot 1 carries the previous step's wait (seconds) and presence; slot 0 nothing.
    red = np.asarray(red)
    assert red[0] == 0.0 and red[2] == 0.0 and red[3] == 2.0 + 1  # present, from step 1
    assert red[1] == np.float32(recs["wait_ns"][1] * 1e-9)
    assert (pays[2] == red).all()  # the reduced payload is kept with the record


def test_exchange_payload_carries_previous_waits(mesh):
    sid = new_site(payload_len=24)
    x = sharded(mesh, jnp.ones((8, 8), jnp.float32))
    f = jax.jit(
        jax.shard_map(
            lambda t: prim.native_collective(
                lambda u: lax.psum(u, "d"),
                t,
                site_id=sid,
                rank=lax.axis_index("d"),
                payload_size=24,
            ),
            mesh=mesh,
            in_specs=P("d"),
            out_specs=(P(), P()),
        )
    )
    _, red0 = jax.block_until_ready(f(x))
    assert not np.asarray(red0).any()  # step 0: no previous wait anywhere
    _, red1 = jax.block_until_ready(f(x))
    recs, _ = all_records(sid, 24)
    step0 = recs[recs["step"] == 0]
    waits = np.zeros(8, np.float32)
    waits[step0["rank"]] = (step0["wait_ns"] * 1e-9).astype(np.float32)
    red1 = np.asarray(red1)
    np.testing.assert_array_equal(red1[:8], waits)
    # Present, with the step the wait is from: 2 + step 0.
    np.testing.assert_array_equal(red1[8:16], np.full(8, 2.0, np.float32))


def test_pending_counts_undrained_records(mesh):
    """What the drain thread checks before draining a site (it skips sites with nothing new)."""
    sid = new_site(num_slots=8)
    x = sharded(mesh, jnp.ones((8, 8), jnp.float32))
    f = jax.jit(jax.shard_map(measured("psum", sid), mesh=mesh, in_specs=P("d"), out_specs=P()))
    assert nat.pending(sid) == 0
    f(x).block_until_ready()
    assert nat.pending(sid) == 8
    recs, _ = nat.drain(sid)
    assert len(recs) == 8 and nat.pending(sid) == 0
    with pytest.raises(ValueError, match="unknown native site"):
        nat.pending(nat.MAX_SITES + 5)


def test_delay_is_applied_bounded_and_released(mesh):
    sid = new_site(num_slots=8)
    x = sharded(mesh, jnp.ones((8, 8), jnp.float32))
    f = jax.jit(jax.shard_map(measured("psum", sid), mesh=mesh, in_specs=P("d"), out_specs=P()))
    f(x).block_until_ready()
    nat.drain(sid)
    try:
        nat.set_max_delay(0.05)
        nat.set_delay(sid, 2, 0.02)  # applied once, at rank 2's next arrival
        f(x).block_until_ready()
        f(x).block_until_ready()
        recs, _ = all_records(sid)
        by = {(int(r), int(s)): d for r, s, d in recs[["rank", "step", "delay_ns"]]}
        assert by[(2, 1)] >= 0.02e9 * 0.9  # slept (steady clock, never early by much)
        assert by[(2, 2)] == 0 and all(by[(r, 1)] == 0 for r in range(8) if r != 2)
        # Clamped by the bound.
        nat.set_max_delay(0.001)
        nat.set_delay(sid, 5, 10.0)
        f(x).block_until_ready()
        recs, _ = all_records(sid)
        d5 = int(recs[recs["rank"] == 5]["delay_ns"][0])
        assert 0.001e9 * 0.9 <= d5 < 5e9
        # A long delay ends when released (from another thread, as the SIGTERM handler does).
        nat.set_max_delay(600.0)
        nat.set_delay(sid, 1, 600.0)
        threading.Timer(0.2, nat.release_all).start()
        f(x).block_until_ready()
        assert nat.released()
        recs, _ = all_records(sid)
        assert int(recs[recs["rank"] == 1]["delay_ns"][0]) < 60e9
        # Released: later delays sleep nothing until re-armed.
        nat.set_delay(sid, 1, 600.0)
        f(x).block_until_ready()
        recs, _ = all_records(sid)
        assert int(recs[recs["rank"] == 1]["delay_ns"][0]) == 0
    finally:
        nat.set_max_delay(0.0)
        nat.rearm()


def test_sample_every_skips_unsampled_steps(mesh):
    sid = new_site(sample_every=3, payload_len=24)
    x = sharded(mesh, jnp.ones((8, 8), jnp.float32))
    f = jax.jit(
        jax.shard_map(
            measured("psum", sid, payload_size=24), mesh=mesh, in_specs=P("d"), out_specs=P()
        )
    )
    for _ in range(7):
        f(x).block_until_ready()
    recs, _ = all_records(sid, 24)
    assert sorted(set(recs["step"].tolist())) == [0, 3, 6]
    assert len(recs) == 3 * 8
    assert nat.counters(sid)["unsampled"] == 4 * 8


def test_ring_drops_oldest_when_full_and_counts(mesh):
    sid = new_site(capacity=16)
    x = sharded(mesh, jnp.ones((8, 8), jnp.float32))
    f = jax.jit(jax.shard_map(measured("psum", sid), mesh=mesh, in_specs=P("d"), out_specs=P()))
    for _ in range(4):  # 32 records into 16 slots
        f(x).block_until_ready()
    recs, _ = all_records(sid)
    assert len(recs) == 16
    assert set(recs["step"].tolist()) == {2, 3}
    c = nat.counters(sid)
    assert c["pushed"] == 32 and c["dropped"] == 16


def test_wait_records_wakes_on_new_records(mesh):
    sid = new_site()
    nat.set_site_max_delay(sid, 0.01)  # a site that can delay: its records wake the drain
    x = sharded(mesh, jnp.ones((8, 8), jnp.float32))
    f = jax.jit(jax.shard_map(measured("psum", sid), mesh=mesh, in_specs=P("d"), out_specs=P()))
    f(x).block_until_ready()
    seen = nat.wait_records(0, 0.0)
    got = []
    th = threading.Thread(target=lambda: got.append(nat.wait_records(seen, 60.0)))
    th.start()
    time.sleep(0.05)
    f(x).block_until_ready()
    th.join(60)
    assert not th.is_alive() and got[0] > seen


def test_measure_only_records_do_not_wake_the_drain(mesh):
    """A site that cannot delay pushes its records without counting toward (or signalling)
    the drain thread's wait: no futex call per record on the hot path."""
    sid = new_site()
    nat.set_site_max_delay(sid, 0.0)
    x = sharded(mesh, jnp.ones((8, 8), jnp.float32))
    f = jax.jit(jax.shard_map(measured("psum", sid), mesh=mesh, in_specs=P("d"), out_specs=P()))
    before = nat.counters(sid)["pushed"]
    seen = nat.wait_records(0, 0.0)
    f(x).block_until_ready()
    assert nat.counters(sid)["pushed"] == before + 8  # recorded...
    assert nat.wait_records(seen, 0.0) == seen  # ...but not counted as a wake-up


def test_idle_site_records_do_not_wake_the_drain(mesh):
    """A site that may delay but whose policy is idle (`set_site_wake(False)`) waits for the
    drain thread's timer; switched back on, its records wake it again."""
    sid = new_site()
    nat.set_site_max_delay(sid, 0.01)
    x = sharded(mesh, jnp.ones((8, 8), jnp.float32))
    f = jax.jit(jax.shard_map(measured("psum", sid), mesh=mesh, in_specs=P("d"), out_specs=P()))
    nat.set_site_wake(sid, False)
    seen = nat.wait_records(0, 0.0)
    f(x).block_until_ready()
    assert nat.pending(sid) == 8 and nat.wait_records(seen, 0.0) == seen
    nat.set_site_wake(sid, True)
    f(x).block_until_ready()
    assert nat.wait_records(seen, 0.0) == seen + 8
    with pytest.raises(ValueError, match="unknown native site"):
        nat.set_site_wake(nat.MAX_SITES + 5, True)


def test_pacer_native_idle_adaptive_is_drained_on_the_timer_and_wakes_once_engaged(mesh):
    from jaxpace.native import driver

    x = sharded(mesh, jnp.ones((8, 8), jnp.float32))
    idle = jp.Pacer(policy=jp.adaptive(threshold_s=1.0), granularity="device")
    busy = jp.Pacer(
        policy=jp.adaptive(threshold_s=0.0, warmup_steps=0, engage_steps=1, max_delay_s=0.001),
        granularity="device",
    )
    f = smap(mesh, lambda v: idle.psum(v, "d", site="idle"))
    g = smap(mesh, lambda v: busy.psum(v, "d", site="busy"))
    for _ in range(6):
        jax.block_until_ready(f(x))
        jax.block_until_ready(g(x))
        idle.stats(), busy.stats()
    e_idle = driver._entries[idle.sites["idle"].native[0]]
    e_busy = driver._entries[busy.sites["busy"].native[0]]
    assert e_idle.can_delay and not e_idle.eager  # never engaged: timer-drained
    assert e_busy.eager and busy.stats()["busy"].steps_paced > 0
    assert idle.stats()["idle"].steps == 6  # every record still arrives (steps, not rank-steps)
    assert sum(r["type"] == "step" for r in idle.records()) == 6 * 8


def test_bad_site_arguments_name_the_field():
    with pytest.raises(ValueError, match="num_slots"):
        nat.register_site(1, 0)
    with pytest.raises(ValueError, match="unknown native site"):
        nat.drain(4001)
    with pytest.raises(ValueError, match="set_delay"):
        nat.set_delay(4002, 0, 0.1)


def test_remat_rule_is_registered():
    ok, why = prim.remat_supported()
    assert ok, why


def test_done_is_kept_by_the_dce_rule_in_a_jitted_program():
    # Canary for the DCE rule's calling convention (JAX 0.12 added a `live_inputs` argument):
    # the rule must be in use, and a jit whose `done` result nobody reads must keep `done`.
    assert prim.done_kept_by_rule()

    def f(r, t):
        prim.done(r, t[0], 0, t[1])
        return r * 2.0

    args = (jnp.ones((3,), jnp.float32), jnp.array([0, -1], jnp.int32))
    assert "jaxpace_done_cpu" in jax.jit(f).lower(*args).as_text()


# --------------------------------------------------------------------- through jaxpace.Pacer

import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import jaxpace as jp  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def smap(mesh, f, out_specs=None):
    out_specs = P() if out_specs is None else out_specs
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("d"), out_specs=out_specs))


def raw(a):
    return np.asarray(a).tobytes()


@pytest.mark.parametrize("checks", [False, True], ids=["plain", "enable_checks"])
def test_pacer_measures_inside_checkpoint_under_grad_bitwise(mesh, checks):
    x = sharded(mesh, jnp.linspace(-3, 3, 8 * 16, dtype=jnp.float32).reshape(8, 16))

    def grad_fn(red):
        return jax.grad(lambda t: jax.checkpoint(lambda u: jnp.sum(red(jnp.sin(u)) ** 2))(t))

    prev = jax.config.jax_enable_checks
    jax.config.update("jax_enable_checks", checks)
    try:
        pacer = jp.Pacer(granularity="device")
        f = smap(mesh, grad_fn(lambda v: pacer.psum(v, "d", site="remat")), P("d"))
        g = smap(mesh, grad_fn(lambda v: lax.psum(v, "d")), P("d"))
        for _ in range(3):
            assert raw(f(x)) == raw(g(x))
    finally:
        jax.config.update("jax_enable_checks", prev)
    s = pacer.stats()["remat"]
    assert s.measured and s.probe.startswith("native")
    assert s.steps == 3  # steps, not rank-steps (issue 26)
    # once per step and shard: the remat replay is not re-measured
    assert sum(r["type"] == "step" for r in pacer.records()) == 3 * 8
    assert sorted(s.ranks) == list(range(8))


def test_pacer_native_exchange_and_fixed_delay_reach_the_records(mesh):
    x = sharded(mesh, jnp.ones((8, 8), jnp.float32))
    pacer = jp.Pacer(policy=jp.fixed(0.002), granularity="device")
    f = smap(mesh, lambda v: pacer.pmean(v * 2.0, "d", site="fx"))
    want = smap(mesh, lambda v: lax.pmean(v * 2.0, "d"))(x)
    for _ in range(6):
        # All 8 shards' programs (and their done handlers) must have finished before the
        # drain below: reading the replicated result waits for one shard only.
        out = jax.block_until_ready(f(x))
        assert raw(out) == raw(want)
        pacer.stats()  # drains now, so each step's delay is set before the next arrives
    recs = [r for r in pacer.records()[1:] if r["site"] == "fx"]
    assert len(recs) == 6 * 8
    assert all(r["wait_ns"] >= 0 for r in recs)
    # The policy ran on each drained record and set the native delay of the next step.
    assert all((r["delay_ns"] >= 0.0015e9) == (r["step"] > 0) for r in recs)
    s = pacer.stats()["fx"]
    assert s.steps_paced > 0 and s.probe.startswith("native")


def test_pacer_native_adaptive_exchange_sees_every_rank(mesh):
    x = sharded(mesh, jnp.ones((8, 8), jnp.float32))
    pacer = jp.Pacer(policy=jp.adaptive(max_delay_s=0.001), granularity="device")
    f = smap(mesh, lambda v: pacer.psum(v, "d", site="ad"))
    for _ in range(5):
        f(x).block_until_ready()
    s = pacer.stats()["ad"]
    assert s.probe.startswith("native") and s.steps == 5  # steps, not rank-steps
    assert len(s.earliness_mean_s) == 8 and np.isfinite(s.earliness_mean_s).all()


def test_pacer_native_sample_every_records_only_sampled_steps(mesh):
    x = sharded(mesh, jnp.ones((8, 8), jnp.float32))
    pacer = jp.Pacer(sample_every=4)
    f = smap(mesh, lambda v: pacer.psum(v, "d", site="smp"))
    for _ in range(9):
        f(x).block_until_ready()
    steps = sorted(r["step"] for r in pacer.records()[1:])
    assert steps == [0, 4, 8]


def test_pacer_release_ends_a_native_sleep(mesh):
    x = sharded(mesh, jnp.ones((8, 8), jnp.float32))
    pacer = jp.Pacer(policy=jp.fixed(5.0))
    f = smap(mesh, lambda v: pacer.psum(v, "d", site="rel"))
    f(x).block_until_ready()
    pacer.stats()  # drains step 0: step 1 now sleeps 5 s unless released
    threading.Timer(0.3, pacer.release).start()
    f(x).block_until_ready()  # returns once the driver sees the stop (pytest timeout guards)
    recs = [r for r in pacer.records()[1:] if r["site"] == "rel"]
    assert recs[-1]["delay_ns"] < 4e9


def test_pacer_native_dropped_records_are_reported(mesh):
    x = sharded(mesh, jnp.ones((8, 2), jnp.float32))
    pacer = jp.Pacer(capacity=8, granularity="device")  # ring of 64 records

    def body(v):
        def step(c, _):
            return lax.pcast(pacer.psum(c, "d", site="drop") * 0.125, "d", to="varying"), None

        return lax.scan(step, v, None, 50)[0]

    smap(mesh, body, P("d"))(x).block_until_ready()  # 400 records at once
    s = pacer.stats()["drop"]
    site = pacer.sites["drop"]
    counts = nat.counters(site.native[0])
    dropped = counts["dropped"]
    assert s.probe.startswith("native") and f"[{dropped} records dropped" in s.probe
    # Every record pushed was drained into a rank's state or counted as dropped. The ring is
    # shared by the 8 ranks and the drain thread may empty it while the scan runs (a loaded
    # machine), so ranks can hold different counts: sum them, and `steps` is the largest.
    per_rank = [site.ranks[r].steps for r in s.ranks]
    assert counts["pushed"] == 50 * 8
    assert dropped > 0 and sum(per_rank) + dropped == 50 * 8
    assert s.steps == max(per_rank) and len(s.ranks) == 8


def test_custom_clock_or_fault_hook_uses_the_fallback_and_says_why(mesh):
    x = sharded(mesh, jnp.ones((8, 8), jnp.float32))
    pacer = jp.Pacer(clock=lambda: time.perf_counter_ns())
    f = smap(mesh, lambda v: pacer.psum(v, "d", site="clk"))
    f(x).block_until_ready()
    s = pacer.stats()["clk"]
    assert s.measured and s.steps == 1
    assert s.probe.startswith("io_callback probes") and "clock" in s.probe
    assert "callback" in f.lower(x).as_text()


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "env", [{"JAXPACE_NATIVE_LIB": "/nonexistent/libjaxpace.so"}, {"JAXPACE_NATIVE": "0"}]
)
def test_absent_native_library_falls_back_to_io_callback(env):
    """A fresh process whose native library is missing (or disabled) measures with io_callback."""
    code = (
        "import jax; jax.config.update('jax_num_cpu_devices', 8)\n"
        "import jax.numpy as jnp, numpy as np\n"
        "from jax import lax\n"
        "from jax.sharding import NamedSharding, PartitionSpec as P\n"
        "import jaxpace as jp\n"
        "m = jax.make_mesh((8,), ('d',))\n"
        "x = jax.device_put(jnp.arange(64.0).reshape(8, 8), NamedSharding(m, P('d')))\n"
        "p = jp.Pacer(policy=jp.adaptive(max_delay_s=0.001))\n"
        "def sm(f): return jax.jit(jax.shard_map(f, mesh=m, in_specs=P('d'), out_specs=P()))\n"
        "f = sm(lambda v: p.pmean(jnp.sin(v), 'd', site='s'))\n"
        "g = sm(lambda v: lax.pmean(jnp.sin(v), 'd'))\n"
        "same = all(np.asarray(f(x)).tobytes() == np.asarray(g(x)).tobytes() for _ in range(3))\n"
        "s = p.stats()['s']\n"
        "print('SAME', same, 'STEPS', s.steps, 'CALLBACK', 'callback' in f.lower(x).as_text())\n"
        "print('PROBE', s.probe)\n"
    )
    e = dict(os.environ)
    e.pop("XLA_FLAGS", None)
    e.update(env, JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=200, env=e, cwd=REPO
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "SAME True STEPS 3 CALLBACK True" in out.stdout, out.stdout
    probe = next(ln for ln in out.stdout.splitlines() if ln.startswith("PROBE"))
    assert "io_callback probes" in probe
    assert ("failed to load" in probe) if "JAXPACE_NATIVE_LIB" in env else ("disabled" in probe)


@pytest.mark.timeout(120)
def test_sigterm_ends_a_native_sleep_promptly():
    e = dict(os.environ)
    e.pop("XLA_FLAGS", None)
    e["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "scripts" / "native_sigterm.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=e,
        cwd=REPO,
    )
    try:
        for line in proc.stdout:
            if line.startswith("SLEEPING"):
                break
        time.sleep(1.0)  # let the 5 s sleep begin
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    line = next(ln for ln in out.splitlines() if ln.startswith("STEP_S"))
    assert float(line.split()[1]) < 4.0 and "SIGNALS 1" in line and "SUM 2.0" in line, line
    assert "PROBE native" in out, out


def test_adam_train_steps_are_bitwise_lax_in_params_and_optimizer_state(mesh):
    """The whole train step, not just the collective, matches lax bit for bit.

    Regression: tying `done`'s 1.0 into the result (bit-preserving by itself)
    changed how XLA fused the optimizer update of that leaf, so Adam's moments
    differed from lax's in the last bit from the second step on.
    """
    import optax

    import jaxpace as jp

    tx = optax.adam(3e-3)
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((16, 8)).astype(np.float32), "b": np.zeros(1, np.float32)}
    params = jax.device_put(params, NamedSharding(mesh, P()))
    x = sharded(mesh, rng.standard_normal((64, 16)).astype(np.float32))
    y = sharded(mesh, rng.standard_normal((64, 8)).astype(np.float32))

    def loss(p, x, y):
        return jnp.mean((jnp.tanh(x @ p["w"]) + p["b"] - y) ** 2)

    def make(reduce):
        def step(p, o, x, y):
            local = jax.tree.map(lambda a: lax.pcast(a, "d", to="varying"), p)
            lv, g = jax.value_and_grad(loss)(local, x, y)
            g, lv = reduce((g, lv), "d")
            u, o = tx.update(g, o, p)
            return optax.apply_updates(p, u), o, lv

        specs = (P(), P(), P("d"), P("d"))
        return jax.jit(jax.shard_map(step, mesh=mesh, in_specs=specs, out_specs=(P(), P(), P())))

    pacer = jp.Pacer()
    ours, ref = make(lambda t, a: pacer.pmean(t, a, site="adam")), make(lax.pmean)
    o0 = jax.device_put(tx.init(params), NamedSharding(mesh, P()))
    state = {"ours": (params, o0), "ref": (params, o0)}
    for _ in range(4):
        p, o, _ = ours(*state["ours"], x, y)
        state["ours"] = (p, o)
        p, o, _ = ref(*state["ref"], x, y)
        state["ref"] = (p, o)
        for a, b in zip(jax.tree.leaves(state["ours"]), jax.tree.leaves(state["ref"]), strict=True):
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    assert pacer.stats()["adam"].probe.startswith("native")
    assert pacer.stats()["adam"].steps == 4


def test_library_path_prefers_this_interpreters_build(tmp_path, monkeypatch):
    """A checkout built for two Pythons holds two libraries; each loads its own."""
    import sysconfig

    other = tmp_path / "_jaxpace_probe.cpython-299-x86_64-linux-gnu.so"  # sorts first
    own = tmp_path / ("_jaxpace_probe" + sysconfig.get_config_var("EXT_SUFFIX"))
    other.write_bytes(b"")
    monkeypatch.delenv("JAXPACE_NATIVE_LIB", raising=False)
    monkeypatch.setattr(nat, "_HERE", str(tmp_path))
    assert nat.library_path() == str(other)  # only another Python's build: that one
    own.write_bytes(b"")
    assert nat.library_path() == str(own)
