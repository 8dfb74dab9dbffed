"""Every access jaxpace makes to JAX internals, each with a canary test.

JAX's private modules move between releases. Each function here either
returns what the internal gives or a documented fallback; none of them is
called per step. `tests/test_jax_compat.py` calls each one on the installed
jax and fails loudly if an internal moved (so a silent fallback never hides a
lost feature).
"""

from __future__ import annotations

import inspect
import os
from typing import Any

__all__ = [
    "bound_axis_sizes",
    "concrete_mesh",
    "current_trace",
    "distributed_client",
    "inside_remat",
    "is_unknown_tracer",
    "profile_session",
    "profiler_stop_collect",
    "reduction_axes",
]


def bound_axis_sizes() -> dict | None:
    """Every bound axis name -> size, or None if this JAX hides its axis env.

    Used only to list the bound axes in an error message; the decision that
    an axis is unbound is made with the public `jax.lax.axis_size`.
    """
    try:
        from jax._src import core

        return dict(core.get_axis_env().axis_sizes)
    except Exception:  # noqa: BLE001 - internal API; the canary test catches a move
        return None


def concrete_mesh() -> Any:
    """The concrete mesh set by `jax.set_mesh`, or None."""
    try:
        from jax._src.mesh import get_concrete_mesh

        cm = get_concrete_mesh()
    except Exception:  # noqa: BLE001 - internal API; the canary test catches a move
        return None
    if cm is None or getattr(cm, "empty", True):
        return None
    return cm


def current_trace() -> Any:
    """The trace being built now (one per traced function body), or None if hidden.

    Used only to tell apart two calls of one site in one traced body from one
    call traced again (a retrace, a second jit).
    """
    try:
        from jax._src import core

        return core.trace_ctx.trace
    except Exception:  # noqa: BLE001 - internal API; the canary test catches a move
        return None


def is_unknown_tracer(x: Any) -> bool:
    """Whether `x` is an unknown of a partial-eval trace (a tangent JAX will transpose)."""
    try:
        from jax._src.interpreters import partial_eval as pe

        return isinstance(x, pe.JaxprTracer) and not x.pval.is_known()
    except Exception:  # noqa: BLE001 - internal API moved: assume not linear
        return False


def distributed_client() -> Any:
    """The `jax.distributed` key-value client, or None when not initialized."""
    try:
        from jax._src import distributed

        return distributed.global_state.client
    except Exception:  # noqa: BLE001 - internal API; the canary test catches a move
        return None


class _ProfileDataExport:
    """`export(data, log_dir)`: writes a stopped session's `ProfileData` as `stop_trace`
    would have (`jax.profiler.export_profile_data`), on any thread."""

    @staticmethod
    def export(data: Any, log_dir: str) -> None:
        import jax

        jax.profiler.export_profile_data(data, log_dir)


def profile_session(options: Any) -> tuple[Any, Any] | None:
    """`(session, exporter)`: a `jax.profiler.ProfileSession` that collects without writing
    (no `log_dir`: its `stop()` returns the `ProfileData`; not started yet), and the object
    whose `export(data, log_dir)` writes it later; None on a JAX without that public API
    (0.10: then `start_trace` and `profiler_stop_collect`). Its `start()` raises "Profile has
    already been started" while another session runs, as `start_trace` does."""
    import jax

    cls = getattr(jax.profiler, "ProfileSession", None)
    if cls is None or not hasattr(jax.profiler, "export_profile_data"):
        return None
    return cls(log_dir=None, profiler_options=options), _ProfileDataExport


def profiler_stop_collect() -> tuple[Any, bytes, str] | None:
    """Ends the `jax.profiler.start_trace` session without writing it: `(session, xspace,
    log_dir)`, where `session.export(xspace, log_dir)` later writes the files `stop_trace`
    would have (on any thread). `jax.profiler.stop_trace` collects and converts on the
    calling thread (41 ms on a 5-call CPU window, of which the conversion is 28 ms);
    jaxpace.watch does the conversion on its own thread. None when this JAX's profiler state
    moved (then call `jax.profiler.stop_trace`); raises what `stop` raises (no session).
    """
    try:
        from jax._src import profiler as p

        state, clear = p._profile_state, p.clear_metadata
        lock, _ = state.lock, state.profile_session
    except Exception:  # noqa: BLE001 - internal API; the canary test catches a move
        return None
    with lock:
        session = state.profile_session
        if session is None or not hasattr(session, "export"):
            if session is None:
                raise RuntimeError("No profile started")
            return None
        xspace = session.stop()
        log_dir = str(state.log_dir)
        state.reset()
        clear()
    return session, xspace, log_dir


REMAT_FILE = os.path.join("jax", "_src", "ad_checkpoint.py")


def inside_remat() -> bool:
    """Whether this call is being traced by `jax.checkpoint` (remat).

    JAX traces a checkpointed function to a jaxpr eagerly, before it knows
    whether it will be differentiated. There is no public flag for "inside
    remat", so look for `jax/_src/ad_checkpoint.py` on the stack (trace time
    only, never per step).
    """
    f = inspect.currentframe()
    try:
        while f is not None:
            if f.f_code.co_filename.endswith(REMAT_FILE):
                return True
            f = f.f_back
        return False
    finally:
        del f


def reduction_axes(x: Any) -> tuple[frozenset, frozenset]:
    """`(unreduced, reduced)` mesh axes of `x`'s explicit-sharding type (empty when none).

    Inside `shard_map` JAX keeps them on the manual axis type (`aval.mat`),
    elsewhere on the sharding spec (`jax.typeof(x).sharding.spec`). Values of
    these types may not meet other types in arithmetic (`ShardingTypeError`).
    """
    try:
        import jax

        aval = jax.typeof(x)
    except Exception:  # noqa: BLE001 - not a JAX value (e.g. a Python scalar)
        return frozenset(), frozenset()
    unreduced, reduced = set(), set()
    for holder in (
        getattr(aval, "mat", None),
        getattr(getattr(aval, "sharding", None), "spec", None),
    ):
        unreduced |= set(getattr(holder, "unreduced", None) or ())
        reduced |= set(getattr(holder, "reduced", None) or ())
    return frozenset(unreduced), frozenset(reduced)


# The stall watchdog's calls on `distributed_client()` (off the hot path, on its own thread).
KV_METHODS = ("key_value_set", "key_value_dir_get", "key_value_delete")


def distributed_client_type() -> Any:
    """The class of `distributed_client()`, or None if this JAX moved it (canary test only)."""
    try:
        from jax._src.lib import _jax

        return _jax.DistributedRuntimeClient
    except Exception:  # noqa: BLE001 - internal API; the canary test catches a move
        return None


def coordination_service(address: str, num_processes: int) -> Any:
    """A `jax.distributed` coordination service started in this process (what process 0 of a
    job runs), listening on `address` (`host:port`). For tests and benchmarks of the
    key-value store at scale only (`tests/watch/test_watch_exchange_scale.py`,
    `benchmarks/watch_exchange.py`); `.shutdown()` ends it. Raises if this JAX moved it."""
    from jax._src.lib import _jax

    return _jax.get_distributed_runtime_service(address, num_processes)


def coordination_client(address: str, process_id: int, timeout_s: int = 30) -> Any:
    """A `jax.distributed` key-value client of the service at `address`, connected as
    `process_id` (the client `jax.distributed.initialize` keeps in `distributed_client()`).
    For tests and benchmarks only; raises if this JAX moved it."""
    from jax._src.lib import _jax

    c = _jax.get_distributed_runtime_client(
        address, process_id, init_timeout=timeout_s, shutdown_on_destruction=False
    )
    c.connect()
    return c


def jit_keyed_flag(name: str, help_text: str) -> Any:
    """A boolean JAX config state that is part of the `jax.jit` cache key and the trace
    context (`jax._src.config.bool_state(..., include_in_jit_key=True,
    include_in_trace_context=True)`): `with flag(True):` traces and caches its own program,
    and `flag.value` reads it at trace time. `jax.config` offers no public way to define
    one. Used for `jaxpace.collectives.measure.pass_through` (watch's unmeasured form)."""
    from jax._src import config

    return config.bool_state(
        name, False, help_text, include_in_jit_key=True, include_in_trace_context=True
    )


def flag_setters(flag: Any) -> tuple[Any, Any]:
    """`(set, restore)` for a `jit_keyed_flag` on the calling thread: `prev = set(value)`
    then `restore(prev)` does what `with flag(value):` does, without making a context
    manager object on each use. `State.swap_local` / `State.set_local` are what the
    context manager calls (`jax._src.config.StateContextManager`); where this JAX lacks
    them, or the flag has a thread-local hook they would skip, its context manager."""
    swap, put = getattr(flag, "swap_local", None), getattr(flag, "set_local", None)
    if swap is not None and put is not None and not getattr(flag, "_update_thread_local_hook", 1):
        return swap, put

    def enter(value: Any) -> Any:
        cm = flag(value)
        cm.__enter__()
        return cm

    def leave(cm: Any) -> None:
        cm.__exit__(None, None, None)

    return enter, leave


def hlo_dialect() -> Any:
    """`jax._src.lib.mlir.dialects.hlo`: the StableHLO op builders a lowering rule emits
    (`compare`, `select`, `broadcast_in_dim`); `jax.interpreters.mlir` exposes no public
    module for them. Used by the native probes' lowering (`jaxpace.native.primitive`)."""
    from jax._src.lib.mlir.dialects import hlo

    return hlo


def partial_eval() -> Any:
    """`jax._src.interpreters.partial_eval`: where a primitive registers its remat rule
    (`partial_eval_jaxpr_custom_rules`) and its DCE rule (`dce_rules`), and `dce_jaxpr`.
    The native probes register both (`jaxpace.native.primitive`); a missing table means
    measured calls skip remat and tie `done`'s result in instead."""
    from jax._src.interpreters import partial_eval as pe

    return pe


def jaxpr_var_type() -> type:
    """`jax._src.core.Var`: a jaxpr variable (not a literal), as a remat rule tells them apart."""
    from jax._src.core import Var

    return Var
