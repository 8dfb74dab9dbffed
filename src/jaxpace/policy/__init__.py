"""Pacing policies: pure `(init, update)` pairs that turn earliness into bounded delays.

- `base`: what a policy is (`PacingPolicy`, `Observation`, `PolicyStatus`, `BatchedPolicy`).
- `simple`: `no_pacing` and `fixed`.
- `adaptive`: the `adaptive` policy, and its algorithm as a plain NumPy reference.
- `quantile`: NumPy's linear quantile on sorted windows, bit for bit.
- `_adaptive_fast`, `_window_order`: `adaptive`'s fast path (private; same bits as the
  reference).

The public names are re-exported by `jaxpace` (`jaxpace.adaptive`, `jaxpace.fixed`, ...).
"""

from jaxpace.policy.base import (
    MAX_DELAY_CAP_S,
    BatchedPolicy,
    Observation,
    PacingPolicy,
    PolicyStatus,
    idle_status,
)
from jaxpace.policy.simple import FixedState, NoPacingState, fixed, no_pacing

__all__ = [
    "MAX_DELAY_CAP_S",
    "BatchedPolicy",
    "FixedState",
    "NoPacingState",
    "Observation",
    "PacingPolicy",
    "PolicyStatus",
    "fixed",
    "idle_status",
    "no_pacing",
]
