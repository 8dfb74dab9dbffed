"""`adaptive`'s kept window order: each window's sort order, updated in place as entries
arrive, so that a windowed quantile is read off it instead of sorting (the fast path's
estimate stage, from 512 ranks on).

An order `o` has the shape of its windows `h` `(sites, window, ranks)`: `o[s, w, r]` is the
rank of `h[s, w, r]` among its window's entries (NaN last). `odd` `(sites, window)` counts
the NaN entries of each row (a window with any is read with `np.nanquantile`'s arithmetic).

Compiled twins in kernels.cc (loaded by `jaxpace.native.kernels`): `insert` at one row for
every site is `jaxpace_order_insert_i8`; `_order_quantile`'s two reads are
`jaxpace_order_pick_i8`; `insert` followed by `_order_quantile` is
`jaxpace_window_step_i8` (called from `_adaptive_fast._insert_estimate`).
"""

from __future__ import annotations

import functools

import numpy as np

from jaxpace.native import kernels
from jaxpace.policy.quantile import (
    nanquantile_lerp,
    nanquantile_read,
    quantile_of_window,
    quantile_read,
)

__all__ = ["build", "insert", "order_dtype", "window_quantile"]


def order_dtype(window: int) -> type:
    """The order's integer type: int8 up to a window of 127 (what the kernels take)."""
    return np.int8 if window <= kernels.ORDER_MAX_WINDOW else np.int16


def build(history: np.ndarray, filled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`(order, odd)` of windows `history` `(sites, window, ranks)` with `filled` `(sites,)`
    rows written: what `insert` would have kept. Equal entries may rank either way (any
    order of equal values reads the same quantile)."""
    W = history.shape[1]
    order = np.argsort(np.argsort(history, axis=1, kind="stable"), axis=1, kind="stable")
    odd = np.isnan(history).sum(axis=2, dtype=np.int64)
    odd[np.arange(W)[None, :] >= np.asarray(filled).reshape(-1, 1)] = 0  # unwritten rows
    return np.ascontiguousarray(order.astype(order_dtype(W))), odd


def insert(
    history: np.ndarray,
    order: np.ndarray | None,
    odd: np.ndarray | None,
    ia: np.ndarray,
    row: np.ndarray,
    e: np.ndarray,
    every: bool,
    r0: int | None = None,
) -> None:
    """Writes `e` into row `row` of sites `ia`'s windows, in place, keeping `order` and `odd`.

    `r0`: every site is active and writes this one row.

    The entry leaving the window drops out of its rank's order (every entry
    above it moves down one); the new one goes above every entry `<=` it
    (above all of them if it is NaN), and every entry above it moves up one.
    """
    if every and r0 is not None and _insert_kernel(history, order, odd, ia, r0, e):
        return
    if every:
        h, o, r, x = history, order, row, e
    else:
        h, r, x = history[ia], row[ia], e[ia]
        o = None if order is None else order[ia]
    at = (slice(None), r0) if r0 is not None else (np.arange(len(r)), r)
    if o is not None:
        o -= o > o[at][:, None, :]
    h[at] = x
    if o is not None:
        le = h <= x[:, None, :]
        if _count_odd(odd, ia, r, x):
            le |= np.isnan(x)[:, None, :]
        below = le.sum(axis=1, dtype=o.dtype)
        o += ~le
        o[at] = below - 1
    if not every:
        history[ia] = h
        if o is not None:
            order[ia] = o


_POS_INF_BITS = np.float64(np.inf).view(np.uint64)


def _insert_kernel(history, order, odd, ia, r0, e) -> bool:
    """`insert` for every site at row `r0` through the compiled kernel; False if it cannot."""
    if order is None or not kernels.order_insert(history, order, r0, e):
        return False
    _count_odd(odd, ia, r0, e)
    return True


def _count_odd(odd: np.ndarray, ia: np.ndarray, r, x: np.ndarray) -> bool:
    """Stores in `odd[ia, r]` how many of each site's new entries `x` are NaN (what sends
    `window_quantile` off the plain order read); True if any are.

    `x` is sanitized: NaN is the canonical quiet NaN, nothing is negative (not even -0.0).
    Read as unsigned integers, exactly NaN (and any -0.0, were one there) lie above +inf.
    """
    bad = x.view(np.uint64) > _POS_INF_BITS
    if bad.any():
        odd[ia, r] = np.count_nonzero(bad, axis=1)
        return True
    odd[ia, r] = 0
    return False


def window_quantile(
    history: np.ndarray,
    order: np.ndarray | None,
    odd: np.ndarray | None,
    idx: np.ndarray,
    filled: int,
    quantile: float,
    num_sites: int,
) -> np.ndarray:
    """`quantile_of_window(history[idx, :filled], quantile)`, read off `order` where it can.

    A window with no NaN has one sorted order of its values (sanitized entries
    hold no -0.0), which `order` gives: the quantile is `quantile.sorted_quantile`'s
    arithmetic on the entries of the two ranks it needs. With NaN (ranked
    last), each rank's finite entries are the first ranks of its window, and
    the quantile is `np.nanquantile`'s: the same arithmetic on as many entries
    as are finite.
    """
    if order is None:
        return quantile_of_window(history[idx, :filled], quantile)
    full = len(idx) == num_sites
    if not odd.any():
        if full:
            return _order_quantile(history, order, filled, quantile)
        return _order_quantile(history[idx], order[idx], filled, quantile)
    clean = odd[idx].sum(axis=1) == 0
    out = np.empty((len(idx), history.shape[2]))
    ic = idx[clean]
    if ic.size:
        out[clean] = _order_quantile(history[ic], order[ic], filled, quantile)
    slow = np.flatnonzero(~clean)
    if slow.size:
        i = idx[slow]
        finite = filled - np.isnan(history[i, :filled]).sum(axis=1)
        out[slow] = _order_nanquantile(history[i], order[i], finite, quantile)
    return out


def _order_nanquantile(
    h: np.ndarray, o: np.ndarray, finite: np.ndarray, quantile: float
) -> np.ndarray:
    """`np.nanquantile` of each (site, rank) window, from `o`: `finite` `(sites, ranks)` entries.

    NumPy's per-column arithmetic (method "linear"): virtual index
    `(finite - 1) q`, the entries at its floor and the next one (both the last
    when it reaches the end), and `a + (b - a) t`, `b - (b - a)(1 - t)` for
    `t >= 0.5`; NaN where nothing is finite.
    """
    k0, k1, t = nanquantile_read(finite, quantile, o.dtype)
    return nanquantile_lerp(_at_rank(h, o, k0), _at_rank(h, o, k1), t, finite)


def _order_quantile(h: np.ndarray, o: np.ndarray, filled: int, quantile: float) -> np.ndarray:
    """`quantile.sorted_quantile` of each (site, rank) window's first `filled` ranks, per `o`.

    The same float64 arithmetic as `quantile.sorted_quantile` (in Python floats for the
    index and weight).
    """
    k0, k1, mode, t, omt = quantile_read(filled, quantile)
    if mode == 0:
        return _at_rank(h, o, k0)
    picked = kernels.order_pick(h, o, k0, k1)
    a, b = picked if picked is not None else (_at_rank(h, o, k0), _at_rank(h, o, k1))
    diff = b - a
    return b - diff * omt if mode == 2 else a + diff * t


@functools.lru_cache(maxsize=32)
def _gather_index(sites: int, window: int, ranks: int) -> tuple[np.ndarray, np.ndarray]:
    """`_at_rank`'s constants: each window slot's number, and each (site, rank)'s offset."""
    slots = np.arange(window, dtype=np.uint8 if window <= 255 else np.uint16)
    base = (np.arange(sites) * (window * ranks))[:, None] + np.arange(ranks)
    slots.flags.writeable = base.flags.writeable = False
    return slots, base


def _at_rank(h: np.ndarray, o: np.ndarray, k: int | np.ndarray) -> np.ndarray:
    """`(sites, ranks)`: the entry of rank `k` (one, or one per (site, rank)) in each
    window of `h` `(sites, window, ranks)`."""
    S, W, R = h.shape
    slots, base = _gather_index(S, W, R)
    hit = o == (k if np.ndim(k) == 0 else k[:, None, :])
    # The one slot holding rank `k`: sum over the window of slot number x hit.
    slot = np.einsum("swr,w->sr", hit.view(np.uint8), slots).astype(np.intp)
    slot *= R
    slot += base
    return np.take(h.reshape(-1), slot)
