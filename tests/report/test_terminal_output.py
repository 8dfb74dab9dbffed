"""Issue 26, item 9: terminal output that fits a person.

The report's summary is short by default (`--verbose` for the rest) and, piped,
plain fixed-width text: nothing wraps into 20-column slivers or is cut with `…`.
The demo prints a screenful, not 154 lines. `jaxpace simulate` ends with a
one-line conclusion, names its throughput unit, and its progress bar fits.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import numpy as np
from rich.console import Console

from jaxpace import demo
from jaxpace.records.synthetic import synthetic_run
from jaxpace.report import analyze, print_summary, synthetic_records
from jaxpace.report.render.terminal import PIPE_WIDTH, summary_lines
from jaxpace.sim import cli as sim_cli


def _amplification():
    return analyze(synthetic_records(16, 200, seed=0, straggler_prob=0.05, straggler_factor=2.0))


def test_summary_is_short_by_default_and_whole_with_verbose():
    rep = analyze(synthetic_records(8, 60, late_rank=3, late_s=0.01, seed=1))
    short, full = summary_lines(rep), summary_lines(rep, verbose=True)
    assert len(short) <= 30, "\n".join(short)
    assert any("--verbose" in ln for ln in short)
    assert len(full) > len(short)
    for part in ("Decisions", "Failure modes", "Cost of waiting", "noise floor"):
        assert part in "\n".join(full), part


def test_piped_summary_is_plain_fixed_width_text(capsys):
    """Off a terminal: 100 columns, names whole, forecast notes on full-width lines."""
    rep = _amplification()
    print_summary(rep, verbose=True)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "…" not in out and "\x1b[" not in out  # nothing cut, no colour codes
    assert max(len(ln) for ln in lines) <= PIPE_WIDTH
    assert "synchronization_amplification" in out
    # Prose wraps at the width, not in narrow table cells (once ~20 characters).
    prose = [ln for ln in lines if ln.startswith(("  - ", "    ")) and " " in ln.strip()]
    assert prose and np.median([len(ln) for ln in prose]) > 60
    caption = next(ln for ln in lines if ln.startswith("  measured "))
    assert len(caption) > 60 and "empirical order statistics" in out.replace("\n  ", " ")


def test_commands_are_never_split_across_lines():
    rep = analyze(synthetic_records(8, 60, late_rank=3, late_s=0.01, seed=1))
    for width in (60, 80, 100):
        text = "\n".join(summary_lines(rep, width=width, verbose=True))
        assert "`nvidia-smi -q -d CLOCK,TEMPERATURE,PERFORMANCE`" in text


# --------------------------------------------------------------------------- demo


def _fake_jobs(args, out: Path, common, console, say):
    """What the demo's two launches leave, from synthetic records (no processes run)."""
    rng = np.random.default_rng(0)
    for job, phases in (("diagnose", ["off"]), ("ab", list(demo.PHASES))):
        for ph in phases:
            synthetic_run(args.processes, args.steps, late_rank=1, late_s=0.02, seed=1).write_jsonl(
                out / job / ph
            )
        for p in range(args.processes):
            res = {
                ph: {
                    "losses": [0.7, 0.5],
                    "step_times_s": (0.03 + 0.001 * rng.random(args.steps)).tolist(),
                    "params_sha256": "same",
                }
                for ph in phases
            }
            (out / job / f"result-p{p}.json").write_text(json.dumps(res))


def test_demo_prints_a_screenful(tmp_path, monkeypatch):
    monkeypatch.setattr(demo, "_run_jobs", _fake_jobs)
    ap = argparse.ArgumentParser()
    demo.configure_parser(ap)
    args = ap.parse_args(["--out", str(tmp_path / "d"), "--steps", "40", "--processes", "2"])
    buf = io.StringIO()
    summary = demo.run_demo(args, console=Console(file=buf, width=100))
    out = buf.getvalue()
    assert summary["culprit_rank"] == 1
    assert len(out.splitlines()) <= 60, out
    assert "…" not in out and "Culprit: rank 1" in out and demo.AB_TITLE in out
    assert max(len(ln) for ln in out.splitlines()) <= 100


# --------------------------------------------------------------------------- simulate


def _simulate(capsys, *argv):
    ap = argparse.ArgumentParser()
    sim_cli.configure_parser(ap)
    assert sim_cli.cli_main(ap.parse_args(list(argv))) == 0
    return capsys.readouterr().out


def test_simulate_ends_with_a_one_line_conclusion_and_names_its_unit(capsys):
    out = _simulate(capsys, "--nodes", "1,2", "--steps", "60", "--scenario", "pure-bsp")
    lines = out.strip().splitlines()
    assert lines[-1].startswith("Conclusion: ")
    assert "rank-steps/s" in out and "throughput/s" not in out
    assert "-0.0%" not in out


def test_simulate_conclusion_without_pacing(capsys):
    out = _simulate(capsys, "--nodes", "1", "--steps", "30", "--policy", "none")
    assert out.strip().splitlines()[-1].startswith("Conclusion: scaling efficiency")


class _FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_simulate_progress_bar_fits_80_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    stream = _FakeTTY()
    with sim_cli._Progress(16, 100_000, stream=stream) as progress:
        progress.start(15, "1024 nodes, baseline")
        progress.update(99_999)
        progress.bar.refresh()
    assert "…" not in stream.getvalue()
    assert "1599999/1600000" in stream.getvalue()


def test_demo_progress_bars_fit_80_columns():
    """The A/B bar's long label once pushed its elapsed time out as `0:00…`."""
    stream = _FakeTTY()
    console = Console(file=stream, width=80, force_terminal=True)
    with demo._progress(console) as progress:
        for label, _ in demo.JOBS.values():
            task = progress.add_task(label, total=100_000)
            progress.update(task, completed=99_999)
        progress.refresh()
    out = stream.getvalue()
    assert "…" not in out and "99999/100000" in out
    for label, _ in demo.JOBS.values():
        assert label in out


def test_report_cli_short_by_default_and_verbose_on_request(tmp_path, capsys):
    from jaxpace.report import cli as report_cli

    run = tmp_path / "run"
    synthetic_run(8, 60, late_rank=3, late_s=0.01, seed=1).write_jsonl(run)
    outputs = []
    for extra in ([], ["--verbose"]):
        ap = argparse.ArgumentParser()
        report_cli.configure_parser(ap)
        assert report_cli.cli_main(ap.parse_args([str(run), *extra])) == 0
        outputs.append(capsys.readouterr().out)
    short, full = outputs
    assert "Decisions (evidence, confidence)" not in short and "--verbose" in short
    assert "Decisions (evidence, confidence)" in full and "Cost of waiting" in full
    assert len(short.splitlines()) <= 32 < len(full.splitlines())
