"""`jaxpace demo`: a local multi-process training run with an injected straggler, diagnosed and paced."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from jaxpace.records.safe_io import write_atomic

__all__ = ["IMBALANCE_PROFILES", "PHASES", "cli_main", "configure_parser", "run_demo"]

# The phases the demo runs, each from the same initial parameters.
PHASES = {
    "off": "measure only",
    "exchange": "exchange, no pacing",
    "on": "pacing on (adaptive)",
}

# name -> (persistent lag of one process in s, per-step straggle probability, straggle s).
# 30 ms is about a third of the demo's step on 2 cores, clear of the 24% of the step a
# job of 4 processes names with confidence even when other work slows the machine (at
# 20 ms, 25% of a quiet step, a loaded machine made it `likely`, not named).
IMBALANCE_PROFILES: dict[str, tuple[float, float, float]] = {
    "slow+episodic": (0.030, 0.03, 0.030),
    "slow": (0.030, 0.0, 0.0),
    "episodic": (0.0, 0.08, 0.030),
    "none": (0.0, 0.0, 0.0),
}


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--processes", type=int, default=4, help="processes (default 4)")
    p.add_argument("--devices", type=int, default=2, help="CPU devices per process (default 2)")
    p.add_argument(
        "--steps", type=int, default=60, help="train steps per phase (default 60; three phases)"
    )
    p.add_argument(
        "--imbalance",
        choices=sorted(IMBALANCE_PROFILES),
        default="slow+episodic",
        help="injected imbalance (default: one slow process + random stragglers)",
    )
    p.add_argument("--slow-process", type=int, default=1, help="which process is slow")
    p.add_argument("--lag-ms", type=float, default=None, help="override the slow process's lag")
    p.add_argument("--max-delay-ms", type=float, default=30.0, help="pacing bound (default 30)")
    p.add_argument(
        "--out", default="jaxpace-demo", help="output directory (default ./jaxpace-demo)"
    )
    p.add_argument("--timeout", type=float, default=600.0, help="kill the job after this many s")
    p.add_argument("--seed", type=int, default=0)


class _Progress:
    """A text stream for `launch` that keeps a log and drives a rich progress bar (if any)."""

    def __init__(self, progress, task: Any, log) -> None:
        self.progress = progress
        self.task = task
        self.log = log

    def write(self, s: str) -> int:
        self.log.write(s)
        if self.progress is None:
            return len(s)
        for line in s.splitlines():
            if "PROGRESS " in line:
                parts = line.split("PROGRESS ", 1)[1].split()
                if len(parts) == 2 and parts[0].isdigit():
                    self.progress.update(self.task, completed=int(parts[0]))
        return len(s)

    def flush(self) -> None:
        self.log.flush()


def _validate(args: argparse.Namespace) -> None:
    from jaxpace.errors import ConfigError

    for name, lo, hi in (("processes", 2, 16), ("devices", 1, 8), ("steps", 10, 100_000)):
        v = getattr(args, name)
        if not lo <= v <= hi:
            raise ConfigError(f"`--{name}` must be in [{lo}, {hi}], got {v}.")
    if not 0 <= args.slow_process < args.processes:
        raise ConfigError(
            f"`--slow-process` must be in [0, {args.processes - 1}], got {args.slow_process}."
        )
    if args.lag_ms is not None and not (0 <= args.lag_ms <= 1000 and math.isfinite(args.lag_ms)):
        raise ConfigError(f"`--lag-ms` must be in [0, 1000], got {args.lag_ms}.")
    if not (0 < args.max_delay_ms <= 1000):
        raise ConfigError(f"`--max-delay-ms` must be in (0, 1000], got {args.max_delay_ms}.")


def _job_step_times(results: list[dict], phase: str, warmup: int) -> np.ndarray:
    """Per step, the slowest process's wall time: the job's step time (s)."""
    times = np.array([r[phase]["step_times_s"] for r in results])  # processes x steps
    return times.max(axis=0)[warmup:]


def run_demo(args: argparse.Namespace, console=None) -> dict[str, Any]:
    """Runs the demo and returns its summary (also written to OUT/demo-summary.json).

    Two launches of `jaxpace.examples.train` on the same injected imbalance:
    1. diagnosis: measure only, analyzed by `jaxpace.report` (HTML, trace);
    2. A/B: measure only, exchange without pacing, and pacing on, interleaved
       step by step (A B C A B C ...) so machine noise hits all three alike.
    """
    from jaxpace import report

    _validate(args)
    say = _printer(console)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    lag_s, p_straggle, straggle_s = IMBALANCE_PROFILES[args.imbalance]
    if args.lag_ms is not None:
        lag_s = args.lag_ms / 1000.0
    say("\n".join(_wrap(_intro(args, lag_s, p_straggle, straggle_s), indent="")))
    t0 = time.monotonic()
    _run_jobs(args, out, _train_command(args, lag_s, p_straggle, straggle_s), console, say)
    diag, ab = (
        _load_results(out, "diagnose", args.processes),
        _load_results(out, "ab", args.processes),
    )
    rep = report.analyze(out / "diagnose" / "off")
    report.print_summary(rep, console=console)
    paths = {k: str(out / f) for k, f in (("html", "report.html"), ("trace", "trace.json"))}
    same_params = all(len({r[ph]["params_sha256"] for ph in PHASES}) == 1 for r in ab)
    losses = diag[0]["off"]["losses"]
    warmup = min(5, args.steps // 4)
    rows = {ph: _phase_row(out, ab, ph, warmup, rep.culprit) for ph in PHASES}
    say("\n".join(["", *_ab_table(rows)]))
    lines = _diagnosis_lines(rep, rows, losses, same_params, paths)
    say("\n".join(["", "Diagnosis", *(w for ln in lines for w in _wrap(ln))]))
    # The HTML carries the same A/B table and Diagnosis as the terminal.
    report.write_html(rep, paths["html"], extra_sections=html_sections(rows, lines))
    report.write_trace(out / "diagnose" / "off", paths["trace"])
    paths["json"] = str(report.write_json(rep, out / "report.json"))
    summary = {
        "culprit_rank": rep.culprit,
        "culprit_process": rep.culprit_process,
        "slow_process": args.slow_process if lag_s > 0 else None,
        "primary_mode": rep.primary_mode,
        "params_identical": same_params,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "pacing_off": rows["off"],
        "exchange_only": rows["exchange"],
        "pacing_on": rows["on"],
        "files": paths,
        "elapsed_s": time.monotonic() - t0,
    }
    write_atomic(out / "demo-summary.json", json.dumps(summary, indent=2), what="demo summary")
    return summary


def _printer(console: Any) -> Any:
    """Prints plain text to `console` (a rich Console, not re-wrapped) or to stdout."""
    if console is None:
        return print
    return lambda text: console.print(text, markup=False, highlight=False, soft_wrap=True)


def _wrap(text: str, indent: str = "  ") -> list[str]:
    """`text` (lines) wrapped at the report's piped width, continuation lines indented."""
    from jaxpace.report.render.terminal import PIPE_WIDTH, wrap_text

    return [w for ln in text.split("\n") for w in wrap_text(ln, PIPE_WIDTH, indent, indent + "  ")]


def _intro(args: argparse.Namespace, lag_s: float, p_straggle: float, straggle_s: float) -> str:
    return (
        f"jaxpace demo: {args.processes} processes x {args.devices} CPU devices, "
        f"Flax/Optax MLP, {args.steps} steps to diagnose, then {args.steps} steps each of "
        f"{', '.join(PHASES.values())}, interleaved.\n"
        f"Injected imbalance '{args.imbalance}': process {args.slow_process} is "
        f"{lag_s * 1e3:.0f} ms late every step"
        + (
            f"; any process may straggle {straggle_s * 1e3:.0f} ms with p={p_straggle}"
            if p_straggle
            else ""
        )
        + "."
    )


def _train_command(
    args: argparse.Namespace, lag_s: float, p_straggle: float, straggle_s: float
) -> list[str]:
    """The `jaxpace.examples.train` command line both launches share."""
    return [
        sys.executable,
        "-m",
        "jaxpace.examples.train",
        "--steps",
        str(args.steps),
        "--lag-s",
        str(lag_s),
        "--lag-process",
        str(args.slow_process),
        "--straggle-p",
        str(p_straggle),
        "--straggle-s",
        str(straggle_s),
        "--max-delay-s",
        str(args.max_delay_ms / 1000.0),
        "--seed",
        str(args.seed),
        "--progress",
    ]


# The two launches: label (short, so a progress bar fits 80 columns) and extra flags.
JOBS = {
    "diagnose": ("diagnose (measure only)", ["--pacing", "off"]),
    "ab": ("A/B (3 runs interleaved)", ["--pacing", ",".join(PHASES)]),
}


def _run_jobs(args: argparse.Namespace, out: Path, common: list[str], console, say) -> None:
    """Launches the diagnosis job and the interleaved A/B job.

    On a terminal, a progress bar per job; off one (piped, logged), one line per
    job when it ends, so no bar is redrawn or cut into the output.
    """
    from jaxpace import launch
    from jaxpace.errors import LaunchError

    log_path = out / "launch.log"
    with _progress(console) as progress, open(log_path, "w") as log:
        for name, (label, extra) in JOBS.items():
            task = progress.add_task(label, total=args.steps) if progress else None
            t0 = time.monotonic()
            res = launch.launch(
                common + extra + ["--out", str(out / name)],
                num_processes=args.processes,
                local_devices=args.devices,
                timeout_s=args.timeout,
                stream=_Progress(progress, task, log),
            )
            if not res.ok:
                raise LaunchError(
                    launch.describe_failure(res, args.timeout) + f"\nFull log: {log_path}"
                )
            if progress is None:
                say(f"{label}: {args.steps} steps in {time.monotonic() - t0:.1f} s")


def _progress(console: Any) -> Any:
    """A rich progress display on a terminal, else a context that yields None."""
    import contextlib

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = console or Console()
    if not console.is_terminal:
        return contextlib.nullcontext(None)
    return Progress(
        TextColumn("{task.description}", table_column=None),
        BarColumn(bar_width=24),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def _load_results(out: Path, job: str, processes: int) -> list[dict]:
    return [json.loads((out / job / f"result-p{i}.json").read_text()) for i in range(processes)]


def _phase_row(
    out: Path, ab: list[dict], phase: str, warmup: int, culprit: int | None
) -> dict[str, float]:
    """Job step statistics and the early ranks' wait and sleep for one A/B phase."""
    from jaxpace import report

    steps = _job_step_times(ab, phase, warmup)
    prep = report.analyze(out / "ab" / phase, warmup_steps=warmup)
    early = [r for r in prep.ranks if r.rank != culprit] or list(prep.ranks)
    return {
        "mean_step_ms": float(steps.mean() * 1e3),
        "p99_step_ms": float(np.percentile(steps, 99) * 1e3),
        "cv": float(steps.std() / steps.mean()),
        "early_sync_wait_ms": float(np.mean([r.sync_wait_s for r in early]) * 1e3),
        "early_delay_ms": float(np.mean([r.delay_s for r in early]) * 1e3),
    }


AB_TITLE = "Pacing A/B (interleaved; same data, same start)"
_AB_ROWS = (
    ("mean_step_ms", "job step, mean (ms)", "{:.1f}"),
    ("p99_step_ms", "job step, p99 (ms)", "{:.1f}"),
    ("cv", "job step CV", "{:.3f}"),
    ("early_sync_wait_ms", "early ranks' sync wait (ms/step)", "{:.2f}"),
    ("early_delay_ms", "early ranks' pacing sleep (ms/step)", "{:.2f}"),
)


def ab_rows(rows: dict[str, dict[str, float]]) -> list[list[str]]:
    """The A/B table as plain rows, header first (terminal and HTML)."""
    return [
        ["", *PHASES.values()],
        *([label, *(fmt.format(rows[ph][key]) for ph in PHASES)] for key, label, fmt in _AB_ROWS),
    ]


def html_sections(rows: dict[str, dict[str, float]], lines: list[str]) -> list[tuple[str, Any]]:
    """`write_html(extra_sections=...)`: the terminal's A/B table and Diagnosis panel."""
    return [(AB_TITLE, ab_rows(rows)), ("Diagnosis", list(lines))]


def _ab_table(rows: dict[str, dict[str, float]]) -> list[str]:
    """The A/B table as fixed-width text lines (title first)."""
    from jaxpace.report.render.terminal import text_table

    return text_table(ab_rows(rows), AB_TITLE)


def _diagnosis_lines(rep, rows, losses, same_params: bool, paths: dict[str, str]) -> list[str]:
    off, exch, on = rows["off"], rows["exchange"], rows["on"]
    culprit = rep.culprit
    verdict = (
        f"Culprit: rank {culprit} (process {rep.culprit_process}), "
        f"{rep.rank_stats(culprit).excess_lateness_s * 1e3:.1f} ms later than a typical rank, "
        f"last to arrive in {rep.rank_stats(culprit).last_fraction:.0%} of steps."
        if culprit is not None
        else f"No culprit named with confidence, but {rep.likely.text}."
        if rep.likely is not None
        else "No persistent culprit: arrivals are balanced."
    )
    detected = sorted(
        (m for m in rep.failure_modes if m.detected and m.name != "balanced"),
        key=lambda m: (m.name != rep.primary_mode, -m.score),  # the report's order
    )
    mode_lines = [f"  {m.name} (score {m.score:.2f}): {m.evidence[0]}" for m in detected]
    return [
        verdict,
        "Failure modes detected:"
        if mode_lines
        else "Failure mode: none detected; not balanced (a likely straggler, below the line)."
        if rep.likely is not None
        else "Failure mode: balanced.",
        *mode_lines,
        f"Pacing moved {exch['early_sync_wait_ms'] - on['early_sync_wait_ms']:.1f} ms/step of "
        "the early ranks' waiting-in-collective into bounded sleeps. Job step: measure only "
        f"{off['mean_step_ms']:.1f} ms, exchange {exch['mean_step_ms']:.1f} ms, paced "
        f"{on['mean_step_ms']:.1f} ms. Nothing on this machine is shared that early ranks "
        "could free, so pacing is not expected to shorten steps here (docs/concepts.md).",
        f"Training: loss {losses[0]:.4f} -> {losses[-1]:.4f}; parameters after measure-only, "
        "exchange and paced training "
        + ("are bitwise identical." if same_params else "DIFFER (this is a bug)."),
        f"Report: {paths['html']}",
        f"Perfetto trace (open in https://ui.perfetto.dev): {paths['trace']}",
    ]


def cli_main(args: argparse.Namespace) -> int:
    from jaxpace.errors import JaxpaceError

    try:
        summary = run_demo(args)
    except JaxpaceError as e:
        print(f"jaxpace demo: {e}", file=sys.stderr)
        return 2
    return 0 if summary["params_identical"] else 1


if __name__ == "__main__":  # pragma: no cover
    ap = argparse.ArgumentParser(prog="jaxpace demo")
    configure_parser(ap)
    sys.exit(cli_main(ap.parse_args()))
