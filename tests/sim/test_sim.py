"""Tests of jaxpace.sim: cost formulas, order statistics, the BSP null, couplings, scenarios."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

import numpy as np
import pytest

from jaxpace.errors import ScenarioError
from jaxpace.policy.adaptive import adaptive
from jaxpace.policy.simple import fixed
from jaxpace.sim import (
    Scenario,
    allreduce_lower_bound_s,
    busbw_gbyte_s,
    cli_main,
    collective_cost_s,
    compare,
    configure_parser,
    ecmp_max_load,
    hierarchical_allreduce_s,
    load_scenario,
    preset_names,
    rabenseifner_allreduce_s,
    recursive_doubling_allreduce_s,
    ring_allgather_s,
    ring_allreduce_s,
    ring_reduce_scatter_s,
    simulate,
    tree_allreduce_s,
)

# --------------------------------------------------------------------------- cost formulas


@pytest.mark.parametrize("p", [1, 2, 3, 8, 64, 1000])
def test_alpha_beta_formulas_exact(p):
    n, a, b, g = 3.0e8, 4.0e-6, 1.0 / 46e9, 1.0 / 500e9
    assert ring_reduce_scatter_s(p, n, a, b) == pytest.approx(
        (p - 1) * a + (p - 1) / p * n * b, rel=1e-12
    )
    assert ring_allgather_s(p, n, a, b) == ring_reduce_scatter_s(p, n, a, b)
    assert ring_allreduce_s(p, n, a, b, g) == pytest.approx(
        2 * (p - 1) * a + 2 * (p - 1) / p * n * b + (p - 1) / p * n * g, rel=1e-12
    )
    assert recursive_doubling_allreduce_s(p, n, a, b) == pytest.approx(
        math.ceil(math.log2(p)) * (a + n * b)
    )
    assert rabenseifner_allreduce_s(p, n, a, b) == pytest.approx(
        2 * math.log2(p) * a + 2 * (p - 1) / p * n * b
    )
    expected_tree = 0.0 if p == 1 else 2 * math.log2(p) * a + 2 * n * b
    assert tree_allreduce_s(p, n, a, b) == pytest.approx(expected_tree)
    assert allreduce_lower_bound_s(p, n, 46e9) == pytest.approx(2 * (p - 1) / p * n / 46e9)
    # The ring meets the bandwidth lower bound up to its latency term.
    assert ring_allreduce_s(p, n, 0.0, b) == pytest.approx(allreduce_lower_bound_s(p, n, 46e9))


@pytest.mark.parametrize("g,q", [(1, 1), (8, 1), (8, 2), (8, 64), (4, 7)])
def test_hierarchical_formula_exact(g, q):
    n, al, bl, an, bn = 1e9, 2e-6, 1 / 370e9, 6e-6, 1 / 46e9
    want = (
        2 * ((g - 1) * al + (g - 1) / g * n * bl)
        + 2 * (q - 1) * an
        + 2 * (q - 1) / q * (n / g) * bn
    )
    assert hierarchical_allreduce_s(g, q, n, al, bl, an, bn) == pytest.approx(want, rel=1e-12)


def test_busbw_and_bad_rank_count():
    assert busbw_gbyte_s(2, 1e9, 1.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="positive integer"):
        ring_allreduce_s(0, 1.0, 1.0, 1.0)


def test_ecmp_collision_statistics_match_published_numbers():
    rng = np.random.default_rng(0)
    load = ecmp_max_load(4, 8, rng, 40_000)
    assert np.mean(load > 1) == pytest.approx(0.59, abs=0.01)  # P(collision), 4 flows on 8 uplinks
    load = ecmp_max_load(8, 8, rng, 40_000)
    assert np.mean(load > 1) == pytest.approx(0.998, abs=0.002)
    assert load.mean() == pytest.approx(2.6, abs=0.05)


def test_engine_collective_cost_uses_formulas():
    s = load_scenario("pure-bsp")
    c = s.collective
    intra, inter = collective_cost_s(s, 4)
    total = hierarchical_allreduce_s(
        8,
        4,
        c.n_bytes,
        c.alpha_intra_s,
        1 / (c.bw_intra_gbyte_s * 1e9),
        c.alpha_inter_s,
        1 / (c.bw_inter_gbyte_s * 1e9),
    )
    assert intra + inter == pytest.approx(total, rel=1e-12)
    # The BSP rule: with no noise and no pacing, every step is compute + T_coll.
    quiet = dataclasses.replace(
        s, compute=dataclasses.replace(s.compute, static_sigma=0.0, jitter_sigma=0.0)
    )
    r = simulate(quiet, nodes=4, steps=10)
    np.testing.assert_allclose(r.step_times_s, s.compute.base_s + total, rtol=1e-12)


# --------------------------------------------------------------------------- order statistics


@pytest.mark.parametrize("sigma,ratios", [(0.05, {1: 1.07, 8: 1.12}), (0.20, {1: 1.31, 8: 1.57})])
def test_expected_max_matches_order_statistics(sigma, ratios):
    # Only i.i.d. per-step lognormal jitter; gpus_per_node = 8 so nodes 1, 8 = N 8, 64.
    base = load_scenario("pure-bsp")
    s = dataclasses.replace(
        base,
        compute=dataclasses.replace(base.compute, static_sigma=0.0, jitter_sigma=sigma),
        collective=dataclasses.replace(
            base.collective, n_bytes=0.0, alpha_intra_s=0.0, alpha_inter_s=0.0
        ),
    )
    mean_x = math.exp(sigma**2 / 2)  # E[X] of lognormal(0, sigma)
    for nodes, want in ratios.items():
        r = simulate(s, nodes=nodes, steps=3000, seed=3)
        x = r.step_times_s / s.compute.base_s
        se = x.std() / math.sqrt(len(x)) / mean_x
        # Published ratios are rounded to 0.01: allow that plus 4 standard errors.
        assert x.mean() / mean_x == pytest.approx(want, abs=0.005 + 4 * se)


# --------------------------------------------------------------------------- pacing physics


def test_pure_bsp_null_pacing_never_helps():
    for nodes in (2, 8):
        for seed in (0, 1):
            c = compare("pure-bsp", nodes=nodes, steps=400, seed=seed)
            assert c.paced.engaged_fraction > 0.5  # pacing really ran
            assert c.throughput_gain <= 1e-12
            assert c.throughput_gain >= -0.005


def test_bsp_rule_each_step_no_faster_than_unpaced():
    # Pointwise: with couplings off, step k is max(a + d) + T >= max(a) + T.
    c = compare("pure-bsp", nodes=4, steps=300, policy=fixed(0.002))
    assert np.all(c.paced.step_times_s >= c.baseline.step_times_s - 1e-15)
    assert np.all(c.paced.step_times_s <= c.baseline.step_times_s + 0.002 + 1e-12)


def test_common_random_numbers_and_determinism():
    a = simulate("paper", nodes=4, steps=300, seed=7)
    b = simulate("paper", nodes=4, steps=300, seed=7)
    np.testing.assert_array_equal(a.step_times_s, b.step_times_s)
    c = simulate("paper", nodes=4, steps=300, seed=8)
    assert not np.array_equal(a.step_times_s, c.step_times_s)
    # A policy that never sleeps reproduces the baseline bit for bit (same draws).
    never = adaptive(threshold_s=5.0, max_delay_s=0.01)
    d = simulate("paper", nodes=4, steps=300, seed=7, policy=never)
    np.testing.assert_array_equal(a.step_times_s, d.step_times_s)


def _coupled(field: str, value: float) -> Scenario:
    s = load_scenario("paper")
    off = dataclasses.replace(
        s.coupling, shared_links=0.0, spin_compute=0.0, power_budget=0.0, host_runahead=0.0
    )
    return dataclasses.replace(s, coupling=dataclasses.replace(off, **{field: value}))


@pytest.mark.parametrize(
    "field,strengths",
    [("power_budget", [0.0, 0.05, 0.1, 0.2]), ("host_runahead", [0.0, 0.5, 1.0, 2.0])],
)
def test_node_couplings_pacing_gain_grows_with_strength(field, strengths):
    gains = [
        compare(_coupled(field, v), nodes=4, steps=400, seed=2).throughput_gain for v in strengths
    ]
    assert all(b > a for a, b in zip(gains, gains[1:], strict=False)), gains


def test_shared_links_slow_the_collective_but_give_pacing_nothing():
    runs = [
        compare(_coupled("shared_links", v), nodes=4, steps=400, seed=2) for v in (0.0, 0.2, 0.4)
    ]
    means = [c.baseline.mean_step_s for c in runs]
    assert means[0] < means[1] < means[2]
    gains = [c.throughput_gain for c in runs]
    assert max(gains) - min(gains) < 0.003, gains


def test_spin_coupling_pacing_gain_grows_with_strength():
    # (b) with 8 gradient buckets, every bucket's all-reduce a pacing site.
    # Measured (docs/simulation.md): the gain grows monotonically with the
    # slowdown s but stays negative across the plausible range 0.05-0.5.
    strengths = (0.0, 0.1, 0.3, 0.5)
    gains = [
        compare(_coupled("spin_compute", v), nodes=4, steps=400, seed=2).throughput_gain
        for v in strengths
    ]
    assert all(b > a for a, b in zip(gains, gains[1:], strict=False)), gains
    assert gains[-1] < 0.0, gains


def test_spin_coupling_only_lengthens_steps():
    # Slowing compute can only delay launches: without pacing, every step is
    # pointwise no shorter with the coupling on (same draws).
    off = simulate(_coupled("spin_compute", 0.0), nodes=2, steps=200, seed=1)
    on = simulate(_coupled("spin_compute", 0.5), nodes=2, steps=200, seed=1)
    assert np.all(on.step_times_s >= off.step_times_s - 1e-12)
    assert on.mean_step_s > off.mean_step_s
    # With one bucket no compute overlaps a collective: the switch does nothing.
    one = dataclasses.replace(
        _coupled("spin_compute", 0.5),
        collective=dataclasses.replace(load_scenario("paper").collective, buckets=1),
    )
    zero = dataclasses.replace(one, coupling=_coupled("spin_compute", 0.0).coupling)
    np.testing.assert_array_equal(
        simulate(one, nodes=2, steps=100).step_times_s,
        simulate(zero, nodes=2, steps=100).step_times_s,
    )


def _advance_reference(t, w, intervals, slow):
    """One rank, event by event: full speed outside `intervals`, `slow`x slower inside."""
    for u, v in intervals:
        if v <= t:
            continue
        if t < u:
            if w <= u - t:
                return t + w
            w -= u - t
            t = u
        if w * slow <= v - t:
            return t + w * slow
        w -= (v - t) / slow
        t = v
    return t + w


def test_advance_matches_event_reference():
    from jaxpace.sim._cluster import _advance

    rng = np.random.default_rng(5)
    R, slow = 300, 1.4
    for nk in (1, 2, 5):
        # Disjoint, time-ordered intervals with a shared end per interval, as in the engine.
        ends = np.cumsum(rng.uniform(0.5, 2.0, nk))
        starts = ends - rng.uniform(0.0, 0.49, (R, nk)) * (ends - np.r_[0.0, ends[:-1]])
        spin_u, spin_v = np.ascontiguousarray(starts.T), ends
        t = rng.uniform(0.0, ends[-1] + 0.5, R)
        w = rng.uniform(0.0, 3.0, R)
        ptr = np.zeros(R, dtype=np.int64)
        got = _advance(t, w, spin_u, spin_v, ptr, nk, slow, np.arange(R))
        want = [
            _advance_reference(t[i], w[i], list(zip(starts[i], ends, strict=True)), slow)
            for i in range(R)
        ]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_bucketed_bsp_null_pacing_never_helps():
    # The null also holds with overlapped gradient buckets, pacing at every bucket:
    # with no coupling the step is a max-plus function of launch times.
    s = load_scenario("pure-bsp")
    s = dataclasses.replace(
        s,
        compute=dataclasses.replace(s.compute, bucket_jitter_sigma=0.05),
        collective=dataclasses.replace(s.collective, buckets=8),
        pacing=dataclasses.replace(s.pacing, sites="every_bucket"),
    )
    c = compare(s, nodes=4, steps=300, seed=0)
    assert c.paced.engaged_fraction > 0.5
    assert -0.005 <= c.throughput_gain <= 1e-12
    f = compare(s, nodes=2, steps=100, policy=fixed(0.002))
    assert np.all(f.paced.step_times_s >= f.baseline.step_times_s - 1e-15)


def test_small_quiet_cluster_disengages_and_costs_nothing():
    s = load_scenario("pure-bsp")
    quiet = dataclasses.replace(
        s, compute=dataclasses.replace(s.compute, static_sigma=0.002, jitter_sigma=0.002)
    )
    for nodes in (1, 2, 4):
        c = compare(quiet, nodes=nodes, steps=300)
        assert c.paced.engaged_fraction == 0.0
        assert c.paced.total_delay_s == 0.0
        assert c.throughput_gain == 0.0


def test_paper_scenario_baseline_cv_at_64_nodes():
    r = simulate("paper", nodes=64, steps=3000, seed=0)
    assert 0.17 <= r.cv <= 0.27
    assert r.scaling_efficiency < 0.95


def test_lag_delays_when_sleep_starts():
    # fixed() decides the same delay every step; with lag L the first L steps are unpaced.
    for lag in (1, 2, 3):
        b = simulate("pure-bsp", nodes=1, steps=20, seed=0)
        p = simulate("pure-bsp", nodes=1, steps=20, seed=0, policy=fixed(0.001), lag_steps=lag)
        np.testing.assert_allclose(p.step_times_s[:lag], b.step_times_s[:lag])
        np.testing.assert_allclose(p.step_times_s[lag:], b.step_times_s[lag:] + 0.001)
        assert p.engaged_fraction == pytest.approx((20 - lag) / 20)


# --------------------------------------------------------------------------- scenarios and errors


def test_presets_load_and_round_trip(tmp_path):
    assert {"paper", "pure-bsp"} <= set(preset_names())
    for name in preset_names():
        s = load_scenario(name)
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps(s.to_dict()))
        assert load_scenario(f) == s


@pytest.mark.parametrize(
    "data,match",
    [
        (
            {"compute": {"jitter_sigma": -1}},
            r"`compute.jitter_sigma` must be a number in \[0.0, 1.0\]",
        ),
        (
            {"compute": {"jiter_sigma": 0.1}},
            r"unknown field `compute.jiter_sigma`. Valid fields: .*`jitter_sigma`",
        ),
        ({"colective": {}}, r"unknown field `colective`. Valid fields: .*`collective`"),
        (
            {"collective": {"algorithm": "butterfly"}},
            r"`collective.algorithm` must be one of `ring`, `tree`",
        ),
        (
            {"pacing": {"adaptive": {"gian": 0.5}}},
            r"`pacing.adaptive.gian`. Valid fields: .*`gain`",
        ),
        ({"gpus_per_node": 0}, r"`gpus_per_node` must be an integer"),
        ({"stragglers": {"magnitude_min": 3, "magnitude_max": 2}}, r"magnitude_max"),
    ],
)
def test_bad_fields_raise_scenario_error(tmp_path, data, match):
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(data))
    with pytest.raises(ScenarioError, match=match):
        load_scenario(f)


def test_unknown_preset_lists_choices():
    with pytest.raises(ScenarioError, match=r"Presets: .*`paper`.*`pure-bsp`"):
        load_scenario("papr")


def test_invalid_json_names_line(tmp_path):
    f = tmp_path / "broken.json"
    f.write_text("{not json")
    with pytest.raises(ScenarioError, match="invalid JSON at line 1"):
        load_scenario(f)


def test_bad_arguments():
    with pytest.raises(ScenarioError, match="`nodes` must be a positive integer"):
        simulate("pure-bsp", nodes=0, steps=10)
    with pytest.raises(ScenarioError, match="Valid choices: `none`, `adaptive`, `fixed:SECONDS`"):
        simulate("pure-bsp", nodes=1, steps=10, policy="fast")


def test_old_bandwidth_field_names_are_read_with_a_warning(tmp_path):
    """`bw_*_gbps` meant GB/s; old scenario files still load, as the renamed `*_gbyte_s`."""
    f = tmp_path / "old.json"
    f.write_text(json.dumps({"collective": {"bw_intra_gbps": 123, "bw_inter_gbps": 7}}))
    with pytest.warns(
        DeprecationWarning,
        match="rename `collective.bw_intra_gbps` to `collective.bw_intra_gbyte_s`",
    ):
        s = load_scenario(f)
    assert (s.collective.bw_intra_gbyte_s, s.collective.bw_inter_gbyte_s) == (123.0, 7.0)
    f.write_text(json.dumps({"collective": {"bw_intra_gbps": 1, "bw_intra_gbyte_s": 2}}))
    with pytest.raises(ScenarioError, match="give only `bw_intra_gbyte_s`"):
        load_scenario(f)
    import jaxpace.sim as sim

    with pytest.warns(DeprecationWarning, match="busbw_gbyte_s"):
        assert sim.busbw_gbps is busbw_gbyte_s


def test_numeric_checks_name_the_field_and_reject_bool_nan():
    with pytest.raises(
        ScenarioError, match=r"`collective.buckets` must be an integer in \[1, 256\]"
    ):
        Scenario.from_dict({"collective": {"buckets": 2.5}})
    with pytest.raises(ScenarioError, match=r"`thermal.rho` must be a number"):
        Scenario.from_dict({"thermal": {"rho": True}})
    with pytest.raises(ScenarioError, match=r"`fabric.oversubscription` must be a number"):
        Scenario.from_dict({"fabric": {"oversubscription": float("nan")}})
    with pytest.raises(ScenarioError, match="`steps` must be a positive integer, got True"):
        simulate("pure-bsp", nodes=1, steps=True)
    with pytest.raises(ValueError, match="`q` must be a positive integer number of ranks, got 1.5"):
        hierarchical_allreduce_s(8, 1.5, 1e6, 1e-6, 1e-9, 1e-6, 1e-9)


def test_policy_sees_the_shared_earliness():
    """The simulator hands the policy `jaxpace.diagnosis.earliness.earliness` of the waits: >= 0, min 0."""
    from jaxpace.diagnosis.earliness import earliness
    from jaxpace.policy.base import PacingPolicy

    seen = []

    def update(obs, state):
        seen.append(np.array(obs.earliness_s))
        return np.zeros_like(obs.earliness_s), state

    spy = PacingPolicy(lambda n: None, update, name="spy", max_delay_s=0.0)
    simulate("paper", nodes=2, steps=5, policy=spy, seed=0)
    assert len(seen) == 5 * 8  # `paper` paces every one of its 8 buckets
    for e in seen:
        assert e.shape == (16,) and np.nanmin(e) == 0.0 and (e >= 0).all()
        np.testing.assert_array_equal(earliness(e), e)


def test_sim_package_has_no_import_cycle():
    """The CLI module imports the engine; the engine never imports the `jaxpace.sim` package's names."""
    import subprocess
    import sys

    code = (
        "import jaxpace.sim.cli as c; "
        "import jaxpace.sim._engine as e; "
        "import jaxpace.sim as s; assert s.cli_main is c.cli_main; "
        "assert s.render_scaling_html is c.render_scaling_html; "
        "assert not hasattr(s, 'render_html')"
    )
    subprocess.run([sys.executable, "-W", "error", "-c", code], check=True, timeout=120)
    import ast
    from pathlib import Path

    import jaxpace.sim as sim

    for f in Path(sim.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "jaxpace.sim":
                assert f.name == "__init__.py", f"{f.name} imports the jaxpace.sim package"


# --------------------------------------------------------------------------- CLI


def test_cli_table_json_html(tmp_path, capsys):
    p = configure_parser(argparse.ArgumentParser())
    out_json, out_html = tmp_path / "r.json", tmp_path / "r.html"
    args = p.parse_args(
        [
            "--nodes",
            "1,2",
            "--scenario",
            "pure-bsp",
            "--steps",
            "50",
            "--json",
            str(out_json),
            "--html",
            str(out_html),
        ]
    )
    assert cli_main(args) == 0
    text = capsys.readouterr().out
    assert "scaling eff." in text and "pure-bsp" in text
    data = json.loads(out_json.read_text())
    assert [r["nodes"] for r in data["runs"]] == [1, 2]
    assert data["runs"][1]["paced"]["ranks"] == 16
    page = out_html.read_text()
    assert (
        page.count("<svg") == 4
        and "<script" not in page
        and "http" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    )


def test_cli_bad_scenario_exit_code(capsys):
    p = configure_parser(argparse.ArgumentParser())
    assert cli_main(p.parse_args(["--nodes", "1", "--scenario", "nope"])) == 2
    assert "Presets:" in capsys.readouterr().err
    assert cli_main(p.parse_args(["--nodes", "1,x"])) == 2
