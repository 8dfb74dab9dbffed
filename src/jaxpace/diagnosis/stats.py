"""Small numerical helpers shared by the report's stages and the runtime's live view.

NumPy, and `scipy.special` for Student's t (imported on first use).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "batch_means_se",
    "col_mean",
    "holm",
    "mean_finite",
    "median_of_others",
    "num_text",
    "p_text",
    "robust_std",
    "t95",
    "t_isf",
    "t_sf",
]

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
    # Removing x[i, j] leaves the row's order statistics v shifted by one above
    # x's own position p; "p > k" is "x > v[k]" (with ties, removing any of the equal
    # values leaves the same multiset). Only two or three central order
    # statistics are needed: a partial sort, O(R) per row.
    m = R - 1
    ks = [(m - 1) // 2, (m - 1) // 2 + 1] if m % 2 else [m // 2 - 1, m // 2, m // 2 + 1]
    v = np.partition(x, ks, axis=1)

    def other(k: int) -> np.ndarray:  # k-th smallest of the row without x itself
        return np.where(x > v[:, [k]], v[:, [k]], v[:, [k + 1]])

    if m % 2:
        return other((m - 1) // 2)
    return 0.5 * (other(m // 2 - 1) + other(m // 2))


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


def t_sf(t: np.ndarray | float, df: float) -> np.ndarray:
    """One-sided upper tail P(T > t) of Student's t with `df` > 0 degrees of freedom.

    `scipy.special.stdtr`, vectorized; a NaN `t` (no evidence) gives 1.

    >>> [round(float(t_sf(x, 10)), 4) for x in (0.0, 2.228, 4.587)]
    [0.5, 0.025, 0.0005]
    """
    from scipy.special import stdtr  # lazily: `import jaxpace` stays light

    t = np.asarray(t, dtype=np.float64)
    return np.where(np.isnan(t), 1.0, stdtr(df, -t))


def t_isf(p: float, df: float) -> float:
    """The t with `P(T > t) = p` for Student's t with `df` > 0 degrees of freedom.

    `scipy.special.stdtrit` (the lower-tail inverse, so small `p` keeps its precision).

    >>> round(t_isf(0.025, 10), 3)
    2.228
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"`p` must be in (0, 1), got {p!r}.")
    from scipy.special import stdtrit

    return 0.0 - float(stdtrit(df, p))


def p_text(p: float) -> str:
    """A p-value for print: `p = 0.0012`, or `p < 1e-12` below that.

    >>> p_text(0.00123), p_text(1e-15)
    ('p = 0.0012', 'p < 1e-12')
    """
    return f"p = {p:.2g}" if p >= 1e-12 else "p < 1e-12"


def num_text(x: float, digits: int = 1) -> str:
    """`x` with `digits` decimals, never `-0.0` (a value that rounds to zero prints as 0).

    >>> num_text(-0.004, 2), num_text(-1.26), num_text(float("inf"))
    ('0.00', '-1.3', 'inf')
    """
    r = round(float(x), digits)
    return f"{(r if r != 0 else 0.0):.{digits}f}"


def holm(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error control), same order as `p`.

    >>> holm(np.array([0.01, 0.04, 0.03])).round(3).tolist()
    [0.03, 0.06, 0.06]
    """
    p = np.asarray(p, dtype=np.float64)
    m = p.size
    if m == 0:
        return p.copy()
    order = np.argsort(p, kind="stable")
    adj = np.maximum.accumulate(p[order] * (m - np.arange(m)))
    out = np.empty(m)
    out[order] = np.minimum(adj, 1.0)
    return out


def batch_means_se(x: np.ndarray, max_batches: int = 30) -> tuple[np.ndarray, int]:
    """Standard error of the column means of `x` (steps x columns) by batch means.

    Consecutive steps are averaged in `max_batches` batches (one step per batch
    when there are fewer steps), so slow drifts and multi-step episodes, which
    make neighbouring steps alike, widen the error instead of faking
    significance. Returns (standard errors, degrees of freedom = batches - 1).
    """
    n = x.shape[0]
    size = max(1, n // max_batches)
    nb = n // size
    if nb < 2:
        return np.full(x.shape[1:], np.inf), 0
    b = x[: nb * size].reshape(nb, size, *x.shape[1:]).mean(axis=1)
    return b.std(axis=0, ddof=1) / math.sqrt(nb), nb - 1
