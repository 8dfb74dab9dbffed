"""The in-band exchange: the payload each rank adds to the collective, and earliness.

A rank's payload is `3 * num_slots` float32 values, zero except at its own slot
`r`: `[r]` its previous wait (s), `[n + r]` its presence: 1.0 when that wait is
present, or `2 + (step mod 2**20)` when the probe also says which step the wait
is from, and `[2n + r]` its previous step time (s). Summed by the collective
(psum), every rank reads every rank's values; a pmean divides them by the group
size, which `decode` undoes. Earliness is `w_i - min_j w_j`: clock-free, >= 0,
NaN where a rank has no valid wait. Waits from different steps are not compared:
`decode` keeps the step most ranks report and drops (and counts) the others. The
native GPU probes can report an older step than their peers (their waits reach
the host when the drain reads the GPU's events); the other probes always report
the previous step. The runtime, the simulator and the report all compute it
here.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from jaxpace.diagnosis.earliness import earliness

__all__ = [
    "Decoded",
    "STEP_TAG_MOD",
    "decode",
    "earliness",  # re-exported: the decode hands it out (home: jaxpace.diagnosis.earliness)
    "encode",
    "payload_size",
    "reduction_scale",
    "sanitize_seconds",
]


STEP_TAG_MOD = 1 << 20  # the presence slot's step tag counts modulo this (exact in float32)


def payload_size(num_slots: int) -> int:
    """Float32 entries of the exchange payload for `num_slots` ranks."""
    return 3 * int(num_slots)


def reduction_scale(kind: str, group_size: int) -> float:
    """What `decode` multiplies the reduced payload by: the group size for pmean, else 1."""
    return float(group_size) if kind == "pmean" else 1.0


def sanitize_seconds(values) -> np.ndarray:
    """Returns a float64 copy where NaN, inf and negative entries become NaN, and -0.0 0.0.

    Timings that are not finite and non-negative carry no information; the
    policies treat NaN as "no measurement" and never derive a delay from it.
    A -0.0 is a zero: made 0.0, so that no window holds two zeros that sort
    either way.

    >>> sanitize_seconds(np.array([0.1, -1.0, np.inf, np.nan, -0.0])).tolist()
    [0.1, nan, nan, nan, 0.0]
    """
    out = np.array(values, dtype=np.float64, copy=True).reshape(-1)
    out += 0.0  # -0.0 + 0.0 is 0.0; nothing else changes
    # All valid (the common case): min is NaN if any entry is, so two reductions tell.
    if out.size and out.min() >= 0 and out.max() < np.inf:
        return out
    out[~np.isfinite(out) | (out < 0)] = np.nan
    return out


def encode(
    payload: np.ndarray, num_slots: int, rank: int, prev_wait_s: float, prev_step_s: float
) -> np.ndarray:
    """Writes this rank's previous wait and step time into `payload` (in place)."""
    n = int(num_slots)
    if 0 <= rank < n:
        if math.isfinite(prev_wait_s):
            payload[rank] = prev_wait_s
            payload[n + rank] = 1.0
        if math.isfinite(prev_step_s):
            payload[2 * n + rank] = prev_step_s
    return payload


class Decoded(NamedTuple):
    """Every rank's view after the collective.

    Attributes:
      earliness_s: `(num_slots,)` earliness of each rank's previous step, NaN
        where absent.
      step_time_s: median over present ranks of their previous step time, NaN
        when unknown.
      mismatched: waits dropped because they came from another step than the
        one most ranks reported.
    """

    earliness_s: np.ndarray
    step_time_s: float
    mismatched: int = 0


def decode(reduced, num_slots: int, scale: float) -> Decoded | None:
    """Reads the reduced payload; None when no rank sent a valid wait."""
    n = int(num_slots)
    vec = np.asarray(reduced, dtype=np.float64).reshape(-1) * scale
    waits = sanitize_seconds(vec[:n])
    present = vec[n : 2 * n] > 0.5
    mismatched = _drop_other_steps(vec[n : 2 * n], present)
    waits[~present] = np.nan
    if not np.isfinite(waits).any():
        return None
    steps_s = sanitize_seconds(vec[2 * n : 3 * n])
    steps_s[~present | (steps_s <= 0)] = np.nan
    step_time = _median(steps_s) if np.isfinite(steps_s).any() else math.nan
    return Decoded(earliness(waits), step_time, mismatched)


def _drop_other_steps(presence: np.ndarray, present: np.ndarray) -> int:
    """Clears `present` where a rank's step tag differs from the one most ranks report (ties:
    the higher tag); returns how many were cleared. A presence of 1.0 carries no tag and is
    kept. Tags are `2 + step mod 2**20`, exact after a pmean's division and `decode`'s scale.

    >>> p = np.array([2.0 + 7, 2.0 + 7, 2.0 + 6, 0.0, 1.0]); keep = p > 0.5
    >>> _drop_other_steps(p, keep), keep.tolist()
    (1, [True, True, False, False, True])
    """
    tags = np.rint(presence).astype(np.int64)
    tagged = present & (tags >= 2)
    seen = tags[tagged]
    if seen.size == 0 or (seen == seen[0]).all():
        return 0  # the common case: every rank reports the same step
    values, counts = np.unique(tags[tagged], return_counts=True)
    ref = values[counts == counts.max()].max()
    other = tagged & (tags != ref)
    present[other] = False
    return int(other.sum())


def _median(x: np.ndarray) -> float:
    """`np.nanmedian(x)` of a short 1-D float64 array (NaN when all of it is NaN), without its
    per-call cost: sort the values that are not NaN, take the middle one or `(a + b) / 2`, as
    NumPy does.

    >>> _median(np.array([3.0, np.nan, 1.0, 2.0, 10.0]))
    2.5
    """
    v = sorted(x[~np.isnan(x)].tolist())
    n = len(v)
    if n == 0:
        return math.nan
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2
