"""Healthy heterogeneous fleets and stragglers placed in robust SDs of the fleet's spread.

Part of `python -m benchmarks diagnosis` (`--fleet` runs only this). Each run is a
bulk-synchronous step repeated `n` times: rank i computes
``T * exp(sigma_s * a_i) * exp(sigma_j * e_ik)`` (T = 100 ms; a static speed
factor per rank, lognormal with spread `sigma_s`; per-step jitter `sigma_j` =
1%), everyone leaves the collective together, so rank i's lateness at step k
is its compute minus the step's fastest. A straggler *placed at k spreads* has
its own speed factor set to the fleet's median and computes `k * sigma_s * T`
longer every step. Every run goes through `jaxpace.diagnosis.culprit.decide`, the
function the report and the live view call; a few end-to-end runs go through
`simulate_records` and `analyze` as a check that the pipeline decides alike.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from jaxpace.diagnosis.culprit import ALPHA, decide, fleet_threshold

T_S = 0.1
JITTER = 0.01
SPREADS = (0.005, 0.01, 0.02)
PLACED = (3.0, 5.0, 8.0)
STEPS = {64: 400, 512: 300, 4096: 200}


def lateness(R: int, n: int, spread: float, rng, late: int | None = None, k: float = 0.0):
    """(n, R) lateness and the median step time of one simulated run."""
    a = spread * rng.standard_normal(R)
    extra = np.zeros(R)
    if late is not None:
        a[late] = 0.0
        extra[late] = k * spread * T_S
    comp = T_S * np.exp(a)[None, :] * np.exp(JITTER * rng.standard_normal((n, R))) + extra
    return comp - comp.min(axis=1, keepdims=True), float(np.median(comp.max(axis=1)))


def limit_spreads(R: int, n: int, spread: float, z: float = 1.645) -> tuple[float, float]:
    """The smallest decidable lateness in spreads: (half the runs, 95% of the runs).

    With `s = sqrt((spread T)^2 + v / n)` the fleet's robust SD of per-rank mean
    lateness (`v` ~ (jitter T)^2: one rank's per-step variance) and `q(R)` the
    fleet threshold, a straggler placed at L is named in half the runs at
    `L50 = q s` and in 95% at `L95 = q s + z sqrt(q^2 s^2 / (2 (R - 1)) + v / n)`
    (its own mean's noise and the error of the estimated spread).
    """
    v = (JITTER * T_S) ** 2
    s = math.sqrt((spread * T_S) ** 2 + v / n)
    q = fleet_threshold(R)
    l50 = q * s
    l95 = l50 + z * math.sqrt(q * q * s * s / (2 * (R - 1)) + v / n)
    return l50 / (spread * T_S), l95 / (spread * T_S)


def run(ranks=(64, 512, 4096), healthy_seeds=None, straggler_seeds=None) -> dict:
    """False alarms per healthy run and recall per placement, per rank count and spread."""
    healthy_seeds = healthy_seeds or {64: 400, 512: 200, 4096: 100}
    straggler_seeds = straggler_seeds or {64: 100, 512: 40, 4096: 20}
    rows = []
    for R in ranks:
        n = STEPS.get(R, 200)
        for spread in SPREADS:
            t0 = time.perf_counter()
            rng = np.random.default_rng([R, int(spread * 1e4)])
            fa, named_max = 0, []
            for _ in range(healthy_seeds[R]):
                lat, step = lateness(R, n, spread, rng)
                dec = decide(lat, step)
                fa += bool(dec.late.any())
                named_max.append(float(dec.fleet.distance.max()))
            row = {
                "ranks": R, "steps": n, "spread": spread, "healthy_runs": healthy_seeds[R],
                "false_alarms": fa, "threshold_sd": fleet_threshold(R),
                "healthy_max_sd_p99": float(np.quantile(named_max, 0.99)),
                "limit50_spreads": limit_spreads(R, n, spread)[0],
                "limit95_spreads": limit_spreads(R, n, spread)[1],
            }  # fmt: skip
            for k in PLACED:
                hit = wrong = 0
                for _ in range(straggler_seeds[R]):
                    late = int(rng.integers(R))
                    lat, step = lateness(R, n, spread, rng, late, k)
                    c = decide(lat, step).culprits
                    hit += late in c
                    wrong += len(set(c) - {late})
                row[f"recall_{k:g}"] = hit / straggler_seeds[R]
                row[f"wrong_{k:g}"] = wrong
            row["straggler_runs"] = straggler_seeds[R]
            row["seconds"] = time.perf_counter() - t0
            rows.append(row)
            print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()},
                  flush=True)  # fmt: skip
    return {"alpha": ALPHA, "jitter": JITTER, "step_s": T_S, "rows": rows}


def end_to_end(seeds: int = 6) -> list[dict]:
    """A few `simulate_records` + `analyze` runs: healthy fleets, and a straggler at 8 spreads."""
    from jaxpace.report import analyze
    from jaxpace.sim import Faults, load_scenario, simulate_records

    out = []
    for R, spread in ((64, 0.005), (64, 0.02), (512, 0.01)):
        sc = load_scenario("pure-bsp")
        sc = dataclasses.replace(
            sc,
            compute=dataclasses.replace(sc.compute, static_sigma=spread, jitter_sigma=JITTER),
            fabric=dataclasses.replace(sc.fabric, ecmp_flows=0),
        )
        named = found = 0
        for seed in range(seeds):
            run_ = simulate_records(sc, nodes=R // 8, steps=STEPS[R], seed=seed)
            rep = analyze(run_.records, expected_transfer_s=run_.expected_transfer_s)
            named += bool(
                rep.culprits
                or rep.late_groups
                or rep.primary_mode not in ("balanced", "likely_straggler")
            )
            f = Faults(late_ranks=(seed,), late_s=8 * spread * T_S)
            run_ = simulate_records(sc, nodes=R // 8, steps=STEPS[R], seed=seed, faults=f)
            found += analyze(run_.records, expected_transfer_s=run_.expected_transfer_s).culprits[
                :1
            ] == (seed,)
        out.append({"ranks": R, "spread": spread, "runs": seeds, "healthy_named": named,
                    "straggler_8_named": found})  # fmt: skip
        print(out[-1], flush=True)
    return out


def predicted_recall(row: dict, k: float) -> float:
    """The formula's share of runs naming a straggler placed at `k` spreads (normal approx.)."""
    l50, l95 = row["limit50_spreads"], row["limit95_spreads"]
    sd = (l95 - l50) / 1.645
    return 0.5 * (1.0 + math.erf((k - l50) / (sd * math.sqrt(2.0)))) if sd > 0 else float(k > l50)


def markdown(res: dict, e2e: list[dict]) -> str:
    """The fleet table for docs/benchmarks.md."""
    lines = [
        "| ranks | steps | spread | healthy runs | false alarms | threshold (SDs) | "
        "limit L50 / L95 (spreads) | recall at 3 / 5 / 8 spreads (runs) | "
        "formula's recall at 3 / 5 / 8 |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in res["rows"]:
        pred = " / ".join(f"{predicted_recall(r, k):.2f}" for k in PLACED)
        lines.append(
            f"| {r['ranks']} | {r['steps']} | {r['spread']:.1%} | {r['healthy_runs']} | "
            f"{r['false_alarms']} ({r['false_alarms'] / r['healthy_runs']:.1%}) | "
            f"{r['threshold_sd']:.2f} | {r['limit50_spreads']:.2f} / {r['limit95_spreads']:.2f} | "
            f"{r['recall_3']:.2f} / {r['recall_5']:.2f} / {r['recall_8']:.2f} "
            f"({r['straggler_runs']} each) | {pred} |"
        )
    if e2e:
        lines += ["", "End to end (`simulate_records` + `analyze`, `pure-bsp`, jitter 1%):", ""]
        lines += [
            "| ranks | spread | runs | healthy runs naming anything | straggler at 8 spreads named |"
        ]
        lines += ["|---:|---:|---:|---:|---:|"]
        for e in e2e:
            lines.append(f"| {e['ranks']} | {e['spread']:.1%} | {e['runs']} | "
                         f"{e['healthy_named']} | {e['straggler_8_named']} |")  # fmt: skip
    return "\n".join(lines)
