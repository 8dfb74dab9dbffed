"""Test setup: 8 CPU devices before JAX initializes, and a launcher fixture for multi-process tests."""

import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

# Scripts run under `jaxpace launch`; they parse argv at import, so no doctest import.
collect_ignore = ["scripts", "fixtures"]

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "tests" / "scripts"


def _run_jaxpace(command, args, *, timeout_s, env, cwd):
    """`python -m jaxpace COMMAND ARGS`, output captured, bounded by `timeout_s`."""
    return subprocess.run(
        [sys.executable, "-m", "jaxpace", command, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        cwd=cwd,
    )


def run_launch(args, *, timeout_s=240, env=None):
    """Runs `python -m jaxpace launch ARGS` and returns the CompletedProcess (bounded)."""
    e = dict(os.environ)
    e.pop("XLA_FLAGS", None)
    e.update(env or {})
    return _run_jaxpace("launch", args, timeout_s=timeout_s, env=e, cwd=REPO)


def run_report(*args, timeout_s=120, env=None, cwd=None):
    """Runs `python -m jaxpace report ARGS` and returns the CompletedProcess (bounded)."""
    return _run_jaxpace("report", args, timeout_s=timeout_s, env=env, cwd=cwd)


def run_4x2(script, *script_args, timeout_s=280, job_timeout_s=240, env=None):
    """`jaxpace launch -n 4 --local-devices 2` of `tests/scripts/SCRIPT ARGS`; asserts success.

    The launcher's own `--timeout` (job_timeout_s) fires before the subprocess bound
    (timeout_s), so a hung job fails with the ranks' output instead of a bare timeout.
    """
    args = ["-n", 4, "--local-devices", 2, "--timeout", job_timeout_s, "--"]
    proc = run_launch(
        [*args, sys.executable, SCRIPTS / script, *script_args], timeout_s=timeout_s, env=env
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return proc


@pytest.fixture
def launch():
    return run_launch


@pytest.fixture(params=["native", "io_callback"])
def probe(request, monkeypatch):
    """Which probes time the measured calls (a test that takes `probe` runs on both paths);
    the io_callback fallback is forced by hiding the native library."""
    from jaxpace.native import probes as _native

    if request.param == "native":
        ok, why = _native.available()
        if not ok:
            pytest.skip(f"native probes unavailable: {why}")
    else:
        monkeypatch.setattr(_native, "available", lambda: (False, "hidden by the test"))
    return request.param


def multi_site_run(num_ranks=16, num_steps=24, sites=3, *, late_rank=5, late_s=0.003, seed=4,
                   shift_ns=1000, loss=0.0):  # fmt: skip
    """A run of `sites` sites, 4 ranks to a process: the synthetic run's rows repeated per
    site (site j's arrivals and exits `j * shift_ns` later), `loss` of the lines dropped at
    random (drawn with `seed`), the sites named `model.py:{10 + j}:layer{j}`."""
    import dataclasses

    import numpy as np

    from jaxpace.records.synthetic import synthetic_run

    run = synthetic_run(num_ranks, num_steps, late_rank=late_rank, late_s=late_s, seed=seed,
                        ranks_per_process=4)  # fmt: skip
    n = len(run)
    cols = {k: np.concatenate([v] * sites) for k, v in run.columns.items()}
    cols["site"] = np.repeat(np.arange(sites), n)
    for k in ("arrive_ns", "done_ns"):
        cols[k] = cols[k] + cols["site"] * shift_ns
    if loss:
        kept = np.random.default_rng(seed).random(cols["step"].size) >= loss
        cols = {k: v[kept] for k, v in cols.items()}
    names = tuple(f"model.py:{10 + j}:layer{j}" for j in range(sites))
    return dataclasses.replace(run, sites=names, columns=cols)
