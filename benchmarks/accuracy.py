"""`python -m benchmarks accuracy`: how often the report names the right rank or host, and how soon.

Runs are generated here (`fleet_run`, physically consistent like
`jaxpace.records.synthetic`, but with several sites a step) and judged with
`jaxpace.report.analyze`. Grid: slowdown of one rank (2, 5, 10, 20% of the
step) x ranks (8, 64, 512, 8192) x lost lines (0, 1%) x sites a step (1, 16),
plus a whole host (8 ranks) late by 10% and healthy runs for the false-alarm
rate. "Healthy" follows ../shared/SIMULATION.md ("A healthy fleet"): a static
per-rank speed factor, lognormal with sigma drawn in 0.005-0.05 and capped at
1.2x the median, per-step lognormal noise sigma 0.02 on the step's compute, no
injected lag; the late runs are healthy runs plus the injected lag.

Per cell: precision (named runs whose names are all right), recall (runs whose
names hold the right rank or host), false-alarm rate (healthy runs naming
anything: a rank, process or group), and the median number of steps, over the
runs that found it, of the first prefix (10, 20, 40, ... steps) at which the
report named the right one. Each figure is printed with the number of runs it
rests on. `--quick` uses few runs and small sizes; the full table needs the
run without it (hours at 8192 ranks).

Writes the table into docs/diagnostics.md between the `accuracy` markers.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import zlib
from pathlib import Path

import numpy as np

from jaxpace.records.format import header_record
from jaxpace.records.reader import Records
from jaxpace.report import analyze

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "diagnostics.md"
BEGIN = "<!-- BEGIN accuracy (python -m benchmarks accuracy) -->"
END = "<!-- END accuracy -->"
RANKS_PER_HOST = 8
STEP_S = 0.1  # compute of one step, split evenly over its sites
TRANSFER_S = 0.002  # one collective's transfer
NOISE_SIGMA = 0.02  # per-step lognormal noise of a rank's step compute (SIMULATION.md)
SLOWDOWNS = (0.02, 0.05, 0.10, 0.20)
HOST_SLOWDOWN = 0.10


def fleet_run(
    num_ranks: int,
    num_steps: int,
    *,
    sites: int = 1,
    late_ranks: tuple[int, ...] = (),
    late_fraction: float = 0.0,
    lost: float = 0.0,
    seed: int = 0,
) -> Records:
    """A healthy fleet's records, with `late_ranks` computing `late_fraction` of a step more.

    Each step runs `sites` collectives in order; a rank computes `STEP_S / sites`
    (times its static speed factor and per-step noise) before each, and its lag
    is spread evenly over them. All ranks leave a collective together, at the
    last entry plus `TRANSFER_S` (and a few us of exit jitter). `lost` drops
    that fraction of the lines at random. Each rank is its own process; hosts
    hold `RANKS_PER_HOST` ranks, named in the headers.
    """
    rng = np.random.default_rng(seed)
    R, S, n = num_ranks, num_steps, sites
    sigma_static = rng.uniform(0.005, 0.05)
    speed = np.minimum(np.exp(sigma_static * rng.standard_normal(R)), 1.2)
    speed = speed / np.median(speed)
    extra = np.zeros(R)
    extra[list(late_ranks)] = late_fraction * STEP_S
    chunk_sigma = NOISE_SIGMA * np.sqrt(n)  # n independent chunks make the step's 2%
    arrive = np.empty((S, n, R), np.int64)
    done = np.empty((S, n, R), np.int64)
    t = np.zeros(R)
    for k in range(S):
        noise = np.exp(chunk_sigma * rng.standard_normal((n, R)))
        for s in range(n):
            a = t + (STEP_S / n) * speed * noise[s] + extra / n
            leave = a.max() + TRANSFER_S * (1 + 0.02 * rng.standard_normal())
            t = leave + rng.exponential(20e-6, R)
            arrive[k, s], done[k, s] = np.round(a * 1e9), np.round(t * 1e9)
    offsets = (rng.uniform(0, 100, R) * 1e9).astype(np.int64) + 10**12
    arrive += offsets
    done += offsets
    ranks = np.broadcast_to(np.arange(R), (S, n, R)).ravel()
    cols = {
        "site": np.broadcast_to(np.arange(n)[None, :, None], (S, n, R)).ravel(),
        "step": np.broadcast_to(np.arange(S)[:, None, None], (S, n, R)).ravel(),
        "rank": ranks,
        "process": ranks,
        "arrive_ns": arrive.ravel(),
        "done_ns": done.ravel(),
        "wait_ns": (done - arrive).ravel(),
        "delay_ns": np.zeros(S * n * R, np.int64),
        "engaged": np.zeros(S * n * R, bool),
        "device": np.full(S * n * R, -1, np.int64),
    }
    if lost > 0:
        keep = rng.random(S * n * R) >= lost
        cols = {k: np.ascontiguousarray(v[keep]) for k, v in cols.items()}
    else:
        cols = {k: np.ascontiguousarray(v) for k, v in cols.items()}
    headers = tuple(
        header_record(
            run_id="accuracy",
            process_index=p,
            process_count=R,
            host=f"node-{p // RANKS_PER_HOST}",
            pid=1000 + p,
            granularity="process",
            jaxpace_version="0.1.0",
            policy="measure",
            local_devices=[p],
            rank_groups=None,
        )
        for p in range(R)
    )
    return Records(
        headers=headers,
        sites=tuple(f"model.py:{10 * (i + 1)}:layer{i}" for i in range(n)),
        columns=cols,
        run_id="accuracy",
        process_count=R,
        granularity="process",
        sources=("<accuracy benchmark>",),
    )


def _prefix(rec: Records, steps: int) -> Records:
    keep = rec.columns["step"] < steps
    cols = {k: np.ascontiguousarray(v[keep]) for k, v in rec.columns.items()}
    return Records(
        headers=rec.headers,
        sites=rec.sites,
        columns=cols,
        run_id=rec.run_id,
        process_count=rec.process_count,
        granularity=rec.granularity,
        sources=rec.sources,
    )


def named(report) -> set[tuple[str, tuple[int, ...]]]:
    """What a report names with confidence: ("rank", (r,)) per culprit, ("group", ranks) per group."""
    out = {("rank", (int(r),)) for r in report.culprits}
    if report.culprit is not None:
        out.add(("rank", (int(report.culprit),)))
    out |= {("group", tuple(sorted(int(r) for r in g.ranks))) for g in report.late_groups}
    return out


def _right(names, truth: tuple[int, ...]) -> tuple[bool, bool]:
    """(holds the right name, every name right) for a run whose late ranks are `truth`."""
    t = set(truth)
    ok = [set(ranks) == t for _, ranks in names]
    return any(ok), bool(names) and all(ok)


def _prefixes(num_steps: int) -> list[int]:
    out, p = [], 10
    while p < num_steps:
        out.append(p)
        p *= 2
    return [*out, num_steps]


def judge(rec: Records, truth: tuple[int, ...], num_steps: int) -> dict:
    """One run's verdict at its full length, and the first prefix naming `truth` (healthy: ())."""
    names = named(analyze(rec, warmup_steps=0))
    found, all_right = _right(names, truth) if truth else (False, False)
    first = None
    if found:
        for p in _prefixes(num_steps)[:-1]:
            if _right(named(analyze(_prefix(rec, p), warmup_steps=0)), truth)[0]:
                first = p
                break
        first = first or num_steps
    return {"named": bool(names), "found": found, "all_right": all_right, "first": first}


def cells(quick: bool, ranks: list[int] | None = None):
    """(label, num_ranks, sites, lost, late_fraction or 'host' or None) of the grid."""
    ranks = ranks or ([8, 64] if quick else [8, 64, 512, 8192])
    out = []
    for R in ranks:
        for sites in (1, 16):
            for lost in (0.0, 0.01):
                out.append((R, sites, lost, None))
                for f in SLOWDOWNS:
                    out.append((R, sites, lost, f))
                if R >= 2 * RANKS_PER_HOST:
                    out.append((R, sites, lost, "host"))
    return out


# Lines (ranks x sites x steps) one run holds at most: 8192 ranks x 16 sites get fewer steps.
MAX_LINES = 4_000_000


def cell_steps(R: int, sites: int, steps: int) -> int:
    """`steps`, or fewer (at least 20) where a run would pass `MAX_LINES` lines."""
    return max(20, min(steps, MAX_LINES // (R * sites)))


def run_cell(R, sites, lost, late, runs, steps, seed0=0) -> dict:
    steps = cell_steps(R, sites, steps)
    rows = []
    for i in range(runs):
        seed = zlib.crc32(repr((R, sites, lost, late, seed0 + i)).encode())
        rng = np.random.default_rng(seed)
        if late is None:
            truth, frac = (), 0.0
        elif late == "host":
            h = int(rng.integers(R // RANKS_PER_HOST))
            truth = tuple(range(h * RANKS_PER_HOST, (h + 1) * RANKS_PER_HOST))
            frac = HOST_SLOWDOWN
        else:
            truth, frac = (int(rng.integers(R)),), late
        rec = fleet_run(
            R, steps, sites=sites, late_ranks=truth, late_fraction=frac, lost=lost, seed=seed
        )
        rows.append(judge(rec, truth, steps))
    return {"ranks": R, "sites": sites, "lost": lost, "late": late, "steps": steps, "runs": rows}


def summarize(cell: dict) -> dict:
    rows = cell["runs"]
    n = len(rows)
    if cell["late"] is None:
        return {"false_alarm": (sum(r["named"] for r in rows), n)}
    named_rows = [r for r in rows if r["named"]]
    firsts = [r["first"] for r in rows if r["first"] is not None]
    return {
        "precision": (sum(r["all_right"] for r in named_rows), len(named_rows)),
        "recall": (sum(r["found"] for r in rows), n),
        "median_steps": (float(np.median(firsts)) if firsts else None, len(firsts)),
    }


def _frac(pair) -> str:
    k, n = pair
    return f"{k / n:.0%} (n={n})" if n else "- (n=0)"


def table(results: list[dict], *, quick: bool, steps: int, runs: int, seconds: float) -> str:
    """The Markdown block between the markers."""
    lines = [
        BEGIN,
        "",
        f"Generated by `python -m benchmarks accuracy{' --quick' if quick else ''}` on "
        f"{time.strftime('%Y-%m-%d')} in {seconds:.0f} s: {runs} run(s) per cell, {steps} steps "
        f"a run (fewer where ranks x sites x steps would pass {MAX_LINES:,} lines), judged with `jaxpace.report.analyze(..., warmup_steps=0)`.",
    ]
    if quick:
        lines.append(
            "**Quick run**: few runs per cell and only the small sizes; these figures rest on "
            "the n shown and say little. The full table needs `python -m benchmarks accuracy` "
            "without `--quick`."
        )
    lines += [
        "",
        'A false alarm is a healthy run (SIMULATION.md, "A healthy fleet") that names any '
        "rank, process or group. Precision: named runs whose names are all right. Recall: "
        "runs naming the late rank (or the late host's ranks as one group). Steps: median "
        "first prefix (10, 20, 40, ... steps) naming it. n: runs each figure rests on.",
        "",
        "| ranks | sites/step | lost lines | steps a run | late | precision | recall | false alarms "
        "| steps to name |",
        "|---:|---:|---:|---:|---|---|---|---|---|",
    ]
    for c in results:
        s = summarize(c)
        late = c["late"]
        who = (
            "healthy"
            if late is None
            else (
                f"host ({RANKS_PER_HOST} ranks) +{HOST_SLOWDOWN:.0%}"
                if late == "host"
                else f"1 rank +{late:.0%}"
            )
        )
        lost = f"{c['lost']:.0%} | {c['steps']}"
        if late is None:
            lines.append(
                f"| {c['ranks']} | {c['sites']} | {lost} | {who} | | | {_frac(s['false_alarm'])} | |"
            )
        else:
            med, m = s["median_steps"]
            steps_txt = f"{med:.0f} (n={m})" if med is not None else "- (n=0)"
            lines.append(
                f"| {c['ranks']} | {c['sites']} | {lost} | {who} | {_frac(s['precision'])} | "
                f"{_frac(s['recall'])} | | {steps_txt} |"
            )
    lines += ["", END]
    return "\n".join(lines)


def write_block(block: str, path: Path = DOC) -> None:
    """Replaces the block between the markers in `path` (appends it when absent; a new
    file gets the block under a title)."""
    text = path.read_text() if path.exists() else "# Accuracy\n"
    if BEGIN in text and END in text:
        pre, rest = text.split(BEGIN, 1)
        post = rest.split(END, 1)[1]
        text = pre + block + post
    else:
        text = text.rstrip("\n") + "\n\n## Accuracy\n\n" + block + "\n"
    path.write_text(text)


BLOCK_ROW = re.compile(r"^\| \d+ \| (1|16) \| [01]% \| \d+ \| .+ \|$")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few runs, 8 and 64 ranks")
    ap.add_argument("--runs", type=int, default=None, help="runs per cell (default 10 quick, 200)")
    ap.add_argument("--steps", type=int, default=None, help="steps a run (default 40 quick, 160)")
    ap.add_argument("--ranks", type=int, nargs="*", default=None)
    ap.add_argument("--doc", default=str(DOC))
    ap.add_argument("--json", default=None, help="also write the per-run rows here")
    args = ap.parse_args(argv)
    runs = args.runs or (10 if args.quick else 200)
    steps = args.steps or (40 if args.quick else 160)
    t0 = time.perf_counter()
    results = []
    for R, sites, lost, late in cells(args.quick, args.ranks):
        results.append(run_cell(R, sites, lost, late, runs, steps))
        s = summarize(results[-1])
        print(R, sites, lost, late, s, f"{time.perf_counter() - t0:.0f}s", flush=True)
    block = table(
        results, quick=args.quick, steps=steps, runs=runs, seconds=time.perf_counter() - t0
    )
    write_block(block, Path(args.doc))
    if args.json:
        Path(args.json).write_text(json.dumps(results, default=str))
    print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
