"""The two policies that do not look at earliness: `no_pacing` (measure only) and `fixed`."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from jaxpace._validate import check_number
from jaxpace.policy.base import MAX_DELAY_CAP_S, BatchedPolicy, Observation, PacingPolicy

__all__ = ["FixedState", "NoPacingState", "fixed", "no_pacing"]


class NoPacingState(NamedTuple):
    """State of `no_pacing`: the number of observed steps."""

    steps: int


def no_pacing() -> PacingPolicy:
    """Measures only: every delay is zero.

    >>> p = no_pacing()
    >>> d, s = p.update(Observation(np.array([0.0, 0.02])), p.init(2))
    >>> d.tolist()
    [0.0, 0.0]
    """

    def init_fn(num_ranks: int) -> NoPacingState:
        del num_ranks
        return NoPacingState(steps=0)

    def update_fn(obs: Observation, state: NoPacingState):
        return np.zeros((len(obs.earliness_s),)), NoPacingState(steps=state.steps + 1)

    def update_batch(obs: Observation, state: NoPacingState):
        return np.zeros(np.shape(obs.earliness_s)), NoPacingState(steps=state.steps + 1)

    return PacingPolicy(
        init_fn,
        update_fn,
        name="no_pacing()",
        max_delay_s=0.0,
        needs_exchange=False,
        batched=BatchedPolicy(lambda num_sites, num_ranks: init_fn(num_ranks), update_batch, True),
        config=(),
    )


class FixedState(NamedTuple):
    """State of `fixed`: the number of observed steps."""

    steps: int


def fixed(delay_s: float) -> PacingPolicy:
    """Delays every rank by the same `delay_s` before each collective.

    Useful as a control in experiments (it can only slow a balanced job down).

    Args:
      delay_s: seconds, in `[0, 5]`.

    Raises:
      ConfigError: `delay_s` is not a finite number in range.

    >>> p = fixed(0.001)
    >>> p.update(Observation(np.zeros(3)), p.init(3))[0].tolist()
    [0.001, 0.001, 0.001]
    """
    check_number("delay_s", delay_s, lo=0.0, hi=MAX_DELAY_CAP_S)
    delay_s = float(delay_s)

    def init_fn(num_ranks: int) -> FixedState:
        del num_ranks
        return FixedState(steps=0)

    def update_fn(obs: Observation, state: FixedState):
        return np.full((len(obs.earliness_s),), delay_s), FixedState(steps=state.steps + 1)

    def update_batch(obs: Observation, state: FixedState):
        return np.full(np.shape(obs.earliness_s), delay_s), FixedState(steps=state.steps + 1)

    return PacingPolicy(
        init_fn,
        update_fn,
        name=f"fixed(delay_s={delay_s!r})",
        max_delay_s=delay_s,
        needs_exchange=False,
        batched=BatchedPolicy(lambda num_sites, num_ranks: init_fn(num_ranks), update_batch, True),
        config=(("delay_s", delay_s),),
    )
