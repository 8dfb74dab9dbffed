"""Vectorized NumPy cluster simulator that drives the real pacing policies step by step.

The cluster itself (draws, collective cost, one step's buckets and couplings) is `_cluster`;
this module runs its steps, feeds the policy, and summarizes the run.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import jaxpace.sim._collective_cost as coll
from jaxpace._validate import check_number
from jaxpace.diagnosis.earliness import earliness
from jaxpace.errors import ConfigError, ScenarioError
from jaxpace.policy.adaptive import adaptive
from jaxpace.policy.base import Observation, PacingPolicy
from jaxpace.policy.simple import fixed, no_pacing
from jaxpace.sim._cluster import (
    _BLOCK_STEPS,
    _Draws,
    _node_coupled_compute,
    _run_buckets,
    _Setup,
    collective_cost_s,
)
from jaxpace.sim._scenario import Scenario, load_scenario

__all__ = [
    "MAX_NODES",
    "MAX_STEPS",
    "Comparison",
    "SimResult",
    "collective_cost_s",
    "compare",
    "estimate_peak_bytes",
    "resolve_policy",
    "simulate",
]


# The bounds `simulate` (and `jaxpace simulate`) accept; outside them a run is
# refused before anything is allocated.
MAX_NODES = 1024
MAX_STEPS = 10_000_000
MAX_SEED = 2**63 - 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimResult:
    """Outcome of one simulated run.

    Attributes:
      scenario: scenario name.
      policy: the policy's name.
      nodes / ranks / steps: cluster size and run length.
      seed: the seed of every random draw.
      step_times_s: `(steps,)` iteration times (collective end to collective end).
      mean_step_s / p99_step_s: mean and 99th percentile of `step_times_s`.
      cv: iteration-time coefficient of variation, std/mean (>= 0).
      throughput_per_s: rank-steps per second, `ranks / mean_step_s` (global
        samples/s at one sample per rank and step).
      ideal_step_s: one median rank's compute plus the one-node collective, no
        noise and no waiting: the step a perfectly scaling job would take.
      scaling_efficiency: `ideal_step_s / mean_step_s`, in (0, 1] in practice.
      total_delay_s: pacing sleep summed over ranks and steps (rank-seconds).
      engaged_fraction: share of steps on which any rank slept, `[0, 1]`.
      mean_spin_s: mean time a rank spent inside the collective waiting for the
        last arriver (excluding its own pacing sleep).
    """

    scenario: str
    policy: str
    nodes: int
    ranks: int
    steps: int
    seed: int
    step_times_s: np.ndarray
    mean_step_s: float
    p99_step_s: float
    cv: float
    throughput_per_s: float
    ideal_step_s: float
    scaling_efficiency: float
    total_delay_s: float
    engaged_fraction: float
    mean_spin_s: float

    def summary(self) -> dict[str, Any]:
        """Every scalar field as a JSON-ready dict (no per-step array)."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name != "step_times_s"
        }


@dataclasses.dataclass(frozen=True, kw_only=True)
class Comparison:
    """The same run with and without pacing, on the same random draws.

    Attributes:
      baseline: the run with `no_pacing()`.
      paced: the run with the pacing policy.
      throughput_gain: `paced.throughput_per_s / baseline.throughput_per_s - 1`;
        positive means pacing helped.
    """

    baseline: SimResult
    paced: SimResult

    @property
    def throughput_gain(self) -> float:
        return self.paced.throughput_per_s / self.baseline.throughput_per_s - 1.0


def resolve_policy(
    spec: str | PacingPolicy | None, scenario: Scenario | None = None
) -> PacingPolicy:
    """Turns `none`, `adaptive`, `fixed:SECONDS` or a `PacingPolicy` into a policy.

    `adaptive` uses the scenario's `pacing.adaptive` settings.

    >>> resolve_policy("fixed:0.002").name
    'fixed(delay_s=0.002)'
    >>> resolve_policy(None).name
    'no_pacing()'
    """
    if spec is None or isinstance(spec, PacingPolicy):
        return no_pacing() if spec is None else spec
    text = str(spec).strip()
    if text in ("none", "no_pacing"):
        return no_pacing()
    if text == "adaptive":
        try:
            return adaptive(**(scenario.pacing.adaptive if scenario is not None else {}))
        except (ConfigError, TypeError) as e:
            raise ScenarioError(
                f"scenario `pacing.adaptive` settings are invalid: {e} Fix the scenario file's "
                "`pacing.adaptive` object (fields of `jaxpace.adaptive`)."
            ) from None
    if text.startswith("fixed:"):
        try:
            return fixed(float(text.split(":", 1)[1]))
        except ValueError as e:  # not a number, or ConfigError: negative, NaN, inf, too big
            detail = f" ({e})" if isinstance(e, ConfigError) else ""
            raise ScenarioError(
                f"`--policy {text}`: expected `fixed:SECONDS` with a delay in seconds >= 0, "
                f"e.g. `fixed:0.002`{detail}."
            ) from None
    raise ScenarioError(
        f"Unknown policy `{text}`. Valid choices: `none`, `adaptive`, `fixed:SECONDS`."
    )


def _ideal_step_s(scenario: Scenario) -> float:
    """One median rank's step on one node with no noise: forward, bucketed backward, all-reduces."""
    cm, B = scenario.compute, scenario.collective.buckets
    t_b = sum(collective_cost_s(scenario, 1, n_bytes=scenario.collective.n_bytes / B))
    end = 0.0
    for j in range(B):
        x = cm.base_s * (1.0 - cm.backward_fraction + cm.backward_fraction * (j + 1) / B)
        end = max(x, end) + t_b
    return end


# Steps run side by side when the policy's delays do not depend on the
# observations (`no_pacing`, `fixed`): enough to amortize NumPy's per-call cost,
# few enough that the step arrays stay in cache.
_CHUNK_STEPS = 32


class _PolicySites:
    """The policy state of every pacing site, updated once per step.

    With a policy that has a batched form (`PacingPolicy.batched`: `no_pacing`,
    `fixed`, `adaptive`) all sites go through one update call, which gives each
    site exactly the delays of its own update; otherwise site by site.
    `constant`: the policy's delays do not depend on what it observes
    (`BatchedPolicy.constant`), so they may be decided before the step runs.
    """

    def __init__(self, pol: PacingPolicy, n_sites: int, num_ranks: int):
        self.pol, self.batch = pol, pol.batched
        self.constant = self.batch is not None and bool(self.batch.constant)
        if self.batch is not None:
            self.state: Any = self.batch.init(n_sites, num_ranks)
        else:
            self.state = [pol.init(num_ranks) for _ in range(n_sites)]
        self._shape = (n_sites, num_ranks)

    def decide(self, e: np.ndarray, step: float) -> np.ndarray:
        """Each site's update on this step's `(sites, ranks)` earliness; returns the delays."""
        if self.batch is not None:
            obs = Observation(earliness_s=e, step_time_s=np.full(len(e), float(step)))
            delays, self.state = self.batch.update(obs, self.state)
            return np.asarray(delays, dtype=np.float64)
        new = np.empty(e.shape)
        for j, ej in enumerate(e):
            obs = Observation(earliness_s=ej.copy(), step_time_s=float(step))
            delays, self.state[j] = self.pol.update(obs, self.state[j])
            new[j] = np.asarray(delays, dtype=np.float64)
        return new

    def decide_ahead(self) -> np.ndarray:
        """A `constant` policy's next update, before its observation exists."""
        obs = Observation(earliness_s=np.zeros(self._shape), step_time_s=np.zeros(self._shape[0]))
        delays, self.state = self.batch.update(obs, self.state)
        return np.asarray(delays, dtype=np.float64)


def simulate(
    scenario: str | Scenario,
    *,
    nodes: int,
    steps: int = 2000,
    policy: str | PacingPolicy | None = None,
    seed: int = 0,
    lag_steps: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> SimResult:
    """Simulates `steps` synchronous training steps on `nodes` nodes.

    Each step: every rank computes (static speed × jitter × straggler episode
    × node thermal drift, plus couplings (c)/(d)): a forward pass, then the
    backward in `collective.buckets` buckets. Bucket `j`'s all-reduce is
    launched when the rank finishes that bucket (after any pacing sleep the
    policy decided `lag_steps` steps earlier, in host order) and overlaps later
    buckets' compute; it ends at `max(max_i launch_ij, end_j-1) + T_coll`.
    While a rank's launched kernel spins for a late peer, its compute runs
    `1 + spin_compute` times slower (coupling (b)). The step ends with the last
    bucket's collective. Each pacing site's policy then sees every rank's
    earliness (`w_i - min_j w_j`, `w` = wait including its own sleep) and the
    step time, exactly as in the runtime (`jaxpace.diagnosis.earliness.earliness`).
    Deterministic for a seed; the random
    draws do not depend on the policy.

    Args:
      scenario: a preset name, a JSON path or a `Scenario`.
      nodes: number of nodes (ranks = nodes × `gpus_per_node`), 1 to 1024.
      steps: number of steps, 1 to 10,000,000.
      policy: `None`/`"none"` (no pacing), `"adaptive"` (the scenario's
        settings), `"fixed:SECONDS"`, or any `PacingPolicy`.
      seed: seed of every random draw, an integer >= 0.
      lag_steps: decision-to-sleep lag; default the scenario's (2).
      progress: called with the number of steps done, after every step.

    Returns:
      A `SimResult`.

    Raises:
      ScenarioError: bad scenario, policy spec, `nodes` (1 to `MAX_NODES`),
        `steps` (1 to `MAX_STEPS`) or `seed` (an integer >= 0).

    >>> r = simulate("pure-bsp", nodes=2, steps=200, seed=1)
    >>> r.ranks, r.steps, bool(r.cv < 0.05), r.engaged_fraction
    (16, 200, True, 0.0)
    """
    sc = load_scenario(scenario)
    nodes, steps, seed = check_run_bounds(nodes, steps, seed)
    lag = coll.positive_int(
        "lag_steps", sc.pacing.lag_steps if lag_steps is None else lag_steps, error=ScenarioError
    )
    pol = resolve_policy(policy, sc)
    draws = _Draws(sc, nodes, seed)
    su = _Setup.of(sc, draws.ranks)
    step_times, total_delay, engaged, spin_sum = _run(draws, su, pol, steps, lag, progress)
    return _result(
        sc, pol, nodes, su.ranks, seed, step_times=step_times, total_delay=total_delay,
        engaged=engaged, spin_sum=spin_sum,
    )  # fmt: skip


def check_run_bounds(nodes: Any, steps: Any, seed: Any) -> tuple[int, int, int]:
    """`(nodes, steps, seed)` as ints if within bounds, else a `ScenarioError` naming the field.

    >>> check_run_bounds(2000, 10, 0)
    Traceback (most recent call last):
    ...
    jaxpace.errors.ScenarioError: `nodes` must be an integer in [1, 1024], got 2000. Pass a value in [1, 1024].
    """
    for name, value, hi in (("nodes", nodes, MAX_NODES), ("steps", steps, MAX_STEPS)):
        coll.positive_int(name, value, error=ScenarioError)  # type, bool, NaN: "positive integer"
        check_number(name, value, lo=1, hi=hi, integer=True, error=ScenarioError)
    try:
        check_number("seed", seed, lo=0, hi=MAX_SEED, integer=True, error=ScenarioError)
    except ScenarioError:
        raise ScenarioError(
            f"`seed` must be an integer >= 0 (below 2**63), got {seed!r}. Pass e.g. `0`."
        ) from None
    return int(nodes), int(steps), int(seed)


def estimate_peak_bytes(
    scenario: str | Scenario, *, nodes: int, steps: int, policy: str | PacingPolicy | None = None
) -> int:
    """An upper estimate of the memory one `simulate` run allocates at its peak, in bytes.

    Counts the arrays the run holds: per-step times, one block of random
    draws (`_BLOCK_STEPS` x ranks, with NumPy's temporaries), one chunk of
    steps run side by side (bucket jitter, spin intervals, waits, node-coupling
    temporaries), the delays in flight, and the policy's per-site state (an
    `adaptive` window is `window x ranks` per site, twice). Call it before
    allocating anything.

    >>> small = estimate_peak_bytes("pure-bsp", nodes=2, steps=1000)
    >>> big = estimate_peak_bytes("pure-bsp", nodes=1024, steps=1000)
    >>> 0 < small < big
    True
    """
    sc = load_scenario(scenario)
    pol = resolve_policy(policy, sc)
    f8 = 8
    R, g = nodes * sc.gpus_per_node, sc.gpus_per_node
    B = sc.collective.buckets
    S = B if sc.pacing.sites == "every_bucket" else 1
    n = min(_BLOCK_STEPS, steps)
    lag = sc.pacing.lag_steps
    chunk = min(max(lag, _CHUNK_STEPS), steps)  # the most steps `_run` runs side by side
    # The policy's state grows linearly in ranks: measure its slope on 1 and 2 ranks.
    per_rank_state = max(0, _nbytes(pol.init(2)) - _nbytes(pol.init(1)))
    total = f8 * steps  # step times
    total += f8 * n * R * 7  # one block of draws, with temporaries
    total += f8 * n * R * B * 3  # its bucket jitter: this block's, the next, one being drawn
    # One chunk of steps: bucket jitter, work, kernel starts and spin intervals per
    # bucket, waits and earliness per site, node-coupling temporaries, per-rank vectors.
    total += f8 * chunk * R * (6 * B + 6 * S + 3 * (g if g > 1 else 0) + 24)
    total += f8 * S * R * (lag + 2)  # delays in flight, new decisions
    total += per_rank_state * R * (S + 4)  # every site's state, one update's temporaries
    return int(total) + (1 << 20)


def _nbytes(tree: Any) -> int:
    if isinstance(tree, np.ndarray):
        return int(tree.nbytes)
    if isinstance(tree, (tuple, list)):
        return sum(_nbytes(x) for x in tree)
    if isinstance(tree, dict):
        return sum(_nbytes(x) for x in tree.values())
    return 0


def _earliness(waits: np.ndarray) -> np.ndarray:
    """`jaxpace.diagnosis.earliness.earliness(waits, axis=-1)`; with every wait finite and >= 0
    (as the engine's are), the same numbers in two NumPy calls instead of a dozen."""
    lo, hi = waits.min(), waits.max()
    if lo >= 0 and hi < np.inf:
        return waits - waits.min(axis=-1, keepdims=True)
    return earliness(waits, axis=-1)


def _run(
    draws: _Draws,
    su: _Setup,
    pol: PacingPolicy,
    steps: int,
    lag: int,
    progress: Callable[[int], None] | None,
    *,
    block_hook: Callable[[int, int, np.ndarray, np.ndarray], tuple] | None = None,
    on_step: Callable[..., None] | None = None,
) -> tuple[np.ndarray, float, int, float]:
    """The step loop; returns `(step times, total delay, engaged steps, spin rank-seconds)`.

    `block_hook(k, n, compute, transfer)` may change a block's draws before it
    runs (injected faults); `on_step(step, waits, bucket_ends, delays, transfer_s)`
    sees each step (the records writer). Both default to nothing.

    A step depends on earlier ones only through the delays decided `lag` steps
    before it, so `lag` steps at a time run side by side (`_run_buckets`), and
    a whole chunk when the policy's delays do not depend on its observations;
    each step's policy update, callbacks and sums still come in step order.
    """
    R, S = su.ranks, su.n_sites
    sites = _PolicySites(pol, S, R)
    chunk = _CHUNK_STEPS if sites.constant else lag
    # pending[slot]: the (sites, ranks) delays decided `lag` steps before the step using `slot`.
    pending = np.zeros((lag, S, R))
    step_times = np.empty(steps)
    total_delay, engaged, spin_sum = 0.0, 0, 0.0
    for k, n, comp, t_coll, jit_block in _blocks(draws, steps):
        if block_hook is not None:
            comp, t_coll = block_hook(k, n, comp, t_coll)
        t = 0
        while t < n:
            L = min(chunk, n - t)
            slots = [(k + t + i) % lag for i in range(L)]
            if sites.constant:  # decided ahead: the delays do not depend on the step
                D = np.empty((L, S, R))
                for i, slot in enumerate(slots):
                    D[i] = pending[slot]
                    pending[slot] = sites.decide_ahead()
            else:  # every step of the chunk was decided before it
                D = pending[slots]
            a = comp[t : t + L]
            if su.node_coupled:
                a = _node_coupled_compute(a.reshape(-1), D[:, 0].reshape(-1), su).reshape(L, R)
            jit = None if jit_block is None else jit_block[t : t + L]
            ends, waits, bucket_ends, spins = _run_buckets(a, D, jit, t_coll[t : t + L], su)
            flat = D.reshape(L, -1)
            any_delay = flat.any(axis=1).tolist()
            delay_sums = flat.sum(axis=1).tolist()
            spin_rows = spins.tolist()
            step_times[k + t : k + t + L] = ends
            e = None if sites.constant else _earliness(waits)
            for i in range(L):
                s = k + t + i
                for sp in spin_rows[i]:
                    spin_sum += sp
                if on_step is not None:
                    on_step(s, waits[:, i], bucket_ends[:, i], D[i], t_coll[t + i])
                if any_delay[i]:
                    engaged += 1
                    total_delay += delay_sums[i]
                if e is not None:
                    pending[slots[i]] = sites.decide(e[:, i], ends[i])
                if progress is not None:
                    progress(s + 1)
            t += L
    return step_times, total_delay, engaged, spin_sum


def _blocks(draws: _Draws, steps: int) -> Iterator[tuple]:
    """`(k, n, compute, transfer, bucket jitter)` for each block of `_BLOCK_STEPS` steps.

    The next block is drawn on a second thread while the caller runs this one
    (NumPy's generators and `exp` release the GIL). Each stream is still drawn
    by one thread, block after block, so the numbers are those of drawing in
    the loop; nothing of the run's state is shared with the thread.
    """

    def draw(k: int) -> tuple:
        n = min(_BLOCK_STEPS, steps - k)
        comp, t_coll = draws.block(k, n)
        return k, n, comp, t_coll, draws.bucket_jitter(n)

    if steps <= _BLOCK_STEPS:  # one block: nothing to overlap
        yield draw(0)
        return
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="jaxpace-sim-draws") as ex:
        nxt = ex.submit(draw, 0)
        for k in range(0, steps, _BLOCK_STEPS):
            cur = nxt.result()
            if k + _BLOCK_STEPS < steps:
                nxt = ex.submit(draw, k + _BLOCK_STEPS)
            yield cur
            del cur


def _result(
    sc: Scenario,
    pol: PacingPolicy,
    nodes: int,
    ranks: int,
    seed: int,
    *,
    step_times: np.ndarray,
    total_delay: float,
    engaged: int,
    spin_sum: float,
) -> SimResult:
    steps = len(step_times)
    mean = float(step_times.mean())
    ideal = _ideal_step_s(sc)
    return SimResult(
        scenario=sc.name,
        policy=pol.name,
        nodes=nodes,
        ranks=ranks,
        steps=steps,
        seed=seed,
        step_times_s=step_times,
        mean_step_s=mean,
        p99_step_s=float(np.percentile(step_times, 99)),
        cv=float(step_times.std() / mean),
        throughput_per_s=ranks / mean,
        ideal_step_s=ideal,
        scaling_efficiency=ideal / mean,
        total_delay_s=total_delay,
        engaged_fraction=engaged / steps,
        mean_spin_s=spin_sum / (steps * ranks),
    )


def compare(
    scenario: str | Scenario,
    *,
    nodes: int,
    steps: int = 2000,
    policy: str | PacingPolicy = "adaptive",
    seed: int = 0,
    lag_steps: int | None = None,
) -> Comparison:
    """Runs `scenario` with and without pacing on the same random draws.

    Both runs use the same seed, and no draw depends on the policy, so every
    difference between them is caused by pacing (common random numbers).

    >>> c = compare("pure-bsp", nodes=2, steps=200)
    >>> c.throughput_gain <= 0.0
    True
    """
    base = simulate(scenario, nodes=nodes, steps=steps, policy=None, seed=seed, lag_steps=lag_steps)
    paced = simulate(
        scenario, nodes=nodes, steps=steps, policy=policy, seed=seed, lag_steps=lag_steps
    )
    return Comparison(baseline=base, paced=paced)
