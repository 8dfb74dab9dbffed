"""Tests of `jaxpace.report`: statistics with known answers, outputs, bad input, CLI."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxpace import report
from jaxpace.errors import RecordsError
from jaxpace.records.synthetic import synthetic_run as _synthetic
from jaxpace.report.render.html import PLOT_TITLES


def _analyze(num_ranks=8, num_steps=200, **kw):
    analyze_kw = {
        k: kw.pop(k) for k in ("warmup_steps", "topology_groups", "expected_transfer_s") if k in kw
    }
    return report.analyze(_synthetic(num_ranks, num_steps, **kw), **analyze_kw)


# --------------------------------------------------------------------------- statistics


@pytest.mark.parametrize("late_s", [0.001, 0.003])
@pytest.mark.parametrize("late_rank", [0, 5])
def test_late_rank_is_named_with_its_lateness(late_rank, late_s):
    rep = _analyze(late_rank=late_rank, late_s=late_s, seed=late_rank)
    assert rep.culprit == late_rank
    assert rep.primary_mode == "persistent_straggler"
    rs = rep.rank_stats(late_rank)
    assert rs.excess_lateness_s == pytest.approx(late_s, abs=0.1e-3)
    assert rs.ci_low_s < late_s + 0.1e-3 and rs.ci_high_s > late_s - 0.1e-3
    assert rs.last_fraction > 0.9 and rs.late
    assert rep.ranking[0] == late_rank
    assert [r.rank for r in rep.ranks if r.late] == [late_rank]
    # What-if: with the culprit at median speed, a step gets shorter by late_s minus
    # how far the slowest other rank is above the median (~1.4 jitter for 7 ranks).
    assert rep.what_if.rank == late_rank and rep.what_if.is_culprit
    assert late_s - 2 * 0.0003 < rep.what_if.saving_s < late_s
    assert rep.what_if.what_if_step_s < rep.iteration.mean_s


@pytest.mark.parametrize("num_ranks", [2, 8, 64])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_balanced_records_name_no_culprit(num_ranks, seed):
    rep = _analyze(num_ranks=num_ranks, num_steps=150, seed=seed)
    assert rep.culprit is None and rep.culprit_process is None
    assert rep.primary_mode == "balanced"
    assert rep.mode("balanced").detected
    assert not any(m.detected for m in rep.failure_modes if m.name != "balanced")
    assert rep.what_if is not None and not rep.what_if.is_culprit


def test_iteration_and_amplification_known_answers():
    # No jitter: rank 2 computes 12 ms, the rest 10 ms; transfer ~1 ms.
    rep = _analyze(
        late_rank=2,
        late_s=0.002,
        jitter_s=0.0,
        exit_jitter_s=0.0,
        compute_s=0.010,
        transfer_s=0.001,
    )
    assert rep.amplification == pytest.approx(0.012 / (0.010 + 0.002 / 8), rel=1e-6)
    assert rep.iteration.mean_s == pytest.approx(0.013, rel=0.005)
    assert rep.iteration.p50_s <= rep.iteration.p90_s <= rep.iteration.p99_s
    assert 0 < rep.iteration.cv < 0.01
    # Phases per rank add up to the step time; the culprit never waits.
    for r in rep.ranks:
        total = r.compute_s + r.delay_s + r.sync_wait_s + r.transfer_s
        assert total == pytest.approx(rep.iteration.mean_s, rel=1e-3)
        assert r.transfer_s == pytest.approx(0.001, rel=0.01)
    assert rep.rank_stats(2).sync_wait_s == pytest.approx(0.0, abs=1e-9)
    assert rep.rank_stats(0).sync_wait_s == pytest.approx(0.002, rel=1e-3)
    assert rep.rank_stats(0).mean_lateness_s == pytest.approx(0.0, abs=1e-9)
    assert rep.rank_stats(2).mean_lateness_s == pytest.approx(0.002, rel=1e-3)


@pytest.mark.parametrize("via", ["header", "argument", "flat_argument"])
def test_numa_group_offset_is_locality(via):
    groups = {r: f"numa{r // 4}" for r in range(8)}
    kw = dict(group_late_s={"numa1": 0.002}, seed=3)
    if via == "header":
        rep = _analyze(groups=groups, **kw)
    else:
        tg = {"numa": groups} if via == "argument" else groups
        rep = _analyze(groups=groups, topology_groups=tg, group_kind="other", **kw)
    loc = rep.mode("locality")
    assert rep.primary_mode == "locality" and loc.detected
    assert loc.score > 0.8
    assert any("`numa1`" in e for e in loc.evidence)
    assert rep.culprit is None  # four ranks late together: no single culprit
    assert not rep.mode("persistent_straggler").detected


def test_single_straggler_inside_a_group_is_not_locality():
    groups = {r: f"numa{r // 4}" for r in range(8)}
    rep = _analyze(groups=groups, late_rank=5, late_s=0.002, seed=4)
    assert rep.primary_mode == "persistent_straggler" and rep.culprit == 5
    assert not rep.mode("locality").detected


def test_random_culprits_with_heavy_tail_is_synchronization_amplification():
    rep = _analyze(num_ranks=16, num_steps=300, straggler_prob=0.02, straggler_factor=2.0, seed=5)
    sa = rep.mode("synchronization_amplification")
    assert rep.primary_mode == "synchronization_amplification" and sa.detected
    assert rep.culprit is None
    assert rep.amplification > 1.15
    assert max(r.last_fraction for r in rep.ranks) < 0.3


def test_growing_transfer_is_topology_contention():
    rep = _analyze(transfer_growth=2.0, seed=6)
    assert rep.primary_mode == "topology_contention"
    assert rep.culprit is None
    flat = _analyze(seed=6, transfer_s=0.003, expected_transfer_s=0.001)
    assert flat.mode("topology_contention").detected
    assert any("alpha-beta" in e for e in flat.mode("topology_contention").evidence)
    ok = _analyze(seed=6, transfer_s=0.001, expected_transfer_s=0.001)
    assert not ok.mode("topology_contention").detected


def test_periodic_rank0_work_is_marked_not_blamed():
    rep = _analyze(periodic_rank=0, periodic_every=20, periodic_extra_s=0.03, seed=7)
    assert rep.periodic is not None
    assert rep.periodic.period == 20 and rep.periodic.dominant_rank == 0
    assert set(rep.periodic.steps) == set(range(19, 200, 20))
    assert rep.periodic.mean_extra_s == pytest.approx(0.03, rel=0.1)
    assert rep.culprit is None and rep.primary_mode == "balanced"
    assert any("periodic" in n for n in rep.notes)


def test_no_periodic_outliers_in_random_heavy_tail():
    rep = _analyze(num_ranks=16, num_steps=300, straggler_prob=0.02, seed=8)
    assert rep.periodic is None


def test_late_process_in_device_granularity():
    # 4 processes x 2 devices, process 1 (ranks 2 and 3) late: each of its ranks is
    # last only about half the time, so the process is judged as a unit.
    rep = _analyze(ranks_per_process=2, late_rank=[2, 3], late_s=0.003, seed=9)
    assert rep.granularity == "device" and rep.num_processes == 4
    assert rep.culprit_process == 1 and rep.culprit in (2, 3)
    assert rep.rank_stats(2).late and rep.rank_stats(3).late
    assert rep.rank_stats(2).excess_lateness_s == pytest.approx(0.003, abs=0.15e-3)


def test_pacing_effect_side_by_side():
    rep = _analyze(late_rank=1, late_s=0.002, engaged_from_step=100, seed=10)
    p = rep.pacing
    assert p is not None and p.engaged_steps == 100 and p.unengaged_steps == 95
    assert p.engaged_delay_s > 0 and p.unengaged_delay_s == 0
    assert p.engaged_sync_wait_s < 0.6 * p.unengaged_sync_wait_s
    # Pure bulk-synchronous model: pacing neither helps nor hurts the step.
    assert p.engaged_step_s == pytest.approx(p.unengaged_step_s, rel=0.03)
    assert _analyze(seed=10).pacing is None


def test_forecast_is_monotone_and_matches_measured_scale():
    rep = _analyze(num_ranks=32, num_steps=200, jitter_s=0.001, seed=11)
    fc = rep.forecast
    assert fc.ranks == report.FORECAST_RANKS
    assert all(b >= a for a, b in zip(fc.amplification, fc.amplification[1:], strict=False))
    assert all(
        b >= a
        for a, b in zip(fc.lognormal_amplification, fc.lognormal_amplification[1:], strict=False)
    )
    assert fc.forecast_at_measured == pytest.approx(rep.amplification, rel=0.03)
    # Normal jitter with sigma 10%: E[max of 1024]/mean ~ 1 + 0.1 * 3.2 (light tail).
    assert 1.2 < fc.lognormal_amplification[-1] < 1.45


def test_lognormal_forecast_matches_known_values():
    # docs/SIMULATION.md: sigma_log 0.05 -> 1.07 (8), 1.12 (64), 1.18 (1024).
    vals = report._lognormal_max_ratio(0.05, (8, 64, 1024))
    assert vals == pytest.approx([1.07, 1.12, 1.18], abs=0.01)
    x = np.random.default_rng(0).lognormal(0, 0.2, 200_000)
    emp = report._empirical_max_ratio(x, (8, 64))
    assert emp == pytest.approx([1.31, 1.57], abs=0.02)


@given(offsets=st.lists(st.integers(-(10**13), 10**13), min_size=4, max_size=4))
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_clock_offsets_do_not_change_any_result(offsets):
    recs = _synthetic(4, 60, late_rank=2, late_s=0.002, seed=12)
    base = report.analyze(recs).to_dict()
    dicts = recs.to_dicts()
    for d in dicts:
        if d["type"] == "step":
            d["arrive_ns"] += offsets[d["process"]]
            d["done_ns"] += offsets[d["process"]]
    assert report.analyze(dicts).to_dict() == base


def test_generator_clock_offsets_of_seconds_do_not_change_results():
    a = _analyze(late_rank=4, late_s=0.002, clock_offset_s=0.0, seed=13)
    b = _analyze(late_rank=4, late_s=0.002, clock_offset_s=5000.0, seed=13)
    assert a.to_dict() == b.to_dict()


def test_warmup_steps_are_excluded():
    recs = _synthetic(8, 100, seed=14)
    dicts = recs.to_dicts()
    for d in dicts:  # rank 6 very late during the first 10 steps only: the others wait for it
        if d["type"] == "step" and d["rank"] != 6 and d["step"] < 10:
            d["arrive_ns"] -= 50_000_000
            d["wait_ns"] += 50_000_000
    assert report.analyze(dicts, warmup_steps=10).culprit is None
    assert report.analyze(dicts, warmup_steps=10).analyzed_steps == 90
    assert report.analyze(dicts, warmup_steps=0).rank_stats(6).mean_lateness_s > 1e-3


@pytest.mark.parametrize(("num_ranks", "num_steps"), [(1, 1), (2, 1), (1, 20), (3, 3)])
def test_tiny_runs_do_not_crash(tmp_path, num_ranks, num_steps):
    rep = _analyze(num_ranks=num_ranks, num_steps=num_steps)
    assert rep.culprit is None and rep.primary_mode == "balanced"
    report.write_html(rep, tmp_path / "r.html")
    report.write_trace(rep, tmp_path / "t.json")
    json.loads(report.write_json(rep, tmp_path / "r.json").read_text())


# --------------------------------------------------------------------------- outputs


def test_html_is_self_contained_with_plots(tmp_path):
    rep = _analyze(late_rank=3, late_s=0.002, engaged_from_step=150)
    path = report.write_html(rep, tmp_path / "r.html")
    html = path.read_text()
    assert html.startswith("<!DOCTYPE html>")
    assert html.count("<svg") == 4
    import re
    import xml.etree.ElementTree as ET

    for svg in re.findall(r"<svg.*?</svg>", html, re.S):
        root = ET.fromstring(svg)  # well-formed XML
        assert root.get("viewBox") and len(root) > 10
    for title in PLOT_TITLES:
        assert f"<title>{title}</title>" in html
    for label in (
        "after the median rank",  # the lateness map's colour bar
        "mean time per step (ms)",
        "step time (ms)",
        "ranks (log scale)",
    ):
        assert label in html
    assert "<script" not in html and "http://" not in html.replace('xmlns="http://www.w3.org', "")
    assert "Pacing effect" in html and "persistent_straggler" in html


def test_html_for_large_run_stays_small(tmp_path):
    rep = _analyze(num_ranks=256, num_steps=400, seed=1)
    size = report.write_html(rep, tmp_path / "r.html").stat().st_size
    assert size < 2_000_000


def test_partial_report_is_marked_in_html(tmp_path):
    recs = _synthetic(4, 30, seed=2)
    paths = recs.write_jsonl(tmp_path)
    paths[-1].unlink()
    rep = report.analyze(tmp_path)
    assert "PARTIAL REPORT" in report.write_html(rep, tmp_path / "r.html").read_text()


@pytest.mark.parametrize("source", ["report", "records"])
def test_trace_has_one_aligned_track_per_rank(tmp_path, source):
    recs = _synthetic(4, 30, late_rank=1, late_s=0.002, engaged_from_step=15, seed=3)
    rep = report.analyze(recs)
    path = report.write_trace(rep if source == "report" else recs.to_dicts(), tmp_path / "t.json")
    trace = json.loads(path.read_text())
    assert trace["displayTimeUnit"] == "ms"
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {r: f"rank {r} (node-{r})" for r in range(4)}
    xs = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in xs} == {0, 1, 2, 3}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in xs)
    assert {e["name"] for e in xs} == {"compute", "pacing sleep", "sync wait", "transfer"}
    # Aligned on the collective exit: each step's transfer ends at the same time on all ranks.
    ends: dict[int, list[float]] = {}
    for e in xs:
        if e["name"] == "transfer":
            ends.setdefault(e["args"]["step"], []).append(e["ts"] + e["dur"])
    assert len(ends) == 30
    assert all(max(v) - min(v) < 0.01 for v in ends.values())  # µs
    # Per rank, events do not overlap.
    for pid in range(4):
        mine = sorted((e["ts"], e["ts"] + e["dur"]) for e in xs if e["pid"] == pid)
        assert all(b[0] >= a[1] - 0.01 for a, b in zip(mine, mine[1:], strict=False))


def test_trace_of_a_single_process_list(tmp_path):
    # What `Pacer.write_trace` passes: only this process's records of a 2-process run.
    dicts = [
        d for d in _synthetic(2, 10).to_dicts() if d.get("process_index", d.get("process")) == 0
    ]
    trace = json.loads(report.write_trace(dicts, tmp_path / "t.json").read_text())
    assert {e["pid"] for e in trace["traceEvents"]} == {0}


def test_json_report_round_trips(tmp_path):
    rep = _analyze(late_rank=3, late_s=0.002)
    d = json.loads(report.write_json(rep, tmp_path / "r.json").read_text())
    assert d["culprit"] == 3 and d["primary_mode"] == "persistent_straggler"
    assert {m["name"] for m in d["failure_modes"]} == set(report.FAILURE_MODES)
    assert all(0.0 <= m["score"] <= 1.0 for m in d["failure_modes"])
    assert "data" not in d and len(d["ranks"]) == 8
    # NaN becomes null: sampled (non-consecutive) steps have no compute.
    sampled = [
        x for x in _synthetic(4, 40).to_dicts() if x["type"] == "header" or x["step"] % 2 == 0
    ]
    rs = report.analyze(sampled)
    assert json.loads(rs.to_json())["amplification"] is None
    assert any("not consecutive" in n for n in rs.notes)


def test_print_summary_mentions_culprit_and_partial():
    from io import StringIO

    from rich.console import Console

    buf = StringIO()
    recs = _synthetic(4, 40, late_rank=2, late_s=0.005).to_dicts()
    recs = [r for r in recs if r.get("process_index", r.get("process")) != 3]
    report.print_summary(report.analyze(recs), Console(file=buf, width=140))
    out = buf.getvalue()
    assert "rank 2 (process 2, node-2)" in out
    assert "PARTIAL REPORT" in out and "process 3" in out


# --------------------------------------------------------------------------- bad input

HEADER = {
    "type": "header",
    "format": 1,
    "run_id": "2f1c",
    "process_index": 0,
    "process_count": 1,
    "host": "node-a",
    "pid": 1234,
    "granularity": "process",
    "jaxpace_version": "0.1.0",
    "policy": "adaptive(...)",
    "local_devices": [0, 1],
    "topology": None,
}


def _write_run(tmp_path, num_ranks=4, num_steps=30, **kw) -> list[Path]:
    return _synthetic(num_ranks, num_steps, **kw).write_jsonl(tmp_path)


def test_records_md_example_is_read(tmp_path):
    # Two device-granularity ranks of one process, written by hand as in docs/records.md.
    lines = [dict(HEADER, granularity="device")]
    t = 1_000_000_000
    for step in range(12):
        for rank, (compute, wait) in enumerate([(9_000_000, 1_200_000), (10_000_000, 200_000)]):
            arrive = t + compute
            lines.append(
                {
                    "type": "step",
                    "site": "train.py:42:train_step",
                    "step": step,
                    "rank": rank,
                    "process": 0,
                    "device": rank,
                    "arrive_ns": arrive,
                    "done_ns": arrive + wait,
                    "wait_ns": wait,
                    "delay_ns": 0,
                    "engaged": False,
                }
            )
        t += 10_200_000
    f = tmp_path / "records-p0.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    rep = report.analyze(f, warmup_steps=1)
    assert rep.granularity == "device" and rep.num_ranks == 2
    assert rep.rank_stats(1).last_fraction == 1.0
    assert rep.rank_stats(1).mean_lateness_s == pytest.approx(0.001)
    assert rep.rank_stats(0).transfer_s == pytest.approx(0.0002)
    assert rep.iteration.mean_s == pytest.approx(0.0102)
    assert rep.rank_stats(1).compute_s == pytest.approx(0.010)


def test_directory_round_trip_equals_memory(tmp_path):
    recs = _synthetic(4, 30, late_rank=1, late_s=0.002, seed=4)
    recs.write_jsonl(tmp_path)
    assert report.analyze(tmp_path).to_dict() == report.analyze(recs.to_dicts()).to_dict()


def test_truncated_last_line_is_skipped_and_marked_partial(tmp_path):
    paths = _write_run(tmp_path)
    text = paths[2].read_text()
    paths[2].write_text(text[: len(text) - 40])  # cut the last line short, no newline
    loaded = report.load_records(tmp_path)
    assert loaded.partial and any(
        "cut short" in n and "records-p2.jsonl" in n for n in loaded.notes
    )
    rep = report.analyze(tmp_path)
    # The last step lacks rank 2: it is used, comparing the ranks present (issue 46).
    assert rep.partial and rep.num_steps == 30
    assert any("lack some ranks" in n and "Most missing: rank 2: 1" in n for n in rep.notes)


def test_garbage_line_names_file_and_line(tmp_path):
    paths = _write_run(tmp_path)
    lines = paths[1].read_text().splitlines()
    lines[5] = "this is not json"
    paths[1].write_text("\n".join(lines) + "\n")
    recs = report.load_records(tmp_path)  # dropped, counted, located; the rest read
    assert recs.partial and len(recs) == sum(len(p.read_text().splitlines()) - 1 for p in paths) - 1
    assert any("1 step line(s) with a bad value" in n and "records-p1.jsonl:6: not JSON" in n
               for n in recs.notes), recs.notes  # fmt: skip


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda h: dict(h, format=2), r"`format` 2, expected 1"),
        (lambda h: {k: v for k, v in h.items() if k != "run_id"}, r"header lacks `run_id`"),
        (lambda h: dict(h, type="step"), r"records-p0\.jsonl:1: first line is not a header"),
    ],
)
def test_bad_header(tmp_path, mutate, match):
    f = tmp_path / "records-p0.jsonl"
    f.write_text(json.dumps(mutate(HEADER)) + "\n")
    with pytest.raises(RecordsError, match=match):
        report.load_records(f)


def test_no_header_and_bad_fields(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text(json.dumps({"type": "step", "site": "s"}) + "\n")
    with pytest.raises(RecordsError, match=r"x\.jsonl:1: first line is not a header"):
        report.load_records(f)
    f.write_text(json.dumps(HEADER) + "\n" + json.dumps({"type": "bogus"}) + "\n")
    notes = " ".join(report.load_records(f).notes)  # a bad line: dropped, located
    assert "x.jsonl:2: unknown record `type` 'bogus'" in notes, notes
    step = {
        k: 1 for k in ("step", "rank", "process", "arrive_ns", "done_ns", "wait_ns", "delay_ns")
    }
    step.update(type="step", site="s", engaged=False, wait_ns="12")
    f.write_text(json.dumps(HEADER) + "\n" + json.dumps(step) + "\n")
    notes = " ".join(report.load_records(f).notes)
    assert "x.jsonl:2: `wait_ns` must be an integer" in notes, notes


def test_mixed_runs_are_refused(tmp_path):
    _write_run(tmp_path, run_id="run-a")
    other = tmp_path / "other"
    _write_run(other, run_id="run-b")
    (other / "records-p1.jsonl").rename(tmp_path / "records-p9.jsonl")
    with pytest.raises(RecordsError, match=r"2 different runs.*`run-a`, `run-b`"):
        report.load_records(tmp_path)


def test_duplicate_process_and_duplicate_records(tmp_path):
    paths = _write_run(tmp_path)
    (tmp_path / "copy.jsonl").write_text(paths[0].read_text())
    with pytest.raises(RecordsError, match=r"two headers claim `process_index` 0"):
        report.load_records(tmp_path)
    dicts = _synthetic(2, 5).to_dicts()
    with pytest.raises(RecordsError, match=r"duplicate records, e.g. step 4 of rank 1"):
        report.analyze(dicts + [dicts[-1]])


def test_missing_process_gives_partial_report(tmp_path):
    paths = _write_run(tmp_path, late_rank=1, late_s=0.005)
    paths[3].unlink()
    rep = report.analyze(tmp_path)
    assert rep.partial and rep.num_ranks == 3
    assert any("1 of 4 processes are missing (process 3)" in n for n in rep.notes)
    assert rep.culprit == 1  # still found among the ranks that reported


@pytest.mark.parametrize("kind", ["empty_dir", "missing", "headers_only", "empty_file"])
def test_nothing_to_read(tmp_path, kind):
    target = tmp_path
    if kind == "missing":
        target = tmp_path / "nope"
    elif kind == "headers_only":
        (tmp_path / "r.jsonl").write_text(json.dumps(HEADER) + "\n")
    elif kind == "empty_file":
        (tmp_path / "r.jsonl").write_text("")
    with pytest.raises(RecordsError):
        report.analyze(target)


def test_unknown_site(tmp_path):
    with pytest.raises(RecordsError, match=r"site `nope` is not in the records; available"):
        report.analyze(_synthetic(2, 5).to_dicts(), site="nope")


def test_several_sites_analyze_the_whole_step_and_say_so():
    a = _synthetic(2, 20, site="a").to_dicts()
    b = [d for d in _synthetic(2, 10, site="b").to_dicts() if d["type"] == "step"]
    rep = report.analyze(a + b)
    assert rep.site == "(whole step)" and rep.sites == ("a", "b")
    assert any("whole step" in n and "`site=`" in n for n in rep.notes)
    assert any("`a` x2" in n for n in rep.notes)  # 20 steps of `a` fold into 10 executions
    assert rep.num_steps == 10
    assert report.analyze(a + b, site="b").num_steps == 10
    assert report.analyze(a + b, site="a").site == "a"


# --------------------------------------------------------------------------- CLI


def _cli(argv):
    parser = argparse.ArgumentParser(prog="jaxpace report")
    report.configure_parser(parser)
    return report.cli_main(parser.parse_args(argv))


def test_cli_writes_default_outputs(tmp_path, capsys):
    _write_run(tmp_path, late_rank=2, late_s=0.005)
    out_json = tmp_path / "rep.json"
    assert _cli([str(tmp_path), "--json", str(out_json), "--warmup", "2"]) == 0
    out = capsys.readouterr().out
    assert "Culprit ranking" in out and "report.html" in out
    assert (tmp_path / "report.html").exists() and (tmp_path / "trace.json").exists()
    assert json.loads(out_json.read_text())["culprit"] == 2


def test_cli_custom_paths(tmp_path):
    _write_run(tmp_path)
    assert (
        _cli(
            [str(tmp_path), "--html", str(tmp_path / "a.html"), "--trace", str(tmp_path / "b.json")]
        )
        == 0
    )
    assert (tmp_path / "a.html").exists() and json.loads((tmp_path / "b.json").read_text())


@pytest.mark.parametrize("problem", ["mixed", "garbage", "missing_dir", "bad_site", "unwritable"])
def test_cli_errors_exit_2_without_traceback(tmp_path, capsys, problem):
    paths = _write_run(tmp_path, run_id="run-a")
    argv = [str(tmp_path)]
    if problem == "mixed":
        _write_run(tmp_path / "o", run_id="run-b")[0].rename(tmp_path / "x.jsonl")
    elif problem == "garbage":
        paths[0].write_text("{garbage\n" + paths[0].read_text())
    elif problem == "missing_dir":
        argv = [str(tmp_path / "nope")]
    elif problem == "bad_site":
        argv += ["--site", "nope"]
    else:
        argv += ["--html", str(tmp_path / "no" / "such" / "dir" / "r.html")]
    assert _cli(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxpace report: error:") and "Traceback" not in err


def test_analysis_is_fast_on_a_big_run():
    # 256 ranks x 2000 steps = 512k records; keep well under a few seconds.
    import time

    recs = _synthetic(256, 2000, late_rank=100, late_s=0.001, seed=1)
    t = time.perf_counter()
    rep = report.analyze(recs)
    assert time.perf_counter() - t < 10.0
    assert rep.culprit == 100
    assert not math.isnan(rep.amplification)
