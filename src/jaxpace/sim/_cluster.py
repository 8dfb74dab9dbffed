"""The simulated cluster's physics: its random draws, the collective's cost, and one step of
bucketed compute and all-reduces with the couplings that let pacing matter.

`_engine` runs steps of this cluster and drives the pacing policy between them. The bucket
loop and the node coupling have compiled twins in jaxpace/native/kernels.cc
(`jaxpace_run_buckets`, `jaxpace_node_coupled`), the same bits.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

import jaxpace.sim._collective_cost as coll
from jaxpace.native import kernels
from jaxpace.sim._scenario import Scenario

__all__ = ["collective_cost_s"]

# Random draws are generated in blocks of this many steps, so memory stays
# bounded at 1024 nodes and results do not depend on anything but the seed.
_BLOCK_STEPS = 256


def collective_cost_s(
    scenario: Scenario, nodes: int, *, n_bytes: float | None = None
) -> tuple[float, float]:
    """Returns `(intra_s, inter_s)`: the all-reduce's intra- and inter-node terms, uncontended.

    `n_bytes` defaults to the scenario's whole gradient (`collective.n_bytes`);
    the engine passes one bucket's share, `n_bytes / buckets`.

    The inter-node bandwidth is that of the slowest rank (a far-NUMA GPU when
    the scenario has any): a ring runs at its slowest link.

    >>> from jaxpace.sim._scenario import load_scenario
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


def _advance(
    t: np.ndarray,
    work: np.ndarray,
    spin_u: np.ndarray,
    spin_v: np.ndarray,
    ptr: np.ndarray,
    nk: int,
    slow: float,
    ar: np.ndarray,
    *,
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
            x = _advance(x, w, spin_u, ends, ptr, j, su.slow, ar, cur=cur)
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
