"""`jaxpace report` on a folder of runs, step-interleaved runs in the records,
the demo's A/B table and Diagnosis in the HTML, and `jp.configure` for the watchdog settings."""

import argparse
import json
import math

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxpace as jp
from jaxpace import demo, report
from jaxpace.errors import ConfigError, RecordsError
from jaxpace.records import reader as records_mod
from jaxpace.records.synthetic import synthetic_run
from jaxpace.report.render.html import render_report_html
from jaxpace.runtime import pacer as pacer_mod


def _cli(argv):
    parser = argparse.ArgumentParser(prog="jaxpace report")
    report.configure_parser(parser)
    return report.cli_main(parser.parse_args(argv))


def _run_dir(path, **kw):
    synthetic_run(4, 24, late_rank=2, late_s=0.004, **kw).write_jsonl(path)
    return path


# ------------------------------------------------------------ report on a folder of runs


def test_report_on_a_folder_of_runs_lists_each_with_its_command(tmp_path, capsys):
    # As `jaxpace demo` leaves it: no records at the top, runs two levels down.
    for sub in ("diagnose/off", "ab/off", "ab/on"):
        _run_dir(tmp_path / sub)
    assert [p.relative_to(tmp_path).as_posix() for p in records_mod.find_runs(tmp_path)] == [
        "ab/off",
        "ab/on",
        "diagnose/off",
    ]
    # Listing the runs is what the README uses it for: not an error (issue 26).
    assert _cli([str(tmp_path)]) == 0
    cap = capsys.readouterr()
    assert "holds 3 runs" in cap.out and "error" not in cap.out + cap.err
    for sub in ("diagnose/off", "ab/off", "ab/on"):
        assert f"jaxpace report {tmp_path / sub}\n" in cap.out + "\n"
    with pytest.raises(RecordsError, match="holds 3 runs"):
        report.load_records(tmp_path)


def test_report_on_a_folder_with_one_run_reports_it(tmp_path, capsys):
    run = _run_dir(tmp_path / "job" / "off")
    assert _cli([str(tmp_path), "--warmup", "2"]) == 0
    out = capsys.readouterr().out
    assert f"reporting {run}" in out and "Culprit ranking" in out
    assert (run / "report.html").exists() and (run / "trace.json").exists()


def test_empty_folder_still_says_what_files_are_expected(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(RecordsError, match="records-p0.jsonl"):
        report.load_records(tmp_path)


# ------------------------------------------------------------ interleaved runs


def _with_header(recs, **fields):
    return [{**r, **fields} if r["type"] == "header" else r for r in recs]


def test_interleaved_records_do_not_take_exit_to_exit_as_the_iteration():
    recs = synthetic_run(4, 40, late_rank=1, late_s=0.005, compute_s=0.020).to_dicts()
    alone = report.analyze(recs, warmup_steps=2)
    assert 0.015 < alone.iteration.mean_s < 0.04  # exit to exit: this run's own step
    inter = report.analyze(_with_header(recs, interleaved_phases=3), warmup_steps=2)
    assert math.isnan(inter.iteration.mean_s) and inter.iteration.num_steps == 0
    assert all(math.isnan(r.compute_s) for r in inter.ranks)
    assert any(n.startswith("INTERLEAVED: ") and "3 runs" in n for n in inter.notes)
    assert not any("not consecutive" in n for n in inter.notes)
    # Waits, delays and the ranking are still this run's own.
    assert inter.culprit == alone.culprit == 1
    assert inter.rank_stats(1).excess_lateness_s == pytest.approx(
        alone.rank_stats(1).excess_lateness_s
    )
    # Not interleaved (1) reads as before.
    one = report.analyze(_with_header(recs, interleaved_phases=1), warmup_steps=2)
    assert one.iteration.mean_s == pytest.approx(alone.iteration.mean_s)


@pytest.mark.parametrize("bad", [0, -2, "3", 2.0, True])
def test_reader_refuses_a_bad_interleaved_phases(tmp_path, bad):
    recs = _with_header(synthetic_run(2, 8).to_dicts(), interleaved_phases=bad)
    path = tmp_path / "records-p0.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    with pytest.raises(RecordsError, match="interleaved_phases"):
        report.load_records(path)


def _measured_pacer():
    pacer = jp.Pacer()
    mesh = jax.make_mesh((8,), ("data",))
    f = jax.jit(
        jax.shard_map(
            lambda x: pacer.psum(x, "data", site="s"), mesh=mesh, in_specs=P("data"), out_specs=P()
        )
    )
    x = jax.device_put(jnp.ones(8), NamedSharding(mesh, P("data")))
    for _ in range(3):
        f(x).block_until_ready()
    return pacer


def test_export_header_extra_reaches_the_header_and_is_checked(tmp_path):
    pacer = _measured_pacer()
    path = pacer.export(f"{tmp_path}/run/", header_extra={"interleaved_phases": 3})
    assert path.endswith("records-p0.parquet")  # the native format
    header = report.load_records(path).headers[0]
    assert header["type"] == "header" and header["interleaved_phases"] == 3
    assert "interleaved_phases" not in pacer.records()[0]  # only where asked
    for bad, match in (
        ({"interleaved_phases": 0}, r"header_extra\['interleaved_phases'\]"),
        ({"run_id": "x"}, r"may not replace the header's own fields \['run_id'\]"),
        ({1: 2}, "string keys"),
        ({"x": object()}, "JSON-serializable"),
        ([("a", 1)], "must be a dict"),
    ):
        with pytest.raises(ConfigError, match=match):
            pacer.export(f"{tmp_path}/bad/", header_extra=bad)
    assert not (tmp_path / "bad").exists()  # checked before anything is created


# ------------------------------------------------------------ the demo's HTML


def test_demo_html_carries_the_ab_table_and_the_diagnosis():
    rows = {
        ph: {
            "mean_step_ms": 100.0 + i,
            "p99_step_ms": 150.0,
            "cv": 0.2,
            "early_sync_wait_ms": 20.0 - 5 * i,
            "early_delay_ms": 7.5 * (i == 2),
        }
        for i, ph in enumerate(demo.PHASES)
    }
    lines = ["Culprit: rank 1 (process 1), 21.0 ms later", "Training: loss 0.66 -> 0.53"]
    rep = report.analyze(synthetic_run(4, 24, late_rank=1, late_s=0.004), warmup_steps=2)
    html = render_report_html(rep, extra_sections=demo.html_sections(rows, lines))
    assert demo.AB_TITLE in html and "<h2>Diagnosis</h2>" in html
    for label in demo.PHASES.values():
        assert label in html
    assert "<td>job step, mean (ms)</td>" in html.replace(' class="num"', "")
    assert "101.0" in html and "7.50" in html
    assert "<p>Culprit: rank 1 (process 1), 21.0 ms later</p>" in html
    # The terminal table is built from the same rows.
    header = demo._ab_table(rows)[1].split()
    assert " ".join(header) == " ".join(demo.PHASES.values())


# ------------------------------------------------------------ jp.configure


@pytest.fixture
def fresh_default(monkeypatch):
    p = jp.Pacer()
    monkeypatch.setattr(pacer_mod, "_DEFAULT", p)
    return p


def test_configure_accepts_the_watchdog_settings(fresh_default, tmp_path):
    assert jp.configure(stall_after_s=12.5, on_stall="raise", run_dir=tmp_path) is fresh_default
    cfg = fresh_default.watchdog.config
    assert (cfg.stall_after_s, cfg.on_stall, cfg.directory()) == (12.5, "raise", str(tmp_path))
    jp.configure(stall_after_s=None)  # off, as in Pacer(stall_after_s=None)
    assert fresh_default.watchdog.config.stall_after_s is None
    assert fresh_default.watchdog.config.on_stall == "raise"  # others kept


@pytest.mark.parametrize(
    "field,value",
    [("stall_after_s", -1.0), ("stall_after_s", "5"), ("on_stall", "panic"), ("run_dir", 3)],
)
def test_configure_checks_the_watchdog_settings_as_pacer_does(fresh_default, field, value):
    with pytest.raises(ConfigError) as direct:
        jp.Pacer(**{field: value})
    before = (fresh_default.watchdog.config, fresh_default.policy)
    with pytest.raises(ConfigError) as via_configure:
        jp.configure(policy=jp.fixed(0.001), **{field: value})
    assert str(via_configure.value) == str(direct.value) and f"`{field}`" in str(direct.value)
    assert (fresh_default.watchdog.config, fresh_default.policy) == before


def test_configure_watchdog_after_the_first_trace_is_refused(fresh_default):
    jax.vmap(lambda v: jp.psum(v, "i"), axis_name="i")(jnp.ones(2))
    with pytest.raises(jp.errors.TracedConfigChangeError):
        jp.configure(on_stall="exit")
    assert fresh_default.watchdog.config.on_stall == "warn"
