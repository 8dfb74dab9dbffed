"""`jaxpace launch` runs plain JAX programs (issue 48, launcher part).

Before: `jax.distributed.initialize()` with no arguments failed under the
launcher ("coordinator_address should be defined"), and `--local-devices` acted
only through `jaxpace.launch.init_from_env`. The launcher now also sets the
variables JAX itself reads (docs/multihost.md). Each run is bounded twice: the
launcher's `--timeout` and the subprocess timeout above it.
"""

from __future__ import annotations

import re
import sys

import pytest
from conftest import SCRIPTS, run_launch

pytestmark = pytest.mark.multiprocess

# An enclosing SLURM allocation's variables (here one task) reach the ranks untouched;
# they must not take over a bare `initialize()` (JAX checks Open MPI's variables first).
SLURM_AROUND = {
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_NODELIST": "node-a",
    "SLURM_NTASKS": "1",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
}


@pytest.mark.timeout(300)
def test_a_plain_jax_program_joins_the_job_and_gets_its_local_devices():
    proc = run_launch(
        ["-n", 2, "--local-devices", 2, "--timeout", 200, "--"]
        + [sys.executable, SCRIPTS / "plain_jax_psum.py"],
        timeout_s=260,
        env=SLURM_AROUND,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    lines = sorted(re.findall(r"^\[rank \d\] process .*$", proc.stdout, re.M))
    # Device d of process p adds p * 10 + d + 1: 1 + 2 + 11 + 12 = 26, on both ranks.
    assert lines == [
        f"[rank {p}] process {p} of 2: 2 local devices, 4 in all, psum = 26" for p in (0, 1)
    ], proc.stdout[-4000:]


JAXPACE_PROGRAM = """
import jaxpace.launch as jl
pid, n = jl.init_from_env()
import jax
print(f"init_from_env: process {pid} of {n}, {jax.local_device_count()} local devices", flush=True)
"""


@pytest.mark.timeout(300)
def test_init_from_env_still_joins_under_the_launcher():
    proc = run_launch(
        ["-n", 2, "--local-devices", 3, "--timeout", 200, "--", sys.executable, "-c"]
        + [JAXPACE_PROGRAM],
        timeout_s=260,
        env=SLURM_AROUND,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    lines = sorted(re.findall(r"^\[rank \d\] init_from_env: .*$", proc.stdout, re.M))
    assert lines == [
        f"[rank {p}] init_from_env: process {p} of 2, 3 local devices" for p in (0, 1)
    ], proc.stdout[-4000:]
