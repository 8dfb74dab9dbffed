"""Physically consistent synthetic timing records, for tests, docs and demos of `report`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxpace.diagnosis.earliness import earliness
from jaxpace.records.format import header_record
from jaxpace.records.reader import Records

__all__ = ["SyntheticSpec", "synthetic_records", "synthetic_run", "synthetic_step_records"]


@dataclasses.dataclass(frozen=True)
class SyntheticSpec:
    """The parameters of a synthetic run; see `synthetic_records` for their meaning."""

    num_ranks: int
    num_steps: int
    late_rank: int | Sequence[int] | None = None
    late_s: float = 0.0
    compute_s: float = 0.010
    jitter_s: float = 0.0003
    transfer_s: float = 0.001
    transfer_growth: float = 0.0
    straggler_prob: float = 0.0
    straggler_factor: float = 2.0
    groups: Mapping[int, str] | None = None
    group_late_s: Mapping[str, float] | None = None
    group_kind: str = "numa"
    periodic_rank: int | None = None
    periodic_every: int = 0
    periodic_extra_s: float = 0.0
    engaged_from_step: int | None = None
    max_delay_s: float = 0.002
    ranks_per_process: int = 1
    clock_offset_s: float = 100.0
    exit_jitter_s: float = 20e-6
    seed: int = 0
    run_id: str = "synthetic"
    site: str = "train.py:1:train_step"

    def __post_init__(self) -> None:
        R, S = self.num_ranks, self.num_steps
        if R < 1 or S < 1:
            raise ValueError(f"need num_ranks >= 1 and num_steps >= 1, got {R}, {S}.")
        if R % self.ranks_per_process:
            raise ValueError(
                f"`num_ranks` ({R}) must be a multiple of `ranks_per_process` "
                f"({self.ranks_per_process})."
            )


def synthetic_run(num_ranks: int, num_steps: int, **kwargs: Any) -> Records:
    """The `Records` that `synthetic_records` returns as dicts (same arguments)."""
    spec = SyntheticSpec(num_ranks, num_steps, **kwargs)
    rng = np.random.default_rng(spec.seed)
    compute, transfer, exit_jit = _draw(spec, rng)
    arrive, done, delay, engaged = _run_steps(spec, compute, transfer, exit_jit)
    # Each process's clock has its own origin: seconds apart, never compared raw.
    P = spec.num_ranks // spec.ranks_per_process
    offsets = np.random.default_rng([spec.seed, 1]).uniform(0.0, spec.clock_offset_s, P)
    offsets_ns = (np.round(offsets * 1e9).astype(np.int64) + 10**12)[
        np.arange(spec.num_ranks) // spec.ranks_per_process
    ]
    return _records(spec, arrive + offsets_ns[None, :], done + offsets_ns[None, :], delay, engaged)


def _draw(spec: SyntheticSpec, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """(compute (S, R), transfer (S,), exit jitter (S, R)) in seconds."""
    R, S = spec.num_ranks, spec.num_steps
    compute = spec.compute_s + spec.jitter_s * rng.standard_normal((S, R))
    if spec.straggler_prob > 0:
        slow = rng.random((S, R)) < spec.straggler_prob
        compute = np.where(slow, compute * spec.straggler_factor, compute)
    if spec.late_rank is not None:
        compute[:, np.atleast_1d(spec.late_rank)] += spec.late_s
    if spec.groups is not None and spec.group_late_s:
        extra = np.array([spec.group_late_s.get(spec.groups.get(r, ""), 0.0) for r in range(R)])
        compute += extra[None, :]
    if spec.periodic_rank is not None and spec.periodic_every > 0:
        every = spec.periodic_every
        compute[every - 1 :: every, spec.periodic_rank] += spec.periodic_extra_s
    compute = np.maximum(compute, 0.1 * spec.compute_s)
    transfer = spec.transfer_s * (1.0 + spec.transfer_growth * np.arange(S) / max(S - 1, 1))
    transfer = transfer * (1.0 + 0.02 * rng.standard_normal(S)).clip(0.5)
    if spec.exit_jitter_s > 0:
        exit_jit = rng.exponential(spec.exit_jitter_s, (S, R))
    else:
        exit_jit = np.zeros((S, R))
    return compute, transfer, exit_jit


def _run_steps(
    spec: SyntheticSpec, compute: np.ndarray, transfer: np.ndarray, exit_jit: np.ndarray
) -> tuple[np.ndarray, ...]:
    """(arrive, done, delay) (S, R) int64 ns on one true clock, and engaged (S,) bool.

    All ranks leave the collective together: done = max_j(enter_j) + transfer,
    plus a small callback exit jitter.
    """
    S, R = compute.shape
    arrive = np.zeros((S, R), np.int64)
    done = np.zeros((S, R), np.int64)
    delay = np.zeros((S, R), np.int64)
    engaged = np.zeros(S, bool)
    prev_done = np.round(exit_jit[0] * 1e9).astype(np.int64)
    prev_early = np.zeros(R)
    for k in range(S):
        a = prev_done + np.round(compute[k] * 1e9).astype(np.int64)
        if spec.engaged_from_step is not None and k >= spec.engaged_from_step:
            engaged[k] = True
            # Pace by last step's earliness, minus a margin, so pacing never makes a
            # rank the last one (pure bulk-synchronous: it cannot shorten a step).
            d = np.clip(prev_early - 2 * spec.jitter_s, 0.0, spec.max_delay_s)
            delay[k] = np.round(d * 1e9).astype(np.int64)
        enter = a + delay[k]
        t = enter.max() + int(round(transfer[k] * 1e9))
        dn = t + np.round(exit_jit[k] * 1e9).astype(np.int64)
        arrive[k], done[k] = a, dn
        prev_early = earliness(dn - a) / 1e9
        prev_done = dn
    return arrive, done, delay, engaged


def _records(
    spec: SyntheticSpec,
    arrive: np.ndarray,
    done: np.ndarray,
    delay: np.ndarray,
    engaged: np.ndarray,
) -> Records:
    """Columnar `Records` with one header per process (`jaxpace.records.format.header_record`)."""
    S, R = arrive.shape
    rpp = spec.ranks_per_process
    steps = np.repeat(np.arange(S), R)
    ranks = np.tile(np.arange(R), S)
    granularity = "device" if rpp > 1 else "process"
    columns = {
        "site": np.zeros(S * R, np.int64),
        "step": steps,
        "rank": ranks,
        "process": ranks // rpp,
        "arrive_ns": arrive.ravel(),
        "done_ns": done.ravel(),
        "wait_ns": (done - arrive).ravel(),
        "delay_ns": delay.ravel(),
        "engaged": np.repeat(engaged, R),
        "device": ranks if granularity == "device" else np.full(S * R, -1, np.int64),
    }
    P = R // rpp
    rank_groups = None if spec.groups is None else {spec.group_kind: spec.groups}
    headers = tuple(
        header_record(
            run_id=spec.run_id,
            process_index=p,
            process_count=P,
            host=f"node-{p}",
            pid=1000 + p,
            granularity=granularity,
            jaxpace_version="0.1.0",
            policy="synthetic",
            local_devices=list(range(p * rpp, (p + 1) * rpp)),
            rank_groups=rank_groups,
        )
        for p in range(P)
    )
    return Records(
        headers=headers,
        sites=(spec.site,),
        columns=columns,
        run_id=spec.run_id,
        process_count=P,
        granularity=granularity,
        sources=("<synthetic>",),
    )


def synthetic_records(num_ranks: int, num_steps: int, **kwargs: Any) -> list[dict[str, Any]]:
    """Synthetic timing records in the exact JSONL format (docs/records.md).

    The model is physically consistent: rank r computes for
    `compute_s + jitter_s * N(0, 1)` (plus `late_s` on `late_rank`, a group
    offset, a periodic extra on one rank, or an episodic `straggler_factor`
    slowdown with probability `straggler_prob`), may sleep a pacing delay, and
    enters the collective; **all ranks leave together** at
    `max_j(enter_j) + transfer` (plus a few µs of callback exit jitter). Each
    process's times are then shifted by a random clock offset of up to
    `clock_offset_s` seconds, drawn from a separate random stream, so the same
    `seed` with different offsets gives the same durations: analysis must be
    clock-free.

    Args:
      num_ranks: ranks (one per process unless `ranks_per_process` > 1, which
        makes `"device"` granularity records).
      num_steps: steps of the single site.
      **kwargs: `late_rank` (one rank or several), `late_s`, `compute_s` (0.010), `jitter_s` (0.0003),
        `transfer_s` (0.001), `transfer_growth` (relative growth of transfer
        over the run, 0), `straggler_prob` (0), `straggler_factor` (2),
        `groups` (rank -> label, written to the header's
        `topology.rank_groups[group_kind]`), `group_late_s` (label -> seconds),
        `group_kind` ("numa"), `periodic_rank`, `periodic_every`,
        `periodic_extra_s` (extra work on one rank every N steps, like eval),
        `engaged_from_step` (pace from that step on), `max_delay_s`,
        `ranks_per_process` (1), `clock_offset_s` (100), `exit_jitter_s`
        (20e-6), `seed` (0), `run_id`, `site`.

    Returns:
      Header dicts (one per process) followed by step dicts.

    >>> recs = synthetic_records(2, 2, seed=1)
    >>> [r["type"] for r in recs]
    ['header', 'header', 'step', 'step', 'step', 'step']
    >>> all(r["wait_ns"] == r["done_ns"] - r["arrive_ns"] for r in recs[2:])
    True
    """
    return synthetic_run(num_ranks, num_steps, **kwargs).to_dicts()


def synthetic_step_records(
    num_ranks: int,
    num_steps: int,
    num_sites: int,
    *,
    late_s: Mapping[int, float] | None = None,
    compute_s: float = 0.010,
    jitter_s: float = 0.0003,
    transfer_s: float = 0.0005,
    repeats: Sequence[int] | None = None,
    ranks_per_process: int = 1,
    seed: int = 0,
    run_id: str = "synthetic-step",
) -> list[dict[str, Any]]:
    """Records of a program whose step runs `num_sites` collectives in order
    (`site-00`, `site-01`, ...), site j `repeats[j]` times an execution (default 1).

    Every rank computes `compute_s / collectives + jitter_s * N(0, 1)` before each
    collective (plus `late_s[rank] / collectives`: a rank late by `late_s[rank]` a step,
    spread over the step); all ranks leave each collective together at the last arrival
    plus `transfer_s`. One clock per process, offset by up to 100 s. A site's `step`
    counts its own executions (`step` of a repeated site runs `repeats[j]` times a step).
    """
    rng = np.random.default_rng(seed)
    R, rpp = num_ranks, ranks_per_process
    reps = list(repeats) if repeats is not None else [1] * num_sites
    order = [j for j in range(num_sites) for _ in range(reps[j])]
    n = len(order)
    extra = np.zeros(R)
    for r, s in (late_s or {}).items():
        extra[r] = s
    offset_ns = (rng.uniform(0, 100.0, R // rpp) * 1e9).astype(np.int64)
    P = R // rpp
    out: list[dict[str, Any]] = [
        header_record(
            run_id=run_id,
            process_index=p,
            process_count=P,
            host=f"node-{p}",
            pid=1000 + p,
            granularity="device" if rpp > 1 else "process",
            jaxpace_version="0.1.0",
            policy="synthetic",
            local_devices=list(range(p * rpp, (p + 1) * rpp)),
            rank_groups=None,
        )
        for p in range(P)
    ]
    t = np.zeros(R)
    count = [0] * num_sites
    for _ in range(num_steps):
        for j in order:
            arrive = t + compute_s / n + extra / n + jitter_s * rng.standard_normal(R)
            done = arrive.max() + transfer_s + rng.uniform(0, 20e-6, R)
            for r in range(R):
                off = offset_ns[r // rpp]
                out.append(
                    {
                        "type": "step",
                        "site": f"site-{j:02d}",
                        "step": count[j],
                        "rank": r,
                        "process": r // rpp,
                        "device": r if rpp > 1 else None,
                        "arrive_ns": int(arrive[r] * 1e9) + int(off),
                        "done_ns": int(done[r] * 1e9) + int(off),
                        "wait_ns": int(done[r] * 1e9) - int(arrive[r] * 1e9),
                        "delay_ns": 0,
                        "engaged": False,
                    }
                )
            count[j] += 1
            t = done
    return out
