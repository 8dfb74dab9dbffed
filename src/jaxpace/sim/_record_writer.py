"""A simulated run as runtime records (docs/records.md), with the ground truth of what was injected.

`simulate_records` runs the same step model as `simulate` (same draws, same
policies, same bucketed collectives) and keeps, for every recorded site, step
and rank, what the runtime would have written: arrival before the pacing sleep,
the collective's exit, the sleep. Each process gets its own clock offset, and
the headers carry the scenario's topology as `rank_groups` (host, NUMA node,
NIC, leaf switch). `Faults` injects labelled problems on top of the scenario;
`GroundTruth` says what a correct diagnosis names. `write_records` writes one
JSONL file per process, fast enough for 8192 ranks x 1000 steps.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

import jaxpace.sim._collective_cost as coll
from jaxpace._validate import check_number
from jaxpace.errors import ScenarioError
from jaxpace.records.format import header_record, make_dirs, records_filename
from jaxpace.records.reader import Records
from jaxpace.records.safe_io import write_atomic
from jaxpace.sim._cluster import _Draws, _Setup
from jaxpace.sim._engine import SimResult, _result, _run, resolve_policy
from jaxpace.sim._scenario import Scenario, load_scenario

__all__ = [
    "Faults",
    "GroundTruth",
    "SimRecords",
    "rank_groups",
    "simulate_records",
    "write_records",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Faults:
    """Labelled problems injected on top of a scenario (all off by default).

    Attributes:
      late_ranks, late_s: ranks whose compute takes `late_s` seconds longer every step.
      late_nodes, node_late_s: whole nodes (hosts) `node_late_s` slower.
      late_numa, numa_late_s: nodes whose second NUMA half (local GPUs
        `g/2 .. g-1`) is `numa_late_s` slower.
      transfer_growth: the collective's time grows linearly by this fraction
        over the run (1 = doubles).
      spike_prob, spike_min, spike_max: chance per step that the collective
        takes `U(spike_min, spike_max)` times longer.
      periodic_every, periodic_rank, periodic_extra_s: `periodic_rank` does
        `periodic_extra_s` of extra work every `periodic_every` steps (eval).
    """

    late_ranks: tuple[int, ...] = ()
    late_s: float = 0.0
    late_nodes: tuple[int, ...] = ()
    node_late_s: float = 0.0
    late_numa: tuple[int, ...] = ()
    numa_late_s: float = 0.0
    transfer_growth: float = 0.0
    spike_prob: float = 0.0
    spike_min: float = 3.0
    spike_max: float = 8.0
    periodic_every: int = 0
    periodic_rank: int = 0
    periodic_extra_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("late_s", "node_late_s", "numa_late_s", "periodic_extra_s"):
            check_number(
                f"faults.{name}", getattr(self, name), lo=0.0, hi=3600.0, error=ScenarioError
            )
        check_number(
            "faults.transfer_growth", self.transfer_growth, lo=0.0, hi=1000.0, error=ScenarioError
        )
        check_number("faults.spike_prob", self.spike_prob, lo=0.0, hi=1.0, error=ScenarioError)
        check_number("faults.spike_min", self.spike_min, lo=1.0, hi=1000.0, error=ScenarioError)
        check_number(
            "faults.spike_max", self.spike_max, lo=self.spike_min, hi=1000.0, error=ScenarioError
        )
        check_number(
            "faults.periodic_every", self.periodic_every, lo=0, hi=10**9, integer=True,
            error=ScenarioError,
        )  # fmt: skip
        for name in ("late_ranks", "late_nodes", "late_numa"):
            object.__setattr__(self, name, tuple(int(x) for x in getattr(self, name)))


@dataclasses.dataclass(frozen=True)
class GroundTruth:
    """What a correct diagnosis of a simulated run names.

    Attributes:
      mode: the failure mode injected (a `jaxpace.report.FAILURE_MODES` name);
        `balanced` for a healthy run (periodic extra work alone is balanced).
      culprits: ranks that are persistently late on their own, sorted.
      groups: `(kind, label)` of groups late together (`host`, `numa`, `process`).
      culprit_process: the process that is late as a whole, or None.
      periodic_rank: the rank doing periodic extra work, or None.
      causes: human-readable list of what was injected.
    """

    mode: str
    culprits: tuple[int, ...] = ()
    groups: tuple[tuple[str, str], ...] = ()
    culprit_process: int | None = None
    periodic_rank: int | None = None
    causes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class SimRecords:
    """`simulate_records`' result: the records, what was injected, and the run's summary."""

    records: Records
    truth: GroundTruth
    result: SimResult
    expected_transfer_s: float  # the uncontended alpha-beta time of one site's collective


def rank_groups(scenario: Scenario, nodes: int) -> dict[str, dict[int, str]]:
    """The topology as rank groups: `host`, `numa` (two halves per node), `nic`, `leaf`.

    A NIC (PCIe switch) serves two neighbouring GPUs; a leaf switch serves
    `fabric.nodes_per_leaf` nodes.

    >>> g = rank_groups(load_scenario("pure-bsp"), 2)
    >>> g["host"][9], g["numa"][12], g["nic"][3], g["leaf"][15]
    ('node-1', 'node-1/numa1', 'node-0/nic1', 'leaf-0')
    """
    g = scenario.gpus_per_node
    ranks = np.arange(nodes * g)
    node, local = ranks // g, ranks % g
    half = max(g // 2, 1)
    leaf = node // scenario.fabric.nodes_per_leaf
    return {
        "host": {int(r): f"node-{n}" for r, n in zip(ranks, node, strict=True)},
        "numa": {
            int(r): f"node-{n}/numa{int(x >= half)}"
            for r, n, x in zip(ranks, node, local, strict=True)
        },
        "nic": {
            int(r): f"node-{n}/nic{x // 2}" for r, n, x in zip(ranks, node, local, strict=True)
        },
        "leaf": {int(r): f"leaf-{lf}" for r, lf in zip(ranks, leaf, strict=True)},
    }


def _truth(sc: Scenario, nodes: int, faults: Faults, draws: _Draws, rpp: int) -> GroundTruth:
    """The ground truth: explicit faults first, then what the scenario itself injects."""
    g = sc.gpus_per_node
    causes: list[str] = []
    culprits: set[int] = set()
    groups: list[tuple[str, str]] = []
    mode = "balanced"
    proc = None
    if faults.late_ranks and faults.late_s > 0:
        culprits |= set(faults.late_ranks)
        mode = "persistent_straggler"
        causes.append(f"ranks {sorted(culprits)} {faults.late_s * 1e3:.3g} ms late")
    static_out = np.flatnonzero(
        draws.base > sc.compute.base_s * (1.0 + 0.5 * (sc.compute.outlier_factor - 1.0))
    )
    if sc.compute.outlier_prob > 0 and static_out.size:
        culprits |= {int(r) for r in static_out}
        mode = "persistent_straggler"
        causes.append(f"static outlier GPUs {static_out.tolist()}")
    if faults.late_nodes and faults.node_late_s > 0:
        for n in faults.late_nodes:
            if rpp == g:
                groups.append(("process", str(n)))
                proc = n if proc is None else proc
            else:
                groups.append(("host", f"node-{n}"))
        mode = "persistent_straggler" if rpp == g else "locality"
        causes.append(f"nodes {list(faults.late_nodes)} {faults.node_late_s * 1e3:.3g} ms late")
    if faults.late_numa and faults.numa_late_s > 0:
        groups += [("numa", f"node-{n}/numa1") for n in faults.late_numa]
        mode = "locality"
        causes.append(
            f"NUMA half 1 of nodes {list(faults.late_numa)} {faults.numa_late_s * 1e3:.3g} ms late"
        )
    loc = sc.locality
    if loc.far_fraction > 0 and loc.far_compute_penalty > 0 and round(loc.far_fraction * g) > 0:
        mode = "locality"
        causes.append(f"far-NUMA GPUs (+{loc.far_compute_penalty:.0%} compute) on every node")
    if sc.stragglers.onset_prob > 0:
        mode = "synchronization_amplification" if mode == "balanced" else mode
        causes.append(f"episodic stragglers (onset {sc.stragglers.onset_prob:g} per rank-step)")
    contention = faults.transfer_growth > 0 or faults.spike_prob > 0
    if draws.leaves > 1 and sc.fabric.ecmp_flows > 0 and draws.inter_s > 0:
        contention = True
        causes.append(f"ECMP collisions: the job spans {draws.leaves} leaf switches")
    if sc.coupling.shared_links > 0 and draws.inter_s > 0:
        contention = True
        causes.append(f"background traffic on shared links ({sc.coupling.shared_links:.0%})")
    if faults.transfer_growth > 0:
        causes.append(f"collective grows {faults.transfer_growth:+.0%} over the run")
    if faults.spike_prob > 0:
        causes.append(
            f"collective {faults.spike_min:g}-{faults.spike_max:g}x on {faults.spike_prob:.0%} of steps"
        )
    if contention and mode == "balanced":
        mode = "topology_contention"
    periodic = None
    if faults.periodic_every > 0 and faults.periodic_extra_s > 0:
        periodic = faults.periodic_rank
        causes.append(
            f"rank {periodic} +{faults.periodic_extra_s * 1e3:.3g} ms every {faults.periodic_every} steps"
        )
    return GroundTruth(
        mode=mode,
        culprits=tuple(sorted(culprits)),
        groups=tuple(groups),
        culprit_process=proc,
        periodic_rank=periodic,
        causes=tuple(causes) or ("nothing injected",),
    )


def _fault_compute(faults: Faults, g: int, R: int) -> np.ndarray:
    """(R,) extra seconds of compute per step from the persistent faults."""
    extra = np.zeros(R)
    if faults.late_ranks:
        extra[np.asarray(faults.late_ranks)] += faults.late_s
    local = np.arange(R) % g
    node = np.arange(R) // g
    if faults.late_nodes:
        extra[np.isin(node, faults.late_nodes)] += faults.node_late_s
    if faults.late_numa:
        extra[np.isin(node, faults.late_numa) & (local >= max(g // 2, 1))] += faults.numa_late_s
    return extra


def simulate_records(
    scenario: str | Scenario,
    *,
    nodes: int,
    steps: int = 1000,
    policy: Any = None,
    seed: int = 0,
    faults: Faults | None = None,
    ranks_per_process: int | None = None,
    clock_offset_s: float = 100.0,
    exit_jitter_s: float = 20e-6,
    run_id: str | None = None,
) -> SimRecords:
    """Simulates a run and returns it as runtime records, with its ground truth.

    The step model is `simulate`'s (forward, bucketed backward, each bucket's
    all-reduce, pacing sleeps decided `lag_steps` earlier by the real policy).
    Each pacing site (the first bucket, or every bucket with `pacing.sites =
    "every_bucket"`) becomes a records site `bucket{j}`. Per rank and step:
    `arrive_ns` when its compute reached the site (before the sleep), `done_ns`
    when the collective ended plus an exponential callback exit jitter of mean
    `exit_jitter_s`, `delay_ns` the sleep; every process's clock is offset by
    up to `clock_offset_s`.

    Args:
      scenario, nodes, steps, policy, seed: as for `simulate`.
      faults: problems to inject (`Faults`), on top of the scenario's own.
      ranks_per_process: ranks per process (a divisor of `gpus_per_node`);
        default one process per node (`"device"` granularity, as JAX runs).
      clock_offset_s, exit_jitter_s: see above.
      run_id: default `sim-<scenario>-<nodes>-<seed>`.

    >>> run = simulate_records("pure-bsp", nodes=2, steps=30, faults=Faults(late_ranks=(3,), late_s=0.02))
    >>> len(run.records), run.truth.mode, run.truth.culprits
    (480, 'persistent_straggler', (3,))
    """
    sc = load_scenario(scenario)
    faults = faults or Faults()
    nodes = coll.positive_int("nodes", nodes, error=ScenarioError)
    steps = coll.positive_int("steps", steps, error=ScenarioError)
    g = sc.gpus_per_node
    rpp = g if ranks_per_process is None else int(ranks_per_process)
    if rpp < 1 or g % rpp:
        raise ScenarioError(
            f"`ranks_per_process` must divide `gpus_per_node` ({g}), got {ranks_per_process!r}."
        )
    pol = resolve_policy(policy, sc)
    draws = _Draws(sc, nodes, seed)
    su = _Setup.of(sc, draws.ranks)
    R = su.ranks
    bad = [r for r in faults.late_ranks if not 0 <= r < R]
    if bad or not 0 <= faults.periodic_rank < R:
        raise ScenarioError(
            f"`faults` names ranks outside 0..{R - 1}: {bad or [faults.periodic_rank]}."
        )
    loop = _record_loop(draws, su, pol, steps, sc.pacing.lag_steps, faults, seed)
    result = _result(
        sc,
        pol,
        nodes,
        R,
        seed,
        step_times=loop["step_times"],
        total_delay=loop["total_delay"],
        engaged=loop["engaged_steps"],
        spin_sum=loop["spin"],
    )
    recs = _to_records(
        sc, nodes, rpp, pol.name, loop, seed, clock_offset_s=clock_offset_s,
        exit_jitter_s=exit_jitter_s, run_id=run_id or f"sim-{sc.name}-{nodes}-{seed}",
    )  # fmt: skip
    expected = draws.intra_s + draws.inter_s
    return SimRecords(recs, _truth(sc, nodes, faults, draws, rpp), result, float(expected))


def _record_loop(draws, su, pol, steps, lag, faults: Faults, seed: int) -> dict[str, Any]:
    """`simulate`'s own step loop with the faults injected, keeping each site's timings."""
    R, S_n = su.ranks, su.n_sites
    arrive = np.empty((S_n, steps, R))
    last = np.empty((S_n, steps))
    delay = np.zeros((S_n, steps, R), dtype=np.float32) if pol.max_delay_s > 0 else None
    t_coll_all = np.empty(steps)
    extra = _fault_compute(faults, su.g, R)
    r_fault = np.random.default_rng([seed, 7])

    def inject(k, n, comp, t_coll):
        comp = comp + extra
        ks = np.arange(k, k + n)
        if faults.periodic_every > 0:
            hit = ks % faults.periodic_every == faults.periodic_every - 1
            comp[hit, faults.periodic_rank] += faults.periodic_extra_s
        t_coll = t_coll * (1.0 + faults.transfer_growth * ks / max(steps - 1, 1))
        if faults.spike_prob > 0:
            spikes = r_fault.random(n) < faults.spike_prob
            t_coll = np.where(
                spikes, t_coll * r_fault.uniform(faults.spike_min, faults.spike_max, n), t_coll
            )
        return comp, t_coll

    def keep(step, waits, ends, D, t_coll):
        t_coll_all[step] = t_coll
        for j in range(S_n):
            last[j, step] = ends[j]
            arrive[j, step] = ends[j] - waits[j]
        if delay is not None:
            delay[:, step] = D

    step_times, total_delay, engaged_steps, spin_sum = _run(
        draws, su, pol, steps, lag, None, block_hook=inject, on_step=keep
    )
    return {
        "arrive": arrive, "last": last, "delay": delay, "t_coll": t_coll_all,
        "step_times": step_times, "total_delay": total_delay, "engaged_steps": engaged_steps,
        "spin": spin_sum,
    }  # fmt: skip


def _to_records(
    sc, nodes, rpp, policy_name, loop, seed, *, clock_offset_s, exit_jitter_s, run_id
) -> Records:
    """Columnar `Records` (site-major, then step, then rank) with one header per process."""
    arrive, last = loop["arrive"], loop["last"]
    S_n, S, R = arrive.shape
    P = R // rpp
    rng = np.random.default_rng([seed, 11])
    start = np.concatenate([[0.0], np.cumsum(loop["step_times"])[:-1]])  # each step's start
    offsets = np.round(rng.uniform(0.0, clock_offset_s, P) * 1e9).astype(np.int64) + 10**12
    off_rank = offsets[np.arange(R) // rpp]
    cols: dict[str, list[np.ndarray]] = {
        k: []
        for k in (
            "site",
            "step",
            "rank",
            "process",
            "arrive_ns",
            "done_ns",
            "wait_ns",
            "delay_ns",
            "engaged",
            "device",
        )
    }
    steps_col = np.repeat(np.arange(S), R)
    ranks_col = np.tile(np.arange(R), S)
    for j in range(S_n):
        a_ns = np.round((start[:, None] + arrive[j]) * 1e9).astype(np.int64)
        end = start + last[j] + loop["t_coll"]
        jit = rng.exponential(exit_jitter_s, (S, R)) if exit_jitter_s > 0 else np.zeros((S, R))
        d_ns = np.round((end[:, None] + jit) * 1e9).astype(np.int64)
        d_ns = np.maximum(d_ns, a_ns)
        dl = loop["delay"]
        dl_ns = (
            np.zeros((S, R), np.int64)
            if dl is None
            else np.round(dl[j].astype(np.float64) * 1e9).astype(np.int64)
        )
        dl_ns = np.minimum(dl_ns, d_ns - a_ns)
        cols["site"].append(np.full(S * R, j, np.int64))
        cols["step"].append(steps_col)
        cols["rank"].append(ranks_col)
        cols["process"].append(ranks_col // rpp)
        cols["arrive_ns"].append((a_ns + off_rank).ravel())
        cols["done_ns"].append((d_ns + off_rank).ravel())
        cols["wait_ns"].append((d_ns - a_ns).ravel())
        cols["delay_ns"].append(dl_ns.ravel())
        cols["engaged"].append(np.repeat((dl_ns > 0).any(axis=1), R))
        cols["device"].append(ranks_col if rpp > 1 else np.full(S * R, -1, np.int64))
    columns = {k: np.concatenate(v) for k, v in cols.items()}
    groups = rank_groups(sc, nodes)
    granularity = "device" if rpp > 1 else "process"
    headers = []
    for p in range(P):
        mine = range(p * rpp, (p + 1) * rpp)
        headers.append(
            header_record(
                run_id=run_id,
                process_index=p,
                process_count=P,
                host=groups["host"][p * rpp],
                pid=10_000 + p,
                granularity=granularity,
                jaxpace_version="sim",
                policy=policy_name,
                local_devices=list(mine),
                rank_groups={kind: {r: m[r] for r in mine} for kind, m in groups.items()},
            )
        )
    return Records(
        headers=tuple(headers),
        sites=tuple(f"bucket{j}" for j in range(S_n)),
        columns=columns,
        run_id=run_id,
        process_count=P,
        granularity=granularity,
        sources=("<simulated>",),
    )


def write_records(records: Records | SimRecords, directory: str | os.PathLike) -> list[Path]:
    """Writes `records-p{process}.jsonl` per process (docs/records.md), vectorized.

    Same lines as `Records.write_jsonl`, formatted column-wise (several times
    faster at millions of records). Each file goes through `safe_io.write_atomic`
    (a temporary file, then one rename; a symlink or special file is refused).
    """
    recs = records.records if isinstance(records, SimRecords) else records
    d = os.fspath(directory)
    make_dirs(d)
    c = recs.columns
    sites = np.array([json.dumps(s) for s in recs.sites], dtype=object)
    proc = c["process"]
    order = np.argsort(proc, kind="stable")
    bounds = np.searchsorted(
        proc[order], np.arange((recs.process_count or int(proc.max()) + 1) + 1)
    )
    by_proc = {int(h["process_index"]): h for h in recs.headers}
    out = []
    for p in range(bounds.size - 1):
        idx = order[bounds[p] : bounds[p + 1]]
        lines = _step_lines(c, idx, sites)
        path = os.path.join(d, records_filename(p))
        head = json.dumps(by_proc[p], separators=(",", ":")) + "\n" if p in by_proc else ""
        out.append(Path(write_atomic(path, head + lines, what="records")))
    return out


def _step_lines(c: dict[str, np.ndarray], idx: np.ndarray, sites: np.ndarray) -> str:
    """The JSONL text of records `idx` (one line each, `step_record`'s keys in its order).

    One `%`-format per line over columns turned into Python lists at once: about
    4x faster than NumPy string concatenation (measured on 500k records).
    """
    if idx.size == 0:
        return ""
    keys = ("step", "rank", "process", "arrive_ns", "done_ns", "wait_ns", "delay_ns")
    cols = [c[k][idx].tolist() for k in keys]
    dev = c["device"][idx]
    dev_s = np.where(dev < 0, "null", dev.astype(str)).tolist()
    eng = np.where(c["engaged"][idx], "true", "false").tolist()
    site = sites[c["site"][idx]].tolist()
    fmt = (
        '{"type":"step","site":%s,"step":%d,"rank":%d,"process":%d,"device":%s,'
        '"arrive_ns":%d,"done_ns":%d,"wait_ns":%d,"delay_ns":%d,"engaged":%s}\n'
    )
    step, rank, proc, arr, done, wait, delay = cols
    return "".join(
        [
            fmt % row
            for row in zip(site, step, rank, proc, dev_s, arr, done, wait, delay, eng, strict=True)
        ]
    )
