"""`python -m benchmarks diagnosis`: labelled simulated runs -> `jaxpace.report.analyze` -> accuracy.

Each case is a `jaxpace.sim.simulate_records` run with a known injected problem
(`GroundTruth`); the report's verdict is compared with it. Prints the tables
and writes them (with the raw per-run rows) to `--out` as JSON and Markdown.

Grid: cases x rank counts x seeds (see `CASES`, `--ranks`, `--seeds`). Base
scenario: `pure-bsp` with identical GPUs (no static spread), one all-reduce per
step (one site), 100 ms compute with per-step lognormal jitter sigma (the noise
level), no ECMP collisions unless a case adds them. Lateness is stated as a
multiple of the per-step jitter (sigma x 100 ms). Every run is analyzed with
the alpha-beta expectation of its collective (`expected_transfer_s`), as a user
who knows their fabric would pass.

Healthy heterogeneous fleets (`--fleet` runs only these; `benchmarks/fleet.py`):
per-rank speed spread 0.5%, 1% and 2% at 64, 512 and 4096 ranks, stragglers
placed at 3, 5 and 8 robust SDs of that spread: false alarms per healthy run,
recall, and the smallest decidable lateness (formula) next to the runs.

Extra measurements: `--scale` times `analyze` (and reading + writing JSONL) at
8192 ranks x 1000 steps with peak RSS; `--sim-speed` times the simulator at
1024 ranks x 10,000 steps with `adaptive`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from jaxpace.report import analyze
from jaxpace.sim import Faults, load_scenario, simulate_records

BASE_S = 0.1
MODES = (
    "persistent_straggler",
    "locality",
    "synchronization_amplification",
    "topology_contention",
    "balanced",
    "likely_straggler",  # reported only: nobody named, a rank last in most steps below the line
)


def _scenario(sigma: float, **over):
    sc = load_scenario("pure-bsp")
    sc = dataclasses.replace(
        sc,
        compute=dataclasses.replace(sc.compute, static_sigma=0.0, jitter_sigma=sigma),
        fabric=dataclasses.replace(sc.fabric, ecmp_flows=0),
    )
    for part, fields in over.items():
        sc = dataclasses.replace(sc, **{part: dataclasses.replace(getattr(sc, part), **fields)})
    return sc


def _cases(R: int) -> list[tuple[str, float | None, object, Faults]]:
    """(case name, lateness/jitter ratio or None, scenario, faults) for `R` ranks."""
    out = []
    for sigma in (0.01, 0.02, 0.03):
        out.append((f"healthy sigma={sigma}", None, _scenario(sigma), Faults()))
    sigma = 0.02
    jit = sigma * BASE_S
    rng = np.random.default_rng(R)
    for ratio in (0.5, 1.0, 2.0, 3.0, 5.0):
        r = int(rng.integers(R))
        out.append(
            (
                f"1 straggler {ratio}x",
                ratio,
                _scenario(sigma),
                Faults(late_ranks=(r,), late_s=ratio * jit),
            )
        )
    for ratio in (2.0, 5.0):
        k = 3 if R >= 8 else 1
        ranks = tuple(int(x) for x in rng.choice(R, k, replace=False))
        out.append(
            (
                f"{k} stragglers {ratio}x",
                ratio,
                _scenario(sigma),
                Faults(late_ranks=ranks, late_s=ratio * jit),
            )
        )
    nodes = R // 8
    n = int(rng.integers(nodes))
    if nodes >= 2:  # one node: every rank is on the late host
        out.append(
            ("late host 3x", 3.0, _scenario(sigma), Faults(late_nodes=(n,), node_late_s=3 * jit))
        )
    out.append(
        ("late NUMA half 3x", 3.0, _scenario(sigma), Faults(late_numa=(n,), numa_late_s=3 * jit))
    )
    strag = dict(
        onset_prob=0.3 / R,
        dwell_min_steps=1,
        dwell_max_steps=3,
        magnitude_min=2.0,
        magnitude_max=3.0,
    )
    out.append(("episodic", None, _scenario(sigma, stragglers=strag), Faults()))
    out.append(("contention growing", None, _scenario(sigma), Faults(transfer_growth=1.0)))
    out.append(("contention spiky", None, _scenario(sigma), Faults(spike_prob=0.05)))
    if nodes >= 2:
        leaf = dict(nodes_per_leaf=max(1, nodes // 4), oversubscription=4.0, ecmp_flows=8)
        out.append(("contention leaf-tied", None, _scenario(sigma, fabric=leaf), Faults()))
    out.append(
        (
            "periodic",
            None,
            _scenario(sigma),
            Faults(
                periodic_every=25, periodic_rank=int(rng.integers(R)), periodic_extra_s=0.3 * BASE_S
            ),
        )
    )
    return out  # fmt: skip


def _steps(R: int) -> int:
    return {8: 400, 64: 400, 512: 300}.get(R, 200)


def run_one(case, ratio, sc, faults, R, seed) -> dict:
    run = simulate_records(sc, nodes=R // 8, steps=_steps(R), faults=faults, seed=seed)
    t0 = time.perf_counter()
    rep = analyze(run.records, expected_transfer_s=run.expected_transfer_s)
    dt = time.perf_counter() - t0
    truth = run.truth
    named = set(rep.culprits)
    groups = {(g.kind, g.label) for g in rep.late_groups}
    if truth.periodic_rank is not None:
        ok = (
            rep.primary_mode == "balanced"
            and rep.periodic is not None
            and rep.periodic.dominant_rank == truth.periodic_rank
        )
        pred = (
            "periodic"
            if rep.periodic is not None and rep.primary_mode == "balanced"
            else rep.primary_mode
        )
        tmode = "periodic"
    else:
        ok = rep.primary_mode == truth.mode
        pred, tmode = rep.primary_mode, truth.mode
    return {
        "case": case,
        "ratio": ratio,
        "ranks": R,
        "seed": seed,
        "steps": _steps(R),
        "truth_mode": tmode,
        "pred_mode": pred,
        "mode_ok": bool(ok),
        "truth_culprits": list(truth.culprits),
        "named": sorted(named),
        "truth_groups": [list(g) for g in truth.groups],
        "named_groups": sorted(list(g) for g in groups),
        "group_ok": bool(set(truth.groups) <= groups) if truth.groups else None,
        # A `likely_straggler` names nobody (it says the slowest is below the line): not an
        # alarm, but counted (`healthy_likely`).
        "false_alarm": bool(tmode == "balanced" and (named or groups or rep.primary_mode not in ("balanced", "likely_straggler"))),
        "analyze_s": dt,
        "decision": rep.decisions[0] if rep.decisions else "",
    }  # fmt: skip


def grid(ranks, seeds, progress=True) -> list[dict]:
    rows = []
    for R in ranks:
        for case, ratio, sc, faults in _cases(R):
            for seed in seeds:
                rows.append(run_one(case, ratio, sc, faults, R, seed))
                if progress:
                    r = rows[-1]
                    print(
                        f"{R:5d} {case:24s} seed {seed}: {r['pred_mode']:30s} "
                        f"{'ok' if r['mode_ok'] else 'WRONG'} named {r['named'][:4]} "
                        f"groups {r['named_groups'][:2]} ({r['analyze_s']:.1f} s)",
                        flush=True,
                    )
    return rows


def summarize(rows: list[dict]) -> dict:
    conf: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in rows:
        conf[r["truth_mode"]][r["pred_mode"]] += 1
    pr: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0])  # tp, named, truth
    for r in rows:
        if not r["truth_culprits"]:
            continue
        t, n = set(r["truth_culprits"]), set(r["named"])
        for key in (
            ("ratio", r["ratio"]),
            ("ranks", r["ranks"]),
            ("ratio>=2 ranks", r["ranks"]) if r["ratio"] >= 2 else None,
        ):
            if key is None:
                continue
            acc = pr[key]
            acc[0] += len(t & n)
            acc[1] += len(n)
            acc[2] += len(t)
    healthy = [r for r in rows if r["truth_mode"] == "balanced"]
    groups = [r for r in rows if r["group_ok"] is not None]
    return {
        "runs": len(rows),
        "confusion": {k: dict(v) for k, v in conf.items()},
        "precision_recall": {f"{k[0]}={k[1]}": {"tp": v[0], "named": v[1], "truth": v[2], "precision": v[0] / v[1] if v[1] else None, "recall": v[0] / v[2] if v[2] else None} for k, v in sorted(pr.items(), key=lambda kv: (kv[0][0], kv[0][1]))},
        "false_alarm_rate": sum(r["false_alarm"] for r in healthy) / max(len(healthy), 1),
        "healthy_runs": len(healthy),
        "healthy_likely": sum(r["pred_mode"] == "likely_straggler" for r in healthy),
        "mode_accuracy": sum(r["mode_ok"] for r in rows) / max(len(rows), 1),
        "group_accuracy": sum(r["group_ok"] for r in groups) / max(len(groups), 1),
        "group_runs": len(groups),
        "analyze_s_max": max(r["analyze_s"] for r in rows),
    }  # fmt: skip


def markdown(summary: dict, ranks, seeds) -> str:
    labels = [*MODES, "periodic"]
    lines = [
        f"Grid: {summary['runs']} runs = cases x ranks {list(ranks)} x seeds {list(seeds)}; "
        "steps 400 (8, 64 ranks), 300 (512), 200 (4096).",
        "",
        "Confusion matrix (rows: injected, columns: the report's primary mode; `periodic` = "
        "balanced with the periodic rank named):",
        "",
        "| injected \\ reported | " + " | ".join(f"`{m}`" for m in labels) + " |",
        "|---|" + "---:|" * len(labels),
    ]
    for t in labels:
        row = summary["confusion"].get(t)
        if not row:
            continue
        lines.append(f"| `{t}` | " + " | ".join(str(row.get(p, 0)) for p in labels) + " |")
    lines += ["", "Culprit precision and recall (ranks named vs injected, pooled over runs):", ""]
    lines += [
        "| slice | injected | named | correct | precision | recall |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for k, v in summary["precision_recall"].items():
        p = "n/a" if v["precision"] is None else f"{v['precision']:.3f}"
        rc = "n/a" if v["recall"] is None else f"{v['recall']:.3f}"
        lines.append(f"| {k} | {v['truth']} | {v['named']} | {v['tp']} | {p} | {rc} |")
    lines += [
        "",
        f"- False alarms on healthy runs: {summary['false_alarm_rate']:.1%} of "
        f"{summary['healthy_runs']} runs (any rank or group named, or a mode other than balanced "
        f"or likely_straggler); reported `likely_straggler` (nobody named, the slowest rank "
        f"below the line): {summary.get('healthy_likely', 0)} of them.",
        f"- Mode accuracy: {summary['mode_accuracy']:.1%} of {summary['runs']} runs.",
        f"- Late host / NUMA group named as the group: {summary['group_accuracy']:.1%} of "
        f"{summary['group_runs']} runs.",
        f"- Slowest single `analyze` in the grid: {summary['analyze_s_max']:.1f} s.",
    ]  # fmt: skip
    return "\n".join(lines)


def _rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def scale(out: Path, ranks: int = 8192, steps: int = 1000) -> dict:
    """Times simulate_records, analyze (in memory), write_records, then reading the
    files back (load_records) and the rest of `jaxpace report` on them, at scale."""
    from jaxpace.report import load_records, write_html, write_json, write_trace
    from jaxpace.sim import write_records

    sc = _scenario(0.02)
    res = {"ranks": ranks, "steps": steps}
    t = time.perf_counter()
    run = simulate_records(
        sc,
        nodes=ranks // 8,
        steps=steps,
        faults=Faults(late_ranks=(4242 % ranks,), late_s=0.004),
        seed=0,
    )
    res["simulate_records_s"] = time.perf_counter() - t
    t = time.perf_counter()
    rep = analyze(run.records)
    res["analyze_memory_s"] = time.perf_counter() - t
    res["culprit"] = rep.culprit
    t = time.perf_counter()
    write_html(rep, out / "scale.html")
    res["html_s"] = time.perf_counter() - t
    res["html_bytes"] = (out / "scale.html").stat().st_size
    res["rss_after_analyze_gib"] = _rss_gib()
    d = out / "scale-run"
    t = time.perf_counter()
    write_records(run, d)
    res["write_records_s"] = time.perf_counter() - t
    res["records_bytes"] = sum(p.stat().st_size for p in d.glob("*.jsonl"))
    del run, rep
    t = time.perf_counter()
    recs = load_records(d)
    res["load_records_s"] = time.perf_counter() - t
    t = time.perf_counter()
    rep = analyze(recs)
    write_html(rep, out / "scale-files.html")
    write_trace(rep, out / "scale-files-trace.json")
    write_json(rep, out / "scale-files.json")
    res["analyze_and_outputs_from_files_s"] = time.perf_counter() - t
    res["culprit_from_files"] = rep.culprit
    res["peak_rss_gib"] = _rss_gib()
    return res  # fmt: skip


def sim_speed(nodes: int = 128, steps: int = 10_000) -> dict:
    """`paper` at `nodes` x 8 ranks: wall and CPU seconds per policy, with the load average."""
    import os

    from jaxpace.sim import simulate

    out = {}
    for policy in (None, "adaptive"):
        load = os.getloadavg()[0]
        c, t = time.process_time(), time.perf_counter()
        r = simulate("paper", nodes=nodes, steps=steps, policy=policy, seed=0)
        out[r.policy.split("(")[0]] = {
            "wall_s": time.perf_counter() - t,
            "cpu_s": time.process_time() - c,
            "load_1min": load,
            "ranks": r.ranks,
            "steps": steps,
        }
    return out


PAPER_SWEEP = {
    "shared_links": (0.1, 0.3, 0.6, 0.9),
    "spin_compute": (0.3, 0.6, 1.0),
    "power_budget": (0.1, 0.3, 0.6, 1.0),
    "host_runahead": (1.0, 3.0, 10.0),
}


def paper_strength(nodes: int = 64, steps: int = 400, seed: int = 0) -> list[dict]:
    """Pacing gain and CV per coupling strength: `paper` with every other coupling off.

    Each strength runs `compare` (same draws with and without the preset's
    adaptive policy). The sweep goes to the top of each field's allowed range.
    """
    from jaxpace.sim import compare

    base = load_scenario("paper")
    off = dataclasses.replace(
        base.coupling, shared_links=0.0, spin_compute=0.0, power_budget=0.0, host_runahead=0.0
    )
    rows = []
    for name, strengths in PAPER_SWEEP.items():
        for x in strengths:
            sc = dataclasses.replace(base, coupling=dataclasses.replace(off, **{name: x}))
            t = time.perf_counter()
            c = compare(sc, nodes=nodes, steps=steps, seed=seed)
            rows.append(
                {
                    "coupling": name,
                    "strength": x,
                    "gain": c.throughput_gain,
                    "cv_off": c.baseline.cv,
                    "cv_on": c.paced.cv,
                    "mean_off_s": c.baseline.mean_step_s,
                    "mean_on_s": c.paced.mean_step_s,
                    "seconds": time.perf_counter() - t,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def _fleet(out: Path) -> str:
    """The heterogeneous-fleet runs (`benchmarks/fleet.py`); writes diagnosis_fleet.{json,md}."""
    from benchmarks import fleet

    t = time.perf_counter()
    res = fleet.run()
    e2e = fleet.end_to_end()
    res["end_to_end"] = e2e
    res["wall_s"] = time.perf_counter() - t
    md = fleet.markdown(res, e2e)
    print(md)
    print(f"fleet wall {res['wall_s']:.0f} s")
    (out / "diagnosis_fleet.json").write_text(json.dumps(res, indent=1))
    (out / "diagnosis_fleet.md").write_text(md + "\n")
    return md


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks diagnosis", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--ranks", default="8,64,512,4096")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--scale", action="store_true", help="only the 8192 x 1000 timing")
    ap.add_argument("--sim-speed", action="store_true", help="only the simulator timing")
    ap.add_argument(
        "--paper-strength", action="store_true", help="only the coupling-strength sweep (paper)"
    )
    ap.add_argument("--fleet", action="store_true", help="only the heterogeneous-fleet runs")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.scale:
        res = scale(out)
        print(json.dumps(res, indent=1))
        (out / "diagnosis_scale.json").write_text(json.dumps(res, indent=1))
        return 0
    if a.paper_strength:
        res = paper_strength()
        (out / "diagnosis_paper_strength.json").write_text(json.dumps(res, indent=1))
        return 0
    if a.sim_speed:
        res = sim_speed()
        print(json.dumps(res, indent=1))
        (out / "diagnosis_sim_speed.json").write_text(json.dumps(res, indent=1))
        return 0
    fleet_md = _fleet(out)
    if a.fleet:
        return 0
    ranks = [int(x) for x in a.ranks.split(",")]
    seeds = [int(x) for x in a.seeds.split(",")]
    t = time.perf_counter()
    rows = grid(ranks, seeds)
    summary = summarize(rows)
    summary["wall_s"] = time.perf_counter() - t
    md = markdown(summary, ranks, seeds) + "\n\n" + fleet_md
    print(md)
    print(f"wall {summary['wall_s']:.0f} s")
    (out / "diagnosis.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    (out / "diagnosis.md").write_text(md + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
