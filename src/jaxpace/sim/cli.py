"""`jaxpace simulate`: scaling table with and without pacing, optional HTML/JSON output."""

from __future__ import annotations

import argparse
import html
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from jaxpace.errors import ScenarioError
from jaxpace.records.safe_io import check_replaceable, write_atomic
from jaxpace.sim._engine import (
    MAX_NODES,
    MAX_STEPS,
    Comparison,
    SimResult,
    check_run_bounds,
    estimate_peak_bytes,
    resolve_policy,
    simulate,
)
from jaxpace.sim._scenario import load_scenario, preset_names

__all__ = ["cli_main", "configure_parser", "render_scaling_html"]


def _parse_nodes(text: str) -> list[int]:
    try:
        nodes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ScenarioError(
            f"`--nodes {text}`: expected comma-separated positive integers, e.g. `1,2,4,8`."
        ) from None
    if not nodes or any(n < 1 or n > MAX_NODES for n in nodes):
        raise ScenarioError(
            f"`--nodes {text}`: expected comma-separated integers from 1 to {MAX_NODES}, "
            "e.g. `1,2,4,8`."
        )
    return nodes


def configure_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the `jaxpace simulate` options to `parser` and returns it.

    >>> p = configure_parser(argparse.ArgumentParser(prog="jaxpace simulate"))
    >>> a = p.parse_args(["--nodes", "1,2", "--scenario", "pure-bsp"])
    >>> a.nodes, a.scenario, a.policy, a.steps
    ('1,2', 'pure-bsp', 'adaptive', 2000)
    """
    parser.add_argument(
        "--nodes",
        default="1,2,4,8,16,32,64",
        help=f"comma-separated node counts, each 1-{MAX_NODES} (default: %(default)s)",
    )
    parser.add_argument(
        "--scenario",
        default="paper",
        help=f"preset name ({', '.join(preset_names())}) or a scenario JSON file (default: %(default)s)",
    )
    parser.add_argument(
        "--policy",
        default="adaptive",
        help="adaptive | fixed:SECONDS | none (default: %(default)s)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=2000,
        help=f"steps per run, 1-{MAX_STEPS:,} (default: %(default)s)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="random seed, an integer >= 0 (default: %(default)s)"
    )
    parser.add_argument(
        "--html", type=Path, default=None, help="write a self-contained HTML report here"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument(
        "--max-memory-gb",
        type=float,
        default=None,
        help="refuse runs estimated to need more memory than this "
        "(default: half of the memory available now)",
    )
    parser.add_argument(
        "--progress-every",
        type=float,
        default=PROGRESS_EVERY_S,
        metavar="SECONDS",
        help="when stderr is not a terminal, print a progress line at most this often "
        "(default: %(default)s; a terminal gets a live bar)",
    )
    return parser


PROGRESS_EVERY_S = 10.0


class _Usage(Exception):
    """A bad option value found before the simulation starts (exit status 2)."""


def _check_output(flag: str, path: Path | None) -> None:
    """Refuses an output path that could not be written, before any simulation runs."""
    if path is None:
        return
    if path.is_dir():
        raise _Usage(
            f"`{flag} {path}` is a directory; pass a file path, e.g. `{flag} {path / 'sim'}"
            f"{'.html' if flag == '--html' else '.json'}`."
        )
    parent = path.parent
    if not parent.is_dir():
        raise _Usage(
            f"`{flag} {path}`: directory `{parent}` does not exist. Create it first or pick "
            "another path (checked before simulating, so no run is wasted)."
        )
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise _Usage(f"`{flag} {path}` is not writable; pick a writable path.")
    try:  # a symlink, FIFO or device there: refused now, as `write_atomic` would after the run
        check_replaceable(path, f"`{flag}` output", flag=flag)
    except OSError as e:
        raise _Usage(str(e)) from None


def _available_bytes() -> int | None:
    """Memory available now (Linux `MemAvailable`), else physical memory, else None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        return None


def _check_memory(args: argparse.Namespace, scenario, nodes: list[int], runs: int) -> None:
    """Refuses, with the estimate, runs that would not fit; nothing is allocated before."""
    per_run = max(
        estimate_peak_bytes(scenario, nodes=n, steps=args.steps, policy=args.policy) for n in nodes
    )
    need = per_run + runs * 8 * args.steps  # every run keeps its step times for the table
    if args.max_memory_gb is not None:
        if not (args.max_memory_gb > 0 and math.isfinite(args.max_memory_gb)):
            raise _Usage(f"`--max-memory-gb` must be a positive number, got {args.max_memory_gb}.")
        limit, why = args.max_memory_gb * 1e9, "`--max-memory-gb`"
    else:
        avail = _available_bytes()
        if avail is None:
            return
        limit, why = avail / 2, f"half of the {avail / 1e9:.1f} GB available"
    if need > limit:
        raise _Usage(
            f"this simulation would need about {_size(need)} of memory ({max(nodes)} nodes "
            f"x {scenario.gpus_per_node} GPUs, {args.steps:,} steps, {runs} runs), more than "
            f"{_size(limit)} ({why}). Use fewer `--nodes` or `--steps`, or raise "
            "`--max-memory-gb`."
        )


THROUGHPUT_COLUMN = "rank-steps/s"  # `SimResult.throughput_per_s`: ranks / mean step time
BAR_WIDTH = 24  # the live bar, so label, bar, count and time fit 80 columns


def conclusion(rows) -> str:
    """One line that says what the table shows: scaling, and what pacing changed.

    `rows`: `(nodes, baseline SimResult, paced SimResult or None)`, by node count.
    """
    (n0, b0, _), (n1, b1, _) = rows[0], rows[-1]
    scale = f"scaling efficiency {b0.scaling_efficiency:.2f} at {n0} node{'s' * (n0 > 1)}" + (
        f", {b1.scaling_efficiency:.2f} at {n1} nodes" if n1 != n0 else ""
    )
    paced = [(n, Comparison(baseline=b, paced=p).throughput_gain) for n, b, p in rows if p]
    if not paced:
        return f"Conclusion: {scale} (no pacing compared; pass --policy adaptive)."
    best_n, best = max(paced, key=lambda t: t[1])
    gains = ", ".join(f"{_pct(g)} at {n}" for n, g in paced)
    verdict = (
        f"pacing helps most at {best_n} nodes ({_pct(best)} rank-steps/s)"
        if best > 0.005
        else "pacing does not raise throughput here (no gain above 0.5%)"
    )
    return f"Conclusion: {verdict}; gain by nodes: {gains}; {scale}."


def _pct(x: float) -> str:
    """A signed percentage to 0.1%, with no `-0.0%` for a change that rounds to zero."""
    v = round(x * 100, 1)
    return f"{v:+.1f}%" if v != 0 else "0.0%"


def _size(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


class _Progress:
    """Progress on stderr: a live bar on a terminal, else a line at most every `every_s`.

    `clock` is injectable so the rate limit can be tested without waiting.
    """

    def __init__(
        self,
        total_runs: int,
        steps: int,
        *,
        stream: TextIO | None = None,
        every_s: float = PROGRESS_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.total_runs, self.steps = total_runs, steps
        self.every_s, self.clock = every_s, clock
        self.t0 = self.last = clock()
        self.run = 0
        self.label = ""
        self.step = 0
        self.bar = None

    def __enter__(self) -> _Progress:
        if getattr(self.stream, "isatty", lambda: False)():
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(bar_width=BAR_WIDTH),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(file=self.stream),
                transient=True,
            )
            self.bar.__enter__()
            self.task = self.bar.add_task("simulating", total=self.total_runs * self.steps)
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def start(self, run: int, label: str) -> None:
        self.run, self.label, self.step = run, label, 0
        if self.bar is not None:
            self.bar.update(self.task, description=label)

    def update(self, step: int) -> None:
        self.step = step
        if self.bar is not None:
            self.bar.update(self.task, completed=self.run * self.steps + step)
            return
        now = self.clock()
        if now - self.last >= self.every_s:
            self.last = now
            print(
                f"jaxpace simulate: run {self.run + 1} of {self.total_runs} ({self.label}): "
                f"step {step:,} of {self.steps:,}, {now - self.t0:.0f} s elapsed",
                file=self.stream,
                flush=True,
            )


def _prepare(args: argparse.Namespace):
    """Checks every option, output path and the memory estimate; returns the plan."""
    nodes = _parse_nodes(args.nodes)
    scenario = load_scenario(args.scenario)
    check_run_bounds(nodes[0], args.steps, args.seed)  # steps and seed, named
    resolve_policy(args.policy, scenario)  # a bad `--policy` fails now, not after a run
    _check_output("--json", args.json)
    _check_output("--html", args.html)
    paced_spec = None if args.policy in ("none", "no_pacing") else args.policy
    runs = [
        (n, spec) for n in nodes for spec in ([None] if paced_spec is None else [None, paced_spec])
    ]
    _check_memory(args, scenario, nodes, len(runs))
    return nodes, scenario, runs


class _DeferredInterrupt:
    """Ctrl-C during the runs sets a flag that the step loop reads between steps.

    Python raises `KeyboardInterrupt` wherever the main thread is, including inside
    `concurrent.futures` and `threading` code that holds a lock the draw thread or the
    interpreter's exit needs; then the process hangs instead of ending. The flag makes
    the first Ctrl-C land between two steps (`check`); a second one raises at once.
    Only where Python's own handler is installed, on the main thread (a shell's ignored
    SIGINT, or a handler the caller installed, stays as it is).
    """

    def __init__(self) -> None:
        self.seen = False
        self._prev = None

    def __enter__(self) -> _DeferredInterrupt:
        main = threading.current_thread() is threading.main_thread()
        if main and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._prev = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.seen:
            raise KeyboardInterrupt
        self.seen = True

    def check(self) -> None:
        """Raises `KeyboardInterrupt` here, at a point that holds no lock, after a Ctrl-C."""
        if self.seen:
            raise KeyboardInterrupt

    def __exit__(self, *exc) -> None:
        if self._prev is not None:
            signal.signal(signal.SIGINT, self._prev)


def _run(
    args: argparse.Namespace, plan, finished: list[str], progress: _Progress
) -> list[tuple[int, SimResult, SimResult | None]]:
    """Runs every planned simulation; appends each finished run's label to `finished`.

    A Ctrl-C raises `KeyboardInterrupt` after the step it came in (`_DeferredInterrupt`).
    """
    with _DeferredInterrupt() as interrupt:

        def tick(step: int) -> None:
            progress.update(step)
            interrupt.check()

        rows = _run_all(args, plan, finished, progress, tick)
        interrupt.check()
    return rows


def _run_all(
    args: argparse.Namespace, plan, finished: list[str], progress: _Progress, tick
) -> list[tuple[int, SimResult, SimResult | None]]:
    nodes, scenario, runs = plan
    out: dict[int, list] = {n: [None, None] for n in nodes}
    for i, (n, spec) in enumerate(runs):
        label = f"{n} node{'s' if n > 1 else ''}, {'paced' if spec else 'baseline'}"
        progress.start(i, label)
        r = simulate(
            scenario,
            nodes=n,
            steps=args.steps,
            policy=spec,
            seed=args.seed,
            progress=tick,
        )
        out[n][0 if spec is None else 1] = r
        finished.append(label)
    return [(n, out[n][0], out[n][1]) for n in nodes]


def _interrupted(finished: list[str], progress: _Progress) -> str:
    """The one line printed on Ctrl-C: where it stopped and what had finished."""
    total = progress.total_runs
    if len(finished) == total:
        return f"jaxpace simulate: interrupted after all {total} runs finished; nothing written."
    done = f" ({'; '.join(finished)})" if finished else ""
    return (
        f"jaxpace simulate: interrupted in run {len(finished) + 1} of {total} "
        f"({progress.label}) at step {progress.step:,} of {progress.steps:,}; "
        f"finished {len(finished)} of {total} runs{done}; nothing written."
    )


def _table(rows, scenario_name: str, policy: str):
    from rich.table import Table

    t = Table(title=f"jaxpace simulate: scenario `{scenario_name}`, policy `{policy}`")
    for col in (
        "nodes",
        "ranks",
        "pacing",
        THROUGHPUT_COLUMN,
        "scaling eff.",
        "mean step ms",
        "p99 step ms",
        "CV",
        "engaged",
        "gain",
    ):
        t.add_column(col, justify="right")
    for n, base, paced in rows:
        for label, r in (("off", base), ("on", paced)):
            if r is None:
                continue
            gain = (
                "" if label == "off" else _pct(Comparison(baseline=base, paced=r).throughput_gain)
            )
            t.add_row(
                str(n),
                str(r.ranks),
                label,
                f"{r.throughput_per_s:,.0f}",
                f"{r.scaling_efficiency:.3f}",
                f"{r.mean_step_s * 1e3:.2f}",
                f"{r.p99_step_s * 1e3:.2f}",
                f"{r.cv:.3f}",
                f"{r.engaged_fraction:.2f}",
                gain,
            )
    return t


def _svg_chart(rows, key: str, label: str, width: int = 420, height: int = 260) -> str:
    """One scaling curve per pacing setting over the node counts (`jaxpace.report.render.svg`)."""
    from jaxpace.report.render import svg

    nodes = [n for n, _, _ in rows]
    pts = [(getattr(b, key), getattr(p, key) if p is not None else None) for _, b, p in rows]
    vals = [v for pair in pts for v in pair if v is not None]
    lo, hi = min(vals + [0.0]), max(vals) * 1.1 or 1.0
    parts = svg.svg_open(label, "nodes", "", width=width, height=height)  # y: the title's
    ax, fx, fy = svg.axes(
        0, max(len(nodes) - 1, 1), lo, hi, range(len(nodes)), svg.ticks(lo, hi, 4),
        width=width, height=height, xfmt=lambda i: str(nodes[int(i)]),
        yfmt=lambda v: f"{v:,.0f}" if abs(v) >= 1000 else svg.fmt(v),
    )  # fmt: skip
    parts += ax
    named = []
    for idx, stroke, name in ((0, "#555", "no pacing"), (1, "#d62728", "pacing")):
        series = [(i, pair[idx]) for i, pair in enumerate(pts) if pair[idx] is not None]
        if series:
            tips = [f"{nodes[i]} nodes, {name}: {v:.4g}" for i, v in series]
            parts += svg.line_series(series, stroke, fx, fy, tips)
            named.append((stroke, name))
    parts += svg.legend(named, 110)
    parts.append("</svg>")
    return "\n".join(parts)


def render_scaling_html(rows, scenario_name: str, policy: str) -> str:
    """A self-contained HTML page (inline SVG, no scripts, no CDN) of the scaling curves.

    Written by `jaxpace simulate --html`; not the run report's page
    (`jaxpace.report`).

    `rows` is a list of `(nodes, baseline SimResult, paced SimResult or None)`.
    """
    from jaxpace.report.render import svg

    charts = "".join(
        _svg_chart(rows, key, label)
        for key, label in (
            ("throughput_per_s", "throughput (rank-steps/s)"),
            ("scaling_efficiency", "scaling efficiency"),
            ("cv", "iteration-time CV"),
            ("p99_step_s", "p99 step time (s)"),
        )
    )
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "nodes",
            "pacing",
            THROUGHPUT_COLUMN,
            "scaling eff.",
            "mean step ms",
            "p99 step ms",
            "CV",
            "engaged",
        )
    )
    body = ""
    for n, b, p in rows:
        for label, r in (("off", b), ("on", p)):
            if r is not None:
                body += (
                    f"<tr><td>{n}</td><td>{label}</td><td>{r.throughput_per_s:,.0f}</td>"
                    f"<td>{r.scaling_efficiency:.3f}</td><td>{r.mean_step_s * 1e3:.2f}</td>"
                    f"<td>{r.p99_step_s * 1e3:.2f}</td><td>{r.cv:.3f}</td>"
                    f"<td>{r.engaged_fraction:.2f}</td></tr>"
                )
    title = html.escape(f"jaxpace simulate — {scenario_name} — {policy}")
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 10px;text-align:right}"
        f"svg{{margin:8px;border:1px solid #eee}}{svg.CSS}</style></head>"
        f"<body><h1>{title}</h1><div>{charts}</div><table><tr>{head}</tr>{body}</table></body></html>"
    )


def cli_main(args: argparse.Namespace) -> int:
    """Runs `jaxpace simulate` with parsed `args`; returns the exit status.

    Prints one table row per node count and pacing setting. Every option, the
    output paths and a memory estimate are checked before anything runs: exit
    status 2 on a bad scenario, policy, option or path, or a run too big for
    memory (the message says which and how to fix it). Long runs report
    progress on stderr; Ctrl-C ends with one line saying what had finished
    (exit status 130).
    """
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze the table to 80 columns
        console = Console(width=160)
    finished: list[str] = []
    progress = None
    try:
        plan = _prepare(args)
        _note_engine()
        progress = _Progress(len(plan[2]), args.steps, every_s=args.progress_every)
        with progress:
            rows = _run(args, plan, finished, progress)
        return _write(args, console, plan[1].name, rows)
    except (ScenarioError, _Usage) as e:
        print(f"jaxpace simulate: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if progress is None:
            print("jaxpace simulate: interrupted before starting; nothing run.", file=sys.stderr)
        else:
            print(_interrupted(finished, progress), file=sys.stderr)
        return 130


def _note_engine() -> None:
    """One stderr line when the compiled kernels are missing: same results, slower."""
    from jaxpace.native import kernels

    ok, why = kernels.available()
    if not ok and "JAXPACE_KERNELS" not in why:
        print(
            f"jaxpace simulate: running the NumPy engine ({why}); results are the same, "
            "about 2x slower. Reinstall with a C++17 compiler to build the kernels.",
            file=sys.stderr,
        )


def _write(args: argparse.Namespace, console, scenario_name: str, rows) -> int:
    console.print(_table(rows, scenario_name, args.policy))
    console.print(conclusion(rows), markup=False, highlight=False, soft_wrap=True)
    try:
        if args.json is not None:
            data = {
                "scenario": scenario_name,
                "policy": args.policy,
                "seed": args.seed,
                "steps": args.steps,
                "runs": [
                    {"nodes": n, "baseline": b.summary(), "paced": p.summary() if p else None}
                    for n, b, p in rows
                ],
            }
            write_atomic(
                args.json,
                json.dumps(data, indent=2),
                what="`--json` output",
                flag="--json",
            )
            console.print(f"wrote {args.json}")
        if args.html is not None:
            write_atomic(
                args.html,
                render_scaling_html(rows, scenario_name, args.policy),
                what="`--html` output",
                flag="--html",
            )
            console.print(f"wrote {args.html}")
    except OSError as e:  # write_atomic's message names the path and the OS error
        print(f"jaxpace simulate: {e}", file=sys.stderr)
        return 2
    return 0
