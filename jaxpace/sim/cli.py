"""`jaxpace simulate`: scaling table with and without pacing, optional HTML/JSON output."""

from __future__ import annotations

import argparse
import html
import json
import sys
from pathlib import Path

from jaxpace.errors import ScenarioError
from jaxpace.sim._engine import Comparison, SimResult, simulate
from jaxpace.sim._scenario import load_scenario, preset_names

__all__ = ["cli_main", "configure_parser", "render_scaling_html"]


def _parse_nodes(text: str) -> list[int]:
    try:
        nodes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ScenarioError(
            f"`--nodes {text}`: expected comma-separated positive integers, e.g. `1,2,4,8`."
        ) from None
    if not nodes or any(n < 1 for n in nodes):
        raise ScenarioError(
            f"`--nodes {text}`: expected comma-separated positive integers, e.g. `1,2,4,8`."
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
        help="comma-separated node counts (default: %(default)s)",
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
        "--steps", type=int, default=2000, help="steps per run (default: %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    parser.add_argument(
        "--html", type=Path, default=None, help="write a self-contained HTML report here"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
    return parser


def _run(args: argparse.Namespace, console) -> list[tuple[int, SimResult, SimResult | None]]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    nodes = _parse_nodes(args.nodes)
    scenario = load_scenario(args.scenario)
    if isinstance(args.steps, bool) or args.steps < 1:
        raise ScenarioError(f"`--steps` must be a positive integer, got {args.steps!r}.")
    paced_spec = None if args.policy in ("none", "no_pacing") else args.policy
    runs = [
        (n, spec) for n in nodes for spec in ([None] if paced_spec is None else [None, paced_spec])
    ]
    out: dict[int, list] = {n: [None, None] for n in nodes}
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("simulating", total=len(runs) * args.steps)
        for i, (n, spec) in enumerate(runs):
            done0 = i * args.steps
            bar.update(task, description=f"{n} nodes, {'paced' if spec else 'baseline'}")
            r = simulate(
                scenario,
                nodes=n,
                steps=args.steps,
                policy=spec,
                seed=args.seed,
                progress=lambda k, d0=done0: bar.update(task, completed=d0 + k),
            )
            out[n][0 if spec is None else 1] = r
    return [(n, out[n][0], out[n][1]) for n in nodes]


def _table(rows, scenario_name: str, policy: str):
    from rich.table import Table

    t = Table(title=f"jaxpace simulate: scenario `{scenario_name}`, policy `{policy}`")
    for col in (
        "nodes",
        "ranks",
        "pacing",
        "throughput/s",
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
                ""
                if label == "off"
                else f"{Comparison(baseline=base, paced=r).throughput_gain * 100:+.1f}%"
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
    pts = [(n, getattr(b, key), getattr(p, key) if p is not None else None) for n, b, p in rows]
    vals = [v for _, b, p in pts for v in (b, p) if v is not None]
    lo, hi = min(vals + [0.0]), max(vals) * 1.1 or 1.0
    xs = list(range(len(pts)))
    pad = 40

    def X(i):
        return pad + (width - 2 * pad) * (i / max(1, len(xs) - 1))

    def Y(v):
        return height - pad - (height - 2 * pad) * ((v - lo) / (hi - lo or 1.0))

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">',
        f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13">{html.escape(label)}</text>',
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="#888"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="#888"/>',
    ]
    for i, (n, _, _) in enumerate(pts):
        parts.append(
            f'<text x="{X(i):.1f}" y="{height - pad + 16}" text-anchor="middle" font-size="11">{n}</text>'
        )
    for v in (lo, (lo + hi) / 2, hi):
        parts.append(
            f'<text x="{pad - 4}" y="{Y(v) + 4:.1f}" text-anchor="end" font-size="10">{v:.3g}</text>'
        )
    for idx, color, name in ((1, "#555", "no pacing"), (2, "#d62728", "pacing")):
        series = [(X(i), Y(p[idx])) for i, p in enumerate(pts) if p[idx] is not None]
        if series:
            d = " ".join(f"{x:.1f},{y:.1f}" for x, y in series)
            parts.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="2"/>')
            parts.extend(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>' for x, y in series
            )
            ly = 30 + 14 * idx
            parts.append(
                f'<text x="{width - pad}" y="{ly}" text-anchor="end" font-size="11" fill="{color}">{name}</text>'
            )
    parts.append(
        f'<text x="{width / 2}" y="{height - 6}" text-anchor="middle" font-size="11">nodes</text>'
    )
    parts.append("</svg>")
    return "".join(parts)


def render_scaling_html(rows, scenario_name: str, policy: str) -> str:
    """A self-contained HTML page (inline SVG, no scripts, no CDN) of the scaling curves.

    Written by `jaxpace simulate --html`; not the run report's page
    (`jaxpace.report`).

    `rows` is a list of `(nodes, baseline SimResult, paced SimResult or None)`.
    """
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
            "throughput/s",
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
        "svg{margin:8px;border:1px solid #eee}</style></head>"
        f"<body><h1>{title}</h1><div>{charts}</div><table><tr>{head}</tr>{body}</table></body></html>"
    )


def cli_main(args: argparse.Namespace) -> int:
    """Runs `jaxpace simulate` with parsed `args`; returns the exit status.

    Prints one table row per node count and pacing setting. Exit status 2 on a
    bad scenario, policy or option (the message says which and how to fix it).
    """
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze the table to 80 columns
        console = Console(width=160)
    try:
        rows = _run(args, console)
    except ScenarioError as e:
        print(f"jaxpace simulate: {e}", file=sys.stderr)
        return 2
    scenario_name = load_scenario(args.scenario).name
    console.print(_table(rows, scenario_name, args.policy))
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
        args.json.write_text(json.dumps(data, indent=2))
        console.print(f"wrote {args.json}")
    if args.html is not None:
        args.html.write_text(render_scaling_html(rows, scenario_name, args.policy))
        console.print(f"wrote {args.html}")
    return 0
