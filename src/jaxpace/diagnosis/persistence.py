"""Test 3 of a culprit (`jaxpace.diagnosis.culprit`): in a short run, late in every part of it.

Below `CONSISTENCY_MAX_STEPS` analyzed steps `batch_means_se` holds one step per batch,
so a multi-step episode (a device thread descheduled for a stretch of a short run on a
loaded host) reads as persistent evidence in test 1. A persistent straggler is late in
each of `CONSISTENCY_BLOCKS` consecutive blocks of the steps; an episode is not.
"""

from __future__ import annotations

import numpy as np

from jaxpace.diagnosis.stats import t_isf

__all__ = [
    "CONSISTENCY_BLOCKS",
    "CONSISTENCY_MAX_STEPS",
    "CONSISTENCY_MIN_STEPS",
    "CONSISTENCY_MISS",
    "CONSISTENCY_SHARE",
    "consistent",
    "short_run_consistent",
]

# Test 3: a culprit is late by more than the noise floor in each of this many consecutive
# blocks of the analyzed steps, once every block holds at least CONSISTENCY_MIN_STEPS.
CONSISTENCY_BLOCKS = 3
CONSISTENCY_MIN_STEPS = 5
# ... in runs of fewer analyzed steps than this: where `batch_means_se` (30 batches) holds
# one step per batch, so test 1 takes a multi-step episode for persistent evidence.
CONSISTENCY_MAX_STEPS = 60
# ... and no block is significantly less late than the others: a persistent straggler
# fails that with probability at most this (Bonferroni over the blocks).
CONSISTENCY_MISS = 0.01
# ... and, to count as less late, a block's mean is also below this share of the other
# blocks' mean: an episode is on time (or nearly) in some block. Without it a rank 46 to
# 49 ms late in every one of 10 steps (blocks of 5 at 49.2 and 46.2 ms, SDs 1.0 and 0.5
# ms: t = 6.1) was "late in part of this short run only".
CONSISTENCY_SHARE = 0.5


def _blocks(x: np.ndarray, blocks: int) -> list[np.ndarray]:
    """Consecutive blocks of the rows of `x`: as many as leave `CONSISTENCY_MIN_STEPS`
    rows in each, at most `blocks` and at least 1 (the whole run, with few steps)."""
    k = max(1, min(int(blocks), x.shape[0] // CONSISTENCY_MIN_STEPS))
    return np.array_split(x, k, axis=0)


def consistent(
    excess: np.ndarray,
    floor_s: float,
    blocks: int = CONSISTENCY_BLOCKS,
    centre: bool = True,
    miss: float = CONSISTENCY_MISS,
) -> np.ndarray:
    """Test 3: per column, whether it is late in every block of consecutive steps.

    `excess`: (steps, M) per-step lateness over the others (a rank's excess, or a
    group's mean over the other ranks'); with `centre` (ranks) each block's means
    are taken relative to that block's median column, as `d` is over the whole
    run. In every block the column's mean is above `floor_s`
    and not materially and significantly below its mean over the other blocks:
    below `CONSISTENCY_SHARE` of it, and the gap, over the standard error of the two
    means (from the steps' spread within the blocks), above the one-sided Student t
    critical value at `miss / blocks` (Bonferroni over blocks), so a persistent
    straggler fails with probability at most `miss`. A run of a few consecutive
    late steps in a short run, and the rest on time, is an episode: it fails. With
    one block, the floor alone.
    """
    x = np.asarray(excess, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        return np.zeros(x.shape[-1] if x.ndim else 0, bool)
    parts = _blocks(x, blocks)
    if centre:
        parts = [b - np.median(b.mean(axis=0)) for b in parts]
    means = np.stack([b.mean(axis=0) for b in parts])  # (K, M)
    ok = (means > floor_s).all(axis=0)
    K = len(parts)
    if K < 2:
        return ok
    sizes = np.array([b.shape[0] for b in parts], dtype=np.float64)
    var = np.stack([b.var(axis=0, ddof=1) for b in parts])  # (K, M)
    q = t_isf(miss / K, float(sizes.min() - 1))
    for k in range(K):
        rest = np.arange(K) != k
        w = sizes[rest] / sizes[rest].sum()
        other = (w[:, None] * means[rest]).sum(axis=0)
        se2 = var[k] / sizes[k] + (w[:, None] ** 2 * var[rest] / sizes[rest][:, None]).sum(axis=0)
        gap = other - means[k]
        with np.errstate(divide="ignore", invalid="ignore"):
            below = np.where(se2 > 0, gap > q * np.sqrt(se2), gap > 0)
        ok &= ~(below & (means[k] < CONSISTENCY_SHARE * other))
    return ok


def short_run_consistent(excess: np.ndarray, floor_s: float, centre: bool = True) -> np.ndarray:
    """Test 3 as `decide` applies it: `consistent` below `CONSISTENCY_MAX_STEPS` rows of
    `excess`, all True from there (none passes with no rows)."""
    x = np.asarray(excess, dtype=np.float64)
    m = x.shape[-1] if x.ndim else 0
    if x.ndim != 2 or x.shape[0] == 0:
        return np.zeros(m, bool)
    if x.shape[0] >= CONSISTENCY_MAX_STEPS:
        return np.ones(m, bool)
    return consistent(x, floor_s, centre=centre)
