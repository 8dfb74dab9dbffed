"""The tie: a leaf made to depend on a scalar (the arrive probe's step tag), with the same bits.

Only a real data dependency orders a probe before a collective (`lax.optimization_barrier`
is compiled away on CPU: the collective then runs before the probe). So every operand leaf
of a measured collective is rewritten through a `select` on a predicate that is never true
(`step_tag < 0`, with `step_tag >= 0` always): its values, -0.0 and NaN payloads included,
are the leaf's own, and XLA cannot fold the select because the predicate comes from a
side-effecting custom call.

How the select is spread over the leaf decides what it costs:
- a small leaf (up to `WHOLE_LEAF_BYTES`) is selected whole: XLA fuses the select into the
  leaf's producer (no kernel at all), or it is one pass over a few KiB. Rewriting only its
  first element would cost a copy of the leaf whenever XLA cannot write it in place (a
  `jit` argument that is not donated, a value used again later) plus one more kernel per
  leaf per device (the FSDP example's step has 33 small leaves; docs/benchmarks.md);
- a larger leaf gets only its first element rewritten (`dynamic_update_slice`). XLA fuses
  the slice of that element into the update's kernel, and XLA:CPU then writes the kernel's
  output as a new buffer: a pass over the leaf (measured: 10 ms of CPU time per step over 8
  devices for an 8 MiB leaf each; docs/benchmarks.md). The `io_callback` path keeps this
  form. The native path uses `tie` only between `WHOLE_LEAF_BYTES` and `IN_PLACE_BYTES`
  (256 KiB) and for `unreduced`/`reduced` leaves: a smaller leaf comes back from the arrive
  probe itself (copied by the CPU handler, selected in the CUDA lowering), and a larger one's
  first element does, so that XLA writes it in place
  (`jaxpace.native.primitive.native_collective`).
- An `unreduced`/`reduced` leaf (explicit sharding) cannot meet another type in arithmetic
  (JAX raises `ShardingTypeError`), so it goes through an optimization barrier instead:
  used only on the io_callback path, where the reduced token orders the post-callback.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxpace import _jax_compat

__all__ = ["WHOLE_LEAF_BYTES", "first_scalar", "leaf_bytes", "reduction_typed", "tie", "token"]

WHOLE_LEAF_BYTES = 64 * 1024


def reduction_typed(leaf) -> bool:
    """Whether `leaf`'s type is `unreduced`/`reduced` over some mesh axis (explicit sharding)."""
    unreduced, reduced = _jax_compat.reduction_axes(leaf)
    return bool(unreduced or reduced)


def leaf_bytes(leaf) -> int:
    """The size of array `leaf` in bytes (from its shape and dtype; nothing is computed)."""
    return int(np.prod(jnp.shape(leaf))) * jnp.dtype(leaf.dtype).itemsize


def tie(leaf, never):
    """`leaf`, bit for bit, made to depend on the boolean scalar `never` (always False).

    >>> import jax.numpy as jnp
    >>> x = jnp.array([-0.0, jnp.nan, 3.0])
    >>> y = tie(x, jnp.int32(5) < 0)
    >>> bool((x.view(jnp.int32) == y.view(jnp.int32)).all())
    True
    """
    if reduction_typed(leaf):
        out, _ = lax.optimization_barrier((leaf, never))
        return out
    shape = jnp.shape(leaf)
    if not shape or leaf_bytes(leaf) <= WHOLE_LEAF_BYTES:
        return lax.select(jnp.broadcast_to(never, shape), jnp.zeros_like(leaf), leaf)
    ndim = len(shape)
    first = lax.slice(leaf, (0,) * ndim, (1,) * ndim)
    upd = lax.select(jnp.broadcast_to(never, first.shape), jnp.zeros_like(first), first)
    return lax.dynamic_update_slice(leaf, upd, (0,) * ndim)


def first_scalar(leaf):
    """Element 0 of `leaf` as a gradient-free float32 scalar (the real part, if complex)."""
    v = jnp.ravel(leaf)[0]
    if jnp.issubdtype(v.dtype, jnp.complexfloating):
        v = jnp.real(v)
    return lax.stop_gradient(v).astype(jnp.float32)


def token(leaves):
    """A float32 scalar that depends on every non-empty leaf (one element each), gradient-free:
    what the `io_callback` arrive probe reads, so it runs once every operand is ready (the
    native probes take the leaves themselves as operands instead: no arithmetic on them).

    `unreduced`/`reduced` leaves cannot meet other types in arithmetic, so the token is
    ordered after them by an optimization barrier instead (io_callback path only).
    """
    tok = jnp.float32(0)
    typed = []
    for leaf in leaves:
        if not hasattr(leaf, "shape") or np.prod(leaf.shape) == 0:
            continue
        if reduction_typed(leaf):
            typed.append(lax.stop_gradient(leaf))
            continue
        tok = tok + first_scalar(leaf)
    if typed:
        _, tok = lax.optimization_barrier((typed, tok))
    return lax.stop_gradient(tok)
