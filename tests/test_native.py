"""Native probes (jaxpace/_native): effect-free primitives lowered to XLA FFI handlers.

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

from jaxpace import _native as nat
from jaxpace._native import primitive as prim

OK, WHY = nat.available()
pytestmark = pytest.mark.skipif(not OK, reason=f"native probes unavailable: {WHY}")

_next_site = [100]


def new_site(num_slots=8, **kw):
    """A fresh native site id, registered."""
    sid = _next_site[0]
    _next_site[0] += 1
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


def all_records(sid, payload_len=0):
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
        got, want = f(tree), ref(tree)
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
    got = f(x)
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
        _, red = g(x)
    recs, pays = all_records(sid, payload_len=6)
    assert recs["rank"].tolist() == [1, 1, 1]
    # Slot 1 carries the previous step's wait (seconds) and presence; slot 0 nothing.
    red = np.asarray(red)
    assert red[0] == 0.0 and red[2] == 0.0 and red[3] == 1.0
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
    _, red0 = f(x)
    assert not np.asarray(red0).any()  # step 0: no previous wait anywhere
    _, red1 = f(x)
    recs, _ = all_records(sid, 24)
    step0 = recs[recs["step"] == 0]
    waits = np.zeros(8, np.float32)
    waits[step0["rank"]] = (step0["wait_ns"] * 1e-9).astype(np.float32)
    red1 = np.asarray(red1)
    np.testing.assert_array_equal(red1[:8], waits)
    np.testing.assert_array_equal(red1[8:16], np.ones(8, np.float32))


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
