"""The measured collective through the native probes (no JAX effect, no Python per step).

Called by `jaxpace.collectives.measure` once it has decided to measure a call and the native
probes apply; `tangent` is lax's own JVP rule for every measured collective.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxpace import _jax_compat
from jaxpace.collectives import kinds as _kinds

__all__ = [
    "TracePlan",
    "axis_rank",
    "fitting_meshes",
    "is_leader",
    "linear_shard_index",
    "mesh_fits",
    "native_or_none",
    "tangent",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class TracePlan:
    """What the traced program of one measured collective is built from (trace time).

    Attributes:
      call: the `_kinds.Call` (its lax function, kind and parameters).
      axis_name: the axis name (or tuple of names) as lax takes it.
      axis_index_groups: as lax takes it.
      granularity: `"process"` or `"device"`.
      num_slots: ranks of the site (processes, or the group's shards).
      n_pay: the exchange payload's length (0: no exchange).
      scale: the reduction's scale for the exchange (pmean), else 1.0.
      table: which linear shard is its process's leader (`"process"`), or None.
      am: the abstract mesh.
      axes: the axes a device's rank is numbered over (`granularity="device"`): the
        reduced axes when the site is one group, every mesh axis when it is several.
      sizes: `{axis: size}` of those axes.
    """

    call: Any
    axis_name: Any
    axis_index_groups: Any
    granularity: str
    num_slots: int
    n_pay: int
    scale: float
    table: np.ndarray | None
    am: Any
    axes: tuple
    sizes: dict


def linear_shard_index(am):
    """This shard's index in the row-major order of the abstract mesh `am`."""
    idx = jnp.int32(0)
    for name, size in zip(am.axis_names, am.axis_sizes, strict=True):
        idx = idx * size + lax.axis_index(name)
    return idx


def is_leader(table: np.ndarray, am):
    """Whether this shard measures for its process: `table[linear shard index]`.

    When the leaders are every `block`-th shard (process-contiguous meshes, as
    `jax.make_mesh` and `pmap` lay out), computed from the index with literals only, so
    `jax.checkpoint` has no constant array to save as a residual.
    """
    idx = linear_shard_index(am)
    n = int(table.size)
    block = int(np.argmax(table[1:])) + 1 if table[1:].any() else n
    if table[0] and n % block == 0 and (table == (np.arange(n) % block == 0)).all():
        return idx % block == 0
    return jnp.asarray(table)[idx]


def axis_rank(axes: tuple, sizes: dict):
    """This shard's rank over `axes` (row-major over their sizes)."""
    idx = jnp.int32(0)
    for a in axes:
        idx = idx * sizes[a] + lax.axis_index(a)
    return idx


def native_or_none(rt, site_obj, probe, plan: TracePlan, x):
    """`(result,)` of the collective through the native probes, or None for the fallback.

    Sets `site_obj.probe` either way (what `stats()` says about the path).
    """
    native_id, native_why, from_device = None, probe.why, False
    if probe.native:
        native_id, native_why, from_device = _attach_native(rt, site_obj, probe, plan)
    site_obj.probe = native_why
    if native_id is None:
        return None
    return (_measured_native(plan, native_id, x, from_device),)


def _attach_native(rt, site_obj, probe, plan: TracePlan):
    """Registers the native site; returns `(native id or None, what stats() says, from_device)`.

    `from_device`: the site holds each local device's rank (`_device_table`), so the program
    passes `RANK_FROM_DEVICE` and computes no rank. Computing it (the partition id, the rank
    over the axes, the leader test) put kernels at the start of every measured program that
    cost several percent of a step on XLA:CPU (docs/benchmarks.md). The CUDA handlers always
    read the table. On CPU it is used in a single-process job only: there XLA's device
    ordinal is the device's index in the process; in a multi-process CPU job it is the global
    device id (2048 and 2049 for process 1 of 2 here), which this table is not keyed by. A
    CPU job without a concrete mesh, or of several processes, computes the rank in the program.
    """
    from jaxpace.native import driver

    platform, why = probe
    fixed_rank = jax.process_index() if plan.granularity == "process" else -1
    try:
        nid = driver.attach(
            rt,
            site_obj,
            num_slots=plan.num_slots,
            fixed_rank=fixed_rank,
            sample_every=rt.config.sample_every,
            payload_len=plan.n_pay,
            scale=plan.scale,
            capacity=rt.config.capacity * max(1, jax.local_device_count()),
            max_delay_s=0.0 if site_obj.measure_only else rt.policy.max_delay_s,
            stop=rt.stop_event,
        )
        if platform == "cuda":
            why_dev = _device_table(rt, nid, plan)
            if why_dev is not None:
                return None, f"io_callback probes: {why_dev}", False
            return nid, f"native: {why}", True
    except Exception as e:  # noqa: BLE001 - any failure here means "use the fallback"
        return None, f"io_callback probes: native site registration failed ({e})", False
    if jax.process_count() > 1:
        return nid, f"native: {why}", False
    try:
        from_device = _device_table(rt, nid, plan, cuda=False) is None
    except Exception:  # noqa: BLE001 - no table: the program computes the rank, as it did
        from_device = False
    return nid, f"native: {why}", from_device


def mesh_fits(mesh, am) -> bool:
    """Whether the concrete `mesh` has the abstract mesh `am`'s axis names and shape."""
    try:
        return tuple(mesh.axis_names) == tuple(am.axis_names) and tuple(
            mesh.devices.shape
        ) == tuple(am.axis_sizes)
    except Exception:  # noqa: BLE001 - not a mesh
        return False


def fitting_meshes(rt, am) -> list:
    """`[(source, mesh)]`: the concrete meshes that fit `am`, `Pacer(mesh=...)`'s first, then
    `jax.set_mesh`'s. The process of each shard and each device's rank both come from the
    first, so the leaders and the rank table never disagree."""
    candidates = [("Pacer(mesh=...)", rt.mesh), ("jax.set_mesh", _jax_compat.concrete_mesh())]
    return [(src, m) for src, m in candidates if m is not None and mesh_fits(m, am)]


def _device_table(rt, nid, plan: TracePlan, *, cuda: bool = True) -> str | None:
    """Each shard's rank in a host table keyed by local device ordinal, built from a concrete
    mesh: the CUDA handlers always read it (GPU operands live on the device), the CPU ones
    when the program passes `RANK_FROM_DEVICE`. None when set, else why not."""
    from jaxpace.native import probes as _native

    granularity, table, am, axes, sizes = (
        plan.granularity,
        plan.table,
        plan.am,
        plan.axes,
        plan.sizes,
    )
    names, shape = tuple(am.axis_names), tuple(am.axis_sizes)
    fits = fitting_meshes(rt, am)  # the one `_collectives._process_map` takes the leaders from
    if not fits:
        return "the CUDA handlers need the concrete mesh (Pacer(mesh=...) or jax.set_mesh)"
    mesh = fits[0][1]
    devs = mesh.devices
    ranks = {}
    for idx in np.ndindex(*shape):
        d = devs[idx]
        if d.process_index != jax.process_index():
            continue
        if granularity == "process":
            lin = int(np.ravel_multi_index(idx, shape))
            r = 0 if table is not None and table[lin] else -1
        else:
            pos = dict(zip(names, idx, strict=True))
            r = 0
            for a in axes:
                r = r * sizes[a] + pos[a]
        ranks[int(d.local_hardware_id)] = r
    arr = np.full(max(ranks) + 1 if ranks else 0, -1, np.int32)
    for k, v in ranks.items():
        arr[k] = v
    _native.set_site_devices(nid, arr, cuda=cuda)
    return None


def _measured_native(plan: TracePlan, nid: int, x, from_device: bool = False):
    """The measured collective through the native probes: no JAX effect, no Python per step.

    Arrive and done are effect-free primitives lowered to side-effecting FFI calls
    (jaxpace.native.primitive); a shard that does not measure passes rank -1 and
    the handler returns at once. Works under remat (measured once per step),
    custom_jvp and jax_enable_checks; the custom_jvp below keeps lax's own tangent
    rule, so gradients stay bitwise lax's (the ties' transposes would add zeros,
    which turns -0.0 into +0.0).
    """
    from jaxpace.native import primitive
    from jaxpace.native import probes as _native

    call, axis_name, axis_index_groups = plan.call, plan.axis_name, plan.axis_index_groups
    n_pay, granularity, table = plan.n_pay, plan.granularity, plan.table
    am, axes, sizes = plan.am, plan.axes, plan.sizes
    lax_fn = call.fn

    def reduce(t):  # t is (x, payload) with exchange: one all-reduce for both
        return lax_fn(t, axis_name, axis_index_groups=axis_index_groups)

    def _probed(fn, x, major=None):
        if from_device:  # the site's table holds each device's rank: nothing to compute
            rank = jnp.int32(_native.RANK_FROM_DEVICE)
        else:
            rank = axis_rank(axes, sizes) if granularity == "device" else jnp.int32(0)
            if table is not None:
                rank = jnp.where(is_leader(table, am), rank, -1)
        out, _ = primitive.native_collective(
            fn, x, site_id=nid, rank=rank, payload_size=n_pay, major=major
        )
        return out

    @jax.custom_batching.custom_vmap
    def measured(x):
        return _probed(reduce, x, _kinds.major_dim(call.kind, call.params))

    @measured.def_vmap
    def measured_vmap(axis_size, in_batched, x):
        if call.kind in _kinds.ELEMENTWISE_KINDS:
            # Elementwise in any other (vmapped) dimension, as lax's own batching rule:
            # one arrival per shard, not one per batch element.
            return measured(x), in_batched[0]
        # all_gather / psum_scatter / all_to_all place axes: lax's batching rule does that.
        in_axes = jax.tree_util.tree_map(lambda b: 0 if b else None, in_batched[0])

        def reduce_batched(t):
            return jax.vmap(reduce, in_axes=(in_axes,), axis_size=axis_size)(t)

        out = _probed(reduce_batched, x)
        return out, jax.tree_util.tree_map(lambda _: True, out)

    @jax.custom_jvp
    def run(x):
        return measured(x)

    @run.defjvp
    def run_jvp(primals, tangents):
        (xp,), (xt,) = primals, tangents
        y = run(xp)
        return y, tangent(call, xp, xt, y, axis_name, axis_index_groups)

    return run(x)


def tangent(call, xp, xt, y, axis_name, axis_index_groups):
    """The tangent lax's own JVP rule gives for `call` at primal `xp`, tangent `xt`.

    For a linear collective, the same collective on the tangent. Integer/bool inputs
    carry `float0` tangents; their outputs get a zero tangent of the output's tangent
    dtype (`float0`, or float for `pmean` of ints). For the others (`pmax`, `pmin`),
    whatever `jax.jvp` of the lax call gives, its errors included.
    """
    lax_fn = call.fn
    if call.kind not in _kinds.LINEAR_KINDS:
        return jax.jvp(
            lambda v: lax_fn(v, axis_name, axis_index_groups=axis_index_groups), (xp,), (xt,)
        )[1]
    float0 = jax.dtypes.float0
    t_leaves, t_def = jax.tree_util.tree_flatten(xt)
    y_leaves = jax.tree_util.tree_leaves(y)
    out = []
    for t, yl in zip(t_leaves, y_leaves, strict=True):
        if getattr(t, "dtype", None) != float0:
            out.append(lax_fn(t, axis_name, axis_index_groups=axis_index_groups))
        elif jnp.issubdtype(yl.dtype, jnp.inexact):
            out.append(jnp.zeros(yl.shape, yl.dtype))
        else:
            out.append(np.zeros(yl.shape, dtype=float0))
    return jax.tree_util.tree_unflatten(t_def, out)
