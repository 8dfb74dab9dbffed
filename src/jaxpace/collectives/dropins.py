"""The module-level drop-ins (`jaxpace.psum`, `jaxpace.all_gather`, ...): `jax.lax`'s, on the default `Pacer`."""

from __future__ import annotations

from jaxpace.runtime import default_pacer

__all__ = ["all_gather", "all_to_all", "pmax", "pmean", "pmin", "ppermute", "psum", "psum_scatter"]


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


def pmax(x, axis_name, *, axis_index_groups=None, site: str | None = None):
    """Drop-in for `jax.lax.pmax` that measures each rank's arrival (measure only).

    Bitwise `lax.pmax` (its gradients and errors too). The in-band exchange rides only on
    `psum`/`pmean`, so this site is timed and recorded but never paced
    (`Pacer.stats()[site].pacing` says so).

    >>> import jax, jax.numpy as jnp, jaxpace as jp
    >>> jax.vmap(lambda v: jp.pmax(v, "i"), axis_name="i")(jnp.arange(3.0))
    Array([2., 2., 2.], dtype=float32)
    """
    return default_pacer().pmax(x, axis_name, axis_index_groups=axis_index_groups, site=site)


def pmin(x, axis_name, *, axis_index_groups=None, site: str | None = None):
    """Drop-in for `jax.lax.pmin` that measures each rank's arrival (measure only).

    Same contract as `jaxpace.pmax`, with `lax.pmin`'s result.

    >>> import jax, jax.numpy as jnp, jaxpace as jp
    >>> jax.vmap(lambda v: jp.pmin(v, "i"), axis_name="i")(jnp.arange(3.0))
    Array([0., 0., 0.], dtype=float32)
    """
    return default_pacer().pmin(x, axis_name, axis_index_groups=axis_index_groups, site=site)


def all_gather(
    x, axis_name, *, axis_index_groups=None, axis=0, tiled=False, to="varying", site=None
):
    """Drop-in for `jax.lax.all_gather` that measures each rank's arrival (measure only).

    Bitwise `lax.all_gather` with the same options, values and gradients (its transpose
    is lax's reduce-scatter), and the same collectives in the compiled program. Arrival
    skew means what it means for `psum`: every rank needs every other rank's shard.
    Recorded and reported, never paced (no exchange can ride without an extra collective).

    Args:
      x: array or pytree of arrays.
      axis_name, axis_index_groups, axis, tiled, to: as in `lax.all_gather`.
      site: a stable name for this collective; default: the caller's `file:line:function`.

    >>> import jax, jax.numpy as jnp, jaxpace as jp
    >>> jax.vmap(lambda v: jp.all_gather(v, "i"), axis_name="i")(jnp.arange(2.0))
    Array([[0., 1.],
           [0., 1.]], dtype=float32)
    """
    return default_pacer().all_gather(
        x, axis_name, axis_index_groups=axis_index_groups, axis=axis, tiled=tiled, to=to, site=site
    )


def psum_scatter(
    x, axis_name, *, scatter_dimension=0, axis_index_groups=None, tiled=False, site=None
):
    """Drop-in for `jax.lax.psum_scatter` (reduce-scatter) that measures arrival (measure only).

    Same contract as `jaxpace.all_gather`, with `lax.psum_scatter`'s options and result.

    >>> import jax, jax.numpy as jnp, jaxpace as jp
    >>> jax.vmap(lambda v: jp.psum_scatter(v, "i"), axis_name="i")(jnp.ones((2, 2)))
    Array([2., 2.], dtype=float32)
    """
    return default_pacer().psum_scatter(
        x,
        axis_name,
        scatter_dimension=scatter_dimension,
        axis_index_groups=axis_index_groups,
        tiled=tiled,
        site=site,
    )


def ppermute(x, axis_name, perm, *, site: str | None = None):
    """Drop-in for `jax.lax.ppermute` that measures each rank's arrival (measure only).

    Point to point: a rank waits for its source only, so its wait is the lateness of
    its source (or the link between them), not of the slowest rank. The site keeps
    `perm`, so the report can name a slow pair of a pipeline. Never paced.

    >>> import jax, jax.numpy as jnp, jaxpace as jp
    >>> jax.vmap(lambda v: jp.ppermute(v, "i", [(0, 1), (1, 0)]), axis_name="i")(
    ...     jnp.arange(2.0))
    Array([1., 0.], dtype=float32)
    """
    return default_pacer().ppermute(x, axis_name, perm, site=site)


def all_to_all(
    x, axis_name, split_axis, concat_axis, *, axis_index_groups=None, tiled=False, site=None
):
    """Drop-in for `jax.lax.all_to_all` that measures each rank's arrival (measure only).

    Same contract as `jaxpace.all_gather`, with `lax.all_to_all`'s options and result.

    >>> import jax, jax.numpy as jnp, jaxpace as jp
    >>> jax.vmap(lambda v: jp.all_to_all(v, "i", 0, 0), axis_name="i")(
    ...     jnp.arange(4.0).reshape(2, 2))
    Array([[0., 2.],
           [1., 3.]], dtype=float32)
    """
    return default_pacer().all_to_all(
        x,
        axis_name,
        split_axis,
        concat_axis,
        axis_index_groups=axis_index_groups,
        tiled=tiled,
        site=site,
    )
