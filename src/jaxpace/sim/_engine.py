"""Vectorized NumPy cluster simulator that drives the real pacing policies step by step."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import jaxpace.sim._collectives as coll
from jaxpace._exchange import earliness
from jaxpace._native import kernels
from jaxpace._validate import check_number
from jaxpace.errors import ConfigError, ScenarioError
from jaxpace.policy.adaptive import adaptive
from jaxpace.policy.base import Observation, PacingPolicy
from jaxpace.policy.simple import fixed, no_pacing
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

# Random draws are generated in blocks of this many steps, so memory stays
# bounded at 1024 nodes and results do not depend on anything but the seed.
_BLOCK_STEPS = 256

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


def collective_cost_s(
    scenario: Scenario, nodes: int, *, n_bytes: float | None = None
) -> tuple[float, float]:
    """Returns `(intra_s, inter_s)`: the all-reduce's intra- and inter-node terms, uncontended.

    `n_bytes` defaults to the scenario's whole gradient (`collective.n_bytes`);
    the engine passes one bucket's share, `n_bytes / buckets`.

    The inter-node bandwidth is that of the slowest rank (a far-NUMA GPU when
    the scenario has any): a ring runs at its slowest link.

    >>> s = load_scenario("pure-bsp")
    >>> intra, inter = collective_cost_s(s, 1)
    >>> inter
    0.0
    """
    c, g, q = scenario.collective, scenario.gpus_per_node, nodes
    n = c.n_bytes if n_bytes is None else float(n_bytes)
    p = g * q
    beta_l = 1.0 / (c.bw_intra_gbyte_s * 1e9)
    far = scenario.locality.far_fraction > 0 and round(scenario.locality.far_fraction * g) > 0
    bw_factor = scenario.locality.far_bw_factor if far else 1.0
    beta_n = 1.0 / (c.bw_inter_gbyte_s * 1e9 * bw_factor)
    if c.algorithm == "hierarchical":
        return (
            coll.hierarchical_intra_s(g, n, c.alpha_intra_s, beta_l),
            coll.hierarchical_inter_s(g, q, n, c.alpha_inter_s, beta_n),
        )
    fn = coll.ring_allreduce_s if c.algorithm == "ring" else coll.tree_allreduce_s
    if q == 1:
        return fn(p, n, c.alpha_intra_s, beta_l), 0.0
    return 0.0, fn(p, n, c.alpha_inter_s, beta_n)


def _ideal_step_s(scenario: Scenario) -> float:
    """One median rank's step on one node with no noise: forward, bucketed backward, all-reduces."""
    cm, B = scenario.compute, scenario.collective.buckets
    t_b = sum(collective_cost_s(scenario, 1, n_bytes=scenario.collective.n_bytes / B))
    end = 0.0
    for j in range(B):
        x = cm.base_s * (1.0 - cm.backward_fraction + cm.backward_fraction * (j + 1) / B)
        end = max(x, end) + t_b
    return end


def _advance(
    t: np.ndarray,
    work: np.ndarray,
    spin_u: np.ndarray,
    spin_v: np.ndarray,
    ptr: np.ndarray,
    nk: int,
    slow: float,
    ar: np.ndarray,
    cur: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """Runs `work` seconds of compute from times `t`, `slow`x slower inside spin intervals.

    Rank `i`'s spin intervals are `[spin_u[m, i], spin_v[m])` for `m < nk`,
    disjoint and in time order (when `spin_v` is 2-D, `(intervals, L)`, the
    ranks are `L` steps side by side: rank `i` is in step `i // (len(t) // L)`
    and its intervals end at `spin_v[m, i // (len(t) // L)]`). `ptr[i]` is the
    first interval that may still end after `t[i]`; it is advanced in place.
    Vectorized over ranks: one pass over all ranks handles the interval `ptr`
    points at; the few ranks whose compute then runs into a further interval
    go through `_advance_loop`.

    `cur`: `(u, v)` buffers holding each rank's interval `ptr`, kept up to date
    across calls (the engine's path, where `ptr <= nk - 1` on entry): only
    ranks that moved to an older interval are gathered, instead of every rank.
    """
    if nk == 0:
        return t + work
    per = len(t) // spin_v.shape[1] if spin_v.ndim == 2 else 0  # ranks per step
    new = None
    if cur is None:
        p = np.minimum(ptr, nk - 1)
        v = spin_v[p] if spin_v.ndim == 1 else spin_v[p, ar // per]
        u = spin_u[p, ar]
    else:
        u, v = cur
        v2 = v.reshape(-1, per)
        if nk == 1:  # every rank starts at interval 0
            u[:] = spin_u[0]
            v2[:] = spin_v[0][:, None]
        else:  # ranks that reached the newest interval at the last call
            new = ptr == nk - 1
            np.copyto(u, spin_u[nk - 1], where=new)
            np.copyto(v2, spin_v[nk - 1][:, None], where=new.reshape(-1, per))
    start = np.maximum(t, u)
    rem = work - (start - t)  # work left when the spin starts
    cap = np.maximum(v - start, 0.0)
    cap /= slow  # work that fits inside the spin
    passed = rem > cap
    # Ends after the spin, else inside it; (rarely) before it starts.
    out = np.where(passed, np.maximum(v, start) + rem - cap, start + rem * slow)
    if rem.min() <= 0:
        early = rem <= 0
        out[early] = t[early] + work[early]
    ptr += passed
    if cur is None:
        np.minimum(ptr, nk, out=ptr)
        q = np.minimum(ptr, nk - 1)
        idx = np.flatnonzero(passed & (ptr < nk) & (out > spin_u[q, ar]))
    elif new is None:  # past interval 0, the only one: nothing ahead
        idx = ar[:0]
    else:
        # Passing the newest interval leaves nothing ahead (`ptr == nk`: loaded
        # at the next call); ranks that passed an older one are at interval `ptr`.
        idx = np.flatnonzero(passed > new)
        if idx.size:
            q = ptr[idx]
            uq = spin_u[q, idx]
            into = out[idx] > uq  # runs into interval `q` too
            after = np.maximum(v[idx[into]], start[idx[into]])
            u[idx] = uq
            v[idx] = spin_v[q, idx // per]
            idx = idx[into]
    if idx.size:
        out[idx] = np.maximum(v[idx], start[idx]) if cur is None else after
        _advance_loop(out, rem[idx] - cap[idx], idx, spin_u, spin_v, ptr, nk, slow)
        if cur is not None:  # where the loop left them
            q = ptr[idx]
            inside = q < nk
            i, q = idx[inside], q[inside]
            u[i] = spin_u[q, i]
            v[i] = spin_v[q, i // per]
    return out


# Below this many ranks, `_advance_loop` runs in plain Python floats (the same
# IEEE operations, without NumPy's per-call cost).
_SCALAR_LOOP = 48


def _advance_loop(
    t: np.ndarray,
    w: np.ndarray,
    idx: np.ndarray,
    spin_u: np.ndarray,
    spin_v: np.ndarray,
    ptr: np.ndarray,
    nk: int,
    slow: float,
) -> None:
    """`_advance` for ranks `idx` with work `w` left, interval by interval; updates `t` in place."""
    if idx.size <= _SCALAR_LOOP:
        _advance_loop_scalar(t, w, idx, spin_u, spin_v, ptr, nk, slow)
        return
    per = len(t) // spin_v.shape[1] if spin_v.ndim == 2 else 0
    while idx.size:
        p = ptr[idx]
        ti = t[idx]
        start = np.maximum(ti, spin_u[p, idx])
        gap = start - ti
        v = spin_v[p] if spin_v.ndim == 1 else spin_v[p, idx // per]
        cap = np.maximum(v - start, 0.0) / slow
        before = w <= gap
        inside = ~before & (w - gap <= cap)
        t[idx] = np.where(
            before, ti + w, np.where(inside, start + (w - gap) * slow, np.maximum(v, start))
        )
        passed = ~(before | inside)
        w = w - gap - cap
        idx, w = idx[passed], w[passed]
        ptr[idx] += 1
        out = ptr[idx] >= nk
        t[idx[out]] += w[out]
        idx, w = idx[~out], w[~out]


def _advance_loop_scalar(
    t: np.ndarray,
    w: np.ndarray,
    idx: np.ndarray,
    spin_u: np.ndarray,
    spin_v: np.ndarray,
    ptr: np.ndarray,
    nk: int,
    slow: float,
) -> None:
    """`_advance_loop`'s arithmetic, rank by rank (times are finite and positive: no NaN, no -0)."""
    per = len(t) // spin_v.shape[1] if spin_v.ndim == 2 else 0
    starts = spin_u[:nk, idx].T.tolist()
    ends = spin_v[:nk].T.tolist() if per else [spin_v[:nk].tolist()]
    ts, ps = t[idx].tolist(), ptr[idx].tolist()
    for k, (i, wi) in enumerate(zip(idx.tolist(), w.tolist(), strict=True)):
        p, ti, us, vs = ps[k], ts[k], starts[k], ends[i // per if per else 0]
        while True:
            u, v = us[p], vs[p]
            start = u if u > ti else ti
            gap = start - ti
            c = v - start
            cap = (c if c > 0.0 else 0.0) / slow
            if wi <= gap:
                ti = ti + wi
                break
            if wi - gap <= cap:
                ti = start + (wi - gap) * slow
                break
            ti = v if v > start else start
            wi = wi - gap - cap
            p += 1
            if p >= nk:
                ti += wi
                break
        ts[k], ps[k] = ti, p
    t[idx] = ts
    ptr[idx] = ps


class _Draws:
    """All randomness of a run, generated block by block from one seed.

    Nothing here depends on the policy, so two runs with the same seed see the
    same compute times and contention (common random numbers).
    """

    def __init__(self, scenario: Scenario, nodes: int, seed: int):
        self.s = scenario
        self.nodes, self.g = nodes, scenario.gpus_per_node
        self.ranks = nodes * self.g
        ss = np.random.SeedSequence(seed)
        # A sixth child for the bucket jitter leaves the first five streams unchanged.
        (s_static, s_jit, s_strag, s_therm, s_net, s_bucket) = ss.spawn(6)
        self.r_bucket = np.random.default_rng(s_bucket)
        self.r_jit = np.random.default_rng(s_jit)
        self.r_strag = np.random.default_rng(s_strag)
        self.r_therm = np.random.default_rng(s_therm)
        self.r_net = np.random.default_rng(s_net)
        cm, loc = scenario.compute, scenario.locality
        r = np.random.default_rng(s_static)
        static = np.exp(cm.static_sigma * r.standard_normal(self.ranks))
        static *= np.where(r.random(self.ranks) < cm.outlier_prob, cm.outlier_factor, 1.0)
        n_far = round(loc.far_fraction * self.g)
        local = np.arange(self.ranks) % self.g
        self.far = local >= self.g - n_far
        self.base = cm.base_s * static * np.where(self.far, 1.0 + loc.far_compute_penalty, 1.0)
        th = scenario.thermal
        self.therm_x = th.sigma * self.r_therm.standard_normal(nodes)
        self.busy_until = np.zeros(
            self.ranks, dtype=np.int64
        )  # straggler episode end (global step)
        self.busy_mag = np.ones(self.ranks)
        c = scenario.collective
        intra, inter = collective_cost_s(scenario, nodes, n_bytes=c.n_bytes / c.buckets)
        self.intra_s, self.inter_s = intra, inter  # one bucket's all-reduce
        fab = scenario.fabric
        self.leaves = math.ceil(nodes / fab.nodes_per_leaf)
        self.uplinks = max(1, round(fab.nodes_per_leaf / fab.oversubscription))

    def bucket_jitter(self, n: int = 1) -> np.ndarray | None:
        """`(n, buckets, ranks)` lognormal factors on each bucket's backward compute, or None.

        Drawn `n` steps at once: the same numbers as `n` draws of one step each.
        """
        sig = self.s.compute.bucket_jitter_sigma
        if sig <= 0:
            return None
        shape = (n, self.s.collective.buckets, self.ranks)
        z = self.r_bucket.standard_normal(shape)
        z *= sig  # in place: the same products as `sig * z`, without a second array
        return np.exp(z, out=z)

    def block(self, k0: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Returns `(compute_s (n, ranks), t_coll_s (n,))` for steps `k0 .. k0+n-1`.

        `t_coll_s` is one bucket's all-reduce (the whole gradient when `buckets` is 1).
        """
        s, R = self.s, self.ranks
        jit = np.exp(s.compute.jitter_sigma * self.r_jit.standard_normal((n, R)))
        comp = self.base * jit
        # Episodic stragglers: Markov on/off per rank, heavy-tailed dwell and magnitude.
        st = s.stragglers
        if st.onset_prob > 0:
            mult = np.ones((n, R))
            carry = self.busy_until > k0
            if carry.any():
                idx = np.nonzero(carry)[0]
                for i in idx:
                    mult[: min(n, self.busy_until[i] - k0), i] = self.busy_mag[i]
            onset = self.r_strag.random((n, R)) < st.onset_prob
            ks, is_ = np.nonzero(onset)
            order = np.lexsort((ks, is_))
            ks, is_ = ks[order], is_[order]
            u_d = self.r_strag.random(len(ks))
            u_m = self.r_strag.random(len(ks))
            dwell = np.minimum(
                st.dwell_max_steps, np.floor(st.dwell_min_steps * u_d ** (-1.0 / st.dwell_alpha))
            ).astype(np.int64)
            mag = np.minimum(
                st.magnitude_max, st.magnitude_min * u_m ** (-1.0 / st.magnitude_alpha)
            )
            for j in range(len(ks)):
                i, k = is_[j], k0 + ks[j]
                if self.busy_until[i] > k:
                    continue  # already in an episode: the chain is "on"
                self.busy_until[i] = k + dwell[j]
                self.busy_mag[i] = mag[j]
                mult[ks[j] : ks[j] + dwell[j], i] = mag[j]
            comp *= mult
        # Per-node thermal drift, AR(1) in log space.
        th = s.thermal
        if th.sigma > 0:
            x = np.empty((n, self.nodes))
            eps = (
                self.r_therm.standard_normal((n, self.nodes)) * th.sigma * math.sqrt(1 - th.rho**2)
            )
            cur = self.therm_x
            for t in range(n):
                cur = th.rho * cur + eps[t]
                x[t] = cur
            self.therm_x = cur
            comp *= np.repeat(np.exp(x), self.g, axis=1)
        # Contention on the inter-node term: ECMP collisions across leaves, background traffic.
        factor = np.ones(n)
        fab = s.fabric
        if self.leaves > 1 and self.inter_s > 0:
            factor *= coll.ecmp_max_load(fab.ecmp_flows, self.uplinks, self.r_net, n)
        u_mean = s.coupling.shared_links
        if u_mean > 0 and self.inter_s > 0:
            conc = 10.0
            u = self.r_net.beta(u_mean * conc, (1 - u_mean) * conc, size=n)
            factor /= 1.0 - np.minimum(u, 0.95)
        return comp, self.intra_s + self.inter_s * factor


@dataclasses.dataclass(frozen=True)
class _Setup:
    """The per-run constants of `simulate`'s step loop."""

    ranks: int
    g: int  # GPUs per node
    buckets: int
    n_sites: int  # pacing sites: 1 (first bucket) or `buckets`
    fwd_frac: float  # share of a rank's compute before the first bucket
    bwd_frac: float  # share of each bucket's backward compute
    k_pow: float  # coupling (c)
    k_host: float  # coupling (d): host_runahead * host_fraction
    node_coupled: bool
    spin_coupled: bool
    slow: float  # compute slowdown while a launched kernel spins (coupling (b))
    ar: np.ndarray  # np.arange(ranks)

    @classmethod
    def of(cls, sc: Scenario, ranks: int) -> _Setup:
        cp, cm, g, B = sc.coupling, sc.compute, sc.gpus_per_node, sc.collective.buckets
        k_pow, k_host = cp.power_budget, cp.host_runahead * cp.host_fraction
        return cls(
            ranks=ranks,
            g=g,
            buckets=B,
            n_sites=B if sc.pacing.sites == "every_bucket" else 1,
            fwd_frac=1.0 - cm.backward_fraction,
            bwd_frac=cm.backward_fraction / B,
            k_pow=k_pow,
            k_host=k_host,
            node_coupled=(k_pow > 0 or k_host > 0) and g > 1,
            spin_coupled=cp.spin_compute > 0 and B > 1,
            slow=1.0 + cp.spin_compute,
            ar=np.arange(ranks),
        )


def _node_coupled_compute(a: np.ndarray, d0: np.ndarray, su: _Setup) -> np.ndarray:
    """Couplings (c) and (d): node-mates' sleeping or spinning changes a rank's compute."""
    g = su.g
    asleep = bool(d0.any())
    got = kernels.node_coupled(a, d0 if asleep else None, g, su.k_pow, su.k_host)
    if got is not None:  # the compiled loop: the same arithmetic, the same bits
        return got
    A = a.reshape(-1, g)
    Am = A[:, None, :]
    Ai = A[:, :, None]
    Em = Am + d0.reshape(-1, g)[:, None, :] if asleep else Am  # + 0.0 changes nothing
    adj = np.zeros_like(A)
    if su.k_pow > 0 and asleep:  # (c) node-mates asleep free power for those still computing
        m = np.minimum(Ai, Em)  # (with nobody asleep every term is 0: skipped)
        m -= Am
        np.maximum(m, 0.0, out=m)
        adj -= su.k_pow * m.sum(axis=2) / (g - 1)
    if su.k_host > 0:  # (d) node-mates' hosts spin-waiting steal CPU from host-bound work
        m = Ai - Em
        np.maximum(m, 0.0, out=m)
        adj += su.k_host * m.sum(axis=2) / (g - 1)
    return (A + adj).reshape(-1)


def _run_buckets(
    a: np.ndarray,
    D: np.ndarray,
    jit: np.ndarray | None,
    tc: np.ndarray,
    su: _Setup,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`L` independent steps' forward and bucketed backward with each bucket's all-reduce.

    `a` `(L, ranks)` is each rank's compute, `D` `(L, sites, ranks)` the delays
    slept before each site's launch, `jit` `(L, buckets, ranks)` the bucket
    jitter (or None), `tc` `(L,)` one bucket's all-reduce time. The steps do
    not depend on each other (only on their delays), so they run side by side,
    each with exactly the arithmetic of a step run alone. Returns
    `(step ends (L,), waits (sites, L, ranks), bucket ends (buckets, L), spin
    rank-seconds (L, buckets))`; a site's wait counts from the rank's natural
    arrival, its own sleep included.
    """
    L, R = a.shape
    N = L * R
    B, S = su.buckets, su.n_sites
    got = kernels.run_buckets(
        a, D, jit, tc, buckets=B, sites=S, fwd_frac=su.fwd_frac, bwd_frac=su.bwd_frac,
        spin=su.spin_coupled, slow=su.slow,
    )  # fmt: skip
    if got is not None:  # the compiled loop: the same arithmetic, the same bits
        end_prev, arrive, ends, starts = got
        return end_prev, ends[:S, :, None] - arrive, ends, _spin_sums(ends, starts)
    a = a.reshape(N)
    bucket_work = a * su.bwd_frac
    x = a * su.fwd_frac  # compute clock: when the rank's compute reached its position
    if jit is not None:
        work = np.empty((B, L, R))
        np.multiply(bucket_work.reshape(L, 1, R), jit, out=work.transpose(1, 0, 2))
        work = work.reshape(B, N)
    ends = np.empty((B, L))  # when each bucket's transfer starts (all ranks in)
    starts = np.empty((B, L, R))  # when each rank's kernel of each bucket starts
    spin = su.spin_coupled
    if spin:  # spin intervals [starts[j, i], ends[j, i // R]); the one each rank's compute is in
        spin_u = starts.reshape(B, N)
        ptr = np.zeros(N, dtype=np.int64)
        cur = (np.empty(N), np.empty(N))
        ar = np.arange(N)
    Dj = D.transpose(1, 0, 2)  # (sites, L, ranks) views
    arrive = []  # each site's compute clock at its launch
    launch_prev = None
    end_prev = np.zeros(L)
    for j in range(B):
        w = bucket_work if jit is None else work[j]
        if spin and j > 0:
            x = _advance(x, w, spin_u, ends, ptr, j, su.slow, ar, cur)
        else:
            x = x + w
        x2 = x.reshape(L, R)
        if j < S:
            arrive.append(x2)
            launch = x2 + Dj[j]
            if j > 0:  # the host launches the buckets' collectives in order
                np.maximum(launch, launch_prev, out=launch)
        else:
            launch = np.maximum(x2, launch_prev)
        last = np.maximum(launch.max(axis=1), end_prev)
        start = starts[j]
        np.maximum(launch, end_prev[:, None], out=start)
        np.minimum(start, last[:, None], out=start)  # own kernel starts
        ends[j] = last
        end_prev = last + tc
        launch_prev = launch
    waits = ends[:S, :, None] - np.stack(arrive)
    return end_prev, waits, ends, _spin_sums(ends, starts)


def _spin_sums(ends: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """`(L, buckets)` spin rank-seconds per step and bucket: each kernel's wait for the last."""
    return (ends[:, :, None] - starts).sum(axis=2).T


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
    step time, exactly as in the runtime (`jaxpace._exchange.earliness`).
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
    return _result(sc, pol, nodes, su.ranks, seed, step_times, total_delay, engaged, spin_sum)


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
    """`jaxpace._exchange.earliness(waits, axis=-1)`; with every wait finite and >= 0
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
