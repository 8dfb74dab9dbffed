"""Distinct integers and distinct rows of integer columns, without a sort where a count does.

What the records' readers and the report's stages share to find a run's steps, ranks and
(rank, process, device) triples (`records.site_data`, `records.by_site`, `records.engine`),
and whether rows are every cell of a (step x rank) grid in order (`grid_axes`);
NumPy alone, so any of them imports it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["grid_axes", "int_unique", "unique_rows"]


def int_unique(a: np.ndarray) -> np.ndarray:
    """`np.unique` of an integer array, by counting when its range is small (no sort)."""
    if a.size == 0:
        return np.unique(a)
    lo, hi = int(a.min()), int(a.max())
    if hi - lo <= 4 * a.size + 1024:
        return np.flatnonzero(np.bincount(a - lo if lo else a, minlength=hi - lo + 1)) + lo
    return np.unique(a)


def unique_rows(*cols: np.ndarray) -> np.ndarray:
    """`np.unique(np.stack(cols), axis=1)` for integer columns, sorted the same way.

    Packed into one int64 key (each column offset by its minimum, in as many bits as
    its range needs, the first column highest) when the ranges fit in 63 bits, so the
    unique is one 1-d sort (or a count, `int_unique`) instead of a sort of structured
    rows: 3.9M (rank, process, device) rows in about 0.1 s against 3.4 s.
    """
    arrs = [np.asarray(c).astype(np.int64, copy=False) for c in cols]
    if not arrs or arrs[0].size == 0:
        return np.zeros((len(arrs), 0), np.int64)
    lo = [int(a.min()) for a in arrs]
    bits = [max((int(a.max()) - m).bit_length(), 1) for a, m in zip(arrs, lo, strict=True)]
    if sum(bits) > 62:
        return np.unique(np.stack(arrs), axis=1)
    key = np.zeros(arrs[0].size, np.int64)
    for a, m, b in zip(arrs, lo, bits, strict=True):
        key = (key << b) | (a - m)
    u = int_unique(key)
    out = np.empty((len(arrs), u.size), np.int64)
    for j in range(len(arrs) - 1, -1, -1):
        out[j] = (u & ((1 << bits[j]) - 1)) + lo[j]
        u = u >> bits[j]
    return out


def grid_axes(step: np.ndarray, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """`(steps, ranks)` when the rows are every cell of the (steps x ranks) grid once, step by
    step and each step's ranks in order (`records.parquet_reader` reads a site so, and
    `records.site_data` finds it so); else None. Two comparisons over the rows, where
    placing them takes a count and a lookup of each column."""
    n = step.size
    if n == 0:
        return None
    R = int(np.searchsorted(step, step[0], side="right"))  # (if sorted: checked below)
    if R == 0 or n % R:
        return None
    steps, ranks = step[::R], rank[:R]
    if (np.diff(steps) <= 0).any() or (np.diff(ranks) <= 0).any():
        return None
    if (
        not (step.reshape(-1, R) == steps[:, None]).all()
        or not (rank.reshape(-1, R) == ranks).all()
    ):
        return None
    return steps.astype(np.int64), ranks.astype(np.int64)
