"""The headline decision is made on the whole step: every collective of one program
execution (issue 47), the hosts named as hosts, and the finding below the line."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_4x2

from jaxpace.diagnosis.culprit import SMALL_JOB_STEP_FRACTION
from jaxpace.records.sources.synthetic import write_inspector_logs
from jaxpace.records.synthetic import synthetic_step_records
from jaxpace.report import analyze
from jaxpace.report.render.text import format_ms
from jaxpace.report.stages import WHOLE_STEP


def test_tied_site_counts_name_the_late_rank():
    # 8 sites of 45 steps each; rank 1 is 2 ms late a step, spread over the 8 collectives
    # (0.25 ms at each). The first of the tied sites alone named nobody ("balanced").
    recs = synthetic_step_records(8, 45, 8, late_s={1: 0.002}, seed=0)
    rep = analyze(recs)
    assert rep.site == WHOLE_STEP
    assert rep.num_steps == 45
    assert rep.culprit == 1
    assert rep.rank_stats(1).excess_lateness_s == pytest.approx(0.002, rel=0.25)
    # --site still narrows to one site: there rank 1 is 0.25 ms late, below the line.
    one = analyze(recs, site="site-00")
    assert one.site == "site-00" and one.culprit is None


def test_tied_site_counts_run_for_real(tmp_path):
    # 4 processes x 2 CPU devices, a `shard_map` step of 8 drop-in psum sites of 30 steps
    # each, process 1 sleeping 15 ms before each step. Before, the report took the
    # alphabetical first of the tied sites (`a-last`, run last in the step), named
    # nobody and called it topology contention.
    run_4x2("tied_sites_job.py", tmp_path, "--steps", 30, "--lag-s", 0.015)
    rep = analyze(tmp_path)
    assert rep.site == WHOLE_STEP and len(rep.sites) == 8
    assert rep.num_steps == 30
    assert rep.culprit_process == 1 or (rep.likely is not None and rep.likely.process == 1)
    assert rep.primary_mode != "topology_contention"


def test_a_collective_inside_a_scan_is_folded_into_its_step():
    # Gradient accumulation: `site-00` runs 4 times a step (a scan over 4 microbatches),
    # `site-01` once; process 1 (ranks 2-3) is 15 ms late a step. A step is one execution:
    # 30 steps of ~200 ms, not 120 microbatches.
    recs = synthetic_step_records(
        8, 30, 2, repeats=[4, 1], late_s={2: 0.015, 3: 0.015}, compute_s=0.186, ranks_per_process=2
    )
    rep = analyze(recs)
    assert rep.num_steps == 30
    assert rep.iteration.p50_s > 0.18
    assert rep.culprit_process == 1 or (rep.likely is not None and rep.likely.process == 1)
    assert any("x4" in n for n in rep.notes)  # the fold is stated


def test_lateness_spread_over_a_step_names_the_rank():
    # 512 ranks, 16 collectives a step, rank 77 0.125 ms late at each (2 ms a step).
    recs = synthetic_step_records(
        512, 30, 16, late_s={77: 16 * 0.000125}, compute_s=0.040, jitter_s=0.0002, seed=1
    )
    rep = analyze(recs)
    assert rep.culprit == 77
    assert rep.primary_mode != "balanced"


def test_a_rank_missing_from_some_collectives_is_not_less_late():
    # Rank 1's records of half the sites are lost in every other step: its lateness in
    # a step is estimated from the collectives it took part in, scaled to the whole step.
    recs = synthetic_step_records(8, 45, 8, late_s={1: 0.002}, seed=2)
    lost = {f"site-{j:02d}" for j in range(4)}

    def gone(r):
        return r["type"] == "step" and r["rank"] == 1 and r["site"] in lost and r["step"] % 2

    rep = analyze([r for r in recs if not gone(r)])
    assert rep.partial and any("missing" in n for n in rep.notes)
    assert rep.rank_stats(1).excess_lateness_s == pytest.approx(0.002, rel=0.25)
    assert rep.culprit == 1


def test_a_rank_in_fewer_collectives_compares_on_the_same_scale():
    # Rank 1 is no member of half the sites (a subgroup collective): not a missing
    # record, and its lateness is still a whole step's.
    recs = synthetic_step_records(8, 45, 8, late_s={1: 0.002}, seed=2)
    lost = {f"site-{j:02d}" for j in range(4)}
    kept = [r for r in recs if not (r["type"] == "step" and r["rank"] == 1 and r["site"] in lost)]
    rep = analyze(kept)
    assert not rep.partial
    assert rep.rank_stats(1).excess_lateness_s == pytest.approx(0.002, rel=0.25)
    assert rep.culprit == 1


def test_a_small_job_one_process_always_last_is_likely_not_balanced():
    # 4 processes, an ~850 ms step, process 1 +15 ms (2% of the step), last every step:
    # below the 24% a job of 4 names with confidence, so not the culprit, but `likely`.
    recs = synthetic_step_records(
        4, 60, 4, late_s={1: 0.015}, compute_s=0.85, jitter_s=0.002, seed=3
    )
    rep = analyze(recs)
    assert rep.culprit is None
    lk = rep.likely
    assert lk is not None and lk.process == 1 and lk.kind == "process"
    assert lk.last_fraction >= 0.9
    assert lk.excess_lateness_s == pytest.approx(0.015, rel=0.3)
    assert lk.threshold == pytest.approx(SMALL_JOB_STEP_FRACTION)
    assert "likely: process 1" in lk.text and "24% of the step" in lk.text
    # Its share is of the median step, named with its time (the headline's step is the mean).
    p50 = rep.iteration.p50_s
    assert lk.step_fraction == pytest.approx(lk.excess_lateness_s / p50)
    assert f"{lk.step_fraction:.0%} of the median step ({format_ms(p50)})" in lk.text
    assert "balanced" not in lk.text.lower()
    assert rep.to_dict()["likely"]["process"] == 1
    # The run is not called balanced anywhere: not its primary mode, not its verdict.
    assert rep.primary_mode == "likely_straggler"
    assert not rep.mode("balanced").detected
    assert "not balanced" in rep.mode("balanced").evidence[0]
    assert not any(m.detected for m in rep.failure_modes)


def test_a_numa_node_always_last_below_the_line_is_likely_not_balanced():
    # 8 ranks of one process, ranks 4-7 (one NUMA node) 4 ms late on a 100 ms step: no rank
    # alone is last in most steps (each about a quarter), the node is last in most, and
    # 3-4% of the step is below the 24% a job of 8 names. The report says so, as a group.
    late = dict.fromkeys(range(4, 8), 0.004)
    kw = dict(compute_s=0.1, jitter_s=0.002, ranks_per_process=8, seed=7)
    numa = {"numa": {r: "node-0/numa0" if r < 4 else "node-0/numa1" for r in range(8)}}
    rep = analyze(synthetic_step_records(8, 80, 2, late_s=late, **kw), topology_groups=numa)
    assert rep.culprit is None and rep.late_groups == ()
    lk = rep.likely
    assert lk is not None and (lk.kind, lk.label) == ("numa", "node-0/numa1 (ranks 4-7)")
    assert lk.rank in range(4, 8) and lk.last_fraction >= 0.5
    assert lk.text.startswith("likely: numa node-0/numa1 (ranks 4-7), last in")
    assert rep.primary_mode == "likely_straggler"
    healthy = analyze(synthetic_step_records(8, 80, 2, **kw), topology_groups=numa)
    assert healthy.likely is None and healthy.primary_mode == "balanced"


def test_a_balanced_run_has_no_likely():
    rep = analyze(synthetic_step_records(8, 45, 4, seed=4))
    assert rep.culprit is None and rep.likely is None


def test_a_whole_host_late_is_named_as_the_host(tmp_path):
    # NCCL Inspector, 256 ranks on 32 hosts of 8; host 9's 8 GPUs are 4 ms late.
    write_inspector_logs(tmp_path, 256, 20, late_ranks=list(range(72, 80)), late_us=4000.0)
    rep = analyze(tmp_path)
    assert rep.culprit is None and rep.culprits == ()  # no rank named alone
    top = rep.late_groups[0]
    assert (top.kind, top.label) == ("host", "node-9")
    assert top.ranks == tuple(range(72, 80))
    assert rep.culprit_group is top  # the culprit line's subject: the host, not a rank
    assert rep.likely is None


def test_an_execution_column_folds_a_program_whose_only_collective_repeats():
    # One all-reduce inside a scan of 4 microbatches and no other collective: the step
    # counts cannot tell; a source's execution ids (a trace's `run_id`) do.
    import dataclasses

    from jaxpace.report.analyze import load_step_records

    recs = load_step_records(
        synthetic_step_records(8, 30, 1, repeats=[4], late_s={5: 0.004}, compute_s=0.08)
    )
    assert analyze(recs).num_steps == 120  # without execution ids: microbatches
    cols = dict(recs.columns, execution=recs.columns["step"] // 4 + 1000)
    rep = analyze(dataclasses.replace(recs, columns=cols))
    assert rep.site == WHOLE_STEP and rep.num_steps == 30
    assert rep.iteration.p50_s > 0.08
    assert rep.culprit == 5
    assert rep.rank_stats(5).excess_lateness_s == pytest.approx(0.004, rel=0.25)


def test_execution_ids_that_run_against_the_step_numbers_fold_all_the_steps():
    # A source's execution ids need not grow with a site's step numbers (ids counted down):
    # every execution is a step, none is lost (this crashed: the count came from the
    # last step's execution).
    import dataclasses

    from jaxpace.report.analyze import load_step_records

    recs = load_step_records(synthetic_step_records(8, 30, 2, late_s={5: 0.004}, compute_s=0.08))
    cols = dict(recs.columns, execution=1000 - recs.columns["step"])
    rep = analyze(dataclasses.replace(recs, columns=cols))
    assert rep.site == WHOLE_STEP and rep.num_steps == 30
    assert rep.culprit == 5


def test_a_rank_late_against_its_late_host_too_is_named_alone():
    # Process 4 (ranks 32-39, one host) is 4 ms late a step: the process is the finding,
    # no rank alone. With rank 35 another 6 ms later, it is late against its own host's
    # ranks too, and named alone beside the group.
    late = dict.fromkeys(range(32, 40), 0.004)
    kw = dict(ranks_per_process=8, compute_s=0.05, seed=5)
    rep = analyze(synthetic_step_records(64, 40, 2, late_s=late, **kw))
    assert rep.culprits == () and rep.culprit_process == 4  # no individual culprit
    assert (rep.late_groups[0].kind, rep.late_groups[0].label) == ("process", "4")
    rep = analyze(synthetic_step_records(64, 40, 2, late_s=late | {35: 0.010}, **kw))
    assert rep.culprits == (35,)
    assert rep.late_groups[0].label == "4"


def test_sites_that_are_not_evidence_are_left_out_of_the_whole_step():
    # Rank 1 is late only at `site-00`, whose operand was invariant (its header says so):
    # its waits are not evidence. With every site refused, the report says why.
    from jaxpace.report.analyze import load_step_records

    recs = synthetic_step_records(8, 45, 2, late_s={1: 0.004}, seed=6)
    bad = {"site-00": {"invariant_over": "data"}}
    recs = [r | {"sites": bad} if r["type"] == "header" else r for r in recs]
    rep = analyze(recs)
    assert rep.site == WHOLE_STEP
    assert any("`site-00` left out of the whole step" in n for n in rep.notes)
    both = {s: {"invariant_over": "data"} for s in ("site-00", "site-01")}
    recs = [r | {"sites": both} if r["type"] == "header" else r for r in recs]
    rep = analyze(load_step_records(recs))
    assert rep.site in ("site-00", "site-01") and rep.culprit is None
    assert any("NO CULPRIT" in d for d in rep.decisions)


def test_the_printed_report_says_likely_never_balanced_or_nothing_to_fix():
    # The same small job: what a user reads (summary, advice, HTML) carries the `likely`
    # sentence, and nowhere says "balanced" or "Nothing to fix".
    from jaxpace.report.render.html import render_report_html as render_html
    from jaxpace.report.render.terminal import summary_lines

    recs = synthetic_step_records(
        4, 60, 4, late_s={1: 0.015}, compute_s=0.85, jitter_s=0.002, seed=3
    )
    rep = analyze(recs)
    assert rep.culprit is None and rep.likely is not None
    for text in ("\n".join(summary_lines(rep)), "\n".join(summary_lines(rep, verbose=True))):
        assert "likely: process 1" in text, text
        assert "Nothing to fix" not in text and "arrivals are balanced" not in text, text
        assert "none (balanced)" not in text and "primary balanced" not in text, text
        assert "primary failure mode              balanced" not in text, text
    html = render_html(rep)
    assert "likely: process 1" in html and "Nothing to fix" not in html
    from jaxpace.report.reach import forecast_support

    assert "likely" in forecast_support(rep)[2]  # why no lognormal: not "too few ranks"


@pytest.mark.parametrize(
    "e, cols",
    [
        ([0, 2, 3], [0, 1, 2, 3, 4]),  # every rank in order: whole rows
        ([1, 2, 3], [0, 1, 2, 3, 4]),  # and a run of executions: a slice, in place
        ([3, 1], [4, 0, 2]),  # some ranks, out of order
        ([1, 1, 2], [0, 1, 2, 3, 4]),  # an execution twice (a site run twice a step)
        ([0, 1], [2, 2, 3]),  # a column twice
    ],
)
def test_the_whole_steps_sums_are_np_add_at_bit_for_bit(e, cols):
    from jaxpace.report.stages.whole import _add_cells

    rng = np.random.default_rng(0)
    e, cols = np.array(e), np.array(cols)
    start = rng.random((4, 5)) * 1e-3
    x = rng.random((e.size, cols.size)) / 3
    want = start.copy()
    np.add.at(want, (e[:, None], cols[None, :]), x)
    got = start.copy()
    _add_cells(got, e, cols, x)
    assert np.array_equal(got, want)
