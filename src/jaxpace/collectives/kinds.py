"""The collectives jaxpace measures: each one's `jax.lax` call, and whether pacing can ride on it.

A *kind* is the name of a `jax.lax` collective (`"psum"`, `"all_gather"`, ...); `lax_fn`
binds its keyword options (`axis`, `tiled`, `perm`, ...) into one calling convention,
`fn(tree, axis_name, axis_index_groups=None)`, that the measured path calls exactly once.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

from jax import lax

__all__ = [
    "ELEMENTWISE_KINDS",
    "LAX",
    "EXCHANGE_KINDS",
    "KINDS",
    "Call",
    "LINEAR_KINDS",
    "carries_exchange",
    "lax_fn",
    "pacing_note",
]

# The in-band exchange is one more operand of the same (variadic) all-reduce: only psum and
# pmean reduce all their leaves in one. `lax.pmax`/`pmin` bind one all-reduce per leaf, so a
# payload there would be an all-reduce of its own. Every other kind is measured only (no
# hidden collective is added).
EXCHANGE_KINDS = frozenset({"psum", "pmean"})
# Collectives whose JVP is the same collective on the tangent (lax's own rule).
LINEAR_KINDS = frozenset({"psum", "pmean", "all_gather", "psum_scatter", "ppermute", "all_to_all"})
KINDS = ("psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "ppermute", "all_to_all")
# Collectives that act elementwise in any dimension other than the named axis.
ELEMENTWISE_KINDS = frozenset({"psum", "pmean", "pmax", "pmin", "ppermute"})
# Kinds whose every rank needs every other rank's data (arrival skew as for all-reduce).
_POINT_TO_POINT = frozenset({"ppermute"})


# The real `jax.lax` functions, captured at import: a test harness that replaces the public
# names with jaxpace's drop-ins (benchmarks/_peer_plugin.py) must not make jaxpace recurse.
LAX = {k: getattr(lax, k) for k in KINDS}


class Call(NamedTuple):
    """One measured collective's kind and its `lax_fn` (options bound)."""

    kind: str
    fn: Any
    params: dict = {}  # noqa: RUF012 - read only


def major_dim(kind: str, params: dict) -> int | None:
    """The result dimension that a `kind` collective gathers or scatters along, or None.

    XLA:CPU lays that dimension out most major (an all-gather over axis 1 of a matrix gives a
    column-major result); the done probe asks for its operand in that layout, so that no
    copy of the result is made for it. An untiled `psum_scatter` drops the dimension: None;
    so does a negative dimension (its result's layout is left row-major).

    >>> major_dim("all_gather", {"axis": 1, "tiled": True}), major_dim("psum", {})
    (1, None)
    """
    if kind == "all_gather":
        d = int(params.get("axis", 0))
    elif kind == "psum_scatter" and params.get("tiled", False):
        d = int(params.get("scatter_dimension", 0))
    else:
        return None
    return d if d >= 0 else None  # (a negative one: left row-major)


def carries_exchange(kind: str) -> bool:
    """Whether the in-band exchange (and so adaptive pacing) can ride on `kind`."""
    return kind in EXCHANGE_KINDS


def pacing_note(kind: str, exchange_wanted: bool, max_delay_s: float = 1.0) -> str:
    """What the policy does at a site of `kind` (the `pacing` field of `stats()`)."""
    if kind in EXCHANGE_KINDS:
        if max_delay_s <= 0:
            return "paceable; this policy never delays (max_delay_s = 0)"
        if exchange_wanted:
            return "paced: the policy's in-band exchange rides on this all-reduce"
        return "paced by the policy (no exchange needed)"
    how = "point to point: a rank waits for its source only" if kind in _POINT_TO_POINT else ""
    why = (
        f"measure only: jax.lax.{kind} cannot carry the in-band exchange without changing "
        "what XLA runs, and jaxpace adds no collective of its own"
    )
    return f"{why} ({how})" if how else why


def lax_fn(kind: str, params: dict[str, Any] | None = None):
    """`fn(tree, axis_name, axis_index_groups=None)`: `jax.lax.<kind>` with `params` bound.

    Raises:
      ValueError: `kind` is not one of `KINDS`.
    """
    if kind not in KINDS:
        raise ValueError(f"`kind` must be one of {', '.join(KINDS)}; got {kind!r}.")
    params = dict(params or {})
    if kind == "ppermute":
        return functools.partial(_ppermute, **params)
    if not params:
        return LAX[kind]
    return functools.partial(_call, LAX[kind], params)


def _call(fn, params, tree, axis_name, axis_index_groups=None):
    if axis_index_groups is None:
        return fn(tree, axis_name, **params)
    return fn(tree, axis_name, axis_index_groups=axis_index_groups, **params)


def _ppermute(tree, axis_name, axis_index_groups=None, *, perm):
    del axis_index_groups  # lax.ppermute has none
    return LAX["ppermute"](tree, axis_name, perm)
