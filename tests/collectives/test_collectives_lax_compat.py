"""The lax-compatibility table of the drop-ins beyond psum/pmean.

For `jaxpace.all_gather`, `psum_scatter`, `ppermute`, `all_to_all`, `pmax` and `pmin`:
dtypes (float32, bfloat16, int32), tiled and untiled, several axes, `axis_index_groups`
(under `pmap`, where lax has them), pytrees and gradients, under `jit`/`shard_map`/`pmap`/
`grad`/`checkpoint`/`scan`/`vmap`/`jax_enable_checks`: the bytes of every output and
gradient equal lax's, the compiled program holds the same collectives, and the call was
measured by the native probes (the arrive probe is in the program).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hlo_graph import check_bracketed, count_collectives
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxpace as jp
from jaxpace.native import probes as _native

AX = ("a", "b")  # a 2 x 4 mesh; the calls below reduce over one axis or both
PERM8 = [(i, (i + 3) % 8) for i in range(8)]
PERM4 = [(i, (i + 1) % 4) for i in range(4)]

# id -> (f(m, tree), dtypes it takes, differentiable)
TABLE = {
    "all_gather-both-untiled": (lambda m, t: m.all_gather(t, AX), "fbi", True),
    "all_gather-b-tiled-axis1": (
        lambda m, t: m.all_gather(t, "b", axis=1, tiled=True),
        "fbi",
        True,
    ),
    "all_gather-a-axis2": (lambda m, t: m.all_gather(t, "a", axis=2), "fbi", True),
    "psum_scatter-both-untiled": (lambda m, t: m.psum_scatter(t, AX), "fbi", True),
    "psum_scatter-b-tiled-dim1": (
        lambda m, t: m.psum_scatter(t, "b", scatter_dimension=1, tiled=True),
        "fbi",
        True,
    ),
    "ppermute-both": (lambda m, t: m.ppermute(t, AX, PERM8), "fbi", True),
    "ppermute-b-partial": (lambda m, t: m.ppermute(t, "b", [(0, 1), (2, 3)]), "fbi", True),
    "all_to_all-both-untiled": (lambda m, t: m.all_to_all(t, AX, 0, 1), "fbi", True),
    "all_to_all-b-tiled": (lambda m, t: m.all_to_all(t, "b", 1, 0, tiled=True), "fbi", True),
    "pmax-both": (lambda m, t: m.pmax(t, AX), "fbi", False),
    "pmin-a": (lambda m, t: m.pmin(t, "a"), "fbi", False),
}
DTYPES = {"f": jnp.float32, "b": jnp.bfloat16, "i": jnp.int32}


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 4), AX, devices=jax.devices()[:8])


@pytest.fixture(scope="module")
def pacer(mesh):
    p = jp.Pacer(jp.no_pacing(), granularity="device", mesh=mesh)
    yield p
    p.close()


def _operand(dtype, mesh):
    """A global (64, 8, 8) array: per shard (8, 8, 8), with -0.0, NaN and ±inf for floats."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 8, 8)).astype(np.float32) * 100
    if np.issubdtype(np.dtype(dtype), np.floating) or dtype == jnp.bfloat16:
        x[0, 0, 0], x[1, 1, 1], x[2, 2, 2], x[3, 3, 3] = -0.0, np.nan, np.inf, -np.inf
    return jax.device_put(jnp.asarray(x).astype(dtype), NamedSharding(mesh, P(AX)))


def _smap(fn, mesh):
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P(AX), out_specs=P(AX), check_vma=False))


def _bytes(tree):
    return [np.asarray(a).view(np.uint8).tobytes() for a in jax.tree.leaves(tree)]


def _assert_same(ours, plain):
    assert jax.tree.structure(ours) == jax.tree.structure(plain)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(plain), strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
    assert _bytes(ours) == _bytes(plain)


def _cases():
    for cid, (_, dtypes, _) in TABLE.items():
        for d in dtypes:
            yield pytest.param(cid, d, id=f"{cid}-{d}")


@pytest.mark.parametrize(("cid", "dt"), list(_cases()))
def test_values_and_hlo_match_lax(mesh, pacer, cid, dt):
    call = TABLE[cid][0]
    x = _operand(DTYPES[dt], mesh)
    with jax.set_mesh(mesh):
        f_lax, f_jp = _smap(lambda v: call(lax, v), mesh), _smap(lambda v: call(pacer, v), mesh)
        _assert_same(f_jp(x), f_lax(x))
        ours = f_jp.lower(x).compile().as_text()
        plain = f_lax.lower(x).compile().as_text()
    if _native.available()[0]:
        assert "jaxpace_arrive_cpu" in ours, "not measured by the native probes"
    assert count_collectives(ours) == count_collectives(plain)
    assert sum(count_collectives(plain).values()) >= 1


@pytest.mark.parametrize("cid", [c for c, (_, _, d) in TABLE.items() if d])
def test_gradients_match_lax_bitwise(mesh, pacer, cid):
    call = TABLE[cid][0]
    x = _operand(jnp.float32, mesh)
    x = jnp.where(jnp.isfinite(x), x, 1.5)

    def loss(m, remat):
        f = _smap(lambda v: call(m, v), mesh)
        g = jax.checkpoint(f) if remat else f
        return lambda v: jnp.sum(jnp.sin(g(v)) * 3.0)

    with jax.set_mesh(mesh):
        for remat in (False, True):
            ours, plain = (
                _outcome(jax.grad(loss(pacer, remat)), x),
                _outcome(jax.grad(loss(lax, remat)), x),
            )
            assert ours[0] == plain[0], (remat, ours, plain)
            if plain[0] == "ok":
                _assert_same(ours[1], plain[1])
            else:  # lax's own error (untiled all_to_all with split != concat, jax 0.10.2)
                assert ours[1] is plain[1]


def _outcome(f, *args):
    try:
        return "ok", f(*args)
    except Exception as e:  # noqa: BLE001 - compared with lax's own outcome
        return "raised", type(e)


@pytest.mark.parametrize("cid", ["pmax-both", "pmin-a"])
def test_pmax_pmin_gradients_fail_as_in_lax(mesh, pacer, cid):
    call = TABLE[cid][0]
    x = _operand(jnp.float32, mesh)
    errors = []
    with jax.set_mesh(mesh):
        for m in (lax, pacer):
            with pytest.raises(Exception) as e:  # noqa: PT011 - the type lax raises
                jax.grad(lambda v, m=m: jnp.sum(_smap(lambda u: call(m, u), mesh)(v)))(x)
            errors.append(type(e.value))
    assert errors[0] is errors[1]


def test_pytrees_scan_vmap_and_enable_checks(mesh, pacer):
    """A mixed pytree through each drop-in, inside `scan`, under an inner `vmap`, with checks."""
    x = _operand(jnp.float32, mesh)

    def body(m, v):
        tree = {"f": v, "h": v.astype(jnp.bfloat16), "k": v[0].astype(jnp.int32)}

        def step(c, _):
            g = m.all_gather(tree, "b", axis=0, tiled=True)
            s = m.psum_scatter(g["f"], "b", scatter_dimension=0, tiled=True)
            r = m.ppermute(c, "a", [(0, 1), (1, 0)])
            a = m.all_to_all(tree["h"], "b", 1, 1, tiled=True)
            mx = m.pmax(tree, AX)
            mn = m.pmin(tree["k"], "a")
            return r + s, (g, a, mx, mn)

        carry, ys = lax.scan(step, v, None, length=2)
        batched = jax.vmap(lambda u: m.all_gather(u, "b", axis=0, tiled=True))(v)
        batched2 = jax.vmap(lambda u: m.all_to_all(u, "b", 0, 1, tiled=True), in_axes=1)(v)
        return carry, ys, batched, batched2

    def run(m):
        f = jax.jit(
            jax.shard_map(
                lambda v: body(m, v), mesh=mesh, in_specs=P(AX), out_specs=P(AX), check_vma=False
            )
        )
        return f(x), f.lower(x).compile().as_text()

    with jax.set_mesh(mesh), jax.enable_checks(True):
        (ours, t_ours), (plain, t_plain) = run(pacer), run(lax)
    _assert_same(ours, plain)
    assert count_collectives(t_ours) == count_collectives(t_plain)
    if _native.available()[0]:  # inside the scan's loop body too
        seen, problems = check_bracketed(t_ours, "jaxpace_arrive_cpu", "jaxpace_done_cpu")
        assert seen >= 8 and not problems, problems


def test_pmap_with_axis_index_groups(pacer):
    """Under `pmap`, with `axis_index_groups` where lax has them."""
    groups = [[0, 1, 2, 3], [4, 5, 6, 7]]
    x = jnp.arange(8 * 4 * 4, dtype=jnp.float32).reshape(8, 4, 4) - 50.25
    calls = {
        "all_gather": lambda m, v, k: m.all_gather(
            v, "i", axis_index_groups=groups, tiled=True, **k
        ),
        "psum_scatter": lambda m, v, k: m.psum_scatter(v, "i", axis_index_groups=groups, **k),
        "pmax": lambda m, v, k: m.pmax(v, "i", axis_index_groups=groups, **k),
        "pmin": lambda m, v, k: m.pmin(v, "i", axis_index_groups=groups, **k),
        "ppermute": lambda m, v, k: m.ppermute(v, "i", PERM8, **k),
        "all_to_all": lambda m, v, k: m.all_to_all(v, "i", 0, 0, axis_index_groups=groups, **k),
    }
    for name, call in calls.items():
        outs = []
        for m, k in ((lax, {}), (pacer, {"site": f"pmap-{name}"})):
            try:
                f = jax.pmap(lambda v, m=m, k=k, c=call: c(m, v, k), axis_name="i")
                outs.append(("ok", f(x)))
            except Exception as e:  # noqa: BLE001 - compared with lax's own outcome
                outs.append(("raised", type(e)))
        assert outs[0][0] == outs[1][0], (name, outs)
        if outs[0][0] == "ok":
            _assert_same(outs[1][1], outs[0][1])
            st = pacer.stats()[f"pmap-{name}"]
            assert st.measured and st.steps > 0, (name, st)
        else:
            assert outs[0][1] is outs[1][1], name


def test_stats_say_measure_only(mesh):
    """`stats()` says, per site, that these collectives are measured but never paced."""
    pacer = jp.Pacer(jp.adaptive(), granularity="device", mesh=mesh)
    try:
        x = _operand(jnp.float32, mesh)
        with jax.set_mesh(mesh):
            _smap(lambda v: pacer.all_gather(v, "b", site="ag"), mesh)(x).block_until_ready()
            _smap(lambda v: pacer.psum(v, AX, site="ps"), mesh)(x).block_until_ready()
            _smap(lambda v: pacer.psum(v, "b", site="ps-b"), mesh)(x).block_until_ready()
        st = pacer.stats()
        assert st["ag"].measured and st["ag"].steps > 0
        assert st["ag"].pacing.startswith("measure only")
        assert st["ps"].pacing.startswith("paced")
        # Over "b" alone the psum runs as 2 groups: paced within each group.
        assert st["ps-b"].measured and st["ps-b"].pacing.startswith("paced")
        assert "2 groups" in st["ps-b"].layout
    finally:
        pacer.close()


def test_module_level_dropins_are_lax_signatures():
    import inspect

    for name in ("all_gather", "psum_scatter", "ppermute", "all_to_all", "pmax", "pmin"):
        ours = inspect.signature(getattr(jp, name)).parameters
        theirs = inspect.signature(getattr(lax, name)).parameters
        assert list(ours)[: len(theirs)] == list(theirs), name
        for p in theirs.values():
            assert ours[p.name].kind == p.kind and ours[p.name].default == p.default, (name, p)
        assert list(ours)[len(theirs) :] == ["site"], name


def test_ppermute_takes_a_one_shot_iterator_as_lax_does(pacer):
    """JAX's pmap_test passes `zip(...)` as `perm`; it is read more than once here."""
    n = 8
    perm = [n - 1, *range(n - 1)]
    x = jnp.arange(n, dtype=jnp.float32)
    ours = jax.pmap(lambda v: pacer.ppermute(v, "i", zip(perm, range(n), strict=True)), "i")(x)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(perm, np.float32))
    try:
        plain = jax.pmap(lambda v: lax.ppermute(v, "i", zip(perm, range(n), strict=True)), "i")(x)
    except TypeError as e:  # jax >= 0.11 wants a list or tuple; jaxpace takes any iterable
        assert "list or a tuple" in str(e), e  # (docs/compatibility.md)
        plain = jax.pmap(
            lambda v: lax.ppermute(v, "i", list(zip(perm, range(n), strict=True))), "i"
        )(x)
    _assert_same(ours, plain)


def test_io_callback_probes_measure_the_new_dropins_bitwise(mesh):
    """The fallback probes (forced by a custom clock) time every new drop-in, bits unchanged."""
    import time

    pacer = jp.Pacer(granularity="device", mesh=mesh, clock=lambda: time.perf_counter_ns())
    try:
        x = _operand(jnp.float32, mesh)
        with jax.set_mesh(mesh):
            for cid in ("all_gather-b-tiled-axis1", "psum_scatter-both-untiled", "ppermute-both",
                        "all_to_all-b-tiled", "pmax-both"):  # fmt: skip
                call = TABLE[cid][0]
                ours = _smap(lambda v, c=call: c(pacer, v), mesh)(x)
                _assert_same(ours, _smap(lambda v, c=call: c(lax, v), mesh)(x))
        st = pacer.stats()
        assert len(st) == 5
        for s in st.values():
            assert s.measured and s.steps > 0 and s.probe.startswith("io_callback"), s
            assert s.pacing.startswith("measure only")
    finally:
        pacer.close()


def test_sampling_records_and_sinks_cover_the_new_dropins(mesh):
    """`sample_every`, records and sinks work at an all_gather site as at a psum site."""
    got = []
    pacer = jp.Pacer(granularity="device", mesh=mesh, sample_every=2, sinks=[got.append])
    try:
        x = _operand(jnp.float32, mesh)
        f = _smap(lambda v: pacer.all_gather(v, AX, axis=1, tiled=True, site="ag"), mesh)
        with jax.set_mesh(mesh):
            for _ in range(4):
                f(x).block_until_ready()
        st = pacer.stats()["ag"]
        assert st.ranks == list(range(8))
        assert st.steps == 2, st  # steps 0 and 2 of 4 (`steps` counts steps, not rank-steps)
        rank_steps = st.steps * 8  # on each of the 8 ranks
        pacer.flush()
        assert {s["site"] for s in got} == {"ag"} and len(got) == rank_steps
        recs = pacer.records()
        layout = recs[0]["sites"]["ag"]  # beside what changes the numbers' meaning (probe...)
        assert {k: layout[k] for k in ("kind", "groups")} == {
            "kind": "all_gather",
            "groups": [list(range(8))],
        }
        assert sum(1 for r in recs if r["type"] == "step") == rank_steps
    finally:
        pacer.close()


def test_remat_saves_the_residuals_lax_saves():
    """JAX's shard_map_test `test_collectives_not_saved`: the leader choice adds no residual."""
    from functools import partial

    from jax._src.ad_checkpoint import saved_residuals

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("x",))
    out = []
    for m in (lax, jp):

        @jax.remat
        @partial(jax.shard_map, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
        def f(x, m=m):
            return m.all_gather(x, "x") * m.all_gather(x, "x")

        out.append(saved_residuals(f, jnp.ones(4)))
    assert out[0] == out[1] and len(out[1]) == 1, out
