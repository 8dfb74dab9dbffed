"""benchmarks/gpu.sh and its Python part, on a machine without a GPU.

What can be checked here: the script parses, says FAIL and exits non-zero when no GPU runs the
CUDA handlers, every verdict gives PASS on inputs that must pass and FAIL on inputs that must
fail (`gpu_check.py dry-run`), and the GPU parts' code runs end to end on CPU devices (its
timing checks reported as NOTEs there, never as passes). What it proves on a GPU is listed in
docs/multihost.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "gpu.sh"
CHECK = REPO / "benchmarks" / "gpu_check.py"


def _env(**extra):
    env = dict(os.environ)  # the installed jaxpace, with its native libraries
    env.update(extra)
    return env


def test_gpu_sh_and_the_sanitizer_script_parse():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True, timeout=60)
    subprocess.run(["bash", "-n", str(REPO / "benchmarks" / "sanitize_probe.sh")], check=True,
                   timeout=60)  # fmt: skip


def test_gpu_sh_fails_without_a_gpu():
    # No build (`pip install -e .` would repoint this environment's install).
    r = subprocess.run(
        ["bash", str(SCRIPT)], env=_env(PYTHON=sys.executable, JAXPACE_GPU_SH_BUILD="0"),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 1, r.stdout + r.stderr
    assert "gpu.sh: FAIL: no GPU with the native CUDA handlers" in r.stdout


def test_every_verdict_passes_and_fails_where_it_must():
    r = subprocess.run(
        [sys.executable, str(CHECK), "dry-run"], env=_env(), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    assert len(lines) >= 20 and all(ln.strip().startswith("PASS") for ln in lines), r.stdout


def test_the_gpu_parts_code_runs_on_cpu_devices():
    r = subprocess.run(
        [sys.executable, str(CHECK), "main", "--platform", "cpu", "--steps", "4",
         "--size", "4099", "--lag-iters", "20"],
        env=_env(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="8"), capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    for name in ("measure-only", "fixed delay", "adaptive", "no blocking per step"):
        assert f"PASS  bitwise == jax.lax ({name}" in out, out
    assert "PASS  no step lost without a count" in out
    assert "PASS  probe path (native)" in out  # the installed package's native probes
    assert "NOTE  waits vs NCCL kernels" in out  # said, not passed: no NCCL on CPU
    assert "Traceback" not in out
