"""Calibrates the small-job fleet test (`jaxpace.diagnosis.culprit.SMALL_JOB_THRESHOLDS`).

`python -m benchmarks.small_job_calibration [--fleets N] [--check N] [--alpha A]` (`--alpha
1e-4 --fleets 4000000`: `SMALL_JOB_THRESHOLDS_WATCH`, the stricter level measured for
watch): per rank
count R = 4..15, the per-stage thresholds (each stage exceeds its threshold on
a normal fleet with probability SMALL_JOB_MARGIN x ALPHA / stages), printed as the table to paste
into `_culprit.py`; then, with the thresholds in the code, the family-wise
false-alarm rate on fresh normal fleets (any member named by the statistical
rule), and the step share beyond which a healthy fleet at its widest
(../shared/SIMULATION.md: per-rank speed lognormal with sigma `--spread`, default
`HEALTHY_SIGMA` = 0.05, capped at 1.2x the median) puts any member past its others'
median with probability ALPHA (the bound under `SMALL_JOB_STEP_FRACTION`), R = 2..15,
for a normal and for that capped lognormal spread.
"""

from __future__ import annotations

import argparse

import numpy as np

from jaxpace.diagnosis.culprit import (
    ALPHA,
    FLEET_MIN_MEMBERS,
    HEALTHY_SIGMA,
    SMALL_JOB_MARGIN,
    calibrate_small_job,
    small_job_stages,
    small_job_thresholds,
    stage_statistics,
)
from jaxpace.diagnosis.stats import median_of_others


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fleets", type=int, default=2_000_000)
    ap.add_argument("--check", type=int, default=1_000_000)
    ap.add_argument("--spread", type=float, default=HEALTHY_SIGMA)
    ap.add_argument(
        "--alpha",
        type=float,
        default=ALPHA,
        help=f"family-wise level (default ALPHA = {ALPHA:g}; WATCH_ALPHA, measured for watch, is 1e-4)",
    )
    args = ap.parse_args()
    alpha = args.alpha
    print("SMALL_JOB_THRESHOLDS = {" if alpha == ALPHA else f"thresholds at {alpha:g} = {{")
    for R in range(4, FLEET_MIN_MEMBERS):
        q = calibrate_small_job(R, SMALL_JOB_MARGIN * alpha, args.fleets, seed=1)
        print(f"    {R}: ({', '.join(f'{v:.2f}' for v in q)}),", flush=True)
    print("}")
    print(
        "R, family-wise rate of the statistical rule, step share exceeded at rate ALPHA "
        "(normal, lognormal capped at 1.2x)"
    )
    for R in range(2, FLEET_MIN_MEMBERS):
        rng = np.random.default_rng([R, 7])
        x = rng.standard_normal((args.check, R))
        named = 0
        if R >= 4:  # anybody named <=> some stage over its threshold (`_small_job`)
            r = small_job_stages(R)
            st = stage_statistics(-np.sort(-x, axis=1), r)
            named = int((st > np.asarray(small_job_thresholds(R, alpha))).any(axis=1).sum())
        over = (x - median_of_others(x)).max(axis=1)
        share = float(np.quantile(over, 1.0 - alpha)) * args.spread
        speed = np.minimum(np.exp(args.spread * x), 1.2)
        speed /= np.median(speed, axis=1, keepdims=True)
        logn = float(np.quantile((speed - median_of_others(speed)).max(axis=1), 1.0 - alpha))
        print(f"{R:3d} {named / args.check:.5f} {share:.4f} {logn:.4f}", flush=True)


if __name__ == "__main__":
    main()
