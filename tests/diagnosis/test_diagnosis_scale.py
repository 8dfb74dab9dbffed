"""Diagnosis at scale: simulated records with a known injected problem, and the report's verdict."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from jaxpace.cli import main as jaxpace_main
from jaxpace.diagnosis.stats import holm, t_sf
from jaxpace.records.synthetic import synthetic_run
from jaxpace.report import analyze
from jaxpace.sim import Faults, load_scenario, simulate_records, write_records

SIGMA = 0.02  # per-step compute jitter (log-sigma) of the test scenario
JITTER_S = SIGMA * 0.1  # ... in seconds at 100 ms compute


def _scenario(**over):
    """`pure-bsp` with identical GPUs and no ECMP: the per-step jitter is the only noise."""
    sc = load_scenario("pure-bsp")
    sc = dataclasses.replace(
        sc,
        compute=dataclasses.replace(sc.compute, static_sigma=0.0, jitter_sigma=SIGMA),
        fabric=dataclasses.replace(sc.fabric, ecmp_flows=0),
    )
    for part, fields in over.items():
        sc = dataclasses.replace(sc, **{part: dataclasses.replace(getattr(sc, part), **fields)})
    return sc


def _verdict(run):
    return analyze(run.records, expected_transfer_s=run.expected_transfer_s)


def test_culprit_at_twice_the_jitter_is_named_among_4096_ranks():
    run = simulate_records(
        _scenario(),
        nodes=512,
        steps=100,
        seed=3,
        faults=Faults(late_ranks=(3001,), late_s=2 * JITTER_S),
    )
    assert run.truth.culprits == (3001,) and run.truth.mode == "persistent_straggler"
    rep = _verdict(run)
    assert rep.num_ranks == 4096
    assert rep.culprits == (3001,) and rep.culprit == 3001
    assert rep.primary_mode == "persistent_straggler" and not rep.late_groups
    rs = rep.rank_stats(3001)
    assert rs.excess_lateness_s == pytest.approx(2 * JITTER_S, rel=0.25)
    assert rs.z > 5 and rs.p_adjusted < 1e-3
    # It is rarely the last arriver: the old ">= 50% last" rule could not name it.
    assert rs.last_fraction < 0.5
    assert rep.decisions[0].startswith("Straggler: rank 3001")


@pytest.mark.parametrize("nodes", [1, 8, 64, 512])
def test_healthy_runs_name_nobody_at_every_size(nodes):
    run = simulate_records(_scenario(), nodes=nodes, steps=100 if nodes == 512 else 200, seed=nodes)
    assert run.truth.mode == "balanced" and run.truth.culprits == ()
    rep = _verdict(run)
    assert rep.culprit is None and rep.culprits == () and rep.late_groups == ()
    assert rep.primary_mode == "balanced"
    assert rep.decisions[-1].startswith("No persistent straggler")


@pytest.mark.parametrize(
    ("faults", "kind", "label"),
    [
        (Faults(late_numa=(5,), numa_late_s=3 * JITTER_S), "numa", "node-5/numa1"),
        (Faults(late_nodes=(2,), node_late_s=3 * JITTER_S), "host", "node-2"),
    ],
)
def test_a_late_group_is_named_as_the_group(faults, kind, label):
    # One process per GPU, so a late host is a group of 8 processes, not one process.
    run = simulate_records(
        _scenario(), nodes=8, steps=200, seed=7, faults=faults, ranks_per_process=1
    )
    assert run.truth.groups == ((kind, label),) and run.truth.mode == "locality"
    rep = _verdict(run)
    assert [(g.kind, g.label) for g in rep.late_groups] == [(kind, label)]
    assert rep.culprits == ()  # its members are explained by the group
    assert rep.primary_mode == "locality"
    assert any(f"{kind} `{label}`" in e for e in rep.mode("locality").evidence)


def test_a_late_host_run_as_one_process_is_a_straggling_process():
    run = simulate_records(
        _scenario(), nodes=8, steps=200, seed=8, faults=Faults(late_nodes=(6,), node_late_s=0.006)
    )
    assert run.truth.culprit_process == 6 and run.records.granularity == "device"
    rep = _verdict(run)
    assert rep.culprit_process == 6 and rep.culprit in range(48, 56)
    assert [g.name for g in rep.late_groups] == ["process 6"]
    assert rep.primary_mode == "persistent_straggler"


_MODES = {
    "healthy": ({}, Faults()),
    "straggler": ({}, Faults(late_ranks=(9, 40), late_s=3 * JITTER_S)),
    "numa": ({}, Faults(late_numa=(3,), numa_late_s=3 * JITTER_S)),
    "episodic": (
        {"stragglers": dict(onset_prob=0.3 / 64, dwell_max_steps=3, magnitude_min=2.0)},
        Faults(),
    ),
    "growing": ({}, Faults(transfer_growth=1.0)),
    "spiky": ({}, Faults(spike_prob=0.05)),
    "leaf": ({"fabric": dict(nodes_per_leaf=2, oversubscription=4.0, ecmp_flows=8)}, Faults()),
    "periodic": ({}, Faults(periodic_every=25, periodic_rank=17, periodic_extra_s=0.03)),
}


@pytest.mark.parametrize("case", sorted(_MODES))
def test_ground_truth_and_report_agree_for_every_failure_mode(case):
    over, faults = _MODES[case]
    run = simulate_records(_scenario(**over), nodes=8, steps=300, seed=11, faults=faults)
    rep = _verdict(run)
    t = run.truth
    assert rep.primary_mode == t.mode, (case, t, rep.decisions)
    assert rep.culprits == tuple(sorted(t.culprits, key=lambda r: -rep.rank_stats(r).z))
    assert {(g.kind, g.label) for g in rep.late_groups} == set(t.groups)
    if t.periodic_rank is not None:
        assert rep.periodic is not None and rep.periodic.dominant_rank == t.periodic_rank
    assert t.mode in {
        "balanced",
        "persistent_straggler",
        "locality",
        "synchronization_amplification",
        "topology_contention",
    }


def test_records_on_disk_are_the_runtime_format_and_jaxpace_report_reads_them(tmp_path):
    run = simulate_records(
        "pure-bsp", nodes=2, steps=40, seed=1, policy="fixed:0.001",
        faults=Faults(late_ranks=(3,), late_s=0.02),  # 10 ms: within 16 ranks' 2% spread
    )  # fmt: skip
    paths = write_records(run, tmp_path, format="jsonl")
    assert [p.name for p in paths] == ["records-p0.jsonl", "records-p1.jsonl"]
    lines = [json.loads(x) for x in paths[1].read_text().splitlines()]
    head, steps = lines[0], lines[1:]
    assert head["type"] == "header" and head["process_index"] == 1 and head["process_count"] == 2
    assert head["granularity"] == "device" and head["local_devices"] == list(range(8, 16))
    groups = head["topology"]["rank_groups"]
    assert set(groups) == {"host", "numa", "nic", "leaf"} and groups["numa"]["12"] == "node-1/numa1"
    assert len(steps) == 40 * 8 and {s["rank"] for s in steps} == set(range(8, 16))
    assert all(s["wait_ns"] == s["done_ns"] - s["arrive_ns"] >= s["delay_ns"] for s in steps)
    assert any(s["delay_ns"] > 0 and s["engaged"] for s in steps)
    # Each process has its own clock: step 0 of the two files starts seconds apart.
    first0 = json.loads(paths[0].read_text().splitlines()[1])["arrive_ns"]
    assert abs(first0 - steps[0]["arrive_ns"]) > 1e6
    assert analyze(tmp_path).to_dict() == analyze(run.records).to_dict()
    assert jaxpace_main(["report", str(tmp_path), "--json", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["culprit"] == 3


def test_adaptive_pacing_is_recorded_and_the_report_sees_it():
    run = simulate_records(
        _scenario(), nodes=2, steps=200, seed=2, policy="adaptive",
        faults=Faults(late_ranks=(5,), late_s=0.004),
    )  # fmt: skip
    c = run.records.columns
    assert (c["delay_ns"] > 0).any() and c["engaged"].any()
    assert run.result.total_delay_s > 0
    rep = analyze(run.records)
    assert rep.pacing is not None and rep.pacing.engaged_delay_s > 0
    assert rep.culprit == 5


def test_cost_of_waiting_per_culprit_and_what_fixing_saves():
    recs = synthetic_run(64, 200, late_rank=[7, 30], late_s=0.003, seed=4)
    rep = analyze(recs)
    assert set(rep.culprits) == {7, 30}
    costs = {c.target: c for c in rep.costs}
    assert set(costs) == {"rank 7", "rank 30", "all of the above"}
    both = costs["all of the above"]
    # One of two equally late ranks fixed saves little: the other still holds everyone up.
    assert costs["rank 7"].saving_s < 0.2 * both.saving_s
    assert both.saving_s == pytest.approx(0.003, abs=0.0008)
    assert both.gpu_hours_per_1000_steps == pytest.approx(both.saving_s * 64 * 1000 / 3600)
    assert both.what_if_step_s == pytest.approx(rep.iteration.mean_s - both.saving_s)


def test_the_issue_examples():
    # 256 ranks, 100 ms steps, 1% jitter, rank 200 2 ms late; 1024 ranks, rank 5 3 ms late.
    for R, rank, late in ((256, 200, 0.002), (1024, 5, 0.003)):
        recs = synthetic_run(R, 150, compute_s=0.1, jitter_s=0.001, late_rank=rank, late_s=late)
        rep = analyze(recs)
        assert rep.culprit == rank and rep.primary_mode == "persistent_straggler"
    # 64 ranks: the collective doubles over the run and is 3-8x longer on 5% of steps.
    run = simulate_records(
        _scenario(), nodes=8, steps=300, seed=5, faults=Faults(transfer_growth=1.0, spike_prob=0.05)
    )
    rep = analyze(run.records)
    assert rep.primary_mode == "topology_contention"
    ev = " ".join(rep.mode("topology_contention").evidence)
    assert "spikes" in ev and "over the run" in ev


def test_significance_helpers_known_values():
    assert float(t_sf(2.228, 10)) == pytest.approx(0.025, abs=1e-4)
    assert float(t_sf(0.0, 3)) == 0.5
    assert float(t_sf(-1.96, 1e6)) == pytest.approx(0.975, abs=1e-4)
    assert holm(np.array([0.01, 0.04, 0.03])).tolist() == pytest.approx([0.03, 0.06, 0.06])
    assert holm(np.array([0.5, 0.9])).max() <= 1.0


# --------------------------------------------------------------------------- batched policy


def test_window_quantile_is_numpy_quantile_bit_for_bit():
    from jaxpace.policy.quantile import sorted_quantile as _sorted_quantile

    rng = np.random.default_rng(1)
    for f in (1, 2, 3, 5, 16, 33):
        for q in (0.0, 0.1, 1 / 3, 0.5, 0.9, 1.0):
            x = rng.random((40, f)) * 1e-3
            x[:10] = np.round(x[:10], 4)  # ties
            assert np.array_equal(
                _sorted_quantile(np.sort(x, axis=-1), q), np.quantile(x, q, axis=-1)
            )


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {
            "ab_test": True,
            "ab_period": 4,
            "ab_min_windows": 1,
            "warmup_steps": 2,
            "engage_steps": 2,
        },
        {"budget_fraction": 0.2, "quantile": 0.1, "window": 5, "giveup_factor": 2},
    ],
)
def test_batched_adaptive_gives_every_site_its_own_update(kw):
    from jaxpace import adaptive
    from jaxpace.policy.base import Observation

    pol = adaptive(threshold_s=0.0005, **kw)
    b = pol.batched
    R, B = 11, 3
    state_b = b.init(B, R)
    singles = [pol.init(R) for _ in range(B)]
    rng = np.random.default_rng(0)
    paced = 0
    for k in range(120):
        e = rng.exponential(0.002, (B, R)) * np.array([[1.0], [2.0], [0.1]])
        if k % 13 == 0:
            e[1, 4] = np.nan
        t = 0.1 + 0.01 * rng.random(B)
        d_b, state_b = b.update(Observation(e, t), state_b)
        for j in range(B):
            d, singles[j] = pol.update(Observation(e[j], float(t[j])), singles[j])
            assert np.array_equal(d, d_b[j])
            paced += int((d > 0).any())
    assert paced > 0
    for j in range(B):
        for name, v in singles[j]._asdict().items():
            assert np.array_equal(np.asarray(v), getattr(state_b, name)[j], equal_nan=True), name
    assert pol.__class__(pol.init, lambda o, s: (o, s)).batched is None  # a custom policy


def test_fast_writer_writes_the_same_bytes_as_records_write_jsonl(tmp_path):
    run = simulate_records("pure-bsp", nodes=2, steps=5, seed=3, policy="fixed:0.001")
    fast = write_records(run, tmp_path / "fast", format="jsonl")
    slow = run.records.write_jsonl(tmp_path / "slow")
    assert [p.name for p in fast] == [p.name for p in slow]
    for a, b in zip(fast, slow, strict=True):
        assert a.read_text() == b.read_text()
