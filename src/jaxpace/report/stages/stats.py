"""The statistics helpers of the analysis stages: `jaxpace._stats` (NumPy only), so the
runtime's live view computes the report's statistics without importing the report."""

from jaxpace._stats import (
    batch_means_se,
    col_mean,
    holm,
    mean_finite,
    median_of_others,
    num_text,
    p_text,
    robust_std,
    t95,
    t_isf,
    t_sf,
)

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
