"""Each stage of `jaxpace.report.analyze` on inputs small enough to know the answer."""

from __future__ import annotations

import ast
import io
import math
from pathlib import Path

import numpy as np
import pytest

from jaxpace.errors import ConfigError, RecordsError
from jaxpace.records.format import header_record, step_record
from jaxpace.records.reader import load_records
from jaxpace.records.synthetic import synthetic_run
from jaxpace.report import analyze, stages
from jaxpace.report.model import FailureMode, SiteData
from jaxpace.report.render.html import render_report_html
from jaxpace.report.render.tables import summary_rows
from jaxpace.report.render.terminal import print_summary
from jaxpace.report.render.text import format_ms, ranges

MS = 1_000_000  # ns


def _header(p: int, count: int) -> dict:
    return header_record(
        run_id="t",
        process_index=p,
        process_count=count,
        host=f"h{p}",
        pid=p,
        granularity="process",
        jaxpace_version="0",
        policy="none",
        local_devices=[p],
        rank_groups=None,
    )


def _records(rows, *, offsets=(0, 0), site="s", processes=2):
    """rows: (step, rank, arrive_ms, done_ms, delay_ms); rank r is process r."""
    out = [_header(p, processes) for p in range(processes)]
    for step, rank, a, d, delay in rows:
        off = offsets[rank] * MS
        out.append(
            step_record(
                site=site,
                step=step,
                rank=rank,
                process=rank,
                arrive_ns=a * MS + off,
                done_ns=d * MS + off,
                delay_ns=delay * MS,
                engaged=delay > 0,
            )
        )
    return load_records(out)


# Two ranks, three steps; rank 1 arrives 4 ms after rank 0 each step, the
# collective takes 1 ms after the last arrival. Rank 0 paces 1 ms at step 2.
_ROWS = [
    (0, 0, 0, 5, 0),
    (0, 1, 4, 5, 0),
    (1, 0, 10, 15, 0),
    (1, 1, 14, 15, 0),
    (2, 0, 20, 25, 1),
    (2, 1, 24, 25, 0),
]


# --------------------------------------------------------------------------- stage 1: site


def test_site_data_phases_have_known_values_whatever_the_clock_offsets():
    for offsets in ((0, 0), (0, 7_000), (123_456, 9)):
        data, notes, partial = stages.site_data(_records(_ROWS, offsets=offsets), "s")
        assert not partial and notes == []
        assert data.steps.tolist() == [0, 1, 2] and data.ranks.tolist() == [0, 1]
        np.testing.assert_allclose(data.wait, [[5e-3, 1e-3]] * 3)
        np.testing.assert_allclose(data.lateness, [[0, 4e-3]] * 3)
        # compute: own arrival minus own previous exit; none for the first step.
        assert np.isnan(data.compute[0]).all()
        np.testing.assert_allclose(data.compute[1:], [[5e-3, 9e-3]] * 2)
        np.testing.assert_allclose(data.step_time[1:], [[10e-3, 10e-3]] * 2)
        # transfer = min (wait - delay); sync wait = the rest of the time in the call.
        np.testing.assert_allclose(data.transfer, [1e-3] * 3)
        np.testing.assert_allclose(data.sync_wait, [[4e-3, 0], [4e-3, 0], [3e-3, 0]], atol=1e-12)
        assert data.engaged.tolist() == [False, False, True]
        assert data.hosts == ("h0", "h1")


def test_site_data_clamps_a_delay_longer_than_the_wait():
    # Rank 0 reports a 9 ms delay in a 5 ms wait (malformed): nothing goes negative.
    rows = [(0, 0, 0, 5, 9), (0, 1, 4, 5, 0)]
    data, _, _ = stages.site_data(_records(rows), "s")
    assert data.transfer.tolist() == [0.0]
    np.testing.assert_allclose(data.sync_wait, [[0.0, 1e-3]])
    assert (data.sync_wait >= 0).all()


def test_site_data_notes_partial_steps_and_rejects_duplicates():
    data, notes, partial = stages.site_data(_records(_ROWS[:-1]), "s")
    assert partial and data.steps.tolist() == [0, 1]
    assert "PARTIAL: 1 of 3 steps" in notes[0] and "steps 2;" in notes[0]
    with pytest.raises(RecordsError, match="duplicate records, e.g. step 0 of rank 0"):
        stages.site_data(_records([*_ROWS, _ROWS[0]]), "s")


def test_pick_site_defaults_to_the_busiest_and_names_the_choices():
    dicts = synthetic_run(2, 5, site="a").to_dicts() + synthetic_run(2, 9, site="b").to_dicts()[2:]
    recs = load_records(dicts)
    assert stages.pick_site(recs, None) == "b"
    assert stages.pick_site(recs, "a") == "a"
    with pytest.raises(RecordsError, match="available sites: `a`, `b`"):
        stages.pick_site(recs, "c")


# --------------------------------------------------------------------------- stage 2: steps


def _data(**kw) -> SiteData:
    recs = synthetic_run(**kw)
    return stages.site_data(recs, recs.sites[0])[0]


def test_select_steps_warmup_default_bounds_and_validation():
    data = _data(num_ranks=4, num_steps=12)
    sel = stages.select_steps(data, None)
    assert sel.warmup_steps == 3 and sel.rows.tolist() == list(range(3, 12))  # 12 // 4
    assert stages.select_steps(data, 0).n == 12
    big = stages.select_steps(data, 50)
    assert big.n == 12 and "leaves no step of 12" in big.notes[0]
    for bad in (-1, 1.5, float("nan"), "2"):
        with pytest.raises(ConfigError, match="`warmup_steps`"):
            stages.select_steps(data, bad)
    # compute holds only rows where every rank's compute is known (not step 0).
    assert sel.compute.shape == (9, 4) and np.isfinite(sel.compute).all()
    assert not stages.select_steps(data, 0).compute_rows[0]


def test_select_steps_drops_periodic_slow_steps():
    data = _data(
        num_ranks=4, num_steps=100, periodic_rank=2, periodic_every=10, periodic_extra_s=0.02
    )
    sel = stages.select_steps(data, 5)
    assert sel.periodic is not None
    assert sel.periodic.period == 10 and sel.periodic.dominant_rank == 2
    assert not set(sel.periodic.steps) & set(data.steps[sel.rows].tolist())
    assert sel.n == 95 - len(sel.periodic.steps)
    assert "periodic slow steps (every 10 steps" in sel.notes[0]
    assert stages.select_steps(_data(num_ranks=4, num_steps=100), 5).periodic is None


def test_iteration_stats_and_amplification_known_values():
    it = stages.iteration_stats(np.array([1.0, 2.0, np.nan, 3.0, 4.0]))
    assert it.num_steps == 4 and it.mean_s == 2.5 and it.p50_s == 2.5
    assert it.std_s == pytest.approx(np.std([1, 2, 3, 4], ddof=1))
    assert it.cv == pytest.approx(it.std_s / 2.5)
    none = stages.iteration_stats(np.array([np.nan]))
    assert none.num_steps == 0 and math.isnan(none.mean_s) and math.isnan(none.cv)
    assert stages.amplification(np.array([[1.0, 3.0], [2.0, 2.0]])) == pytest.approx(1.25)
    assert math.isnan(stages.amplification(np.zeros((0, 2))))


# --------------------------------------------------------------------------- stage 3: culprit


def _ranked(**kw):
    data = _data(**kw)
    sel = stages.select_steps(data, None)
    it = stages.iteration_stats(sel.iter_all[sel.rows])
    return data, sel, it, stages.rank_culprits(data, sel, it)


def test_rank_culprits_names_the_late_rank():
    _, _, _, c = _ranked(num_ranks=6, num_steps=80, late_rank=4, late_s=0.002, seed=3)
    assert c.culprit == 4 and c.culprit_process == 4 and c.ranking[0] == 4
    assert c.late.tolist() == [False, False, False, False, True, False]
    assert c.rank_stats[4].excess_lateness_s == pytest.approx(0.002, abs=1e-4)
    assert c.notes == ()


def test_rank_culprits_judges_a_late_process_as_a_unit():
    _, _, _, c = _ranked(
        num_ranks=8, num_steps=80, ranks_per_process=4, late_rank=[4, 5, 6, 7], late_s=0.003
    )
    assert c.culprit_process == 1 and c.culprit in (4, 5, 6, 7)
    assert "process 1 is last in" in c.notes[0] and "ranks 4-7" in c.notes[0]


def test_balanced_run_has_no_culprit_and_noise_floor_terms():
    _, _, it, c = _ranked(num_ranks=6, num_steps=80, seed=1)
    assert c.culprit is None and c.culprit_index is None and not c.late.any()
    assert c.noise_floor_s >= max(20e-6, 0.01 * it.p50_s)
    assert stages.noise_floor(np.zeros((1, 3)), math.nan) == 20e-6
    assert stages.noise_floor(np.zeros((1, 3)), 0.01) == pytest.approx(1e-4)


# --------------------------------------------------------------------------- stage 4: modes


def test_straggler_and_amplification_modes():
    data, sel, _, c = _ranked(num_ranks=6, num_steps=80, late_rank=1, late_s=0.002)
    m = stages.straggler_mode(c, sel.n)
    assert m.detected and m.score >= 0.5 and "rank 1" in m.evidence[0]
    amp = stages.amplification_mode(c, sel.compute, stages.amplification(sel.compute))
    assert not amp.detected  # a culprit is not random amplification
    one = stages.amplification_mode(c, np.zeros((0, 6)), math.nan)
    assert one.score == 0.0 and "needs >= 2 ranks" in one.evidence[0]
    _, sel_b, _, c_b = _ranked(num_ranks=6, num_steps=80, seed=2)
    assert not stages.straggler_mode(c_b, sel_b.n).detected


def test_locality_mode_finds_a_late_group_and_skips_untestable_groupings():
    groups = {r: ("a" if r < 4 else "b") for r in range(8)}
    recs = synthetic_run(8, 120, groups=groups, group_late_s={"b": 0.002}, seed=4)
    data = stages.site_data(recs, recs.sites[0])[0]
    sel = stages.select_steps(data, None)
    c = stages.rank_culprits(data, sel, stages.iteration_stats(sel.iter_all[sel.rows]))
    found = stages.normalize_groups(None, recs, data)
    assert found["numa"] == {r: g for r, g in groups.items()}
    m = stages.locality_mode(found, data, sel, c.noise_floor_s)
    assert m.detected and m.score > 0.5 and "numa `b` (ranks 4-7)" in m.evidence[1]
    # Groups that equal processes, or one group, cannot be tested.
    mean_lat = data.lateness[sel.rows].mean(axis=0)
    per_rank = {r: str(r) for r in range(8)}
    assert stages.locality_score("x", per_rank, data, mean_lat, 0.0) is None
    assert stages.locality_score("x", {r: "a" for r in range(8)}, data, mean_lat, 0.0) is None
    none = stages.locality_mode({}, data, sel, c.noise_floor_s)
    assert not none.detected and "no rank groups" in none.evidence[0]


def test_contention_mode_scores_transfer_above_expectation_and_growth():
    def mode(expected=None, **kw):
        data = _data(num_ranks=4, num_steps=100, seed=5, **kw)
        sel = stages.select_steps(data, None)
        it = stages.iteration_stats(sel.iter_all[sel.rows])
        return stages.contention_mode(data, sel, it.mean_s, expected)

    assert mode(0.001, transfer_s=0.003).detected
    assert not mode(0.001, transfer_s=0.001).detected
    assert mode(transfer_growth=2.0).detected
    assert not mode().detected


def test_classify_picks_the_strongest_detected_mode_or_balanced():
    def fm(name, score, detected):
        return FailureMode(name, score, detected, ())

    base = {
        "persistent_straggler": fm("persistent_straggler", 0.2, False),
        "locality": fm("locality", 0.7, True),
        "synchronization_amplification": fm("synchronization_amplification", 0.1, False),
        "topology_contention": fm("topology_contention", 0.9, True),
    }
    modes, primary = stages.classify(base)
    assert primary == "topology_contention"
    assert [m.name for m in modes][-1] == "balanced" and not modes[-1].detected
    assert modes[-1].score == pytest.approx(0.1)
    quiet = {k: fm(k, 0.1, False) for k in base}
    modes, primary = stages.classify(quiet)
    assert primary == "balanced" and modes[-1].detected


# --------------------------------------------------------------------------- stage 5: outlook


def test_what_if_forecast_and_pacing_effect():
    data, sel, it, c = _ranked(num_ranks=6, num_steps=80, late_rank=2, late_s=0.003)
    w = stages.what_if(data, sel, c, it.mean_s)
    assert w.rank == 2 and w.is_culprit and 0.002 < w.saving_s < 0.003
    fc, note = stages.forecast(sel.compute, 1.1, c.culprit)
    assert fc.ranks[0] == 8 and fc.measured_ranks == 6
    assert list(fc.amplification) == sorted(fc.amplification)  # grows with N
    assert "culprit rank 2" in note
    assert stages.forecast(np.zeros((0, 6)), math.nan, None) == (None, "")
    assert stages.pacing_effect(data, sel) is None  # never engaged
    paced = _data(num_ranks=4, num_steps=60, engaged_from_step=30, late_rank=0, late_s=0.002)
    p = stages.pacing_effect(paced, stages.select_steps(paced, 5))
    assert p.engaged_steps == 30 and p.unengaged_steps == 25
    assert p.engaged_delay_s > 0 == p.unengaged_delay_s
    assert p.engaged_sync_wait_s < p.unengaged_sync_wait_s


def test_order_statistics_known_values():
    assert stages.empirical_max_ratio(np.array([1.0, 3.0]), (1, 2)) == pytest.approx([1.0, 1.25])
    assert stages.lognormal_max_ratio(0.0, (8, 64)) == [1.0, 1.0]
    lo = stages.lognormal_max_ratio(0.1, (2,))[0]
    # E[max of 2 normals] = sigma / sqrt(pi) for small sigma.
    assert lo == pytest.approx(1 + 0.1 / math.sqrt(math.pi), rel=2e-3)


# --------------------------------------------------------------------------- the pipeline


def test_pipeline_equals_its_stages():
    recs = synthetic_run(8, 100, late_rank=6, late_s=0.002, seed=9)
    rep = analyze(recs)
    data = stages.site_data(recs, recs.sites[0])[0]
    sel = stages.select_steps(data, None)
    it = stages.iteration_stats(sel.iter_all[sel.rows])
    c = stages.rank_culprits(data, sel, it)
    assert rep.iteration == it and rep.ranks == c.rank_stats and rep.culprit == c.culprit
    assert rep.analyzed_steps == sel.n and rep.warmup_steps == sel.warmup_steps
    with pytest.raises(ConfigError, match="`expected_transfer_s`"):
        analyze(recs, expected_transfer_s=-1.0)


def test_summary_rows_are_rendered_alike_in_terminal_and_html():
    from rich.console import Console

    rep = analyze(synthetic_run(4, 60, late_rank=1, late_s=0.005))
    rows = summary_rows(rep)
    buf = io.StringIO()
    print_summary(rep, Console(file=buf, width=200), verbose=True)  # every row
    page = render_report_html(rep)
    for metric, value in rows[1:]:
        assert metric in buf.getvalue() and value in buf.getvalue()
        assert f"<td>{metric}</td><td>{value}</td>" in page
    assert any(r[0] == "culprit" and r[1].startswith("rank 1 (process 1") for r in rows)


def test_text_helpers():
    assert format_ms(0.0125) == "12.5 ms" and format_ms(0.0125, unit=False) == "12.5"
    assert format_ms(math.inf) == "n/a"
    assert ranges([1, 2, 3, 5]) == "1-3, 5"


def test_report_modules_sit_below_the_runtime():
    root = Path(__file__).resolve().parents[2] / "src" / "jaxpace" / "report"
    files = sorted(root.rglob("*.py"))
    assert len(files) >= 10
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for n in names:
                assert not n.startswith(("jaxpace.runtime", "jaxpace.collectives.measure")), (f, n)
                # No reaching into a private name of another report module.
                tail = n.rsplit(".", 1)[-1]
                if n.startswith("jaxpace.report") and tail.startswith("_"):
                    assert f.name == "__init__.py", (f, n)


def test_alpha_sets_the_culprit_decisions_level_and_the_text_says_it():
    """A marginal straggler (0.5 ms on 8 ranks, 60 steps) is named at the report's ALPHA
    and not at watch's stricter WATCH_ALPHA, whose text states the level it used; a clear
    one (1 ms) is named at both; a level outside (0, 0.5] is refused, naming the field."""
    from jaxpace.diagnosis.culprit import ALPHA, WATCH_ALPHA
    from jaxpace.errors import ConfigError
    from jaxpace.report import analyze, synthetic_records

    marginal = synthetic_records(8, 60, late_rank=3, late_s=0.0005, seed=0)
    assert analyze(marginal).culprit == 3
    strict = analyze(marginal, alpha=WATCH_ALPHA)
    assert strict.culprit is None
    text = " ".join(" ".join(m.evidence) for m in strict.failure_modes)
    assert f"Holm p < {WATCH_ALPHA:g}" in text and f"Holm p < {ALPHA:g}," not in text
    clear = synthetic_records(8, 60, late_rank=3, late_s=0.001, seed=0)
    assert analyze(clear, alpha=WATCH_ALPHA).culprit == 3
    for bad in (0, -0.1, 0.6, float("nan"), "0.01"):
        with pytest.raises(ConfigError, match="alpha"):
            analyze(marginal, alpha=bad)
        with pytest.raises(ConfigError, match="fleet_alpha"):
            analyze(marginal, fleet_alpha=bad)


def test_fleet_alpha_sets_the_fleet_lines_level_and_the_text_says_it():
    """Watch's levels (`alpha=ALPHA, fleet_alpha=WATCH_ALPHA`): the marginal straggler of
    the test above (0.5 ms on 8 ranks) is not named and the text states both levels;
    the clear one is named as at ALPHA, with the same ranking."""
    from jaxpace.diagnosis.culprit import ALPHA, WATCH_ALPHA
    from jaxpace.report import analyze, synthetic_records

    marginal = synthetic_records(8, 60, late_rank=3, late_s=0.0005, seed=0)
    got = analyze(marginal, fleet_alpha=WATCH_ALPHA)
    assert got.culprit is None
    text = " ".join(" ".join(m.evidence) for m in got.failure_modes)
    assert f"Holm p < {ALPHA:g}, to be outside the fleet's normal spread (at level " in text
    assert f"(at level {WATCH_ALPHA:g})" in text
    assert "(at level" not in " ".join(
        " ".join(m.evidence) for m in analyze(marginal).failure_modes
    )
    clear = synthetic_records(8, 60, late_rank=3, late_s=0.001, seed=0)
    a, b = analyze(clear), analyze(clear, fleet_alpha=WATCH_ALPHA)
    assert a.culprit == b.culprit == 3 and a.ranking == b.ranking


def test_the_slowest_ranks_savings_are_each_rank_left_out_of_the_step():
    """`culprit._Savings` finds the per-step median and largest once for the slowest ranks;
    each rank's saving is the leave-its-column-out model's, bit for bit: ties at the
    largest, a NaN, one rank, a rank largest in every step."""
    from jaxpace.report.stages.culprit import _Savings

    def left_out(compute, transfer, i):
        keep = np.ones(compute.shape[1], bool)
        keep[i] = False
        med = np.median(compute, axis=1)
        rest = compute[:, keep].max(axis=1) if keep.any() else np.full(med.shape, -np.inf)
        model = float((compute.max(axis=1) + transfer).mean())
        return max(model - float((np.maximum(rest, med) + transfer).mean()), 0.0)

    rng = np.random.default_rng(7)
    for trial in range(200):
        S, R = int(rng.integers(1, 20)), int(rng.integers(1, 10))
        compute = rng.normal(0, 1, (S, R)).round(int(rng.integers(0, 3)))  # (ties)
        if trial % 5 == 0:
            compute[rng.integers(0, S), rng.integers(0, R)] = np.nan
        if trial % 7 == 0:
            compute[:, rng.integers(0, R)] += 5.0
        transfer = rng.normal(0, 1, S)
        savings = _Savings(compute, transfer)
        for i in range(R):
            want, got = left_out(compute, transfer, i), savings.saving_s(i)
            assert got == want or (np.isnan(got) and np.isnan(want)), (trial, i)
