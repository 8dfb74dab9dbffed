"""Local multi-process launcher (`jaxpace launch`) and the helper a script calls to join."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import TextIO

from jaxpace._runtime.watchdog import STALL_EXIT_CODE
from jaxpace._validate import check_number
from jaxpace.errors import ConfigError, LaunchError

__all__ = [
    "LaunchResult",
    "free_port",
    "init_from_env",
    "launch",
    "ENV_PREFIX",
    "STALL_EXIT_CODE",
]

log = logging.getLogger("jaxpace")

ENV_PREFIX = "JAXPACE_"
_ENV = {
    "coordinator": "JAXPACE_COORDINATOR",
    "num_processes": "JAXPACE_NUM_PROCESSES",
    "process_id": "JAXPACE_PROCESS_ID",
    "local_devices": "JAXPACE_LOCAL_DEVICES",
    "init_timeout": "JAXPACE_INIT_TIMEOUT_S",
    "heartbeat_timeout": "JAXPACE_HEARTBEAT_TIMEOUT_S",
}


def free_port() -> int:
    """Returns a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env_int(name: str, default: int | None = None) -> int | None:
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise ConfigError(f"environment variable `{name}` must be an integer, got {v!r}.") from None


# What `jax.distributed.initialize()` raises when its cluster detection found no cluster
# (jax/_src/distributed.py): the job is then a single process.
_NO_CLUSTER = (
    "coordinator_address should be defined",
    "Number of processes must be defined",
    "process id of the current process must be defined",
)


def init_from_env(
    *, platform: str | None = None, cluster_detection_method: str | None = None
) -> tuple[int, int]:
    """Joins the job described by the environment and returns `(process_id, num_processes)`.

    Under `jaxpace launch` this reads `JAXPACE_*` variables: it requests
    `JAXPACE_LOCAL_DEVICES` CPU devices (when running on CPU) and calls
    `jax.distributed.initialize` with the launcher's coordinator and short
    init/heartbeat timeouts, so a dead peer ends the job in seconds, not
    minutes. Otherwise JAX's own cluster detection decides: it calls
    `jax.distributed.initialize()`, which finds SLURM, Open MPI, Kubernetes
    (Job/JobSet), Cloud TPU (GCE, GKE), an explicit `JAX_COORDINATOR_ADDRESS`,
    or, with `cluster_detection_method="mpi4py"`, any MPI; when it finds no
    cluster the process runs alone (single process, logged at INFO). A SLURM
    step of one task is run as a single process without initializing (JAX
    would otherwise hide all but one GPU). If `jax.distributed` is already
    initialized, nothing is done.

    Must run before anything initializes the JAX backend.

    Args:
      platform: force `"cpu"` (tests, demo); default: whatever JAX picks.
      cluster_detection_method: passed to `jax.distributed.initialize` (e.g.
        `"mpi4py"`, which JAX only uses when asked); default: JAX's automatic
        detection.

    Returns:
      `(jax.process_index(), jax.process_count())`.
    """
    import jax

    nproc = _env_int(_ENV["num_processes"])
    local = _env_int(_ENV["local_devices"])
    if platform is not None:
        jax.config.update("jax_platforms", platform)
    if local is not None and (platform == "cpu" or os.environ.get("JAX_PLATFORMS", "") == "cpu"):
        jax.config.update("jax_num_cpu_devices", local)
    if nproc is not None and nproc > 1:
        coord = os.environ.get(_ENV["coordinator"])
        pid = _env_int(_ENV["process_id"])
        if not coord or pid is None:
            raise ConfigError(
                f"`{_ENV['num_processes']}`={nproc} but `{_ENV['coordinator']}` or "
                f"`{_ENV['process_id']}` is missing; start the job with `jaxpace launch`."
            )
        jax.distributed.initialize(
            coordinator_address=coord,
            num_processes=nproc,
            process_id=pid,
            initialization_timeout=_env_int(_ENV["init_timeout"], 60),
            heartbeat_timeout_seconds=_env_int(_ENV["heartbeat_timeout"], 10),
            # The launcher's job, not a cluster around it (SLURM would hide local devices).
            cluster_detection_method="deactivate",
        )
    elif nproc is None:
        _join_detected_cluster(cluster_detection_method)
    return jax.process_index(), jax.process_count()


def _join_detected_cluster(cluster_detection_method: str | None = None) -> bool:
    """`jax.distributed.initialize()` with JAX's own detection; False when it finds no cluster.

    Any other error (a cluster was found but joining it failed, or an explicit
    `JAX_COORDINATOR_ADDRESS` is incomplete) propagates.
    """
    import jax

    from jaxpace import _jax_compat

    if _jax_compat.distributed_client() is not None:
        return True  # the program initialized jax.distributed itself
    if os.environ.get("SLURM_NTASKS") == "1" and not os.environ.get("JAX_COORDINATOR_ADDRESS"):
        return False
    try:
        jax.distributed.initialize(cluster_detection_method=cluster_detection_method)
    except ValueError as e:
        if os.environ.get("JAX_COORDINATOR_ADDRESS") or not any(m in str(e) for m in _NO_CLUSTER):
            raise
        log.info("jaxpace: jax.distributed found no cluster (%s); running as one process.", e)
        return False
    except RuntimeError as e:
        if "must be called before" not in str(e):
            raise
        log.warning(
            "jaxpace: init_from_env() ran after the JAX backend started, so it cannot join a "
            "cluster; this process runs as jax.process_count()=%d process(es). Call "
            "`jaxpace.launch.init_from_env()` first in your program, before any JAX call.",
            jax.process_count(),
        )
        return False
    return True


@dataclasses.dataclass
class LaunchResult:
    """Outcome of `launch`: per-rank exit codes and captured output lines."""

    returncodes: list[int | None]
    output: list[list[str]]
    timed_out: bool
    failed_rank: int | None
    elapsed_s: float

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(rc == 0 for rc in self.returncodes)


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def launch(
    cmd: Sequence[str],
    *,
    num_processes: int,
    local_devices: int = 1,
    timeout_s: float | None = 600.0,
    env: dict[str, str] | None = None,
    stream: TextIO | None = sys.stdout,
    heartbeat_timeout_s: int = 10,
    init_timeout_s: int = 60,
    per_rank_env: Sequence[dict[str, str]] | None = None,
    cpu: bool = True,
) -> LaunchResult:
    """Runs `cmd` as `num_processes` local processes joined through `jax.distributed`.

    Each process gets `JAXPACE_*` variables (coordinator on 127.0.0.1 at a free
    port, its process id, device count, short timeouts) and, with `cpu=True`,
    `JAX_PLATFORMS=cpu`. Output lines are prefixed `[rank N]`. When a rank
    fails, the others are killed at once (by process group); on timeout or
    Ctrl-C every group is killed.

    Args:
      cmd: the command, e.g. `[sys.executable, "train.py"]`.
      num_processes: processes to start, `[1, 64]`.
      local_devices: CPU devices per process, `[1, 64]`.
      timeout_s: wall-clock limit for the whole job (None = no limit).
      env: extra environment for every rank.
      stream: where prefixed output goes (None = only captured).
      heartbeat_timeout_s: seconds after which JAX declares a silent peer dead.
      init_timeout_s: seconds `jax.distributed.initialize` waits for peers.
      per_rank_env: optional extra environment per rank (len == num_processes).
      cpu: force the CPU platform (simulated devices).

    Returns:
      A `LaunchResult`.

    Raises:
      ConfigError: bad arguments.
    """
    _check_launch_args(cmd, num_processes, local_devices, per_rank_env)
    num_processes, local_devices = int(num_processes), int(local_devices)
    base = _rank_env_base(
        num_processes, local_devices, env, init_timeout_s, heartbeat_timeout_s, cpu
    )
    start = time.monotonic()
    procs = _spawn(cmd, base, num_processes, per_rank_env)
    out: list[list[str]] = [[] for _ in range(num_processes)]
    readers = _start_readers(procs, out, stream)
    timed_out, failed = False, None
    try:
        timed_out, failed = _supervise(procs, start, timeout_s)
    except KeyboardInterrupt:
        for p in procs:
            _kill_group(p, signal.SIGKILL)
        raise
    finally:
        _stop_all(procs, readers, kill_first=timed_out or failed is not None)
    codes = [p.returncode for p in procs]
    if failed is None and not timed_out:
        bad = [r for r, c in enumerate(codes) if c != 0]
        failed = bad[0] if bad else None
    return LaunchResult(
        returncodes=codes,
        output=out,
        timed_out=timed_out,
        failed_rank=failed,
        elapsed_s=time.monotonic() - start,
    )


def _check_launch_args(cmd, num_processes, local_devices, per_rank_env) -> None:
    if not cmd:
        raise ConfigError(
            "`cmd` is empty: pass the command after `--`, e.g. "
            "`jaxpace launch -n 2 -- python train.py`."
        )
    check_number("num_processes", num_processes, lo=1, hi=64, integer=True)
    check_number("local_devices", local_devices, lo=1, hi=64, integer=True)
    if per_rank_env is not None and len(per_rank_env) != num_processes:
        raise ConfigError(
            f"`per_rank_env` must have one dict per process ({num_processes}), got {len(per_rank_env)}."
        )


def _rank_env_base(
    num_processes, local_devices, env, init_timeout_s, heartbeat_timeout_s, cpu
) -> dict[str, str]:
    """The environment every rank shares: coordinator, counts, short timeouts."""
    port = free_port()
    base = dict(os.environ)
    base.update(env or {})
    base.update(
        {
            _ENV["coordinator"]: f"127.0.0.1:{port}",
            _ENV["num_processes"]: str(num_processes),
            _ENV["local_devices"]: str(local_devices),
            _ENV["init_timeout"]: str(init_timeout_s),
            _ENV["heartbeat_timeout"]: str(heartbeat_timeout_s),
            "PYTHONUNBUFFERED": "1",
        }
    )
    if cpu:
        base["JAX_PLATFORMS"] = "cpu"
        base.pop("XLA_FLAGS", None)
    return base


def _spawn(cmd, base, num_processes, per_rank_env) -> list[subprocess.Popen]:
    """Starts every rank in its own process group (so a kill reaches its children)."""
    procs: list[subprocess.Popen] = []
    for rank in range(num_processes):
        e = dict(base)
        e[_ENV["process_id"]] = str(rank)
        if per_rank_env is not None:
            e.update(per_rank_env[rank])
        procs.append(
            subprocess.Popen(
                list(cmd),
                env=e,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                text=True,
                bufsize=1,
                errors="replace",
            )
        )
    return procs


def _start_readers(procs, out: list[list[str]], stream: TextIO | None) -> list[threading.Thread]:
    """One thread per rank that collects its output and echoes it prefixed `[rank N]`."""
    lock = threading.Lock()

    def emit(rank: int, line: str) -> None:
        with lock:
            out[rank].append(line.rstrip("\n"))
            if stream is not None:
                stream.write(f"[rank {rank}] {line.rstrip(chr(10))}\n")
                stream.flush()

    def pump(rank: int, f) -> None:
        try:
            for line in f:
                emit(rank, line)
        except (OSError, ValueError):
            pass

    readers = [
        threading.Thread(target=pump, args=(r, p.stdout), daemon=True) for r, p in enumerate(procs)
    ]
    for t in readers:
        t.start()
    return readers


def _supervise(procs, start: float, timeout_s: float | None) -> tuple[bool, int | None]:
    """Polls until all exit, one fails, or time runs out; returns `(timed_out, failed_rank)`."""
    while True:
        codes = [p.poll() for p in procs]
        bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            return False, bad[0]
        if all(c is not None for c in codes):
            return False, None
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            return True, None
        time.sleep(0.05)


def _stop_all(procs, readers, *, kill_first: bool) -> None:
    """Ends every rank (TERM, then KILL after 3 s when `kill_first`) and joins the readers."""
    if kill_first:
        for p in procs:
            if p.poll() is None:
                _kill_group(p, signal.SIGTERM)
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.05)
        for p in procs:
            if p.poll() is None:
                _kill_group(p, signal.SIGKILL)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _kill_group(p, signal.SIGKILL)
    for t in readers:
        t.join(timeout=5)


def launch_or_raise(cmd: Sequence[str], **kwargs) -> LaunchResult:
    """`launch`, raising `LaunchError` with the failing rank's last output lines."""
    res = launch(cmd, **kwargs)
    if not res.ok:
        raise LaunchError(describe_failure(res, kwargs.get("timeout_s")))
    return res


def describe_failure(res: LaunchResult, timeout_s: float | None) -> str:
    if res.timed_out:
        return (
            f"launch timed out after {timeout_s}s; every rank was killed. Raise `--timeout` "
            "if the job is slow rather than hung."
        )
    r = res.failed_rank if res.failed_rank is not None else 0
    tail = "\n".join(f"  {line}" for line in res.output[r][-25:])
    if res.returncodes[r] == STALL_EXIT_CODE:
        stalled = [i for i, c in enumerate(res.returncodes) if c == STALL_EXIT_CODE]
        return (
            f"rank {r} stalled (jaxpace on_stall='exit', exit code {STALL_EXIT_CODE}): it sat "
            f"in a collective past `stall_after_s`; ranks that stalled: {stalled}. The others "
            "were stopped. Its message names the process it was waiting for; stack dumps are "
            f"in stall-p{{i}}.json in the run directory (`jaxpace report`). Its last output:\n{tail}"
        )
    return f"rank {r} exited with code {res.returncodes[r]}; the others were stopped. Its last output:\n{tail}"
