"""Sites that run as several independent groups (the header's `sites[...]["groups"]`).

Ranks of different groups never wait for each other, so the single-site analysis measures
lateness within each group. The records here are built step by step with the model of
`jaxpace.records.synthetic` (all ranks of a group leave together, at the group's last entry
plus its transfer), but with one transfer per group: group k's ranks all wait about 5*k ms
more than group 0's, while being balanced among themselves.
"""

from __future__ import annotations

import numpy as np

from jaxpace.records import format as _record_format
from jaxpace.report import analyze

GROUPS_4X2 = [[0, 4], [1, 5], [2, 6], [3, 7]]  # an all-gather over `data` on a 2x4 mesh


def grouped_records(
    sites: dict[str, dict],
    *,
    num_ranks: int = 8,
    steps: int = 60,
    late_rank: int | None = None,
    late_s: float = 0.0,
    late_every: int = 1,
    group_transfer_s: float = 0.005,
    seed: int = 0,
    compute_s: float = 0.010,
) -> list[dict]:
    """Record dicts of a run whose step calls `sites` in order (dict order), one rank per
    process. At each site the ranks of each group leave together at the group's last entry
    plus `1 ms + group_transfer_s * k` (k: the group's index); `late_rank` computes `late_s`
    longer before the first site of every step; every rank computes about `compute_s` before
    each site."""
    rng = np.random.default_rng(seed)
    out = [
        _record_format.header_record(
            run_id="groups", process_index=p, process_count=num_ranks, host=f"h{p}", pid=p,
            granularity="process", jaxpace_version="0", policy="no_pacing()",
            local_devices=[p], rank_groups=None, sites=sites,
        )
        for p in range(num_ranks)
    ]  # fmt: skip
    prev = np.full(num_ranks, 10**12, np.int64) + rng.integers(0, 10**9, num_ranks)
    for k in range(steps):
        for n, (name, info) in enumerate(sites.items()):
            compute = compute_s + 0.0003 * rng.standard_normal(num_ranks)
            if n == 0 and late_rank is not None and k % late_every == 0:
                compute[late_rank] += late_s
            arrive = prev + np.round(compute * 1e9).astype(np.int64)
            done = np.empty_like(arrive)
            for g, members in enumerate(_groups(info, num_ranks)):
                tr = 0.001 + group_transfer_s * g
                done[members] = arrive[members].max() + int(tr * 1e9)
            done += np.round(rng.exponential(20e-6, num_ranks) * 1e9).astype(np.int64)
            for r in range(num_ranks):
                out.append(
                    _record_format.step_record(
                        site=name, step=k, rank=r, process=r, arrive_ns=int(arrive[r]),
                        done_ns=int(done[r]), delay_ns=0, engaged=False,
                    )
                )  # fmt: skip
            prev = done
    return out


def _groups(info: dict, num_ranks: int) -> list[list[int]]:
    """The site's groups among ranks 0..num_ranks-1; unlisted ranks run as one more group."""
    groups = [[r for r in g if r < num_ranks] for g in info.get("groups") or []]
    groups = [g for g in groups if g]
    rest = sorted(set(range(num_ranks)) - {r for g in groups for r in g})
    return groups + ([rest] if rest else [])


AG = {"ag": {"kind": "all_gather", "groups": GROUPS_4X2}}


def test_late_rank_within_its_group_is_the_only_one_named():
    rep = analyze(grouped_records(AG, late_rank=5, late_s=0.020))
    assert rep.culprit == 5 and rep.culprits == (5,)
    assert [r.rank for r in rep.ranks if r.late] == [5]
    assert 0.015 < rep.rank_stats(5).mean_lateness_s < 0.025
    # Its partner waited for it; the other groups' ranks are on time within their group.
    assert all(rep.rank_stats(r).mean_lateness_s < 0.002 for r in (0, 2, 3, 4, 6, 7))
    assert any("lateness is measured within each group of 2" in n for n in rep.notes)


def test_groups_that_differ_but_are_balanced_name_nobody():
    """Fails with lateness over all ranks: group 0 waits ~15 ms less than group 3 every step,
    which reads as ranks 0 and 4 arriving 15 ms late."""
    for seed in range(3):
        rep = analyze(grouped_records(AG, seed=seed))
        assert rep.culprit is None and not rep.culprits, seed
        assert not any(r.late for r in rep.ranks), seed
        assert rep.primary_mode != "persistent_straggler", seed


def test_transfer_and_sync_wait_are_group_relative():
    rep = analyze(grouped_records(AG))
    data = rep.data
    # Per step: each group's least time inside is its transfer (1, 6, 11, 16 ms); the
    # median over groups is about 8.5 ms.
    assert np.all(np.abs(data.transfer[5:] - 0.0085) < 0.001)
    # Sync wait is measured against the rank's own group: a few ms of jitter at most.
    assert float(data.sync_wait[5:].max()) < 0.003


def test_one_group_and_no_groups_keep_the_all_ranks_numbers():
    plain = analyze(grouped_records({"ag": {"kind": "all_gather"}}, seed=1))
    one = analyze(
        grouped_records({"ag": {"kind": "all_gather", "groups": [list(range(8))]}}, seed=1)
    )
    for a, b in ((plain.data, one.data),):
        assert np.array_equal(a.lateness, b.lateness)
        assert np.array_equal(a.transfer, b.transfer)
        assert np.array_equal(a.sync_wait, b.sync_wait)
    w = plain.data.wait
    assert np.array_equal(plain.data.lateness, w.max(axis=1, keepdims=True) - w)
    assert not any("within each group" in n for n in plain.notes + one.notes)


def test_unlisted_and_absent_ranks():
    # Ranks 3 and 7 are in no group: they form one group of their own. Rank 9 is listed but
    # has no records: ignored.
    sites = {"ag": {"kind": "all_gather", "groups": [[0, 4], [1, 5], [2, 6, 9]]}}
    recs = grouped_records(sites, late_rank=2, late_s=0.020)
    rep = analyze(recs)
    assert rep.culprits == (2,)
    lat = rep.data.lateness[5:]
    # 3 and 7 (group "the rest", transfer of the default group 0) balanced among themselves.
    assert float(lat[:, [3, 7]].mean()) < 0.002
    assert any("groups" in n and "within each group" in n for n in rep.notes)


def test_periodic_slow_steps_name_the_rank_latest_in_its_group():
    """Rank 5 does 60 ms of extra work every 10th step. In those steps it is the last of its
    group {1, 5}, but it waits its group's transfer (6 ms), longer than group {0, 4} waits
    (1 ms): the rank that waited least over all ranks is in the other group."""
    recs = grouped_records(
        {"ag": {"kind": "all_gather", "groups": GROUPS_4X2}},
        steps=100, late_rank=5, late_s=0.06, late_every=10,
    )  # fmt: skip
    rep = analyze(recs, warmup_steps=0)
    assert rep.periodic is not None and rep.periodic.period == 10
    assert rep.periodic.dominant_rank == 5
    assert rep.periodic.dominant_fraction == 1.0
