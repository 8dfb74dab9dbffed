"""`jaxpace demo`: a local multi-process training run with an injected straggler, diagnosed and paced."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["IMBALANCE_PROFILES", "cli_main", "configure_parser", "run_demo"]

# name -> (persistent lag of one process in s, per-step straggle probability, straggle s)
IMBALANCE_PROFILES: dict[str, tuple[float, float, float]] = {
    "slow+episodic": (0.020, 0.03, 0.030),
    "slow": (0.020, 0.0, 0.0),
    "episodic": (0.0, 0.08, 0.030),
    "none": (0.0, 0.0, 0.0),
}


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--processes", type=int, default=4, help="processes (default 4)")
    p.add_argument("--devices", type=int, default=2, help="CPU devices per process (default 2)")
    p.add_argument("--steps", type=int, default=60, help="train steps per phase (default 60)")
    p.add_argument("--imbalance", choices=sorted(IMBALANCE_PROFILES), default="slow+episodic",
                   help="injected imbalance (default: one slow process + random stragglers)")
    p.add_argument("--slow-process", type=int, default=1, help="which process is slow")
    p.add_argument("--lag-ms", type=float, default=None, help="override the slow process's lag")
    p.add_argument("--max-delay-ms", type=float, default=30.0, help="pacing bound (default 30)")
    p.add_argument("--out", default="jaxpace-demo", help="output directory (default ./jaxpace-demo)")
    p.add_argument("--timeout", type=float, default=600.0, help="kill the job after this many s")
    p.add_argument("--seed", type=int, default=0)


class _Progress:
    """A text stream for `launch` that drives a rich progress bar and keeps a log."""

    def __init__(self, progress, tasks: dict[str, Any], log_path: Path) -> None:
        self.progress = progress
        self.tasks = tasks
        self.log = open(log_path, "w")  # noqa: SIM115 - closed by close()

    def write(self, s: str) -> int:
        self.log.write(s)
        for line in s.splitlines():
            if "PROGRESS " in line:
                parts = line.split("PROGRESS ", 1)[1].split()
                if len(parts) == 3 and parts[0] in self.tasks:
                    self.progress.update(self.tasks[parts[0]], completed=int(parts[1]))
        return len(s)

    def flush(self) -> None:
        self.log.flush()

    def close(self) -> None:
        self.log.close()


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


def run_demo(args: argparse.Namespace, console=None) -> dict[str, Any]:
    """Runs the demo and returns its summary (also written to OUT/demo-summary.json)."""
    from rich.console import Console
    from rich.panel import Panel
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from jaxpace import launch, report
    from jaxpace.errors import LaunchError

    _validate(args)
    console = console or Console()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    lag_s, p_straggle, straggle_s = IMBALANCE_PROFILES[args.imbalance]
    if args.lag_ms is not None:
        lag_s = args.lag_ms / 1000.0
    console.print(
        f"[bold]jaxpace demo[/]: {args.processes} processes x {args.devices} CPU devices, "
        f"Flax/Optax MLP, {args.steps} steps with pacing off, then on.\n"
        f"Injected imbalance '{args.imbalance}': process {args.slow_process} is "
        f"{lag_s * 1e3:.0f} ms late every step"
        + (f"; any process may straggle {straggle_s * 1e3:.0f} ms with p={p_straggle}"
           if p_straggle else "")
        + "."
    )
    cmd = [
        sys.executable, "-m", "jaxpace.examples.train", "--steps", str(args.steps),
        "--pacing", "off,on", "--lag-s", str(lag_s), "--lag-process", str(args.slow_process),
        "--straggle-p", str(p_straggle), "--straggle-s", str(straggle_s),
        "--max-delay-s", str(args.max_delay_ms / 1000.0), "--seed", str(args.seed),
        "--out", str(out), "--progress",
    ]
    t0 = time.monotonic()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=False) as progress:
        tasks = {"off": progress.add_task("pacing off (measure)", total=args.steps),
                 "on": progress.add_task("pacing on (adaptive)", total=args.steps)}
        stream = _Progress(progress, tasks, out / "launch.log")
        try:
            res = launch.launch(cmd, num_processes=args.processes, local_devices=args.devices,
                                timeout_s=args.timeout, stream=stream)
        finally:
            stream.close()
    if not res.ok:
        raise LaunchError(launch.describe_failure(res, args.timeout) +
                          f"\nFull log: {out / 'launch.log'}")
    results = [json.loads((out / f"result-p{i}.json").read_text()) for i in range(args.processes)]

    rep_off = report.analyze(out / "off")
    rep_on = report.analyze(out / "on")
    report.print_summary(rep_off, console=console)
    paths = {
        "html": str(report.write_html(rep_off, out / "report.html")),
        "trace": str(report.write_trace(out / "off", out / "trace.json")),
        "html_paced": str(report.write_html(rep_on, out / "report-paced.html")),
        "trace_paced": str(report.write_trace(out / "on", out / "trace-paced.json")),
        "json": str(report.write_json(rep_off, out / "report.json")),
    }

    same_params = all(r["off"]["params_sha256"] == r["on"]["params_sha256"] for r in results)
    losses = results[0]["off"]["losses"]

    def phase_row(rep) -> dict[str, float]:
        early = [r for r in rep.ranks if r.rank != rep.culprit] or list(rep.ranks)
        return {
            "mean_step_ms": rep.iteration.mean_s * 1e3,
            "cv": rep.iteration.cv,
            "p99_step_ms": rep.iteration.p99_s * 1e3,
            "early_sync_wait_ms": float(sum(r.sync_wait_s for r in early) / len(early) * 1e3),
            "early_delay_ms": float(sum(r.delay_s for r in early) / len(early) * 1e3),
        }

    off, on = phase_row(rep_off), phase_row(rep_on)
    # Name early ranks with the culprit of the unpaced run in both phases.
    on_early = [r for r in rep_on.ranks if r.rank != rep_off.culprit]
    if on_early:
        on["early_sync_wait_ms"] = float(sum(r.sync_wait_s for r in on_early) / len(on_early) * 1e3)
        on["early_delay_ms"] = float(sum(r.delay_s for r in on_early) / len(on_early) * 1e3)

    t = Table(title="Pacing effect (same job, same data)")
    t.add_column("")
    t.add_column("pacing off", justify="right")
    t.add_column("pacing on", justify="right")
    for key, label, fmt in (("mean_step_ms", "mean step (ms)", "{:.1f}"),
                            ("p99_step_ms", "p99 step (ms)", "{:.1f}"),
                            ("cv", "step-time CV", "{:.3f}"),
                            ("early_sync_wait_ms", "early ranks' sync wait (ms/step)", "{:.2f}"),
                            ("early_delay_ms", "early ranks' pacing sleep (ms/step)", "{:.2f}")):
        t.add_row(label, fmt.format(off[key]), fmt.format(on[key]))
    console.print(t)

    culprit = rep_off.culprit
    verdict = (
        f"Culprit: rank {culprit} (process {rep_off.culprit_process}), "
        f"{rep_off.rank_stats(culprit).excess_lateness_s * 1e3:.1f} ms later than a typical rank, "
        f"last to arrive in {rep_off.rank_stats(culprit).last_fraction:.0%} of steps."
        if culprit is not None else "No persistent culprit: arrivals are balanced."
    )
    detected = sorted((m for m in rep_off.failure_modes if m.detected and m.name != "balanced"),
                      key=lambda m: -m.score)
    mode_lines = [f"  {m.name} (score {m.score:.2f}): {m.evidence[0]}" for m in detected]
    lines = [
        verdict,
        "Failure modes detected:" if mode_lines else "Failure mode: balanced.",
        *mode_lines,
        f"Pacing moved {off['early_sync_wait_ms'] - on['early_sync_wait_ms']:.1f} ms/step of "
        f"waiting-in-collective into bounded sleeps; mean step {off['mean_step_ms']:.1f} -> "
        f"{on['mean_step_ms']:.1f} ms. Here nothing is shared that early ranks could free, so "
        "pacing cannot speed the step up, and CPU/gloo runs the in-band exchange as one more "
        "small all-reduce (NCCL groups it); see docs/concepts.md.",
        f"Training: loss {losses[0]:.4f} -> {losses[-1]:.4f}; parameters with pacing off and on "
        + ("are bitwise identical." if same_params else "DIFFER (this is a bug)."),
        f"Report: {paths['html']}",
        f"Perfetto trace (open in https://ui.perfetto.dev): {paths['trace']}",
    ]
    console.print(Panel("\n".join(lines), title="Diagnosis", expand=False))
    summary = {
        "culprit_rank": culprit,
        "culprit_process": rep_off.culprit_process,
        "slow_process": args.slow_process if lag_s > 0 else None,
        "primary_mode": rep_off.primary_mode,
        "params_identical": same_params,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "pacing_off": off,
        "pacing_on": on,
        "files": paths,
        "elapsed_s": time.monotonic() - t0,
    }
    (out / "demo-summary.json").write_text(json.dumps(summary, indent=2))
    return summary


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
