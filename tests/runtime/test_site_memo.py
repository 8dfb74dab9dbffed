"""The ranks of one process share each step's decode and policy update (`SiteMemo`), and get
exactly the delays each would get from its own update."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import jaxpace as jp
from jaxpace.collectives import exchange as _exchange
from jaxpace.policy.base import Observation, PacingPolicy
from jaxpace.runtime.delay import clamp_delay
from jaxpace.runtime.sites import Site

N = 8


def _counting(policy: PacingPolicy, calls: list) -> PacingPolicy:
    def update(obs, state):
        calls.append(1)
        return policy.update(obs, state)

    return PacingPolicy(
        policy.init, update, name="counting", max_delay_s=policy.max_delay_s, status=policy.status
    )


def _payloads(steps: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(steps):
        v = np.zeros(3 * N, np.float32)
        v[:N] = rng.exponential(0.002, N) + np.where(np.arange(N) == 3, 0.0, 0.004)
        v[N : 2 * N] = 1.0
        v[2 * N :] = 0.09 + 0.001 * rng.random(N)
        if k % 17 == 5:
            v[N + 2] = 0.0  # rank 2 sent nothing this step
        out.append(v)
    return out


@pytest.mark.parametrize("skip", [False, True])
def test_shared_update_gives_every_rank_its_own_delays(skip):
    calls: list = []
    base = jp.adaptive(threshold_s=0.001, warmup_steps=2, engage_steps=2)
    pacer = jp.Pacer(policy=_counting(base, calls), granularity="device")
    site = Site("t", N, 4096, pacer.policy, None)
    pays = _payloads(120, 1)
    missed = {(5, 30), (5, 31), (0, 60)} if skip else set()
    got = {r: [] for r in range(N)}
    for k, pay in enumerate(pays):
        for r in range(N):
            if (r, k) in missed:
                continue
            d = pacer.hooks.native_record(site, r, k, 10**6 * k, 10**6 * k + 5000, 0, pay, 1.0)
            got[r].append(d)
    # Reference: each rank alone, its own state, the observations it saw.
    paced = 0
    for r in range(N):
        state, want = base.init(N), []
        for k, pay in enumerate(pays):
            if (r, k) in missed:
                continue
            view = _exchange.decode(pay, N, 1.0)
            delays, state = base.update(Observation(view.earliness_s, view.step_time_s), state)
            want.append(clamp_delay(float(np.asarray(delays)[r]), base.max_delay_s))
        assert got[r] == want, r
        paced += sum(d > 0 for d in want)
    assert paced > 0, "the case should pace"
    # One update per step and state lineage. With the skips: rank 5 has its own from step 32,
    # rank 0 from step 61: 30 + 2 + 28 * 2 + 2 + 59 * 3 = 267.
    assert len(calls) == (267 if skip else 120)


def test_ranks_with_their_own_history_do_not_share():
    calls: list = []
    base = jp.adaptive(threshold_s=0.001, warmup_steps=0, engage_steps=1)
    pacer = jp.Pacer(policy=_counting(base, calls), granularity="device")
    site = Site("t", N, 4096, pacer.policy, None)
    pays = _payloads(10, 2)
    for k in range(2):  # rank 0 alone first, one step ahead: its state moves on
        pacer.hooks.native_record(site, 0, k, k, k + 1, 0, pays[k], 1.0)
    n0 = len(calls)
    # Rank 1 at step 0 from the initial state, with rank 0's step-0 payload: rank 0's update
    # (entries live for their step and the next).
    pacer.hooks.native_record(site, 1, 0, 0, 1, 0, pays[0], 1.0)
    assert len(calls) == n0
    for r in range(2, N):  # the others see another payload: one new update, shared by them
        pacer.hooks.native_record(site, r, 0, 0, 1, 0, pays[7], 1.0)
    assert len(calls) == n0 + 1
    assert site.rank(2).policy_state is site.rank(7).policy_state
    assert site.rank(1).policy_state is not site.rank(2).policy_state


def test_median_is_nanmedian():
    rng = np.random.default_rng(0)
    for k in range(3000):
        n = int(rng.integers(1, 40))
        x = rng.exponential(0.1, n)
        if k % 3 == 0:
            x = np.round(x, 2)  # ties
        m = rng.random(n)
        x[m < 0.2] = np.nan
        if k % 7 == 0:
            x[m > 0.95] = np.inf
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            want = float(np.nanmedian(x))
        got = _exchange._median(x)
        assert got == want or (np.isnan(got) and np.isnan(want)), x


def test_decode_ignores_a_step_time_that_is_only_inf():
    v = np.zeros(3 * 2, np.float32)
    v[:2] = [0.001, 0.002]
    v[2:4] = 1.0
    v[4:] = [np.inf, np.nan]
    assert np.isnan(_exchange.decode(v, 2, 1.0).step_time_s)


def _status_policy(status):
    base = jp.fixed(0.001)
    return PacingPolicy(
        base.init, base.update, name="st", max_delay_s=0.001, needs_exchange=True, status=status
    )


def test_drain_wake_follows_the_policy_status():
    from jaxpace.policy.base import PolicyStatus

    pay = _payloads(1, 3)[0]
    cases = {
        "engaged": (PolicyStatus(engaged=True), True),
        "idle": (PolicyStatus(engaged=False), False),
        "rejected": (PolicyStatus(engaged=True, ab_effect={"rejected": True}), False),
        "kept": (PolicyStatus(engaged=True, ab_effect={"rejected": False}), True),
    }
    for name, (status, want) in cases.items():
        pacer = jp.Pacer(policy=_status_policy(lambda s, st=status: st), granularity="device")
        site = Site("t", N, 64, pacer.policy, None)
        pacer.hooks.native_record(site, 0, 0, 0, 1, 0, pay, 1.0)
        assert pacer.hooks.native_wants_wake(site) is want, name
    # The default status says nothing about pacing (`fixed`): always wake.
    pacer = jp.Pacer(policy=jp.fixed(0.001), granularity="device")
    site = Site("t", N, 64, pacer.policy, None)
    pacer.hooks.native_record(site, 0, 0, 0, 1, 0, pay, 1.0)
    assert pacer.hooks.native_wants_wake(site) is True


def test_memo_holds_no_old_states():
    """Entries older than the previous step are dropped: at 8192 ranks a state is megabytes."""
    pacer = jp.Pacer(policy=jp.adaptive(threshold_s=0.001), granularity="device")
    site = Site("t", N, 64, pacer.policy, None)
    pays = _payloads(40, 4)
    for k, pay in enumerate(pays):
        for r in range(N):
            if r == 5 and k == 10:
                continue  # rank 5 has its own lineage from here on
            pacer.hooks.native_record(site, r, k, k, k + 1, 0, pay, 1.0)
    held = site.memo._updated
    assert 1 <= len(held) <= 4
    assert all(v[6] >= len(pays) - 2 for v in held.values())


def test_concurrent_ranks_share_the_memo_without_errors():
    """The io_callback path runs ranks' callbacks on several threads at once."""
    import threading

    base = jp.adaptive(threshold_s=0.001, warmup_steps=0, engage_steps=1)
    pacer = jp.Pacer(policy=base, granularity="device")
    site = Site("t", N, 64, pacer.policy, None)
    pays = _payloads(150, 5)
    got = {r: [] for r in range(N)}
    barrier = threading.Barrier(N)

    def rank(r):
        for k, pay in enumerate(pays):
            barrier.wait(timeout=30)
            got[r].append(pacer.hooks.native_record(site, r, k, k, k + 1, 0, pay, 1.0))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert site.errors == 0
    for r in range(N):
        state, want = base.init(N), []
        for pay in pays:
            view = _exchange.decode(pay, N, 1.0)
            delays, state = base.update(Observation(view.earliness_s, view.step_time_s), state)
            want.append(clamp_delay(float(np.asarray(delays)[r]), base.max_delay_s))
        assert got[r] == want, r


def test_stats_keep_at_most_4_mib_of_earliness_per_rank():
    from jaxpace.runtime.sites import early_rows

    assert early_rows(4096, 8) == 1024 and early_rows(4096, 1024) == 1024
    assert early_rows(4096, 8192) == 128 and early_rows(4096, 2**20) == 64
    assert early_rows(256, 8) == 256 and early_rows(2, 8192) == 2
    assert early_rows(4096, 8192) * 8192 * 4 == 4 << 20


@pytest.mark.parametrize("q", [0.0, 0.5, 0.99, 1.0])
def test_stats_percentiles_are_nanquantiles(q):
    """`stats()` reads its p50/p99 off one sort; the values are `np.nanquantile`'s (and
    `np.quantile`'s without NaN), bit for bit."""
    from jaxpace.policy.quantile import sorted_nanquantile

    rng = np.random.default_rng(3)
    h = np.round(rng.exponential(0.002, (300, 50)), 4)  # ties
    clean = h.copy()
    h[rng.random(h.shape) < 0.2] = np.nan
    h[:, 7] = np.nan  # never seen
    h[:, 8] = np.nan
    h[5, 8] = 0.003  # seen once
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = np.nanquantile(h, q, axis=0)
    got = sorted_nanquantile(np.sort(h, axis=0).T, q)
    assert np.array_equal(got.view(np.uint64), want.view(np.uint64))
    got = sorted_nanquantile(np.sort(clean, axis=0).T, q)
    assert np.array_equal(got.view(np.uint64), np.quantile(clean, q, axis=0).view(np.uint64))
