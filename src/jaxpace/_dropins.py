"""The module-level drop-ins `jaxpace.psum` / `jaxpace.pmean`: `jax.lax`'s, on the default `Pacer`."""

from __future__ import annotations

from jaxpace._runtime import default_pacer

__all__ = ["pmean", "psum"]


def psum(x, axis_name, *, axis_index_groups=None, site: str | None = None):
    """Drop-in for `jax.lax.psum` that measures each process's arrival.

    Use it inside `jax.shard_map` or `jax.pmap` exactly like `lax.psum`. The
    result is bitwise identical to `lax.psum` (gradients too); the default
    `Pacer` records arrival and wait times and applies its pacing policy. Where
    timing cannot apply (e.g. a `vmap` axis, partial-manual `shard_map`), it is
    exactly `lax.psum` and `Pacer.stats()` says why.

    Args:
      x: array or pytree of arrays.
      axis_name: a bound axis name, or a tuple of them.
      axis_index_groups: as in `lax.psum`.
      site: a stable name for this collective; default: the caller's
        `file:line:function`.

    Returns:
      `lax.psum(x, axis_name, axis_index_groups=axis_index_groups)`.

    >>> import jax, jax.numpy as jnp, jaxpace as jp
    >>> jax.vmap(lambda v: jp.psum(v, "i"), axis_name="i")(jnp.arange(3.0))
    Array([3., 3., 3.], dtype=float32)
    """
    return default_pacer().psum(x, axis_name, axis_index_groups=axis_index_groups, site=site)


def pmean(x, axis_name, *, axis_index_groups=None, site: str | None = None):
    """Drop-in for `jax.lax.pmean` that measures each process's arrival.

    Same contract as `jaxpace.psum`, with `lax.pmean`'s result (integer inputs
    give floating outputs, as in `lax.pmean`).

    >>> import jax, jax.numpy as jnp, jaxpace as jp
    >>> jax.vmap(lambda v: jp.pmean(v, "i"), axis_name="i")(jnp.arange(3.0))
    Array([1., 1., 1.], dtype=float32)
    """
    return default_pacer().pmean(x, axis_name, axis_index_groups=axis_index_groups, site=site)
