"""JAX primitives for the native probes: no JAX effect, lowered to side-effecting FFI calls.

`arrive` and `done` are custom primitives without any JAX effect, so a jitted function that
uses them keeps jit's C++ fast dispatch and works under `jax.checkpoint` + `jax.grad` and under
`jax_enable_checks` (where `io_callback`'s IOEffect fails). They lower to XLA custom calls with
`has_side_effect=True`, so XLA neither removes nor merges nor hoists them. JAX itself would drop
an unused result of an effect-free primitive: `arrive`'s outputs are tied into the collective's
operands (the operands keep their bits: `native_collective`), and `done` is
kept by a dead-code-elimination rule that always keeps it. `done`'s result is *not* tied into the
collective's result: a tie there, though bit-preserving itself, changes how XLA fuses and
simplifies the consumers (e.g. an optimizer update), which changed a train step's parameters in
the last bit. Only if the keep rule is unavailable is `done`'s 1.0 tied into the result.

JAX-internal access, all in `_register_jax_rules`: one partial-eval rule (remat) that treats
the probes' outputs as saved residuals, so a checkpointed function's recomputation under grad
reuses them instead of running the probes a second time (one record per step, no duplicates),
and one DCE rule that keeps `done` although nothing reads its result.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, mlir
from jax.sharding import PartitionSpec

from jaxpace import _jax_compat
from jaxpace.collectives.tie import WHOLE_LEAF_BYTES, leaf_bytes, reduction_typed, tie

hlo = _jax_compat.hlo_dialect()

__all__ = ["arrive", "arrive_p", "done", "done_p", "native_collective", "register_targets"]

_TARGETS = {
    "cpu": ("jaxpace_arrive_cpu", "jaxpace_done_cpu", "JaxpaceArriveCpu", "JaxpaceDoneCpu"),
    "cuda": ("jaxpace_arrive_cuda", "jaxpace_done_cuda", "JaxpaceArriveCuda", "JaxpaceDoneCuda"),
}
_registered: dict[str, tuple[bool, str]] = {}
_reg_lock = threading.Lock()
_REMAT_RULE: dict = {"ok": None, "why": ""}
_KEEP_DONE: dict = {"ok": False}


# ---------------------------------------------------------------------- avals


def _like(aval, shape, dtype):
    """An aval of `shape`/`dtype` with `aval`'s varying manual axes (shard_map's vma rules)."""
    kw = {}
    sharding = getattr(aval, "sharding", None)
    if sharding is not None and hasattr(sharding, "update"):
        kw["sharding"] = sharding.update(spec=PartitionSpec(*([None] * len(shape))))
    return aval.update(shape=tuple(shape), dtype=np.dtype(dtype), weak_type=False, **kw)


# ---------------------------------------------------------------------- arrive

arrive_p = Primitive("jaxpace_arrive")
arrive_p.multiple_results = True


def _invariant_scalar(aval, dtype):
    """A scalar aval of `dtype` that varies along no manual axis (a constant's type)."""
    sharding = getattr(aval, "sharding", None)
    kw = {}
    if sharding is not None and hasattr(sharding, "update"):
        kw["sharding"] = sharding.update(spec=PartitionSpec())
    return jax.core.ShapedArray((), np.dtype(dtype), weak_type=False, **kw)


def _vma(avals) -> frozenset:
    """The union of `avals`' varying manual axes (shard_map's vma; empty outside it)."""
    return frozenset().union(*(getattr(a, "vma", frozenset()) for a in avals))


def _with_vma(aval, vma):
    return aval.update(vma=vma) if hasattr(aval, "vma") else aval


def _arrive_abstract(rank, *deps, site, payload_size, n_alias=0, n_through=0):
    del site
    # The payload varies along every axis that the rank or an operand leaf varies along.
    # The step tag is typed as invariant: it only feeds `step_tag < 0`, which is False on
    # every shard, into each leaf's tie; typed as varying, a tie would make a leaf that is
    # invariant along some axis (a replicated loss under `pmean`) vary along it.
    # The last `n_alias + n_through` deps come back as outputs: the first `n_alias` in their
    # own buffers (aliased), the others tied to the probe (`_arrive_lowering`).
    payload = _with_vma(_like(rank, (payload_size,), np.float32), _vma((rank, *deps)))
    n_out = n_alias + n_through
    tied = list(deps[len(deps) - n_out :]) if n_out else []
    return [_invariant_scalar(rank, np.int32), payload, *tied]


def _arrive_impl(rank, *deps, **params):
    return jax.jit(lambda r, *d: arrive_p.bind(r, *d, **params))(rank, *deps)


def _zero_tangent(x):
    return ad.Zero(jax.typeof(x).to_tangent_aval())


def _arrive_jvp(primals, tangents, **params):
    # The leaves that come back (`n_through`) are the operands' bits: their tangents pass
    # through; the step tag, the payload and the first elements (gradient-free) have none.
    outs = arrive_p.bind(*primals, **params)
    n = params.get("n_through", 0)
    zeros = [_zero_tangent(o) for o in outs[: len(outs) - n]]
    return outs, [*zeros, *(tangents[len(tangents) - n :] if n else [])]


arrive_p.def_abstract_eval(_arrive_abstract)
arrive_p.def_impl(_arrive_impl)
ad.primitive_jvps[arrive_p] = _arrive_jvp

# ---------------------------------------------------------------------- done

done_p = Primitive("jaxpace_done")


def _done_abstract(reduced, tag, rank, *deps, site, layouts=()):
    del tag, site, layouts
    # A constant 1.0 on every shard: it varies exactly as the collective's outputs (and the
    # reduced payload) do, so tying it into the collective's (invariant) result keeps that
    # result invariant.
    return _with_vma(_like(rank, (), np.float32), _vma((reduced, *deps)))


def _done_impl(reduced, tag, rank, *deps, site, layouts=()):
    return jax.jit(lambda *a: done_p.bind(*a, site=site, layouts=layouts))(
        reduced, tag, rank, *deps
    )


def _done_jvp(primals, tangents, *, site, layouts=()):
    del tangents
    out = done_p.bind(*primals, site=site, layouts=layouts)
    return out, _zero_tangent(out)


done_p.def_abstract_eval(_done_abstract)
done_p.def_impl(_done_impl)
ad.primitive_jvps[done_p] = _done_jvp


# ---------------------------------------------------------------------- lowering / registration


def _lowering(target, layout_hints: bool = False):
    def lower(ctx, *args, site, n_alias=0, layouts=(), n_after=0, copies=None):
        # Arrive's `n_alias` operands before its last `n_after` are its outputs 2, 3, ...: the
        # same buffers, which the handler never touches, so each comes back with its bits.
        first = len(args) - n_alias - n_after
        aliases = {first + i: 2 + i for i in range(n_alias)}
        kw = {"operand_output_aliases": aliases} if aliases else {}
        if layout_hints and layouts:
            # Done's last operands in the layout XLA gives the collective's results (the
            # handler never reads them): no row-major copy of a result for the probe.
            kw["operand_layouts"] = [None] * (len(args) - len(layouts)) + list(layouts)
        attrs = {} if copies is None else {"copies": np.int64(copies)}
        return jax.ffi.ffi_lowering(target, has_side_effect=True, **kw)(
            ctx, *args, site=np.int64(site), **attrs
        )

    return lower


def _select_tie(tag, value, aval):
    """`value`, bit for bit, selected through `tag < 0` (never true), as `_tie.tie` selects a
    small leaf: XLA cannot fold it (the tag comes from the probe) and fuses it into the leaf's
    producer where it can."""
    never = hlo.compare(
        tag,
        mlir.ir_constant(np.int32(0)),
        hlo.ComparisonDirectionAttr.get("LT"),
        compare_type=hlo.ComparisonTypeAttr.get("SIGNED"),
    )
    zero = mlir.ir_constant(np.zeros((), aval.dtype))
    if aval.shape:
        i1 = mlir.ir.IntegerType.get_signless(1)
        bool_type = mlir.ir.RankedTensorType.get(aval.shape, i1)
        never = hlo.broadcast_in_dim(bool_type, never, mlir.dense_int_array([]))
        zero = hlo.broadcast_in_dim(value.type, zero, mlir.dense_int_array([]))
    return hlo.select(never, zero, value)


def _arrive_lowering(target, copies: bool):
    """Arrive's lowering. Its last `n_through` operands (small leaves) come back as its last
    results, each made to depend on the probe. On CPU the handler copies them itself
    (`copies`): one memcpy of a few KiB in a call that runs anyway, where a tie is a kernel of
    its own wherever XLA cannot fuse it into the leaf's producer (a `jit` argument, whose tie
    needs a new buffer whatever its form; a product). On CUDA each is selected through the
    never-true `step_tag < 0` after the call (a copy would be a kernel there too).
    """
    base = _lowering(target)

    def lower(ctx, *args, site, n_alias=0, n_through=0, **_):
        kw = {"site": site, "n_alias": n_alias, "n_after": n_through}
        if copies:
            return base(ctx, *args, copies=n_through, **kw)
        # The leaves stay operands (the probe runs once they are ready), not results.
        outs = base(ctx.replace(avals_out=ctx.avals_out[: 2 + n_alias]), *args, **kw)
        k = len(args) - n_through
        tied = [_select_tie(outs[0], v, a) for v, a in zip(args[k:], ctx.avals_in[k:], strict=True)]
        return [*outs, *tied]

    return lower


# XLA:CPU lays out an all-gather's or reduce-scatter's result with the gathered or scattered
# dimension most major (jax 0.10.2); XLA's GPU layouts are not measured here, so done's
# operands keep the row-major default there.
for _plat, (_arr, _don, _, _) in _TARGETS.items():
    mlir.register_lowering(arrive_p, _arrive_lowering(_arr, copies=_plat == "cpu"), platform=_plat)
    mlir.register_lowering(done_p, _lowering(_don, layout_hints=_plat == "cpu"), platform=_plat)


def _register_jax_rules() -> tuple[bool, str]:
    """The one JAX-internal hook: remat's partial-eval rule for both probes.

    Under `jax.checkpoint` + `jax.grad`, JAX splits the function into a forward part and a
    recomputation. For an effect-free primitive its default is to recompute it, i.e. to run
    the probe twice per step. This rule marks the probes' outputs as saved residuals (what JAX
    does for effectful primitives): they run once, in the forward pass, and the recomputation
    reuses their outputs. Returns `(ok, why)`; without it, callers must not measure inside remat.
    """
    if _REMAT_RULE["ok"] is not None:
        return _REMAT_RULE["ok"], _REMAT_RULE["why"]
    try:
        Var = _jax_compat.jaxpr_var_type()  # noqa: N806 - JAX's class
        pe = _jax_compat.partial_eval()

        def rule(saveable, unks_in, inst_in, eqn):
            del saveable
            n = len(eqn.outvars)
            if any(unks_in):  # cannot happen for stop-gradient'ed inputs; stage as usual
                inputs = [
                    v
                    for v, inst in zip(eqn.invars, inst_in, strict=True)
                    if type(v) is Var and not inst
                ]
                return None, eqn, [True] * n, [True] * n, inputs
            return eqn, None, [False] * n, [False] * n, []

        pe.partial_eval_jaxpr_custom_rules[arrive_p] = rule
        pe.partial_eval_jaxpr_custom_rules[done_p] = rule
        _REMAT_RULE.update(ok=True, why="")
    except Exception as e:  # noqa: BLE001 - internal API moved: measured calls skip remat
        _REMAT_RULE.update(ok=False, why=f"remat rule unavailable in this JAX ({e!r})")
    try:
        pe = _jax_compat.partial_eval()

        def keep_done(*args):
            # JAX <= 0.10 calls `rule(used_outputs, eqn)`, newer JAX (0.12) calls
            # `rule(used_outputs, live_inputs, eqn)`: the equation is always last.
            eqn = args[-1]
            return [True] * len(eqn.invars), eqn

        pe.dce_rules[done_p] = keep_done
        _KEEP_DONE["ok"] = _dce_keeps_done(pe)
        if not _KEEP_DONE["ok"]:
            pe.dce_rules.pop(done_p, None)
    except Exception:  # noqa: BLE001 - internal API moved: tie done's 1.0 into the result
        _KEEP_DONE["ok"] = False
    return _REMAT_RULE["ok"], _REMAT_RULE["why"]


def _dce_keeps_done(pe) -> bool:
    """Whether JAX's own DCE, called as this JAX calls it, keeps an unused `done` (once).

    A rule JAX calls with a different signature would fail in the user's jit; this checks the
    calling convention where a failure only means falling back to the tie.
    """
    try:
        jaxpr = jax.make_jaxpr(lambda r, t, k: done_p.bind(r, t, k, site=0))(
            jax.ShapeDtypeStruct((1,), np.float32),
            jax.ShapeDtypeStruct((), np.int32),
            jax.ShapeDtypeStruct((), np.int32),
        ).jaxpr
        kept, _ = pe.dce_jaxpr(jaxpr, [False])
        return any(e.primitive is done_p for e in kept.eqns)
    except Exception:  # noqa: BLE001 - internal API moved: tie done's 1.0 into the result
        return False


def done_kept_by_rule() -> bool:
    """Whether JAX keeps `done` through the DCE rule (else its 1.0 is tied into the result)."""
    _register_jax_rules()
    return bool(_KEEP_DONE["ok"])


def remat_supported() -> tuple[bool, str]:
    """Whether probes inside `jax.checkpoint` run once per step (see `_register_jax_rules`)."""
    return _register_jax_rules()


def register_targets(lib, load_cuda) -> tuple[bool, str]:
    """Registers the CPU handlers with XLA (once); CUDA ones too when JAX has a CUDA backend.

    `load_cuda()` loads the CUDA runtime for the GPU handlers: `(ok, why)`.
    """
    with _reg_lock:
        if "cpu" in _registered:
            return _registered["cpu"]
        try:
            _, _, arr_sym, don_sym = _TARGETS["cpu"]
            jax.ffi.register_ffi_target(
                _TARGETS["cpu"][0], jax.ffi.pycapsule(getattr(lib, arr_sym)), platform="cpu"
            )
            jax.ffi.register_ffi_target(
                _TARGETS["cpu"][1], jax.ffi.pycapsule(getattr(lib, don_sym)), platform="cpu"
            )
            _registered["cpu"] = (True, "")
        except Exception as e:  # noqa: BLE001 - reported by available()
            _registered["cpu"] = (False, f"registering the FFI targets failed: {e!r}")
        _register_jax_rules()
        _registered["cuda"] = _register_cuda(lib, load_cuda)
        return _registered["cpu"]


def _register_cuda(lib, load_cuda) -> tuple[bool, str]:
    try:
        has_gpu = bool(jax.devices("cuda"))
    except Exception:  # noqa: BLE001 - no CUDA backend in this JAX
        return False, "no CUDA backend"
    if not has_gpu:
        return False, "no CUDA devices"
    ok, why = load_cuda()
    if not ok:
        return False, why
    try:
        _, _, arr_sym, don_sym = _TARGETS["cuda"]
        jax.ffi.register_ffi_target(
            _TARGETS["cuda"][0], jax.ffi.pycapsule(getattr(lib, arr_sym)), platform="CUDA"
        )
        jax.ffi.register_ffi_target(
            _TARGETS["cuda"][1], jax.ffi.pycapsule(getattr(lib, don_sym)), platform="CUDA"
        )
    except Exception as e:  # noqa: BLE001
        return False, f"registering the CUDA FFI targets failed: {e!r}"
    return True, why


def cuda_registered() -> tuple[bool, str]:
    return _registered.get("cuda", (False, "native probes not loaded"))


# ---------------------------------------------------------------------- user-level functions


# Above this, a leaf's first element goes through the arrive probe and is written back in
# place (`native_collective`). That costs two one-element kernels (the slice, the update);
# up to it `_tie.tie` costs one kernel, which XLA fuses with the producer or makes a pass
# over the leaf. `python -m benchmarks tie` (docs/benchmarks.md): the two cost the same at
# 256 KiB per device; at 128 KiB `_tie.tie` was cheaper, from 512 KiB the in-place form.
IN_PLACE_BYTES = 256 * 1024


def _large(leaf) -> bool:
    """Whether `leaf` is tied in place through its first element (above `IN_PLACE_BYTES`)."""
    return leaf_bytes(leaf) > IN_PLACE_BYTES


def _first(leaf):
    """`leaf`'s first element as a `(1, ..., 1)` slice, gradient-free."""
    leaf = lax.stop_gradient(jnp.asarray(leaf))
    nd = leaf.ndim
    return lax.slice(leaf, (0,) * nd, (1,) * nd)


def _major_layout(ndim: int, major) -> tuple | None:
    """The minor-to-major layout with dimension `major` most major and the others row-major
    (None: that is row-major, or there is no such dimension)."""
    if major is None or ndim < 2:
        return None
    d = major % ndim
    return None if d == 0 else (*(i for i in reversed(range(ndim)) if i != d), d)


def _deps(leaves, major=None) -> tuple[list, tuple]:
    """The non-empty array leaves of `leaves`, gradient-free: operands the probes never read.

    A custom call's operand gets XLA's default (row-major) layout: a leaf that XLA lays out
    otherwise (a reduce-scatter over a minor dimension) is copied for it. For a small leaf
    that copy is one small kernel, as a slice would be; a large leaf of two or more
    dimensions is passed as its first element instead, so that no large buffer is ever
    copied for a probe. `major`: the dimension of each leaf that XLA lays out most major (an
    all-gather's or reduce-scatter's result), or None. The layouts returned beside the
    operands ask for that (`_major_layout`; None: row-major), so a small leaf is not copied.
    """
    out, layouts = [], []
    for leaf in jax.tree_util.tree_leaves(leaves):
        leaf = jnp.asarray(leaf)
        if leaf.size == 0:
            continue
        if leaf.ndim >= 2 and leaf_bytes(leaf) > WHOLE_LEAF_BYTES:
            out.append(_first(leaf))
            layouts.append(None)
        else:
            out.append(lax.stop_gradient(leaf))
            layouts.append(_major_layout(leaf.ndim, major))
    return out, tuple(layouts)


def arrive(deps, site_id: int, rank, payload_size: int = 0, firsts=(), through=()):
    """Records this shard's arrival at native site `site_id` and sleeps its pending delay.

    Args:
      deps: the collective's operands (a pytree of arrays): the probe runs once they are all
        ready. They are operands of the custom call, never read (as they are; a large leaf
        of 2+ dimensions as its first element: `_deps`).
      site_id: the native site (registered with `jaxpace.native.probes.register_site`).
      rank: int32 scalar, this shard's rank; -1 makes the call a no-op for this shard;
        `jaxpace.native.probes.RANK_FROM_DEVICE`: the site's table of ranks per device ordinal.
      payload_size: length of the exchange payload to produce (0: none).
      firsts: arrays (the first elements of large leaves: `_first`) that the probe returns as
        they are, in the same buffers (aliased operands; never read or written).
      through: arrays (small operand leaves) that come back with their bits, each made to
        depend on the probe: copied by the CPU handler, selected through `step_tag < 0` in
        the CUDA lowering (`_arrive_lowering`).

    Returns:
      `(step_tag, payload, firsts + through)`: step_tag is `step + 1` (int32, > 0) when this arrival is
      measured, else 0; payload is float32 `(payload_size,)`, zero except this rank's previous
      wait, presence and step time at its slot (layout of `jaxpace.collectives.exchange`); `firsts` as
      given, bit for bit, now computed by the probe (XLA cannot see through it).
    """
    firsts, through = list(firsts), [jnp.asarray(t) for t in through]
    step_tag, payload, *out = arrive_p.bind(
        jnp.asarray(rank, jnp.int32),
        *_deps(deps)[0],
        *firsts,
        *through,
        site=int(site_id),
        payload_size=int(payload_size),
        n_alias=len(firsts),
        n_through=len(through),
    )
    return step_tag, payload, out


def done(reduced, step_tag, site_id: int, rank, deps=(), major=None):
    """Closes this shard's measured step at site `site_id`; returns a float32 1.0 to tie in.

    `reduced` is the collective's reduced exchange payload (empty without one): its values are
    kept with the record. `deps` are the collective's outputs: the data dependency that orders
    `done` after the collective (operands of the custom call, never read). `major`: the
    dimension of each output that the collective gathers or scatters along, or None (`_deps`).
    """
    red = jnp.ravel(jnp.asarray(reduced, jnp.float32))
    operands, layouts = _deps(deps, major)
    return done_p.bind(
        lax.stop_gradient(red),
        jnp.asarray(step_tag, jnp.int32),
        jnp.asarray(rank, jnp.int32),
        *operands,
        site=int(site_id),
        layouts=layouts if any(lay is not None for lay in layouts) else (),
    )


def native_collective(reduce, x, *, site_id: int, rank, payload_size: int = 0, major=None):
    """`reduce` timed by the native probes: arrive -> reduce -> done, bitwise `reduce(x)`.

    Every non-empty operand leaf is an operand of the `arrive` custom call, and every leaf is
    rewritten with its own bits from the probe's outputs, which XLA cannot see through: a
    leaf of up to `WHOLE_LEAF_BYTES` comes back from the probe itself (`arrive`'s `through`:
    the CPU handler's copy, the CUDA lowering's select); one of up to `IN_PLACE_BYTES` goes
    through `_tie.tie` on its step tag; a larger one
    through a one-element `dynamic_update_slice` of its first element, which arrive takes
    and returns in the same buffer (an aliased operand it never touches). Nothing else in
    that update's kernel reads the leaf, so XLA writes it in place; a slice of the leaf
    fused beside the update (`_tie.tie`) made XLA:CPU copy the whole leaf. Every output leaf
    is an operand of the `done` custom call. So every collective XLA makes of `reduce` (one
    per leaf, or any combination the all-reduce combiner forms) runs after the arrive probe
    and before the done probe, with no concatenation or stack of the data on either side
    (and a slice only of a large leaf's first element).

    Args:
      reduce: `reduce(tree)` -> the collective's result (e.g. `lambda t: lax.psum(t, "i")`).
        With `payload_size > 0` it is called on `(x, payload)`, so the payload is an operand of
        the same collective, and must return `(out, reduced_payload)`.
      x: the operand pytree (non-empty arrays).
      site_id, rank, payload_size: as in `arrive`.
      major: the dimension of each result leaf that the collective gathers or scatters along
        (`jaxpace.collectives.kinds.major_dim`), or None: the done probe takes the leaf in that layout.

    Returns:
      `(out, reduced_payload or None)`.
    """
    leaves, tdef = jax.tree_util.tree_flatten(x)
    sizes = [int(np.prod(jnp.shape(leaf))) for leaf in leaves]
    # (An empty leaf has no bytes, so it is never large.)
    large = [_large(leaf) and not reduction_typed(leaf) for leaf in leaves]
    # A leaf of up to WHOLE_LEAF_BYTES goes through the probe (`arrive`'s `through`), except
    # an `unreduced` / `reduced` one: only `_tie.tie`'s barrier can meet that one.
    through = [
        s > 0 and leaf_bytes(leaf) <= WHOLE_LEAF_BYTES and not reduction_typed(leaf)
        for leaf, s in zip(leaves, sizes, strict=True)
    ]
    # `later`: tied after the probe by `_tie.tie` (those, and leaves up to IN_PLACE_BYTES).
    later = [s > 0 and not big and not th for s, big, th in zip(sizes, large, through, strict=True)]
    step_tag, payload, outs = arrive(
        [leaf for leaf, t in zip(leaves, later, strict=True) if t],
        site_id,
        rank,
        payload_size,
        firsts=[_first(leaf) for leaf, big in zip(leaves, large, strict=True) if big],
        through=[leaf for leaf, t in zip(leaves, through, strict=True) if t],
    )
    step_tag = lax.stop_gradient(step_tag)
    never = step_tag < 0  # step_tag >= 0 always: each tie keeps the leaf's bits
    n_big = sum(large)
    firsts, passed = iter(outs[:n_big]), iter(outs[n_big:])
    tied = []
    for leaf, big, t, th in zip(leaves, large, later, through, strict=True):
        if big:  # the probe's copy of its own first element: an in-place one-element update
            tied.append(lax.dynamic_update_slice(leaf, next(firsts), (0,) * jnp.ndim(leaf)))
        elif th:
            tied.append(next(passed))
        else:
            tied.append(tie(leaf, never) if t else leaf)
    tied_x = jax.tree_util.tree_unflatten(tdef, tied)
    if payload_size > 0:
        out, red = reduce((tied_x, lax.stop_gradient(payload)))
        red = lax.stop_gradient(red)
    else:
        out, red = reduce(tied_x), None
    no_payload = jnp.zeros((0,), jnp.float32)
    one = lax.stop_gradient(
        done(no_payload if red is None else red, step_tag, site_id, rank, deps=out, major=major)
    )
    if done_kept_by_rule():
        return out, red
    out_leaves, out_def = jax.tree_util.tree_flatten(out)
    dep = min(
        (i for i, leaf in enumerate(out_leaves) if int(np.prod(jnp.shape(leaf)))),
        key=lambda i: int(np.prod(jnp.shape(out_leaves[i]))),
    )
    out_leaves = list(out_leaves)
    out_leaves[dep] = tie(out_leaves[dep], one < 0)  # done returns 1.0: the same bits
    return jax.tree_util.tree_unflatten(out_def, out_leaves), red
