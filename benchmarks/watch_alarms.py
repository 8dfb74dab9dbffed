"""`python -m benchmarks watch-alarms`: how often watch's live decision names someone in a healthy job.

Healthy runs are `benchmarks.accuracy.fleet_run` (../shared/SIMULATION.md's healthy
fleet: static per-rank speed factors, per-step noise, no injected lag), one device per
process, cut into windows of `window` consecutive steps, window `i` at call
`i * every` as watch places them. Each window goes through watch's live path exactly:
every process's summary as `summary.summarize` writes it (rows of site, execution,
device, arrival in us from its own first collective of the window, time inside in us),
`summary.combine` into the window's `Records`, then `decide.decide` on the windows so
far (pooling up to `MAX_POOLED`) with the history of earlier results, as process 0's
worker calls it. A false alarm is a window whose result names a process
(`culprit_process`, the verdict's confidence "named"); `likely` (below the line, the
verdict's "likely") is counted apart. Runs are independent seeds; held-out seeds
(`--seed0`) check a change made after looking at the first ones.

Writes `benchmarks/results/watch_alarms.json` and the section between the
`watch-alarms` markers in docs/diagnostics.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "diagnostics.md"
BEGIN = "<!-- BEGIN watch-alarms (python -m benchmarks watch-alarms) -->"
END = "<!-- END watch-alarms -->"
BEGIN_RECALL = "<!-- BEGIN watch-recall (python -m benchmarks watch-alarms --late F) -->"
END_RECALL = "<!-- END watch-recall -->"
LATE_PROCESS = 3  # the late process of `--late` runs
WINDOW = 5
EVERY = 100
WEEK_S = 7 * 86400.0


def summaries_of(rec, w: int, window: int = WINDOW, every: int = EVERY) -> dict[int, dict]:
    """Every process's summary of window `w` (steps `[w * window, (w + 1) * window)` of the
    healthy run `rec`) as watch's `summary.summarize` makes it from its own trace."""
    c = rec.columns
    sel = (c["step"] >= w * window) & (c["step"] < (w + 1) * window)
    site, step, proc = c["site"][sel], c["step"][sel] - w * window, c["process"][sel]
    arrive, wait = c["arrive_ns"][sel], c["wait_ns"][sel]
    out = {}
    for p in range(rec.process_count):
        m = proc == p
        t0 = int(arrive[m].min())
        rows = np.stack([site[m], step[m], np.full(int(m.sum()), p),
                         (arrive[m] - t0) // 1000, wait[m] // 1000], axis=1)  # fmt: skip
        out[p] = {
            "v": 1, "process": p, "host": f"node-{p}", "window": w + 1,
            "first_step": (w + 1) * every, "last_step": (w + 1) * every + window - 1,
            "sites": list(rec.sites), "rows": rows.astype(np.int64), "notes": [],
            "partial": False, "platform": "gpu",
        }  # fmt: skip
    return out


def run_one(
    processes: int,
    windows: int,
    seed: int,
    *,
    sites: int = 1,
    late: int | None = None,
    late_fraction: float = 0.2,
    alpha: float | None = None,
) -> dict:
    """One healthy job of `windows` windows through watch's decision; what it named.
    `late`: a process computing `late_fraction` of a step more (a check that the path
    names one). `alpha`: the decision's level in place of watch's `decide.LEVEL`."""
    from benchmarks.accuracy import fleet_run
    from jaxpace.watch import decide as _decide
    from jaxpace.watch.summary import combine

    lag = {"late_ranks": (late,), "late_fraction": late_fraction} if late is not None else {}
    rec = fleet_run(processes, windows * WINDOW, sites=sites, seed=seed, **lag)
    kept: list = []
    history: list = []
    named = likely = 0
    names: list[int | None] = []
    for w in range(windows):
        first = (w + 1) * EVERY
        recs, notes = combine(
            summaries_of(rec, w),
            process_count=processes,
            window=w + 1,
            first=first,
            last=first + WINDOW - 1,
            run_id="alarms",
        )
        kept.append((w + 1, first, first + WINDOW - 1, recs, tuple(notes), frozenset()))
        kept = kept[-_decide.MAX_POOLED :]
        r = _decide.decide(kept, history, analyze=_at_level(alpha))
        history.append(r)
        named += r.culprit_process is not None
        likely += r.likely is not None
        names.append(r.culprit_process)
    return {"seed": seed, "windows": windows, "named": named, "likely": likely, "names": names}


def _at_level(alpha: float | None):
    """`jaxpace.report.analyze` with both tests at `alpha`, whatever levels watch asks for
    (None: as asked, `decide.LEVEL` and the fleet line at `decide.FLEET_LEVEL`)."""
    from jaxpace.report.analyze import analyze

    if alpha is None:
        return analyze
    return lambda recs, warmup_steps=0, alpha=None, fleet_alpha=None, _level=alpha: analyze(
        recs, warmup_steps=warmup_steps, alpha=_level
    )


def _onsets(names: list) -> int:
    """Alarms as a scheduler sees them: windows naming a process the window before did
    not name (a process named window after window is one alarm)."""
    return sum(
        1 for a, b in zip([None, *names[:-1]], names, strict=True) if b is not None and b != a
    )


def upper95(k: int, n: int) -> float:
    """The one-sided 95% upper bound (Clopper-Pearson) of a rate seen `k` times in `n`."""
    from scipy import stats

    return 1.0 if k >= n else float(stats.beta.ppf(0.95, k + 1, n - k))


def need(step_s: float, window_cost_s: float, budget: float) -> tuple[float, float]:
    """`(windows per job-week, the per-window false-alarm rate for one per job-week)` at
    `every="auto"`'s spacing for that step time and window cost."""
    from jaxpace.watch.schedule import spacing

    gap_s = spacing(window_cost_s, step_s, window=WINDOW, budget=budget) * step_s
    per_week = WEEK_S / gap_s
    return per_week, 1.0 / per_week


def _map(fn, todo: list[tuple], jobs: int, chunksize: int) -> list:
    """`fn(*args)` for each of `todo`, in order; in `jobs` spawned processes when > 1."""
    if jobs <= 1:
        return [fn(*a) for a in todo]
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        return pool.starmap(fn, todo, chunksize=chunksize)


def run(
    sizes, runs: int, windows: int, seed0: int, jobs: int = 1, alpha: float | None = None
) -> dict:
    import functools

    out: dict = {"runs": runs, "windows_per_run": windows, "seed0": seed0, "sizes": {}}
    out["alpha"] = alpha
    one = functools.partial(run_one, alpha=alpha)
    for P in sizes:
        t0 = time.perf_counter()
        got = _map(one, [(P, windows, seed0 + i) for i in range(runs)], jobs, 8)
        n = sum(g["windows"] for g in got)
        k = sum(g["named"] for g in got)
        onsets = sum(_onsets(g["names"]) for g in got)
        out["sizes"][str(P)] = {
            "windows": n,
            "named": k,
            "rate": k / n,
            "upper95": upper95(k, n),
            "onsets": onsets,
            "onset_rate": onsets / n,
            "onset_upper95": upper95(onsets, n),
            "most_in_one_run": max(g["named"] for g in got),
            "likely": sum(g["likely"] for g in got),
            "runs_with_alarm": sum(g["named"] > 0 for g in got),
            "alarmed": [
                {"seed": g["seed"], "named": g["named"], "onsets": _onsets(g["names"])}
                for g in got
                if g["named"]
            ],
            "seconds": round(time.perf_counter() - t0, 1),
        }
        print(f"  {P} processes: {k} named in {n} windows", flush=True)
    return out


def recall(
    sizes, fractions, runs: int, windows: int, seed0: int, jobs: int = 1, alphas=(None,)
) -> dict:
    """The other side of the false alarms: jobs of the same fleets with process
    `LATE_PROCESS` computing `fraction` of a step more, through the same path; how many
    windows after the first named it, and how many named another process."""
    import functools

    out: dict = {"runs": runs, "windows_per_run": windows, "seed0": seed0, "cases": []}
    for P, alpha, f in itertools.product(sizes, alphas, fractions):
        one = functools.partial(run_one, late=LATE_PROCESS, late_fraction=f, alpha=alpha)
        got = _map(one, [(P, windows, seed0 + i) for i in range(runs)], jobs, 4)
        names = [g["names"] for g in got]
        out["cases"].append({
            "processes": P,
            "alpha": alpha,
            "level": level_text(alpha),
            "late_fraction": f,
            "after_first": sum(len(n) - 1 for n in names),
            "named_late": sum(x == LATE_PROCESS for n in names for x in n[1:]),
            "named_other": sum(x not in (None, LATE_PROCESS) for n in names for x in n),
        })  # fmt: skip
        print(f"  {P} processes, late {f:.0%}: {out['cases'][-1]}", flush=True)
    return out


def markdown_recall(res: dict, command: str) -> str:
    lines = [
        BEGIN_RECALL,
        f"`{command}`: the fleets of the healthy runs' kind (seeds {res['seed0']}-"
        f"{res['seed0'] + res['runs'] - 1}, {res['windows_per_run']} windows each) with "
        f"process {LATE_PROCESS} computing a share of the step more, through the same path.",
        "",
        "| processes | level (both tests, or test 1 and the fleet line) | late by (share of a "
        "step) | windows after the first | named "
        "the late process | named another |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for c in res["cases"]:
        lines.append(
            f"| {c['processes']} | {c['level']} | {c['late_fraction']:.0%} | "
            f"{c['after_first']:,} | "
            f"{c['named_late']:,} ({c['named_late'] / max(c['after_first'], 1):.0%}) | "
            f"{c['named_other']} |"
        )
    lines.append(END_RECALL)
    return "\n".join(lines)


def level_text(alpha: float | None) -> str:
    """The levels a run used: `alpha` for both tests, or watch's own (None)."""
    from jaxpace.watch.decide import FLEET_LEVEL, LEVEL

    if alpha is not None:
        return f"{alpha:g}"
    return f"{LEVEL:g}, fleet line {FLEET_LEVEL:g} (watch's)"


def markdown(res: dict, command: str) -> str:
    from jaxpace.watch.decide import FLEET_LEVEL, LEVEL
    from jaxpace.watch.schedule import BUDGET

    cases = [(0.005, 0.2), (1.0, 0.2), (5.0, 0.5)]
    lines = [
        BEGIN,
        f"`{command}`: healthy jobs (`benchmarks/accuracy.py`'s `fleet_run`, one device per "
        f"process), {res['runs']} runs (seeds {res['seed0']}-{res['seed0'] + res['runs'] - 1}) "
        f"of {res['windows_per_run']} windows of {WINDOW} steps each, every window through "
        "watch's path as process 0 runs it live (each process's summary, `summary.combine`, "
        "`decide.decide` pooling up to 8 windows, with the history), at "
        + (
            f"the level {res['alpha']:g} for both tests"
            if res.get("alpha") is not None
            else f"watch's levels (test 1 at `decide.LEVEL` = {LEVEL:g}, the fleet line at "
            f"`decide.FLEET_LEVEL` = {FLEET_LEVEL:g})"
        )
        + ". Named: the verdict's "
        "confidence `named` (a false alarm); likely: `likely` (below the line, not an "
        "alarm). Upper bound: one-sided 95% (Clopper-Pearson).",
        "",
        "| processes | windows | named | per window | 95% upper bound | onsets (a process "
        "named that the window before did not name) | per window | 95% upper bound | runs "
        "with one | most named in one run | likely |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for P, f in res["sizes"].items():
        lines.append(
            f"| {P} | {f['windows']:,} | {f['named']} | {f['rate']:.2e} | "
            f"{f['upper95']:.2e} | {f['onsets']} | {f['onset_rate']:.2e} | "
            f"{f['onset_upper95']:.2e} | {f['runs_with_alarm']} of {res['runs']} | "
            f"{f['most_in_one_run']} of {res['windows_per_run']} | {f['likely']} |"
        )
    lines += [
        "",
        'What one false alarm per job-week needs at the default cadence (`every="auto"`: '
        f"a window's measured cost is {BUDGET:.1%} of the time between windows):",
        "",
        "| step time | window cost | windows a week | per-window rate needed |",
        "|---:|---:|---:|---:|",
    ]
    for step_s, cost_s in cases:
        per_week, rate = need(step_s, cost_s, BUDGET)
        lines.append(f"| {step_s * 1e3:g} ms | {cost_s:g} s | {per_week:,.0f} | {rate:.1e} |")
    lines.append(END)
    return "\n".join(lines)


def write_block(block: str, path: Path = DOC, begin: str = BEGIN, end: str = END) -> None:
    """`block` in place of the one between the markers of `path`, or after its text (a file
    of its own when `path` does not exist yet: the run's results are never lost for it)."""
    text = path.read_text() if path.exists() else ""
    if begin in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def _level_arg(text: str) -> float | None:
    """`--alpha`'s values: a level in (0, 0.5], or `watch` (watch's own levels: None)."""
    if text == "watch":
        return None
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not 0 < v <= 0.5:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a level in (0, 0.5] or 'watch'")
    return v


def _level_name(alpha: float | None) -> str:
    return "watch" if alpha is None else f"{alpha:g}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks watch-alarms", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--sizes", type=int, nargs="+", default=[8, 64], help="processes")
    ap.add_argument("--runs", type=int, default=100, help="healthy jobs per size")
    ap.add_argument("--windows", type=int, default=40, help="windows per job")
    ap.add_argument("--seed0", type=int, default=0, help="first seed (held-out: another range)")
    ap.add_argument("--jobs", type=int, default=1, help="processes running the jobs")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--markdown", default=str(DOC))
    ap.add_argument(
        "--alpha",
        type=_level_arg,
        nargs="+",
        default=None,
        help="both tests' level in place of watch's levels (decide.LEVEL, decide.FLEET_LEVEL);"
        " 'watch' for watch's own (with --late: several)",
    )
    ap.add_argument(
        "--late",
        type=float,
        nargs="+",
        default=None,
        help="shares of a step process 3 computes more: the recall table instead",
    )
    args = ap.parse_args(argv)
    if args.runs < 1 or args.windows < 1 or min(args.sizes) < 2:
        ap.error("--runs and --windows must be >= 1 and every size >= 2 processes")
    if args.late is not None:
        if min(args.sizes) <= LATE_PROCESS or not all(0 < f <= 10 for f in args.late):
            ap.error(f"--late needs sizes above {LATE_PROCESS} processes and shares in (0, 10]")
        alphas = tuple(args.alpha or (None,))
        res = recall(
            args.sizes, args.late, args.runs, args.windows, args.seed0, max(args.jobs, 1), alphas
        )
        cmd = (
            f"python -m benchmarks watch-alarms --late {' '.join(f'{f:g}' for f in args.late)} "
            f"--sizes {' '.join(map(str, args.sizes))} --runs {args.runs} --windows "
            f"{args.windows} --seed0 {args.seed0}"
            + (f" --alpha {' '.join(_level_name(a) for a in args.alpha)}" if args.alpha else "")
        )
        write_block(markdown_recall(res, cmd), Path(args.markdown), BEGIN_RECALL, END_RECALL)
        return 0
    if args.alpha is not None and len(args.alpha) != 1:
        ap.error("--alpha takes one level without --late")
    alpha = args.alpha[0] if args.alpha else None
    res = run(args.sizes, args.runs, args.windows, args.seed0, max(args.jobs, 1), alpha)
    res["date"] = time.strftime("%Y-%m-%d")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "watch_alarms.json").write_text(json.dumps(res, indent=1) + "\n")
    cmd = "python -m benchmarks watch-alarms " + " ".join(
        f"--{k} {v}" if not isinstance(v, list) else f"--{k} " + " ".join(map(str, v))
        for k, v in (("sizes", args.sizes), ("runs", args.runs), ("windows", args.windows),
                     ("seed0", args.seed0))
    ) + (f" --alpha {_level_name(alpha)}" if alpha is not None else "")  # fmt: skip
    write_block(markdown(res, cmd), Path(args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
