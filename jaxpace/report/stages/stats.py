"""Small numerical helpers shared by the analysis stages."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["col_mean", "mean_finite", "median_of_others", "robust_std", "t95"]

# Two-sided 95% Student-t critical values for 1..30 degrees of freedom.
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t95(df: int) -> float:
    """Two-sided 95% Student-t critical value for `df` degrees of freedom (inf below 1)."""
    if df < 1:
        return math.inf
    return _T95[df - 1] if df <= 30 else 1.96 + 2.4 / df


def median_of_others(x: np.ndarray) -> np.ndarray:
    """For each (row, column), the median of the row without that column.

    >>> median_of_others(np.array([[1.0, 2.0, 3.0, 10.0]])).tolist()
    [[3.0, 3.0, 2.0, 2.0]]
    """
    S, R = x.shape
    if R < 2:
        return np.zeros_like(x)
    order = np.argsort(x, axis=1)
    v = np.take_along_axis(x, order, axis=1)
    p = np.arange(R)[None, :]  # sorted position of the removed element

    def other(k: int) -> np.ndarray:  # k-th smallest of the row without position p
        return np.where(p > k, v[:, [k]], v[:, [k + 1]])

    m = R - 1
    med_sorted = other((m - 1) // 2) if m % 2 else 0.5 * (other(m // 2 - 1) + other(m // 2))
    out = np.empty_like(x)
    np.put_along_axis(out, order, med_sorted, axis=1)
    return out


def robust_std(x: np.ndarray, axis: int = 0) -> np.ndarray:
    """1.4826 times the median absolute deviation (the std for normal data)."""
    med = np.median(x, axis=axis, keepdims=True)
    return 1.4826 * np.median(np.abs(x - med), axis=axis)


def mean_finite(x: np.ndarray) -> float:
    """Mean of the finite entries; NaN when there are none."""
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else math.nan


def col_mean(a: np.ndarray, num_cols: int) -> np.ndarray:
    """Column means of a (rows, num_cols) array; NaN per column when it has no rows."""
    return a.mean(axis=0) if a.shape[0] else np.full(num_cols, np.nan)
