"""Alpha-beta collective cost models and a coarse rail-optimized Clos contention model."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from jaxpace._validate import check_number

__all__ = [
    "allreduce_lower_bound_s",
    "busbw_gbyte_s",
    "ecmp_max_load",
    "hierarchical_allreduce_s",
    "rabenseifner_allreduce_s",
    "recursive_doubling_allreduce_s",
    "ring_allgather_s",
    "ring_allreduce_s",
    "ring_reduce_scatter_s",
    "tree_allreduce_s",
]

# Units: `alpha_s` is the per-message latency in seconds, `beta_s_per_byte` the
# inverse bandwidth (1 / bytes per second), `gamma_s_per_byte` the reduction
# cost per byte, `n_bytes` the payload per rank.


def positive_int(
    name: str, value: Any, *, what: str = "", error: type[Exception] = ValueError
) -> int:
    """`value` as an int if it is an integer >= 1, else raises `error` naming `name`.

    The check is `jaxpace._validate.check_number`'s; the message says "positive
    integer" rather than the range `[1, inf]`.

    >>> positive_int("p", 0, what=" number of ranks")
    Traceback (most recent call last):
    ...
    ValueError: `p` must be a positive integer number of ranks, got 0.
    """
    try:
        check_number(name, value, lo=1, hi=math.inf, integer=True, error=error)
    except error:
        raise error(f"`{name}` must be a positive integer{what}, got {value!r}.") from None
    return int(value)


def _check_p(p: int, name: str = "p") -> int:
    return positive_int(name, p, what=" number of ranks")


def ring_reduce_scatter_s(p: int, n_bytes: float, alpha_s: float, beta_s_per_byte: float) -> float:
    """Ring reduce-scatter time: `(p-1)α + (p-1)/p·nβ` seconds [Thakur et al. 2005].

    >>> ring_reduce_scatter_s(4, 1e6, 1e-6, 1e-9)
    0.000753
    """
    p = _check_p(p)
    return (p - 1) * alpha_s + (p - 1) / p * n_bytes * beta_s_per_byte


def ring_allgather_s(p: int, n_bytes: float, alpha_s: float, beta_s_per_byte: float) -> float:
    """Ring all-gather time, the same as reduce-scatter: `(p-1)α + (p-1)/p·nβ` seconds.

    >>> ring_allgather_s(1, 1e6, 1e-6, 1e-9)
    0.0
    """
    return ring_reduce_scatter_s(p, n_bytes, alpha_s, beta_s_per_byte)


def ring_allreduce_s(
    p: int, n_bytes: float, alpha_s: float, beta_s_per_byte: float, gamma_s_per_byte: float = 0.0
) -> float:
    """Ring all-reduce time: `2(p-1)α + 2(p-1)/p·nβ + (p-1)/p·nγ` seconds.

    >>> round(ring_allreduce_s(8, 1e9, 5e-6, 1 / 46e9), 6)
    0.038113
    """
    p = _check_p(p)
    return (
        2 * (p - 1) * alpha_s
        + 2 * (p - 1) / p * n_bytes * beta_s_per_byte
        + (p - 1) / p * n_bytes * gamma_s_per_byte
    )


def recursive_doubling_allreduce_s(
    p: int, n_bytes: float, alpha_s: float, beta_s_per_byte: float
) -> float:
    """Recursive-doubling all-reduce time: `⌈log2 p⌉(α + nβ)` seconds.

    >>> recursive_doubling_allreduce_s(5, 100.0, 1.0, 0.01)
    6.0
    """
    p = _check_p(p)
    return math.ceil(math.log2(p)) * (alpha_s + n_bytes * beta_s_per_byte)


def rabenseifner_allreduce_s(
    p: int, n_bytes: float, alpha_s: float, beta_s_per_byte: float
) -> float:
    """Rabenseifner (reduce-scatter + all-gather by halving/doubling): `2 log2 p·α + 2(p-1)/p·nβ`.

    >>> rabenseifner_allreduce_s(4, 100.0, 1.0, 0.01)
    5.5
    """
    p = _check_p(p)
    return 2 * math.log2(p) * alpha_s + 2 * (p - 1) / p * n_bytes * beta_s_per_byte


def tree_allreduce_s(p: int, n_bytes: float, alpha_s: float, beta_s_per_byte: float) -> float:
    """Pipelined double-binary-tree all-reduce (NCCL tree), large n: `2 log2 p·α + 2nβ`.

    Zero for `p == 1` (nothing to exchange).

    >>> tree_allreduce_s(8, 100.0, 1.0, 0.01)
    8.0
    """
    p = _check_p(p)
    if p == 1:
        return 0.0
    return 2 * math.log2(p) * alpha_s + 2 * n_bytes * beta_s_per_byte


def hierarchical_allreduce_s(
    g: int,
    q: int,
    n_bytes: float,
    alpha_intra_s: float,
    beta_intra_s_per_byte: float,
    alpha_inter_s: float,
    beta_inter_s_per_byte: float,
) -> float:
    """Rail-aligned hierarchical all-reduce, `g` GPUs per node, `q` nodes, in seconds.

    `2[(g-1)α_l + (g-1)/g·nβ_l] + 2(q-1)α_n + 2(q-1)/q·(n/g)β_n`: an intra-node
    reduce-scatter and all-gather around an inter-node all-reduce of `n/g` bytes
    on each rail.

    >>> hierarchical_allreduce_s(8, 1, 8.0, 1.0, 0.5, 10.0, 1.0)
    21.0
    >>> hierarchical_allreduce_s(8, 2, 8.0, 1.0, 0.5, 10.0, 1.0)
    42.0
    """
    return hierarchical_intra_s(
        g, n_bytes, alpha_intra_s, beta_intra_s_per_byte
    ) + hierarchical_inter_s(g, q, n_bytes, alpha_inter_s, beta_inter_s_per_byte)


def hierarchical_intra_s(g: int, n_bytes: float, alpha_s: float, beta_s_per_byte: float) -> float:
    """The intra-node part of `hierarchical_allreduce_s`: `2[(g-1)α_l + (g-1)/g·nβ_l]`."""
    g = _check_p(g, "g")
    return 2 * ((g - 1) * alpha_s + (g - 1) / g * n_bytes * beta_s_per_byte)


def hierarchical_inter_s(
    g: int, q: int, n_bytes: float, alpha_s: float, beta_s_per_byte: float
) -> float:
    """The inter-node part of `hierarchical_allreduce_s`: `2(q-1)α_n + 2(q-1)/q·(n/g)β_n`."""
    g = _check_p(g, "g")
    q = _check_p(q, "q")
    return 2 * (q - 1) * alpha_s + 2 * (q - 1) / q * (n_bytes / g) * beta_s_per_byte


def allreduce_lower_bound_s(p: int, n_bytes: float, bandwidth_bytes_per_s: float) -> float:
    """Bandwidth lower bound of any all-reduce: `2(p-1)/p·n/B` seconds [Patarasuk & Yuan 2009].

    >>> allreduce_lower_bound_s(2, 1e9, 1e9)
    1.0
    """
    p = _check_p(p)
    return 2 * (p - 1) / p * n_bytes / bandwidth_bytes_per_s


def busbw_gbyte_s(p: int, n_bytes: float, time_s: float) -> float:
    """nccl-tests all-reduce bus bandwidth in GB/s (1e9 bytes/s): `algbw · 2(p-1)/p`, `algbw = n / t`.

    >>> busbw_gbyte_s(8, 1e9, 0.01)
    175.0
    """
    p = _check_p(p)
    return n_bytes / time_s * 2 * (p - 1) / p / 1e9


def ecmp_max_load(flows: int, uplinks: int, rng: np.random.Generator, size: int) -> np.ndarray:
    """Samples the busiest uplink's flow count when `flows` elephants hash onto `uplinks` links.

    ECMP hashes each flow to a uniformly random uplink; a link carrying `m`
    flows gives each of them `1/m` of its bandwidth, so a collective whose
    slowest flow sits on the busiest link is slowed by that count. With 8 flows
    on 8 links the mean is about 2.6 (SIMULATION.md).

    Args:
      flows: elephant flows leaving a leaf switch (>= 0).
      uplinks: uplinks they hash onto (>= 1).
      rng: the random generator.
      size: number of independent samples (steps).

    Returns:
      int array of shape `(size,)`, each entry in `[1, flows]` (1 when `flows <= 1`).

    >>> rng = np.random.default_rng(0)
    >>> float(np.round(ecmp_max_load(8, 8, rng, 20000).mean(), 1))
    2.6
    """
    if flows <= 1:
        return np.ones(size, dtype=np.int64)
    picks = rng.integers(0, uplinks, size=(size, flows))
    counts = np.zeros((size, uplinks), dtype=np.int64)
    np.add.at(counts, (np.repeat(np.arange(size), flows), picks.reshape(-1)), 1)
    return counts.max(axis=1)
