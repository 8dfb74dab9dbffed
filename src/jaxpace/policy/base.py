"""What a pacing policy is: `PacingPolicy`, its observation, status and batched form."""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Protocol

import numpy as np

__all__ = [
    "MAX_DELAY_CAP_S",
    "BatchedPolicy",
    "Observation",
    "PacingPolicy",
    "PolicyStatus",
    "idle_status",
]

# Largest delay any policy may ask for. A rank asleep longer than this looks
# hung to its peers, and nothing in JAX aborts a sleeping callback.
MAX_DELAY_CAP_S = 5.0


class Observation(NamedTuple):
    """What every rank knows after a collective, identical on all of them.

    Attributes:
      earliness_s: shape `(num_ranks,)`, seconds each rank arrived before the
        last arriver at the previous step (`w_i - min_j w_j`, so >= 0). NaN marks
        a rank with no measurement (unsampled step, missing process).
      step_time_s: the previous step's iteration time in seconds (median over
        ranks of collective-exit to collective-exit), NaN when unknown.
    """

    earliness_s: np.ndarray
    step_time_s: float = math.nan


class PolicyInitFn(Protocol):
    def __call__(self, num_ranks: int) -> Any:
        """Returns the initial state for `num_ranks` ranks."""


class PolicyUpdateFn(Protocol):
    def __call__(self, obs: Observation, state: Any) -> tuple[np.ndarray, Any]:
        """Returns `(delays_s, new_state)`.

        `delays_s` has shape `(num_ranks,)`, each entry in `[0, max_delay_s]`:
        how long that rank sleeps before the next collective at this site. Pure:
        no clocks, no I/O, no globals, so every rank (and the simulator)
        computes the same decision from the same observation.
        """


class PolicyStatus(NamedTuple):
    """What a policy's state says about pacing, for `Pacer.stats()` and logs.

    Attributes:
      engaged: pacing is on (delays may be non-zero).
      backed_off: the policy refused to chase a skew beyond its bounds.
      spread_s: the latest spread estimate in seconds (NaN if the policy has none).
      ab_effect: `{"paced_step_s", "unpaced_step_s", "rejected"}` once an A/B
        guard has measured both arms, else None.
    """

    engaged: bool = False
    backed_off: bool = False
    spread_s: float = math.nan
    ab_effect: dict[str, Any] | None = None


class PolicyStatusFn(Protocol):
    def __call__(self, state: Any) -> PolicyStatus:
        """Reads a `PolicyStatus` from a state of this policy (pure, cheap)."""


def idle_status(state: Any) -> PolicyStatus:
    """The status of a policy that never paces adaptively (the default `status`)."""
    del state
    return PolicyStatus()


class BatchedPolicy(NamedTuple):
    """A policy's update for `num_sites` independent sites at once (the simulator's path).

    `init(num_sites, num_ranks)` returns one state whose fields carry a leading
    site axis; `update(obs, state)` takes `obs.earliness_s` of shape
    `(num_sites, num_ranks)` and `obs.step_time_s` of shape `(num_sites,)` and
    returns `(delays (num_sites, num_ranks), state)`. Each site's delays equal
    what the policy's own `update` returns for that site alone.

    `update` may reuse the arrays of the state it is given for the state it
    returns: keep only the returned state (the simulator does).
    `constant`: the delays and the state do not depend on the observation's
    values, only on its shape (`no_pacing`, `fixed`), so a caller may run the
    update before the observation exists.
    """

    init: Any
    update: Any
    constant: bool = False


class PacingPolicy(NamedTuple):
    """A pacing policy, as an optax-style pair of pure functions.

    Attributes:
      init: `init(num_ranks) -> state`.
      update: `update(obs, state) -> (delays_s, state)`.
      name: a short description for logs and records.
      max_delay_s: the hard upper bound of every delay this policy returns.
      needs_exchange: whether `update` reads the other ranks' earliness. If
        False, the runtime skips the in-band exchange (its observations then
        carry NaN earliness) and the collective's operands are exactly lax's.
      status: `status(state) -> PolicyStatus`; the only way the runtime reads
        a policy's state (default: never engaged).
      batched: the update of many sites at once (`BatchedPolicy`), or None;
        `no_pacing`, `fixed` and `adaptive` have one, and callers update the
        sites of a policy without one in turn.
      config: what the policy computes with (a frozen dataclass, a tuple of
        numbers, ...), or None; its `repr` is part of `identity`.

    >>> from jaxpace.policy.simple import fixed
    >>> b = fixed(0.002).batched
    >>> b.update(Observation(np.zeros((2, 3)), np.zeros(2)), b.init(2, 3))[0].shape
    (2, 3)
    """

    init: PolicyInitFn
    update: PolicyUpdateFn
    name: str = "custom"
    max_delay_s: float = 0.0
    needs_exchange: bool = True
    status: PolicyStatusFn = idle_status
    batched: BatchedPolicy | None = None
    config: Any = None

    @property
    def identity(self) -> str:
        """What every process must agree on to run the same policy: its name, configuration,
        bounds, and where its functions are defined (so two custom policies that both keep
        the default name `"custom"` still differ).

        >>> from jaxpace.policy.simple import fixed
        >>> fixed(0.001).identity == fixed(0.001).identity != fixed(0.002).identity
        True
        """
        where = ",".join(_qualified(f) for f in (self.init, self.update, self.status))
        return (
            f"{self.name}|config={self.config!r}|max_delay_s={float(self.max_delay_s)!r}"
            f"|needs_exchange={bool(self.needs_exchange)}|batched={self.batched is not None}"
            f"|fns={where}"
        )


def _qualified(fn: Any) -> str:
    """`module.qualname` of a function (the same on every process running the same code)."""
    mod = getattr(fn, "__module__", None) or type(fn).__module__
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{mod}.{name}"
