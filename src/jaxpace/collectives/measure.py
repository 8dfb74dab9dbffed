"""The measured collective: trace-time decisions, then probe → exchange → delay → `jax.lax`."""

from __future__ import annotations

import enum
import inspect
import os
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import io_callback

from jaxpace import _jax_compat
from jaxpace.collectives import exchange as _exchange
from jaxpace.collectives import invariant as _invariant
from jaxpace.collectives import kinds as _kinds
from jaxpace.collectives import layout as _site_layout
from jaxpace.collectives.native_program import (
    TracePlan,
    axis_rank,
    fitting_meshes,
    is_leader,
    mesh_fits,
    native_or_none,
    tangent,
)
from jaxpace.collectives.tie import reduction_typed as _reduction_typed
from jaxpace.collectives.tie import tie, token
from jaxpace.errors import UnboundAxisError

__all__ = [
    "Decision",
    "pass_through",
    "restore_pass_through",
    "set_pass_through",
    "passed_through_count",
    "MeasuredSite",
    "Probe",
    "Runtime",
    "Unmeasured",
    "caller_site",
    "collective",
]

_LAX = _kinds.LAX  # the real jax.lax functions (captured before any test harness patch)
# the jaxpace package (every frame inside it is jaxpace's own, not the caller's)
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Unmeasured(enum.Enum):
    """Why a call passes straight to `jax.lax` unmeasured; the value is what `stats()` says."""

    VMAP_AXIS = "axis bound by vmap (no device mapping to time)"
    PARTIAL_MANUAL = "partial-manual shard_map (host callbacks are not supported there by JAX)"
    CONSTANT = "constant operand (folded by jax.lax, nothing to time)"
    TANGENT = (
        "tangent/cotangent under autodiff (a linear value JAX will transpose; host "
        "callbacks cannot be transposed)"
    )
    REMAT = (
        "inside jax.checkpoint/remat (JAX rejects host callbacks in remat partial-eval "
        "under grad); move the collective outside the checkpointed function to time it"
    )
    NO_CPU_BACKEND = (
        "no CPU backend for host callbacks (add `cpu` to JAX_PLATFORMS, e.g. "
        "JAX_PLATFORMS=cuda,cpu, to measure)"
    )


class Probe(NamedTuple):
    """Which probes time a measured call: `platform` "cpu"/"cuda" for the native ones, None
    for the io_callback ones; `why` goes into `stats()[site].probe` either way."""

    platform: str | None
    why: str

    @property
    def native(self) -> bool:
        return self.platform is not None


class Decision(NamedTuple):
    """What the trace-time ladder chose: `unmeasured` (None: measure) and the probes."""

    unmeasured: Unmeasured | None
    probe: Probe


class MeasuredSite(Protocol):
    """The host state of a measured site, as the collectives set it at trace time
    (`jaxpace.runtime.sites.Site` implements it)."""

    probe: str | None  # which probes time it, and why
    measure_only: bool  # the in-band exchange cannot ride this collective (never paced)
    pacing: str | None  # what the policy does here, and why
    layout_info: dict[str, Any] | None  # collective, groups, ppermute pairs (records header)


class Runtime(Protocol):
    """What a measured collective needs from its runtime (`Pacer.hooks` implements it).

    This is the whole contract between the collectives (with the native probes'
    drain thread) and the `Pacer`; they read nothing else of it.

    Attributes:
      config: the `PacerConfig` (`enabled`, `granularity`, `sample_every`, ...).
      policy: the `PacingPolicy` (`needs_exchange`, `max_delay_s`).
      mesh: the concrete mesh the user passed, or None.
    """

    config: Any
    policy: Any
    mesh: Any

    def begin_trace(self) -> None:
        """Freezes settings and agrees on them across processes (first call only)."""

    def callbacks_available(self) -> bool:
        """Whether host callbacks can run (a CPU backend exists)."""

    def note_unmeasured(self, site: str, reason: str) -> None:
        """Records that `site` passes straight to `jax.lax`, and why."""

    def note_invariant(self, site: str, axis: str) -> None:
        """The operand at `site` is already invariant over `axis` (records it)."""

    def open_site(self, name: str, num_slots: int, layout: str | None) -> MeasuredSite:
        """The host state of a measured site (created on first use)."""

    def arrive(self, site: Any, rank: int) -> tuple[np.ndarray, np.int32]:
        """Pre-collective body: `(payload, step_tag)`; sleeps the pending delay."""

    def done(self, site: Any, rank: int, step_tag: int, reduced: Any, scale: float) -> None:
        """Post-collective body: closes the record and runs the policy."""

    # The native probes (`jaxpace.collectives.native_program`, the drain thread `jaxpace.native.driver`).

    def native_blocker(self) -> str | None:
        """Why this runtime needs the Python (io_callback) probes, or None."""

    @property
    def stop_event(self) -> Any:
        """A `threading.Event` set when pacing stops: native pacing sleeps end too."""

    def native_record(
        self,
        site: Any,
        rank: int,
        step: int,
        arrive_ns: int,
        done_ns: int,
        delay_ns: int,
        reduced: Any,
        scale: float,
        *,
        execution: int | None = None,
    ) -> float:
        """One record the native probes finished: `done`'s work; returns the next delay (s).
        `execution`: XLA's run id of the program execution it ran in (None: unknown)."""

    def native_wants_wake(self, site: Any) -> bool:
        """Whether the drain thread should handle each record of `site` at once."""


# ---------------------------------------------------------------------- trace-time decisions


# Watch's unmeasured form: inside `pass_through()` every jaxpace collective traces as the
# plain `jax.lax` one. The flag is part of the jit cache key, so one jit function keeps both
# programs (measured and plain) and a call runs the one its context selects.
_PASS_THROUGH = _jax_compat.jit_keyed_flag(
    "jaxpace_collectives_pass_through",
    "jaxpace collectives trace as the plain jax.lax ones (jaxpace.watch outside its windows).",
)
_passed_through = [0]  # collectives traced in the pass-through form (all threads)


def pass_through(on: bool = True) -> Any:
    """A context in which jaxpace's collectives trace as the plain `jax.lax` ones (`on`),
    or as usual (`on=False`); the choice is part of the `jax.jit` cache key."""
    return _PASS_THROUGH(bool(on))


# `(set, restore)` of the pass-through flag on the calling thread without a context object:
# watch's wrapper runs every call between windows in the plain form (`prev = set(True)`,
# then `restore(prev)`), where making `pass_through(True)` took most of its own time.
set_pass_through, restore_pass_through = _jax_compat.flag_setters(_PASS_THROUGH)


def passed_through_count() -> int:
    """How many jaxpace collectives were traced in the pass-through form so far."""
    return _passed_through[0]


def caller_site() -> str:
    """`file:line:function` of the first frame outside jaxpace and jax."""
    frame = inspect.currentframe()
    try:
        f = frame.f_back if frame is not None else None
        while f is not None:
            fn = os.path.abspath(f.f_code.co_filename)
            if (
                not fn.startswith(_PKG_DIR)
                and f"{os.sep}jax{os.sep}" not in fn
                and (f"{os.sep}jax{os.sep}_src" not in fn)
                and "contextlib" not in fn
                and "functools" not in fn
            ):
                return f"{os.path.basename(fn)}:{f.f_lineno}:{f.f_code.co_name}"
            f = f.f_back
        return "unknown"
    finally:
        del frame


def _axes(axis_name) -> tuple:
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def _check_bound(axes: tuple, lax_call) -> tuple[dict | None, Any]:
    """`({axis: size}, None)` when every axis is bound; else what `jax.lax` does.

    For an unbound axis, `lax_call()` (the plain lax collective) decides: if lax
    raises `NameError`/`AssertionError`, ours is raised with lax's own message
    first, verbatim (code that matches on it keeps working), then jaxpace's
    advice naming the axis and the bound ones; any other lax error propagates
    unchanged; if lax accepts the call, `(None, lax's result)`.
    """
    sizes = {}
    missing = []
    for a in axes:
        try:
            sizes[a] = int(lax.axis_size(a))  # public API: NameError when unbound
        except NameError:
            missing.append(a)
    if not missing:
        return sizes, None
    bound = ", ".join(f"`{a}`" for a in (_jax_compat.bound_axis_sizes() or {})) or "none"
    advice = (
        f"jaxpace: axis {missing[0]!r} is not bound here; jaxpace collectives must be "
        "called inside `jax.shard_map`, `jax.pmap` or `jax.vmap(axis_name=...)` that binds "
        f"the axis; bound here: {bound}. Did you mean one of those, or call it outside the "
        "mapped function?"
    )
    try:
        result = lax_call()
    except (NameError, AssertionError) as e:
        first = str(e).strip()
        if not first:  # lax's error inside shard_map is an empty AssertionError
            first = f"unbound axis name: {missing[0]!r}."
        elif first[-1] not in ".!?":
            first += "."
        raise _UnboundAxis(f"{first} {advice}") from e
    return None, result


class _UnboundAxis(UnboundAxisError, AssertionError):
    """`UnboundAxisError` that is also an `AssertionError`.

    `jax.lax` raises `NameError` for an unbound axis outside any mapping and an
    (empty) `AssertionError` inside `shard_map`; this is both, with a message.
    """


def _measurement_mode(axes: tuple) -> tuple[Unmeasured | None, Any]:
    """Returns `(why the call is not measured, or None; abstract_mesh)`."""
    am = jax.sharding.get_abstract_mesh()
    names = tuple(getattr(am, "axis_names", ()) or ())
    manual = set(getattr(am, "manual_axes", ()) or ())
    if not all(a in manual for a in axes):
        return Unmeasured.VMAP_AXIS, am
    if set(names) != manual:
        return Unmeasured.PARTIAL_MANUAL, am
    return None, am


def _leader_table(rt: Runtime, am) -> tuple[np.ndarray, str, np.ndarray]:
    """`(is_leader[linear shard index], source, process[linear shard index])` over the
    abstract mesh: one leader per process, its first shard in mesh order."""
    procs, source = _process_map(rt, am)
    return _site_layout.leaders(procs), source, procs


def _process_map(rt: Runtime, am) -> tuple[np.ndarray, str]:
    """`(process index of each linear shard, where that came from)`."""
    shape = tuple(am.axis_sizes)
    total = int(np.prod(shape)) if shape else 1
    from jaxpace.topology import registry

    def procs_of(m) -> np.ndarray:
        return np.array([getattr(d, "process_index", 0) for d in m.devices.reshape(-1)])

    fits = fitting_meshes(rt, am)
    if fits:
        src, m = fits[0]
        return procs_of(m), src
    # Meshes from jaxpace.make_mesh: usable only if every one of this shape
    # agrees (the one inside shard_map is not known by identity).
    registered = [procs_of(m) for m in registry.recent() if mesh_fits(m, am)]
    if registered and all((t == registered[0]).all() for t in registered):
        return registered[0], "jaxpace.make_mesh"
    nproc = jax.process_count()
    block = max(total // max(nproc, 1), 1)
    procs = np.minimum(np.arange(total) // block, max(nproc - 1, 0))
    return procs, "assumed process-contiguous blocks (as jax.make_mesh and pmap lay out)"


def _group_size(axes: tuple, sizes: dict, axis_index_groups) -> int:
    if axis_index_groups is not None:
        return len(axis_index_groups[0])
    n = 1
    for a in axes:
        n *= sizes[a]
    return n


# ---------------------------------------------------------------------- the collective


def collective(rt: Runtime, kind: str, x, axis_name, axis_index_groups, site, params=None):
    """Measured `jax.lax.<kind>` on behalf of the runtime `rt` (a `Pacer`'s hooks).

    `params` are the collective's own keyword options (`axis`, `tiled`, `perm`, ...).

    Every pass-through decision below is made at trace time from static facts
    (axis kinds, tracer kinds, the mesh, settings agreed at consensus), so every
    process traces the same program.
    """
    try:
        return _collective(
            rt,
            _kinds.Call(kind, _kinds.lax_fn(kind, params), dict(params or {})),
            x,
            axis_name,
            axis_index_groups,
            site,
        )
    except NotImplementedError as e:
        if str(e).strip():
            raise
        # JAX raises a bare `NotImplementedError()` for some calls (e.g.
        # `axis_index_groups` inside `shard_map`): same type, clearer message.
        raise NotImplementedError(
            f"`jax.lax.{kind}` does not support this call here (JAX raised a bare "
            f"NotImplementedError): axis_name={axis_name!r}, "
            f"axis_index_groups={axis_index_groups!r}. `axis_index_groups` works under "
            "`jax.pmap` only; inside `jax.shard_map` or `jax.vmap`, reduce over a mesh axis "
            "(or a sub-mesh made with `shard_map(axis_names=...)`) instead."
        ) from e


def _collective(rt: Runtime, call, x, axis_name, axis_index_groups, site):
    lax_fn = call.fn

    def plain():
        return lax_fn(x, axis_name, axis_index_groups=axis_index_groups)

    if site is None:
        site = caller_site()
    elif not isinstance(site, str) or not site:
        raise TypeError(f"`site` must be a non-empty string, got {site!r}.")
    axes = _axes(axis_name)
    if not axes or any(isinstance(a, int) for a in axes):
        # `psum(x, ())` is the identity and integer axes are positional in lax:
        # nothing crosses devices, so nothing to time (lax raises where it must).
        return plain()
    if not rt.config.enabled:
        rt.begin_trace()  # freezes settings; `enabled` is agreed like the rest
        return plain()
    if _PASS_THROUGH.value:  # watch, outside its windows: the same decision on every process
        _passed_through[0] += 1
        rt.begin_trace()
        return plain()
    leaves = jax.tree_util.tree_leaves(x)
    if not leaves or any(
        not isinstance(leaf, _SCALARS) and not hasattr(leaf, "shape") for leaf in leaves
    ):
        # Empty trees, or operands lax rejects: lax's own result or error.
        return plain()
    # Unbound axes: ours names the axis and the bound ones (JAX's is often an
    # empty AssertionError); it subclasses both NameError and AssertionError.
    sizes, lax_result = _check_bound(axes, plain)
    if sizes is None:
        rt.note_unmeasured(
            site, "jax.lax accepted an axis that jax.lax.axis_size does not bind (nothing to time)"
        )
        return lax_result
    # Settings are frozen and agreed across processes before any decision.
    rt.begin_trace()
    decision, am = _decide(rt, axes, leaves)
    if decision.unmeasured is not None:
        rt.note_unmeasured(site, decision.unmeasured.value)
        return plain()
    if call.kind in ("psum", "pmean", "pmax", "pmin"):  # the skew would be hidden
        if _invariant.warn_if_invariant(call.kind, leaves, axes, site):
            rt.note_invariant(site, str(axes[0]))  # into the records: the report refuses a culprit
    axis_name = axes if len(axes) > 1 else axes[0]
    return _measured(
        rt,
        call,
        x,
        axis_name,
        axis_index_groups,
        site=site,
        sizes=sizes,
        am=am,
        probe=decision.probe,
    )


_SCALARS = (jax.Array, np.ndarray, np.generic, int, float, bool, complex)


def _is_traced(leaf) -> bool:
    return isinstance(leaf, jax.core.Tracer)


def _decide(rt: Runtime, axes: tuple, leaves: list) -> tuple[Decision, Any]:
    """The trace-time ladder: measure this call or not, and with which probes.

    Every rung reads static facts only (axis kinds, tracer kinds, the mesh, agreed
    settings), so every process decides the same. Returns `(decision, abstract_mesh)`.
    """
    unmeasured, am = _measurement_mode(axes)
    if unmeasured is None and any(not _is_traced(leaf) for leaf in leaves):
        # Python scalars / numpy constants (e.g. the `psum(1, axis)` idiom): lax
        # folds these to the axis size; there is nothing to time.
        unmeasured = Unmeasured.CONSTANT
    if unmeasured is None and any(_jax_compat.is_unknown_tracer(leaf) for leaf in leaves):
        unmeasured = Unmeasured.TANGENT
    if unmeasured is not None:
        return Decision(unmeasured, Probe(None, "")), am
    probe = _native_probe(rt, am)
    if probe.native and all(int(np.prod(jnp.shape(leaf))) == 0 for leaf in leaves):
        probe = Probe(
            None, "io_callback probes: every operand is empty (nothing to tie the native ones to)"
        )
    if probe.native and any(_reduction_typed(leaf) for leaf in leaves):
        probe = Probe(
            None, "io_callback probes: an operand is unreduced/reduced (explicit sharding)"
        )
    if not probe.native and _jax_compat.inside_remat():
        return Decision(Unmeasured.REMAT, probe), am
    if not probe.native and not rt.callbacks_available():
        return Decision(Unmeasured.NO_CPU_BACKEND, probe), am
    return Decision(None, probe), am


def _native_probe(rt: Runtime, am) -> Probe:
    """`(platform, why)`: "cpu"/"cuda" when the native probes time this trace, else None.

    Chosen at trace time; `why` goes into `stats()[site].probe` either way, so a
    fallback to the io_callback probes is never silent.
    """
    from jaxpace.native import primitive
    from jaxpace.native import probes as _native

    ok, why = _native.available()
    if not ok:
        return Probe(None, f"io_callback probes: {why}")
    blocker = rt.native_blocker()
    if blocker:
        return Probe(None, f"io_callback probes: {blocker}")
    dev = getattr(am, "abstract_device", None)
    platform = getattr(dev, "platform", None) or jax.default_backend()
    if _jax_compat.inside_remat() and not primitive.remat_supported()[0]:
        return Probe(None, f"io_callback probes: {primitive.remat_supported()[1]}")
    if platform == "cpu":
        if not rt.callbacks_available():
            return Probe(None, "io_callback probes: no CPU backend")
        return Probe("cpu", why)
    if platform in ("gpu", "cuda"):
        ok_cuda, why_cuda = primitive.cuda_registered()
        if not ok_cuda:
            return Probe(None, f"io_callback probes: no native CUDA handlers ({why_cuda})")
        return Probe(
            "cuda", f"{why}, CUDA events on XLA's stream ({why_cuda}; unverified on a GPU)"
        )
    return Probe(None, f"io_callback probes: no native handler for platform {platform!r}")


def _measured(rt: Runtime, call, x, axis_name, axis_index_groups, *, site, sizes, am, probe):
    axes = _axes(axis_name)
    granularity = rt.config.granularity
    group = _group_size(axes, sizes, axis_index_groups)
    names, shape = tuple(am.axis_names), tuple(am.axis_sizes)
    total = int(np.prod(shape)) if shape else 1
    rank_axes, rank_sizes = axes, sizes
    if granularity == "process":
        num_slots = jax.process_count()
        table, source, procs = _leader_table(rt, am)
        layout_procs = procs
    elif total == group:  # one group: a device's rank is its index over the reduced axes
        num_slots, table, layout_procs = group, None, None
        source = "every shard (granularity='device')"
    else:
        # Several groups (the mesh's other axes, or `axis_index_groups`): a device's rank is
        # its index over the whole mesh, so devices of different groups never share a rank
        # (and a record); the header lists each group's ranks. The exchange's payload has a
        # slot per device and is reduced within each group, so each device sees its own
        # group's ranks present and the others absent: the policy paces within the group.
        num_slots, table, layout_procs = total, None, np.arange(total)
        rank_axes, rank_sizes = names, dict(zip(names, shape, strict=True))
        source = (
            f"every shard (granularity='device'), {total // max(group, 1)} groups numbered "
            "over the mesh"
        )
    site_obj = rt.open_site(site, num_slots, source)
    site_obj.layout_info = _site_layout.describe(
        call.kind,
        names,
        shape,
        axes,
        layout_procs,
        axis_index_groups,
        call.params.get("perm") if call.kind == "ppermute" else None,
    )
    scale = _exchange.reduction_scale(call.kind, group) if call.kind in ("psum", "pmean") else 1.0
    paceable = _kinds.carries_exchange(call.kind)
    exchange = rt.policy.needs_exchange and paceable
    site_obj.measure_only = not paceable
    site_obj.pacing = _kinds.pacing_note(call.kind, rt.policy.needs_exchange, rt.policy.max_delay_s)
    plan = TracePlan(
        call=call,
        axis_name=axis_name,
        axis_index_groups=axis_index_groups,
        granularity=granularity,
        num_slots=num_slots,
        n_pay=_exchange.payload_size(num_slots) if exchange else 0,
        scale=scale,
        table=table,
        am=am,
        axes=rank_axes,
        sizes=rank_sizes,
    )
    done_native = native_or_none(rt, site_obj, probe, plan, x)
    if done_native is not None:
        return done_native[0]

    return _measured_io_callback(rt, site_obj, plan, x)


def _measured_io_callback(rt, site_obj, plan: TracePlan, x):
    """The measured collective through the io_callback probes (the fallback path)."""
    granularity, n_pay, table, am = plan.granularity, plan.n_pay, plan.table, plan.am
    exchange = n_pay > 0
    pre = _io_pre(rt, site_obj, granularity, n_pay, table, am)
    post = _io_post(rt, site_obj, granularity, exchange, plan.scale)
    reduce = _io_reduce(plan.call, exchange, plan.axis_name, plan.axis_index_groups)
    leaves = jax.tree_util.tree_leaves(x)
    tok = token(leaves)
    rank = axis_rank(plan.axes, plan.sizes) if granularity == "device" else jnp.int32(0)
    payload, step_tag = pre(tok, rank)
    out, red = reduce(x, payload, step_tag)
    post(lax.stop_gradient(red), step_tag, rank)
    return out


def _io_pre(rt, site_obj, granularity, n_pay, table, am):
    """The pre-collective io_callback (arrival, delay, payload), leader shards only."""

    def pre_cb(tok, rank):
        del tok
        r = jax.process_index() if granularity == "process" else int(rank)
        payload, step_tag = rt.arrive(site_obj, r)
        return payload, step_tag

    # Without exchange (measure-only or fixed delays) the user's operands are the
    # all-reduce's only operands, exactly as in lax: the pre-callback is tied in
    # through a select that never picks its other side (bitwise the leaf), since
    # CPU/gloo runs each operand of a variadic all-reduce as its own collective.
    # With exchange, the payload is one more (tiny) operand of the same op.
    pre_shape = (
        jax.ShapeDtypeStruct((n_pay,), jnp.float32),
        jax.ShapeDtypeStruct((), jnp.int32),
    )

    # The host callbacks sit outside any custom_jvp: JAX allows no IOEffect
    # there (`jax_enable_checks` enforces it). Their inputs are gradient-free, so
    # autodiff never traces them; only the pure-lax part (tie + collective)
    # carries the custom JVP that keeps lax's own tangent rule (the tie's
    # transpose would add zeros, which turns -0.0 into +0.0).
    def call_pre(args):
        t, r = args
        return io_callback(pre_cb, pre_shape, t, r, ordered=False)

    def skip_pre(args):
        return (jnp.zeros((n_pay,), jnp.float32), jnp.int32(0))

    @jax.custom_batching.custom_vmap
    def pre(tok, rank):
        leader = is_leader(table, am) if table is not None else jnp.bool_(True)
        return lax.cond(leader, call_pre, skip_pre, (tok, rank))

    # A collective over a named axis is elementwise in any other (vmapped)
    # dimension, as lax.psum's own batching rule: one arrival per shard, not one
    # callback per batch element (token and reduced value are dependencies).
    @pre.def_vmap
    def pre_vmap(axis_size, in_batched, tok, rank):
        del axis_size
        return pre(*_unbatch((tok, rank), in_batched)), (False, False)

    return pre


def _io_post(rt, site_obj, granularity, exchange, scale):
    """The post-collective io_callback (record, policy), where the pre one measured."""

    def post_cb(reduced, step_tag, rank):
        r = jax.process_index() if granularity == "process" else int(rank)
        rt.done(site_obj, r, int(step_tag), np.asarray(reduced) if exchange else None, scale)
        return np.int32(0)

    def call_post(args):
        red, tag, r = args
        return io_callback(post_cb, jax.ShapeDtypeStruct((), jnp.int32), red, tag, r, ordered=False)

    def skip_post(args):
        return jnp.int32(0)

    @jax.custom_batching.custom_vmap
    def post(reduced, step_tag, rank):
        return lax.cond(step_tag > 0, call_post, skip_post, (reduced, step_tag, rank))

    @post.def_vmap
    def post_vmap(axis_size, in_batched, reduced, step_tag, rank):
        del axis_size
        return post(*_unbatch((reduced, step_tag, rank), in_batched)), False

    return post


def _io_reduce(call, exchange, axis_name, axis_index_groups):
    """The collective with the arrival tied in, under lax's own tangent rule."""
    lax_fn = call.fn

    @jax.custom_jvp
    def reduce(x, payload, step_tag):
        # `step_tag` is never negative, so each tie rewrites a leaf's first element
        # with itself, bit for bit; XLA cannot know that, so every collective that
        # carries a leaf (whatever XLA's combiner does) waits for the pre-callback.
        # (For a large leaf XLA:CPU makes that a pass over the leaf: `jaxpace.collectives.tie`.)
        leaves, tdef = jax.tree_util.tree_flatten(x)
        never = step_tag < 0
        leaves = [
            tie(leaf, never) if int(np.prod(jnp.shape(leaf))) > 0 else leaf for leaf in leaves
        ]
        tied = jax.tree_util.tree_unflatten(tdef, leaves)
        if exchange:
            out, red = lax_fn((tied, payload), axis_name, axis_index_groups=axis_index_groups)
            # The post-callback reads the payload; XLA may split the all-reduce per operand,
            # so tie one element of every output leaf into it (never true: the same bits).
            tok = token(jax.tree_util.tree_leaves(out))
            return out, tie(red, never & (tok == tok))
        out = lax_fn(tied, axis_name, axis_index_groups=axis_index_groups)
        # The post-callback reads one element of every output leaf: it runs after all.
        return out, token(jax.tree_util.tree_leaves(out)).reshape((1,))

    @reduce.defjvp
    def reduce_jvp(primals, tangents):
        xp, payload, step_tag = primals
        out, red = reduce(xp, payload, step_tag)
        out_t = tangent(call, xp, tangents[0], out, axis_name, axis_index_groups)
        # `red` only feeds the post-callback, through stop_gradient: its tangent is unused.
        return (out, red), (out_t, jnp.zeros_like(red))

    return reduce


def _unbatch(args, in_batched):
    """One shard's dependency values from vmapped ones: the first batch element."""
    return tuple(a[0] if b else a for a, b in zip(args, in_batched, strict=True))
