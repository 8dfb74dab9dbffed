"""examples/cluster: the SLURM script and the JobSet manifest, run for their jaxpace part on
this machine against faked cluster environments.

SLURM: `slurm.sbatch` runs unchanged under bash with a stand-in `srun` on PATH that starts
SLURM_NTASKS local processes with SLURM's per-task variables, so JAX's own SLURM detection
joins them (coordinator `localhost`, port from the job id, as on a cluster). JobSet: the
manifest's container command and environment are run as local processes, with what
Kubernetes would fill in (the completion index, the JobSet name, `$(VAR)` expansion) and
two substitutions a machine without Kubernetes needs: the coordinator's service name
becomes 127.0.0.1 and `/shared` a temporary folder. Each job makes one process late and
checks that watch and `jaxpace report` on the kept windows name it.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.multiprocess

REPO = Path(__file__).resolve().parent.parent
CLUSTER = REPO / "examples" / "cluster"
PROCS, DEVICES = 3, 2
LATE = ["--late-process", "1", "--late-ms", "40"]
SHORT = ["--steps", "45", "--every", "10", "--window", "5"]

FAKE_SRUN = """#!/usr/bin/env python3
# A stand-in for srun: SLURM_NTASKS local tasks with SLURM's per-task variables.
import os, subprocess, sys
n = int(os.environ["SLURM_NTASKS"])
procs = []
for i in range(n):
    env = dict(os.environ, SLURM_PROCID=str(i), SLURM_LOCALID=str(i), SLURM_NODEID="0")
    procs.append(subprocess.Popen(sys.argv[1:], env=env))
sys.exit(max(p.wait() for p in procs))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _slurm_job_id() -> int:
    """A job id whose port (JAX: 61440 + id mod 4096) is free here now."""
    for _ in range(50):
        with socket.socket() as s:
            port = 61440 + int.from_bytes(os.urandom(2), "little") % 4096
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return 4096 * 7 + (port - 61440)
    raise RuntimeError("no free port in JAX's SLURM range")


def _cpu_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "JAX"))}
    env.update(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(DEVICES), PYTHONUNBUFFERED="1")
    env.pop("XLA_FLAGS", None)
    return env


def _check_named(out: Path, text: str) -> None:
    """watch named process 1 live (the log line), and the report on the windows names it."""
    assert re.search(r"jaxpace watch: steps \d+-\d+: process 1 \(host", text), text[-4000:]
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["culprit_process"] == 1, verdict
    report = json.loads((out / "report.json").read_text())
    named = report.get("culprit")
    assert named is not None and named // DEVICES == 1, report.get("culprit")
    assert (out / "report.html").is_file()


def test_the_slurm_script_runs_watch_and_the_report_on_shared_storage(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text(FAKE_SRUN)
    srun.chmod(srun.stat().st_mode | stat.S_IEXEC)
    job_id = _slurm_job_id()
    env = _cpu_env()
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env['PATH']}",
        PYTHON=sys.executable,
        SLURM_JOB_ID=str(job_id),
        SLURM_NTASKS=str(PROCS),
        SLURM_STEP_NODELIST="localhost",
        SLURM_STEP_NUM_NODES="1",
        JAXPACE_SHARED=str(tmp_path / "shared"),
        JAXPACE_EXAMPLE_DIR=str(CLUSTER),
        STEPS="45",
        EVERY="10",
        WINDOW="5",
        EXTRA_ARGS=" ".join(LATE),
    )
    proc = subprocess.run(
        ["bash", str(CLUSTER / "slurm.sbatch")],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    _check_named(tmp_path / "shared" / str(job_id), text)


def _manifest() -> tuple[dict, dict]:
    docs = list(yaml.safe_load_all((CLUSTER / "jobset.yaml").read_text()))
    jobset = next(d for d in docs if d["kind"] == "JobSet")
    report = next(d for d in docs if d["kind"] == "Job")
    return jobset, report


def _container(spec: dict) -> dict:
    return spec["template"]["spec"]["containers"][0]


def _local(arg: str, shared: Path) -> str:
    """The manifest's paths on this machine: the image's /app is the repository, /shared a
    temporary folder."""
    return arg.replace("/app/", f"{REPO}/").replace("/shared/", f"{shared}/")


def test_the_jobset_manifest_passes_the_coordinator_and_runs_watch(tmp_path):
    jobset, report_job = _manifest()
    name = jobset["metadata"]["name"]
    [workers] = jobset["spec"]["replicatedJobs"]
    job = workers["template"]["spec"]
    assert job["completionMode"] == "Indexed" and job["parallelism"] == job["completions"]
    c = _container(job)
    env_spec = {e["name"]: e for e in c["env"]}
    # What the manifest passes explicitly: the coordinator (pod 0 of the JobSet's service),
    # the process count (= the pods), and each pod's index from its completion index.
    coord = env_spec["JAX_COORDINATOR_ADDRESS"]["value"]
    assert coord.startswith(f"{name}-{workers['name']}-0-0.{name}:")
    assert int(env_spec["JAX_NUM_PROCESSES"]["value"]) == job["parallelism"]
    index_ref = env_spec["JAX_PROCESS_ID"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert "job-completion-index" in index_ref
    port = _free_port()
    shared = tmp_path / "shared"
    procs = []
    for i in range(PROCS):
        env = _cpu_env()
        env.update(
            JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",  # the service name, resolved here
            JAX_NUM_PROCESSES=str(PROCS),  # 8 pods in the manifest; this machine runs 3
            JAX_PROCESS_ID=str(i),  # the pod's completion index
            JOBSET_NAME=name,
        )
        cmd = [
            sys.executable if a == "python" else _local(a.replace("$(JOBSET_NAME)", name), shared)
            for a in c["command"]
        ]
        steps = cmd.index("--steps")
        cmd = cmd[:steps] + SHORT + LATE
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    texts = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=240)
            texts.append(out)
    finally:
        for p in procs:
            p.kill()
    text = "\n".join(texts)
    assert all(p.returncode == 0 for p in procs), text[-4000:]
    # The report Job, after the workers.
    rc = _container(report_job["spec"])
    cmd = [sys.executable if a == "python" else _local(a, shared) for a in rc["command"]]
    rep = subprocess.run(cmd, env=_cpu_env(), capture_output=True, text=True, timeout=180)
    assert rep.returncode == 0, rep.stdout[-2000:] + rep.stderr[-2000:]
    _check_named(shared / "jaxpace" / name, text)
