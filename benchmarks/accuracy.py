"""`python -m benchmarks accuracy`: how often the report names the right rank or host, and how soon.

Runs are generated here (`fleet_run`, physically consistent like
`jaxpace.records.synthetic`, but with several sites a step) and judged with
`jaxpace.report.analyze`. Grid: slowdown of one rank (2, 5, 10, 20% of the
step, and 50%, the "1.5x outlier" SIMULATION.md calls worth naming) x ranks
(8, 64, 512, 8192) x lost lines (0, 1%) x sites a step (1, 16), plus a whole host (8 ranks) late by 10% and healthy runs for the false-alarm
rate. "Healthy" follows ../shared/SIMULATION.md ("A healthy fleet"): a static
per-rank speed factor, lognormal with sigma drawn in 0.005-0.05 and capped at
1.2x the median, per-step lognormal noise sigma 0.02 on the step's compute, no
injected lag; the late runs are healthy runs plus the injected lag.

Per cell: precision (named runs whose names are all right), recall (runs whose
names hold the right rank or host), false-alarm rate (healthy runs naming
anything: a rank, process or group), and the median number of steps, over the
runs that found it, of the first prefix (10, 20, 40, ... steps) at which the
report named the right one. Each figure is printed with the number of runs it
rests on. `--quick` uses few runs and small sizes. `--budget-min M --state F`
bounds a run by time instead of runs: the cells run round-robin (each next run
goes to the cell with the fewest runs for its `weight`: healthy cells 10x, the
large sizes fewer), so every cell's n grows together; each run's row is saved
to F every minute and a later run with the same F resumes (run i of a cell
always has the same seed), and the table covers every run in F.

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
SLOWDOWNS = (0.02, 0.05, 0.10, 0.20, 0.50)  # +50%: the straggler SIMULATION.md calls worth naming
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
    _, speed = static_speeds(rng, R)
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


def static_speeds(rng: np.random.Generator, R: int) -> tuple[float, np.ndarray]:
    """A healthy fleet's static per-rank speed factors (time a step takes, relative to
    the median): lognormal with sigma drawn in 0.005-0.05, capped at 1.2x. The first
    draws of `fleet_run`'s generator, so a run's factors can be read back from its seed."""
    sigma = rng.uniform(0.005, 0.05)
    speed = np.minimum(np.exp(sigma * rng.standard_normal(R)), 1.2)
    return float(sigma), speed / np.median(speed)


def false_alarm_causes(results: list[dict], max_ranks: int = 64, limit: int = 200) -> str | None:
    """Re-runs (from their seeds) up to `limit` healthy runs that named someone, at sizes up
    to `max_ranks`, and says whom they named: how many named the rank with the largest
    static speed factor, and that factor's range. None when there is none."""
    hits, factors, sigmas, seen = 0, [], [], 0
    for c in results:
        if c["late"] is not None or c["ranks"] > max_ranks:
            continue
        for i, row in enumerate(c["runs"]):
            if not row["named"] or seen >= limit:
                continue
            seen += 1
            seed = zlib.crc32(repr((c["ranks"], c["sites"], c["lost"], None, i)).encode())
            sigma, speed = static_speeds(np.random.default_rng(seed), c["ranks"])
            rec = fleet_run(c["ranks"], c["steps"], sites=c["sites"], lost=c["lost"], seed=seed)
            who = {r for _, ranks in named(analyze(rec, warmup_steps=0)) for r in ranks}
            slowest = int(np.argmax(speed))
            if who == {slowest}:
                hits += 1
                factors.append(float(speed[slowest]))
                sigmas.append(sigma)
    if not seen:
        return None
    out = (
        f"Whom the healthy runs named (the {seen} such runs at up to {max_ranks} ranks, "
        f"re-run from their seeds): {hits} named exactly the rank with the largest static "
        "speed factor"
    )
    if factors:
        out += (
            f", {min(factors):.3f}-{max(factors):.3f}x the median's step time, in fleets whose "
            f"spread sigma was {min(sigmas):.3f}-{max(sigmas):.3f}"
        )
    return out + (
        ". SIMULATION.md's healthy fleet allows a rank up to 1.2x the median (sigma up to "
        "0.05); the report's lines are drawn for that fleet (docs/diagnostics.md), and every "
        "such run counts as a false alarm here."
    )


def upper95(k: int, n: int) -> float:
    """The exact (Clopper-Pearson) one-sided 95% upper bound of a rate seen k times in n."""
    from scipy.stats import beta

    return 1.0 if k >= n else float(beta.ppf(0.95, k + 1, n - k))


def target_lines(results: list[dict], target: float = 0.001) -> list[str]:
    """Per healthy cell: its false alarms against `target`, with the 95% upper bound."""
    out = []
    for c in results:
        if c["late"] is not None:
            continue
        k, n = summarize(c)["false_alarm"]
        if not n:
            continue
        up = upper95(k, n)
        if k / n > target:
            verdict = "**ABOVE the target**"
        elif up <= target:
            verdict = "meets it (95% bound)"
        else:
            verdict = f"not shown: {n} runs cannot bound it below {target:.1%}"
        out.append(
            f"- {c['ranks']} ranks, {c['sites']} site(s) a step, {c['lost']:.0%} lost: "
            f"{k} of {n} runs ({100 * k / n:.2g}%), 95% upper bound {100 * up:.2g}%: {verdict}."
        )
    return out


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


def _cell_key(R, sites, lost, late) -> str:
    return repr((R, sites, lost, late))


def one_run(R, sites, lost, late, i, steps) -> dict:
    """Run `i` of a cell (its seed depends only on the cell and `i`, so a resumed run
    continues the same sequence), judged; `seconds` is what it took."""
    t0 = time.perf_counter()
    seed = zlib.crc32(repr((R, sites, lost, late, i)).encode())
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
    row = judge(rec, truth, steps)
    row["seconds"] = round(time.perf_counter() - t0, 3)
    return row


def run_cell(R, sites, lost, late, runs, steps, seed0=0) -> dict:
    steps = cell_steps(R, sites, steps)
    rows = [one_run(R, sites, lost, late, seed0 + i, steps) for i in range(runs)]
    return {"ranks": R, "sites": sites, "lost": lost, "late": late, "steps": steps, "runs": rows}


# Runs a cell gets per scheduling unit in a `--budget-min` run: a false-alarm rate near
# 0.1% needs the most runs, so healthy cells get 10x a late cell's; the large sizes cost
# 10-100x more a run and get fewer.
WEIGHT = {8: 1.0, 64: 0.5, 512: 0.1, 8192: 0.025}
HEALTHY_WEIGHT = 10.0


def weight(R: int, late) -> float:
    return WEIGHT.get(R, 0.1) * (HEALTHY_WEIGHT if late is None else 1.0)


def load_state(path: Path | None, steps: int) -> dict:
    """{cell key: cell dict} from a previous run's file (empty when absent); a file
    written with another `steps` is refused, since its rows would not be comparable."""
    if path is None or not path.exists():
        return {}
    data = json.loads(path.read_text())
    if data.get("steps") != steps:
        raise SystemExit(
            f"accuracy: {path} holds runs of {data.get('steps')} steps, not {steps}: pass "
            f"--steps {data.get('steps')} to resume it, or another --state file"
        )
    return {c["key"]: c for c in data["cells"]}


def save_state(path: Path | None, steps: int, state: dict, seconds: float) -> None:
    if path is None:
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"steps": steps, "seconds": seconds, "cells": list(state.values())}))
    tmp.replace(path)


def run_budget(
    grid, steps: int, budget_s: float, state: dict, save, log=print, max_runs=None
) -> dict:
    """Runs the grid's cells round-robin until `budget_s` seconds pass: next is always the
    cell with the fewest runs for its `weight`, so every cell's n grows together. `state`
    ({key: cell}) is extended in place (a resumed run continues each cell's seeds); `save`
    is called every 60 s and at the end. `max_runs` also stops it after that many runs."""
    for R, sites, lost, late in grid:
        key = _cell_key(R, sites, lost, late)
        if key not in state:
            state[key] = {
                "key": key,
                "ranks": R,
                "sites": sites,
                "lost": lost,
                "late": late,
                "steps": cell_steps(R, sites, steps),
                "runs": [],
            }
    keys = [_cell_key(*c) for c in grid]
    t0 = last = time.perf_counter()
    done = 0
    while time.perf_counter() - t0 < budget_s and (max_runs is None or done < max_runs):
        done += 1
        key = min(
            keys,
            key=lambda k: (len(state[k]["runs"]) + 1) / weight(state[k]["ranks"], state[k]["late"]),
        )
        c = state[key]
        i = len(c["runs"])
        c["runs"].append(one_run(c["ranks"], c["sites"], c["lost"], c["late"], i, c["steps"]))
        if time.perf_counter() - last > 60:
            last = time.perf_counter()
            save()
            log(
                f"{last - t0:.0f}s: "
                + ", ".join(f"{state[k]['ranks']}:{len(state[k]['runs'])}" for k in keys[::6])
            )
    save()
    return state


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
    if not n:
        return "- (n=0)"
    pct = 100 * k / n
    # below 1% two significant figures, so 1 false alarm in 1,000 runs reads 0.1%, not 0%
    return f"{pct:.0f}% (n={n})" if pct == 0 or pct >= 1 else f"{pct:.2g}% (n={n})"


def table(
    results: list[dict], *, quick: bool, steps: int, runs: int | None, seconds: float, budget=None
) -> str:
    """The Markdown block between the markers (`runs` None: cells differ, each n shown)."""
    ns = [len(c["runs"]) for c in results]
    per_cell = (
        f"{runs} run(s) per cell"
        if runs is not None
        else f"between {min(ns, default=0)} and {max(ns, default=0)} run(s) per cell, healthy "
        f"cells weighted {HEALTHY_WEIGHT:.0f}x (false alarms need the most runs), the large "
        "sizes fewer"
    )
    # A budget run may be resumed several times: the block says how, and the runs' seconds.
    how = " --budget-min M --state F" if budget is not None else ""
    lines = [
        BEGIN,
        "",
        f"Generated by `python -m benchmarks accuracy{' --quick' if quick else ''}{how}` on "
        f"{time.strftime('%Y-%m-%d')} in {seconds:.0f} s of runs: {per_cell}, {steps} steps "
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
    if runs is None:  # a budget run: the target, plainly, and whom the healthy runs named
        lines += [
            "",
            "Healthy runs against the issue's target (at most 0.1% of runs name anyone):",
            "",
            *target_lines(results),
        ]
        why = false_alarm_causes(results)
        if why:
            lines += ["", why]
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
    ap.add_argument(
        "--budget-min",
        type=float,
        default=None,
        help="run the cells round-robin (healthy weighted over late) for this many minutes "
        "instead of --runs each; with --state, resumable",
    )
    ap.add_argument(
        "--state",
        default=None,
        help="with --budget-min: per-run rows are saved here (every minute) and a later run "
        "resumes from them; the table covers every run in the file",
    )
    args = ap.parse_args(argv)
    runs = args.runs or (10 if args.quick else 200)
    steps = args.steps or (40 if args.quick else 160)
    t0 = time.perf_counter()
    grid = cells(args.quick, args.ranks)
    if args.budget_min is not None:
        path = Path(args.state) if args.state else None
        state = load_state(path, steps)

        def save():
            total = sum(r.get("seconds", 0.0) for c in state.values() for r in c["runs"])
            save_state(path, steps, state, total)

        run_budget(grid, steps, args.budget_min * 60, state, save)
        keys = {_cell_key(*c) for c in grid}
        results = [c for k, c in state.items() if k in keys]
        for c in results:
            print(c["ranks"], c["sites"], c["lost"], c["late"], summarize(c), flush=True)
        seconds = sum(r.get("seconds", 0.0) for c in results for r in c["runs"])
        block = table(
            results,
            quick=args.quick,
            steps=steps,
            runs=None,
            seconds=seconds,
            budget=args.budget_min,
        )
    else:
        results = []
        for R, sites, lost, late in grid:
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
