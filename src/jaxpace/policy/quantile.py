"""NumPy's linear quantile, bit for bit, on windows already sorted (or read off a kept order).

`np.quantile` and `np.nanquantile` (method "linear") compute a virtual index
`(n - 1) q`, take the entries at its floor and the next one, and interpolate as
`a + (b - a) t`, or `b - (b - a)(1 - t)` for `t >= 0.5`. The functions here do that
arithmetic on sorted data, so that the policy (and `Pacer.stats()`) get NumPy's values
without NumPy's per-row loop. tests/diagnosis/test_diagnosis_scale.py and tests/native/test_kernels.py check
them against NumPy bit for bit.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "nanquantile_lerp",
    "nanquantile_read",
    "quantile_read",
    "sorted_nanquantile",
    "sorted_quantile",
    "quantile_of_window",
]


def quantile_read(filled: int, quantile: float) -> tuple[int, int, int, float, float]:
    """The read of a window of `filled` sorted entries: `(k0, k1, mode, t, 1 - t)`: mode 0 is
    entry k0 alone, 1 `a + (b - a) t`, 2 `b - (b - a)(1 - t)` (t >= 0.5), with `a`, `b` the
    entries k0 and k1 (Python floats for the index and weight)."""
    n = filled
    virtual = (n - 1) * float(quantile)
    if virtual >= n - 1:
        return n - 1, n - 1, 0, 0.0, 1.0
    if virtual < 0:
        return 0, 0, 0, 0.0, 1.0
    prev = math.floor(virtual)
    t = virtual - prev
    return prev, prev + 1, 2 if t >= 0.5 else 1, t, 1 - t


def nanquantile_read(finite: np.ndarray, quantile: float, dtype) -> tuple:
    """`np.nanquantile`'s read of windows with `finite` entries each, sorted (NaN last):
    `(k0, k1, t)`, the entries at the virtual index's floor and the next one (both the last
    when it reaches the end), and the weight."""
    n = finite.astype(np.float64)
    virtual = (n - 1) * np.float64(quantile)
    last = np.maximum(finite - 1, 0)
    prev = np.floor(virtual)
    t = virtual - prev
    at_end = virtual >= n - 1
    k0 = np.where(at_end, last, np.maximum(prev, 0)).astype(dtype)
    k1 = np.where(at_end, last, k0 + 1).astype(dtype)
    return k0, k1, t


def nanquantile_lerp(a, b, t, finite) -> np.ndarray:
    """`a + (b - a) t`, or `b - (b - a)(1 - t)` for `t >= 0.5`; NaN where nothing is finite."""
    diff = b - a
    out = np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)
    out[finite == 0] = np.nan
    return out


def sorted_quantile(v: np.ndarray, quantile: float) -> np.ndarray:
    """`np.quantile(v, quantile, axis=-1)` (method "linear") of `v` already sorted on that axis."""
    k0, k1, mode, t, omt = quantile_read(v.shape[-1], quantile)
    if mode == 0:
        return v[..., k0].copy()
    a, b = v[..., k0], v[..., k1]
    diff = b - a
    return b - diff * omt if mode == 2 else a + diff * t


def sorted_nanquantile(v: np.ndarray, quantile: float) -> np.ndarray:
    """`np.nanquantile(v, quantile, axis=-1)` of `v` sorted along its last axis (NaN last):
    the same values bit for bit, NaN where a row has nothing else, without NumPy's loop over
    the rows in Python (the runtime's `stats()` and the policy's sorted windows use it)."""
    finite = v.shape[-1] - np.isnan(v).sum(axis=-1)
    k0, k1, t = nanquantile_read(finite, quantile, np.intp)
    a = np.take_along_axis(v, k0[..., None], axis=-1)[..., 0]
    b = np.take_along_axis(v, k1[..., None], axis=-1)[..., 0]
    return nanquantile_lerp(a, b, t, finite)


def quantile_of_window(rows: np.ndarray, quantile: float) -> np.ndarray:
    """Each rank's quantile over the window axis of `rows` `(..., window, ranks)`.

    The window axis is made the contiguous one and sorted in one call (NaN last): the same
    values as `np.quantile` / `np.nanquantile` along that axis (NaN for a rank with nothing
    finite), many times faster (`nanquantile` loops over the ranks in Python). `rows` is
    sanitized: its only non-finite is NaN.
    """
    v = np.sort(np.swapaxes(rows, -1, -2), axis=-1)
    if not np.isnan(rows).any():
        return sorted_quantile(v, quantile)
    return sorted_nanquantile(v, quantile)
