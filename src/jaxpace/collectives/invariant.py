"""Trace-time check: an operand already invariant over the reduced axis (the skew is hidden).

In `shard_map` (with `check_vma`, the default), `jax.grad` with respect to
replicated parameters inserts its own all-reduce: the gradients reaching
`jaxpace.pmean` are already in sync, so every rank's wait is the same and the
report finds no straggler. `warn_if_invariant` logs that once per site, with the fix,
and tells the caller, which writes it into the records (header `sites`), so the
report refuses to name a culprit from that site (docs/records.md).
"""

from __future__ import annotations

import logging

import jax

__all__ = ["already_invariant", "warn_if_invariant"]

log = logging.getLogger("jaxpace")
_warned: set[str] = set()


def _varying(x) -> frozenset | None:
    """The mesh axes `x` varies over (JAX's vma), or None where JAX does not say."""
    try:
        t = jax.typeof(x)
    except Exception:  # noqa: BLE001
        return None
    mat = getattr(t, "manual_axis_type", None)  # jax 0.10
    v = getattr(mat, "varying", None) if mat is not None else getattr(t, "vma", None)
    return frozenset(v) if v is not None else None


def already_invariant(leaves, axes) -> bool:
    """True when vma checking is on and no leaf varies over any of `axes`."""
    for leaf in leaves:
        v = _varying(leaf)
        if v is None or any(a in v for a in axes):
            return False
    try:  # is vma tracked here? (pmap and check_vma=False track none: no warning)
        probe = _varying(jax.lax.axis_index(axes[0]))
    except Exception:  # noqa: BLE001
        return False
    return probe is not None and axes[0] in probe


def warn_if_invariant(kind: str, leaves, axes, site: str) -> bool:
    """True when the operand is already invariant over `axes` (warns once per site)."""
    if not already_invariant(leaves, axes):
        return False
    if site in _warned:
        return True
    _warned.add(site)
    ax = axes[0]
    log.warning(
        "jaxpace: the operand of %s at %s is already invariant over %r: JAX reduced it "
        "before this call (e.g. jax.grad with respect to replicated parameters inserts its "
        "own all-reduce), so every rank waits the same and the skew is hidden. Differentiate "
        "a varying copy instead: `local = jax.tree.map(lambda p: jax.lax.pcast(p, %r, "
        "to='varying'), params)`, then `jax.grad(loss)(local, ...)` (README, 'Use it').",
        kind,
        site,
        ax,
        ax,
    )
    return True
