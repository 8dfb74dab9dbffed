"""`SiteData`: one site's timings as dense (step x rank) arrays, the form every source becomes."""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["SiteData"]


@dataclasses.dataclass(frozen=True)
class SiteData:
    """Dense (step x rank) arrays of one site; seconds, NaN where unknown.

    Built by `jaxpace.report.stages.site_data` from the complete steps (every
    rank reported) of one site; read by the stages, the HTML plots and the trace.
    """

    steps: np.ndarray  # (S,) step numbers, complete steps only
    ranks: np.ndarray  # (R,)
    processes: np.ndarray  # (R,) process of each rank
    hosts: tuple[str, ...]  # (R,)
    arrive: np.ndarray  # (S, R) seconds since the rank's own first arrival
    done: np.ndarray
    wait: np.ndarray
    delay: np.ndarray
    engaged: np.ndarray  # (S,) bool
    compute: np.ndarray  # (S, R)
    step_time: np.ndarray  # (S, R)
    transfer: np.ndarray  # (S,)
    sync_wait: np.ndarray  # (S, R)
    lateness: np.ndarray  # (S, R)
