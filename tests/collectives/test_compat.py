"""Drop-in completeness: one table of cases through `jax.lax` and `jaxpace`, compared byte for byte.

Each case is a function of a module-like object `mod` (either `jax.lax` or a
`jaxpace.Pacer`) that builds and runs a program using `mod.psum`/`mod.pmean`.
Both runs must give the same bytes, dtypes, shapes and weak types, or raise the
same error type. Where jaxpace cannot time a call it must say so in `stats()`.
docs/compatibility.md is the table of these contexts.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxpace as jp
from jaxpace.native.probes import available as native_available

pytestmark = pytest.mark.timeout(120)

MESH = jax.make_mesh((8,), ("data",))
DATA, REPL = P("data"), P()
MESH2 = jax.make_mesh((4, 2), ("data", "model"))


def put(x, mesh=MESH, spec=DATA):
    return jax.device_put(x, NamedSharding(mesh, spec))


def smap(f, in_specs=DATA, out_specs=REPL, mesh=MESH, **kw):
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, **kw))


X = np.linspace(-2, 2, 8 * 3, dtype=np.float32).reshape(8, 3)
# The native probes measure inside jax.checkpoint; the io_callback fallback passes it through.
NATIVE = native_available()[0]
REMAT_REASON = None if NATIVE else "checkpoint"
X2 = np.arange(32, dtype=np.float32).reshape(8, 4) / 7


@dataclasses.dataclass(frozen=True)
class Case:
    """One call context. `run(mod)` returns outputs (a pytree of arrays) or raises.

    `measured`: True when jaxpace must time it, False when it must pass the
    call through to lax and say why in `stats()`, None when either is fine
    (e.g. an error case).
    """

    name: str
    run: Callable[[Any], Any]
    measured: bool | None = True
    reason: str | None = None  # substring of `unmeasured_reason`


CASES: list[Case] = []


def case(name, measured=True, reason=None):
    def deco(fn):
        CASES.append(Case(name, fn, measured, reason))
        return fn

    return deco


# --------------------------------------------------------------------- scalars and weak types


@case("psum(1, axis) axis-size idiom", measured=False, reason="constant")
def _(mod):
    return smap(lambda v: (mod.psum(1, "data"), mod.pmean(1, "data")))(put(X))


@case("python floats (weak)", measured=False, reason="constant")
def _(mod):
    return smap(lambda v: (mod.psum(2.0, "data"), mod.pmean(2.0, "data"), mod.psum(True, "data")))(
        put(X)
    )


@case("numpy scalar and array constants", measured=False, reason="constant")
def _(mod):
    return smap(lambda v: (mod.psum(np.float32(1.5), "data"), mod.pmean(np.arange(3), "data")))(
        put(X)
    )


@case("traced weak-typed scalar")
def _(mod):
    return smap(lambda s: (mod.psum(s, "data"), mod.pmean(s * 3, "data")), in_specs=P())(2.0)


@case("traced weak int")
def _(mod):
    return smap(lambda s: (mod.psum(s, "data"), mod.pmean(s, "data")), in_specs=P())(3)


@case("mixed pytree with None and ints")
def _(mod):
    t = {"a": put(X), "b": None, "c": (put(jnp.arange(8, dtype=jnp.int32)),)}
    specs = ({"a": P("data"), "b": None, "c": (P("data"),)},)
    outs = {"a": P(), "b": None, "c": (P(),)}
    return smap(lambda t: (mod.psum(t, "data"), mod.pmean(t, "data")), specs, (outs, outs))(t)


@case("empty pytree", measured=None)
def _(mod):
    return smap(
        lambda v: (mod.psum((), "data"), mod.psum({}, "data"), v.sum()), out_specs=P("data")
    )(put(X))


# --------------------------------------------------------------------- axes


@case("tuple of axis names on a 2-D mesh")
def _(mod):
    def body(v):
        return mod.psum(v, ("data", "model")), mod.pmean(v, ("model", "data")), mod.psum(v, "model")

    return smap(body, P("data", "model"), (P(), P(), P("data")), mesh=MESH2)(
        put(X2, MESH2, P("data", "model"))
    )


@case("axis name given as a list", measured=None)
def _(mod):
    return smap(lambda v: mod.psum(v, ["data"]))(put(X))


@case("empty axis tuple (identity in lax)", measured=None)
def _(mod):
    return smap(lambda v: mod.psum(v, ()), out_specs=P("data"))(put(X))


@case("error: positional (integer) axis inside shard_map", measured=None)
def _(mod):
    return smap(lambda v: mod.psum(v, (0, "data")), out_specs=P("data"))(put(X))


@case("pmap with axis_index_groups")
def _(mod):
    groups = [[0, 1, 2, 3], [4, 5, 6, 7]]
    f = jax.pmap(
        lambda v: (
            mod.psum(v, "i", axis_index_groups=groups),
            mod.pmean(v, "i", axis_index_groups=[[0, 2, 4, 6], [1, 3, 5, 7]]),
        ),
        axis_name="i",
    )
    return f(jnp.asarray(X))


@case("pmap over all 8 local devices (one process)")
def _(mod):
    return jax.pmap(lambda v: mod.pmean(v, "i"), axis_name="i")(jnp.asarray(X))


@case("nested pmap")
def _(mod):
    def inner(v):
        return mod.psum(v, "j"), mod.psum(v, "i"), mod.pmean(v, ("i", "j"))

    f = jax.pmap(jax.pmap(inner, axis_name="j"), axis_name="i")
    return f(jnp.asarray(X2).reshape(2, 4, 4))


@case("vmap(axis_name=...)", measured=False, reason="vmap")
def _(mod):
    return jax.vmap(lambda v: (mod.psum(v, "v"), mod.pmean(v, "v")), axis_name="v")(jnp.asarray(X))


@case("vmap with spmd_axis_name under jit", measured=False, reason="vmap")
def _(mod):
    with jax.set_mesh(MESH):
        f = jax.jit(jax.vmap(lambda v: mod.psum(v, "v"), axis_name="v", spmd_axis_name="data"))
        return f(put(X))


@case("vmap axis inside shard_map, reduced over both", measured=False, reason="vmap")
def _(mod):
    def body(v):
        return jax.vmap(lambda r: mod.psum(r, ("data", "v")), axis_name="v")(v)

    return smap(body, out_specs=P())(put(jnp.asarray(X2).reshape(8, 4)))


@case("nested shard_map (outer data, inner model)")
def _(mod):
    def inner(v):
        return mod.psum(v, "model"), mod.psum(v, ("data", "model"))

    def outer(v):
        return jax.shard_map(
            inner,
            in_specs=P(None, "model"),
            out_specs=(P(None, "model"), P()),
            axis_names={"model"},
        )(v)

    f = smap(outer, P("data"), (P("data"), P()), mesh=MESH2, axis_names={"data"})
    return f(put(X2, MESH2, P("data", "model")))


@case("partial-manual shard_map", measured=False, reason="partial-manual")
def _(mod):
    f = smap(lambda v: mod.psum(v, "data"), mesh=MESH2, axis_names={"data"})
    return f(put(X2, MESH2, P("data", "model")))


# --------------------------------------------------------------------- control flow


@case("inside cond with a traced predicate")
def _(mod):
    def body(v):
        return lax.cond(v.sum() > -1e9, lambda u: mod.psum(u, "data"), lambda u: u * 2, v)

    return smap(body, out_specs=P("data"))(put(X))


@case("inside switch")
def _(mod):
    def body(v):
        i = jnp.int32(1)
        return lax.switch(i, [lambda u: u, lambda u: mod.pmean(u, "data"), lambda u: -u], v)

    return smap(body, out_specs=P("data"))(put(X))


@case("inside while_loop")
def _(mod):
    def body(v):
        def step(c):
            i, u = c
            return i + 1, mod.pmean(u * 1.5, "data")

        return lax.while_loop(lambda c: c[0] < 3, step, (0, v))[1]

    return smap(body, out_specs=P("data"))(put(X))


@case("inside scan and fori_loop")
def _(mod):
    def body(v):
        c, ys = lax.scan(lambda c, _: (mod.psum(c, "data") / 8, c.sum()), v, None, length=3)
        c = lax.fori_loop(0, 2, lambda i, c: mod.pmean(c + i, "data"), c)
        return c, ys

    return smap(body, out_specs=(P("data"), P()))(put(X))


@case("named_call")
def _(mod):
    f = jax.named_call(lambda v: mod.psum(v, "data"), name="my_layer")
    return smap(f)(put(X))


@case("inside a custom_jvp function and its rule", measured=None, reason="tangent")
def _(mod):
    @jax.custom_jvp
    def g(v):
        return mod.psum(jnp.sin(v), "data")

    @g.defjvp
    def g_jvp(primals, tangents):
        (v,), (t,) = primals, tangents
        return g(v), mod.psum(jnp.cos(v) * t, "data")

    def body(v):
        return g(v), jax.grad(lambda u: g(u).sum())(v)

    return smap(body, out_specs=(P(), P("data")))(put(X))


@case("inside custom_vjp fwd and bwd")
def _(mod):
    @jax.custom_vjp
    def g(v):
        return mod.psum(v * v, "data")

    def fwd(v):
        return mod.psum(v * v, "data"), v

    def bwd(v, ct):
        return (mod.pmean(2 * v * ct, "data"),)

    g.defvjp(fwd, bwd)

    def body(v):
        return g(v), jax.grad(lambda u: g(u).sum())(v)

    return smap(body, out_specs=(P(), P("data")))(put(X))


@case("jax.checkpoint, forward only", measured=NATIVE, reason=REMAT_REASON)
def _(mod):
    return smap(jax.checkpoint(lambda v: mod.psum(jnp.sin(v), "data")))(put(X))


@case("jax.checkpoint under grad", measured=NATIVE, reason=REMAT_REASON)
def _(mod):
    def loss(v):
        return jnp.sum(jax.checkpoint(lambda u: mod.psum(jnp.sin(u), "data"))(v) ** 2)

    return smap(jax.value_and_grad(loss), out_specs=(P(), P("data")))(put(X))


@case("jax.checkpoint with a policy, under grad, inside scan", measured=NATIVE, reason=REMAT_REASON)
def _(mod):
    pol = jax.checkpoint_policies.dots_with_no_batch_dims_saveable

    def layer(c, _):
        return jax.checkpoint(lambda u: mod.pmean(jnp.tanh(u) * 1.1, "data"), policy=pol)(c), None

    def loss(v):
        return jnp.sum(lax.scan(layer, v, None, length=2)[0] ** 2)

    return smap(jax.grad(loss), out_specs=P("data"))(put(X))


# --------------------------------------------------------------------- transformations


@case("vmap over a batch dim inside shard_map")
def _(mod):
    return smap(jax.vmap(lambda r: mod.psum(r, "data")), out_specs=P())(
        put(jnp.asarray(X2).reshape(8, 2, 2))
    )


@case("grad and value_and_grad(has_aux)")
def _(mod):
    def loss(v):
        y = mod.pmean(jnp.tanh(v) ** 2, "data")
        return y.sum(), y

    def body(v):
        return jax.value_and_grad(loss, has_aux=True)(v), jax.grad(lambda u: loss(u)[0])(v)

    return smap(body, out_specs=(((P(), P()), P("data")), P("data")))(put(X))


@case("jvp, vjp, linearize")
def _(mod):
    def f(v):
        return mod.psum(jnp.exp(v / 4), "data")

    def body(v):
        _, t = jax.jvp(f, (v,), (jnp.ones_like(v),))
        y, pull = jax.vjp(f, v)
        (ct,) = pull(jnp.ones_like(y))
        y2, lin = jax.linearize(f, v)
        return t, y, ct, y2, lin(v)

    return smap(body, out_specs=(P(), P(), P("data"), P(), P()))(put(X))


@case("hessian and jacfwd/jacrev")
def _(mod):
    def body(v):
        h = jax.hessian(lambda u: jnp.sum(mod.pmean(u**3, "data")))(v[0])
        jf = jax.jacfwd(lambda u: mod.psum(jnp.sin(u), "data"))(v[0])
        jr = jax.jacrev(lambda u: mod.psum(jnp.sin(u), "data"))(v[0])
        return h, jf, jr

    return smap(body, out_specs=(P("data"), P("data"), P("data")))(put(X))


@case("jax.eval_shape", measured=None)
def _(mod):
    f = jax.shard_map(
        lambda v: (mod.psum(v, "data"), mod.pmean(1, "data")),
        mesh=MESH,
        in_specs=P("data"),
        out_specs=P(),
    )
    out = jax.eval_shape(f, jax.ShapeDtypeStruct((8, 3), jnp.float32))
    return [np.zeros(o.shape, o.dtype) for o in out], [o.weak_type for o in out]


@case("jax.make_jaxpr", measured=None)
def _(mod):
    f = jax.shard_map(lambda v: mod.psum(v, "data"), mesh=MESH, in_specs=P("data"), out_specs=P())
    j = jax.make_jaxpr(f)(jnp.zeros((8, 3)))
    return [np.zeros(v.aval.shape, v.aval.dtype) for v in j.jaxpr.outvars]


@case(".lower() without running", measured=None)
def _(mod):
    f = smap(lambda v: mod.pmean(v, "data"))
    lowered = f.lower(jax.ShapeDtypeStruct((8, 3), jnp.float32))
    text = lowered.as_text()
    return np.asarray(["all_reduce" in text or "all-reduce" in text])


@case("donate_argnums")
def _(mod):
    f = jax.jit(
        jax.shard_map(
            lambda v: mod.psum(v, "data") + v, mesh=MESH, in_specs=P("data"), out_specs=P("data")
        ),
        donate_argnums=0,
    )
    return f(put(X))


# --------------------------------------------------------------------- errors (lax raises → we raise)


@case("error: unbound axis inside shard_map", measured=None)
def _(mod):
    return smap(lambda v: mod.psum(v, "dta"))(put(X))


@case("error: no axis bound at all (global-view jit)", measured=None)
def _(mod):
    return jax.jit(lambda v: mod.psum(v, "data"))(jnp.asarray(X))


@case("error: eager call outside any mapping", measured=None)
def _(mod):
    return mod.pmean(jnp.asarray(X), "data")


@case("error: axis_index_groups inside shard_map", measured=None)
def _(mod):
    return smap(lambda v: mod.psum(v, "data", axis_index_groups=[[0, 1, 2, 3], [4, 5, 6, 7]]))(
        put(X)
    )


@case("error: uneven axis_index_groups in pmap", measured=None)
def _(mod):
    return jax.pmap(
        lambda v: mod.psum(v, "i", axis_index_groups=[[0, 1, 2], [3, 4, 5, 6, 7]]), axis_name="i"
    )(jnp.asarray(X))


@case("error: string operand", measured=None)
def _(mod):
    return smap(lambda v: mod.psum("abc", "data"))(put(X))


@case("error: object operand", measured=None)
def _(mod):
    return smap(lambda v: mod.psum(object(), "data"))(put(X))


@case("error: axis name of an unhashable type", measured=None)
def _(mod):
    return smap(lambda v: mod.psum(v, {"data": 1}))(put(X))


@case("error: psum of a shard_map-varying value with out_specs=P() missing", measured=None)
def _(mod):
    return smap(lambda v: mod.psum(v, "data") + v)(put(X))


# --------------------------------------------------------------------- the comparison


def _flatten_out(out):
    return jax.tree.leaves(out, is_leaf=lambda x: x is None)


def _describe(x):
    a = np.asarray(x)
    weak = getattr(x, "weak_type", None)
    if weak is None and isinstance(x, (int, float, bool, complex)):
        weak = True
    return a.dtype, a.shape, weak, a.reshape(-1).view(np.uint8).tobytes()


def _run(fn, mod):
    try:
        return fn(mod), None
    except Exception as e:  # noqa: BLE001 - compared below
        return None, e


def _compare(c: Case, pacer) -> None:
    ref, ref_err = _run(c.run, lax)
    ours, our_err = _run(c.run, pacer)
    if ref_err is not None:
        assert our_err is not None, f"lax raised {ref_err!r} but jaxpace did not"
        assert isinstance(our_err, type(ref_err)), (
            f"lax raised {type(ref_err).__name__}: {ref_err}\n"
            f"jaxpace raised {type(our_err).__name__}: {our_err}"
        )
        # At least as clear: never an empty message (lax's sometimes is).
        assert str(our_err).strip(), f"jaxpace's {type(our_err).__name__} has no message"
        return ref_err
    if our_err is not None:
        raise our_err
    la, lb = _flatten_out(ours), _flatten_out(ref)
    assert len(la) == len(lb)
    for a, b in zip(la, lb, strict=True):
        assert (a is None) == (b is None)
        if a is None:
            continue
        da, db = _describe(a), _describe(b)
        assert da[:3] == db[:3], f"dtype/shape/weak_type differ: {da[:3]} vs {db[:3]}"
        assert da[3] == db[3], f"bytes differ:\n{np.asarray(a)}\n{np.asarray(b)}"
    return None


@pytest.mark.parametrize("c", CASES, ids=[c.name for c in CASES])
def test_same_as_lax(c):
    _check_measured_as_declared(c, jp.Pacer(granularity="device"))


def _check_measured_as_declared(c, pacer):
    """Runs case `c` on `pacer` and checks `stats()` says measured / passed through as declared."""
    err = _compare(c, pacer)
    if err is not None:
        return  # lax rejects this call in this JAX version; so did we (same type)
    stats = pacer.stats()
    if c.measured is True:
        assert stats and all(s.measured for s in stats.values()), stats
    elif c.measured is False:
        assert stats and not any(s.measured for s in stats.values()), stats
    assert all(s.errors == 0 for s in stats.values())
    for s in stats.values():
        if not s.measured and c.reason is not None:
            assert c.reason in s.unmeasured_reason, s.unmeasured_reason


SAMPLE = ("pmap", "nested", "tuple", "hessian", "inside custom", "jax.checkpoint under", "error")


@pytest.mark.parametrize(
    "c",
    [c for c in CASES if c.name.startswith(SAMPLE)],
    ids=[c.name for c in CASES if c.name.startswith(SAMPLE)],
)
def test_same_as_lax_default_granularity(c):
    """A sample of the table again under the default once-per-process granularity."""
    _check_measured_as_declared(c, jp.Pacer())


# --------------------------------------------------------------------- signatures


@pytest.mark.parametrize("name", ["psum", "pmean"])
@pytest.mark.parametrize(
    "ours_of", [lambda n: getattr(jp, n), lambda n: getattr(jp.Pacer(), n)], ids=["module", "Pacer"]
)
def test_signature_accepts_everything_lax_does(name, ours_of):
    theirs = inspect.signature(getattr(lax, name))
    ours = inspect.signature(ours_of(name))
    for pname, p in theirs.parameters.items():
        assert pname in ours.parameters, pname
        q = ours.parameters[pname]
        assert q.kind == p.kind, (pname, q.kind, p.kind)
        assert q.default == p.default, (pname, q.default, p.default)
    # Anything extra is keyword-only with a default, so no lax call can bind to it.
    for pname, q in ours.parameters.items():
        if pname not in theirs.parameters:
            assert q.kind is inspect.Parameter.KEYWORD_ONLY and q.default is not q.empty, pname
    # Keyword call forms lax accepts.
    x = jnp.arange(3.0)
    f = jax.vmap(lambda v: ours_of(name)(x=v, axis_name="v", axis_index_groups=None), axis_name="v")
    g = jax.vmap(
        lambda v: getattr(lax, name)(x=v, axis_name="v", axis_index_groups=None), axis_name="v"
    )
    assert np.asarray(f(x)).tobytes() == np.asarray(g(x)).tobytes()
