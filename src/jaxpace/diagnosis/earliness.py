"""The clock-free rule: within one collective, the rank that waited least arrived last.

One definition for the runtime's exchange, the report, the simulator and the policies.
"""

from __future__ import annotations

import numpy as np

__all__ = ["earliness"]


def earliness(waits, axis: int = -1) -> np.ndarray:
    """Clock-free earliness `w_i - min_j w_j` along `axis` (seconds or any unit).

    Invalid waits (NaN, inf, negative) give NaN and never set the minimum; an
    all-invalid row gives all NaN. Works on one step (1-D) or many (2-D, one
    row per step with `axis=-1`).

    >>> earliness(np.array([0.003, 0.0, np.nan, 0.001])).tolist()
    [0.003, 0.0, nan, 0.001]
    """
    w = np.array(waits, dtype=np.float64, copy=True)
    w[~np.isfinite(w) | (w < 0)] = np.nan
    valid = np.isfinite(w)
    if not valid.any():
        return w
    lo = np.min(np.where(valid, w, np.inf), axis=axis, keepdims=True)
    lo[~np.isfinite(lo)] = np.nan
    return w - lo
