"""Local multi-process launcher (`jaxpace launch`) and the helper a script calls to join."""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import TextIO

from jaxpace._validate import check_number
from jaxpace.errors import ConfigError, LaunchError
from jaxpace.launch.output import OutputSink, open_output_file, read_available
from jaxpace.runtime.watchdog import STALL_EXIT_CODE

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
    """Outcome of `launch`: per-rank exit codes and the last lines of each rank's output.

    `output[r]` keeps at most the last `tail_lines` lines (and 1 MiB) of rank
    `r`; `dropped_lines[r]` says how many earlier lines were let go (pass
    `output_file` to keep every line). `signal` is the signal number that
    stopped the launcher (SIGTERM, SIGHUP), forwarded to every rank, or None.
    `output_file_error` says why writing `output_file` stopped (a full disk),
    or is None; the job itself is not stopped for it.
    """

    returncodes: list[int | None]
    output: list[list[str]]
    timed_out: bool
    failed_rank: int | None
    elapsed_s: float
    dropped_lines: list[int] = dataclasses.field(default_factory=list)
    signal: int | None = None
    output_file_error: str | None = None

    @property
    def ok(self) -> bool:
        return (
            not self.timed_out and self.signal is None and all(rc == 0 for rc in self.returncodes)
        )


# Signals the launcher forwards to every rank's process group before it ends.
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_TAIL_BYTES = 1 << 20
_MAX_TIMEOUT_S = 366 * 24 * 3600.0


def _rank_argv(cmd: Sequence[str]) -> list[str]:
    """The argv that starts one rank: on Linux through `rank_exec.py`, so the rank gets
    SIGTERM when the launcher dies, even by SIGKILL; elsewhere the command itself.

    Raises:
      FileNotFoundError: the command is not found (as `subprocess.Popen` would raise).
    """
    cmd = list(cmd)
    if not sys.platform.startswith("linux"):
        return cmd
    exe = cmd[0]
    found = shutil.which(exe) if os.sep not in exe else (exe if os.access(exe, os.X_OK) else None)
    if found is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), exe)
    wrapper = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_exec.py")
    return [sys.executable, "-I", "-S", wrapper, str(os.getpid()), *cmd]


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(proc: subprocess.Popen) -> bool:
    """Whether any running process is left in the rank's process group (helpers included).

    Killed helpers whose new parent has not reaped them yet (zombies) do not count.
    """
    try:
        os.killpg(proc.pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True  # no /proc: the signal test is all there is
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == proc.pid and fields[0] not in (b"Z", b"X"):
            return True
    return False


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
    grace_s: float = 5.0,
    tail_lines: int = 200,
    output_file: str | os.PathLike | None = None,
    keep_going_s: float = 0.0,
) -> LaunchResult:
    """Runs `cmd` as `num_processes` local processes joined through `jax.distributed`.

    Each process gets `JAXPACE_*` variables (coordinator on 127.0.0.1 at a free
    port, its process id, device count, short timeouts) for `init_from_env`,
    and the variables with which a plain `jax.distributed.initialize()` (no
    arguments, no jaxpace) joins the same job: `JAX_COORDINATOR_ADDRESS` and
    JAX's Open MPI cluster variables; with `cpu=True` also
    `JAX_PLATFORMS=cpu` and `JAX_NUM_CPU_DEVICES=local_devices`
    (docs/multihost.md lists them all). Each rank runs in its own process group. Output is
    passed on in whole lines prefixed `[rank N]` (stdout and stderr are read
    separately, so one never splits a line of the other).

    The launcher never leaves a process behind: when a rank fails, on timeout,
    and on SIGTERM, SIGINT or SIGHUP (forwarded to every rank's group), it
    waits up to `grace_s` and then kills every group; when all ranks succeed it
    still ends what they left in their groups (helpers holding the output pipe)
    the same way. Reading output never blocks: it is multiplexed with the
    supervision loop, so `timeout_s` holds even when a rank's helper keeps the
    pipe open.

    Args:
      cmd: the command, e.g. `[sys.executable, "train.py"]`.
      num_processes: processes to start, `[1, 64]`.
      local_devices: CPU devices per process, `[1, 64]`.
      timeout_s: wall-clock limit for the whole job, > 0 and finite (None = no limit).
      env: extra environment for every rank.
      stream: where prefixed output goes (None = only the kept tail).
      heartbeat_timeout_s: seconds after which JAX declares a silent peer dead, an
        integer `[1, 366 days]`.
      init_timeout_s: seconds `jax.distributed.initialize` waits for peers, an
        integer `[1, 366 days]`.
      per_rank_env: optional extra environment per rank (len == num_processes).
      cpu: force the CPU platform (simulated devices).
      grace_s: seconds between forwarding a stop signal and killing, `[0, 600]`.
      tail_lines: lines kept per rank in `LaunchResult.output`, `[1, 100000]`.
      output_file: also write every prefixed line here (None = no file): a regular
        file (truncated) or a new path; anything else is refused before a rank starts.
      keep_going_s: when a rank fails, let the others run up to this many more seconds
        (they may end themselves: JAX's heartbeat abort, their own error handling)
        before they are stopped, `[0, 600]`; 0 (default): stop them at once.
        `timeout_s` still holds.

    Returns:
      A `LaunchResult`.

    Raises:
      ConfigError: bad arguments.
      KeyboardInterrupt: on SIGINT, after every rank was stopped.
    """
    _check_launch_args(cmd, num_processes, local_devices, per_rank_env)
    _check_run_args(timeout_s, grace_s, tail_lines)
    check_number("keep_going_s", keep_going_s, lo=0.0, hi=600.0)
    _check_jax_timeouts(heartbeat_timeout_s, init_timeout_s)
    num_processes, local_devices = int(num_processes), int(local_devices)
    base = _rank_env_base(
        num_processes, local_devices, env, init_timeout_s, heartbeat_timeout_s, cpu
    )
    log = open_output_file(output_file) if output_file is not None else None
    sink = OutputSink(
        num_processes, stream, log, tail_lines=int(tail_lines), tail_bytes=_TAIL_BYTES
    )
    start = time.monotonic()
    try:
        with _ForwardedSignals() as caught:
            procs = _spawn(cmd, base, num_processes, per_rank_env)
            job = _Job(procs, sink, caught)
            try:
                timed_out, failed = job.supervise(start, timeout_s, float(keep_going_s))
            finally:
                job.shutdown(float(grace_s))
    finally:
        if log is not None:
            try:
                log.close()
            except OSError as e:  # its last buffered lines could not be written (full disk)
                sink.log_error = sink.log_error or e.strerror or str(e)
    if caught and caught[0] == signal.SIGINT:
        raise KeyboardInterrupt
    codes = [p.returncode for p in procs]
    if failed is None and not timed_out:
        bad = [r for r, c in enumerate(codes) if c != 0]
        failed = bad[0] if bad else None
    return LaunchResult(
        returncodes=codes,
        output=[list(t.lines) for t in sink.tails],
        timed_out=timed_out,
        failed_rank=failed,
        elapsed_s=time.monotonic() - start,
        dropped_lines=[t.dropped for t in sink.tails],
        signal=caught[0] if caught else None,
        output_file_error=(
            f"writing `--output-file` {os.fspath(output_file)!r} failed ({sink.log_error}); "
            "lines after the failure are not in it"
            if sink.log_error
            else None
        ),
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


def _check_run_args(timeout_s, grace_s, tail_lines) -> None:
    if timeout_s is not None:
        _check_with_hint(
            "timeout_s",
            timeout_s,
            "The job timeout (`--timeout`) is the wall-clock limit in seconds, e.g. "
            "`--timeout 600`; it must be finite and above 0.",
            lo=0.0,
            hi=_MAX_TIMEOUT_S,
            lo_open=True,
        )
    check_number("grace_s", grace_s, lo=0.0, hi=600.0)
    check_number("tail_lines", tail_lines, lo=1, hi=100_000, integer=True)


def _check_jax_timeouts(heartbeat_timeout_s, init_timeout_s) -> None:
    """Both are whole seconds of at least 1 (JAX took 0 and -5 and misbehaved later)."""
    whole = dict(lo=1, hi=int(_MAX_TIMEOUT_S), integer=True)
    _check_with_hint(
        "heartbeat_timeout_s",
        heartbeat_timeout_s,
        "`--heartbeat-timeout` is the seconds after which JAX declares a silent peer dead: "
        "a whole number of at least 1, e.g. `--heartbeat-timeout 10`.",
        **whole,
    )
    _check_with_hint(
        "init_timeout_s",
        init_timeout_s,
        "It is the seconds `jax.distributed.initialize` waits for every peer: a whole "
        "number of at least 1, e.g. 60.",
        **whole,
    )


def _check_with_hint(name: str, value, hint: str, **bounds) -> None:
    """`check_number(name, value, **bounds)`, its error followed by `hint` (what the
    setting is, with an example)."""
    try:
        check_number(name, value, **bounds)
    except ConfigError as e:
        raise ConfigError(f"{e} {hint}") from None


def _rank_env_base(
    num_processes, local_devices, env, init_timeout_s, heartbeat_timeout_s, cpu
) -> dict[str, str]:
    """The environment every rank shares: coordinator, counts, short timeouts.

    Besides `JAXPACE_*` (read by `init_from_env`), the variables JAX itself
    reads, so that a program calling `jax.distributed.initialize()` with no
    arguments joins the job without importing jaxpace: see `_rank_env`.
    """
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
            # Read by `jax.distributed.initialize()` itself.
            "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
            # JAX's Open MPI cluster detection (jax/_src/clusters/ompi_cluster.py) gives a
            # bare `initialize()` the process count and id; see `_rank_env`.
            _OMPI_URI: f"0.0;tcp://127.0.0.1:{port}",
            "OMPI_COMM_WORLD_SIZE": str(num_processes),
        }
    )
    if cpu:
        base["JAX_PLATFORMS"] = "cpu"
        base["JAX_NUM_CPU_DEVICES"] = str(local_devices)  # `--local-devices`, for any program
        base.pop("XLA_FLAGS", None)
    return base


# JAX's Open MPI cluster detection keys on this variable's presence; its address part is
# only parsed when `JAX_COORDINATOR_ADDRESS` is unset, and then names the same coordinator.
_OMPI_URI = "OMPI_MCA_orte_hnp_uri"


def _rank_env(rank: int) -> dict[str, str]:
    """The variables that differ between ranks: `JAXPACE_PROCESS_ID` and the Open MPI rank.

    Why Open MPI's variables: in jax 0.10.2 a bare `jax.distributed.initialize()`
    takes the process count and id only from a detected cluster, and JAX
    checks Open MPI first, so an enclosing SLURM allocation's variables (left
    as they are, for the tools that need them) cannot take over. SLURM's would
    have to fake a job id and a node list, and overwrite the real ones under
    `salloc`; Kubernetes and Cloud TPU detection query a server. The local rank
    is the rank (one host), which JAX also uses as the visible GPU
    (`jax_cuda_visible_devices`) when the ranks run on accelerators (`cpu=False`).
    """
    return {
        _ENV["process_id"]: str(rank),
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(rank),
    }


def _spawn(cmd, base, num_processes, per_rank_env) -> list[subprocess.Popen]:
    """Starts every rank in its own process group (so a kill reaches its children).

    If starting one fails, the ranks already started are killed before the
    error propagates.
    """
    procs: list[subprocess.Popen] = []
    argv = _rank_argv(cmd)
    try:
        for rank in range(num_processes):
            e = dict(base)
            e.update(_rank_env(rank))
            if per_rank_env is not None:
                e.update(per_rank_env[rank])
            procs.append(
                subprocess.Popen(
                    argv,
                    env=e,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    bufsize=0,
                )
            )
    except BaseException:
        for p in procs:
            _kill_group(p, signal.SIGKILL)
            p.wait()
            p.stdout.close()
            p.stderr.close()
        raise
    return procs


class _ForwardedSignals:
    """Catches SIGTERM/SIGINT/SIGHUP while the job runs (main thread only); restores after.

    The caught signal numbers are appended to the list `__enter__` returns; the
    supervision loop forwards the first to every rank's process group.
    """

    def __enter__(self) -> list[int]:
        self.caught: list[int] = []
        self.previous: dict[int, object] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in FORWARDED_SIGNALS:
                try:
                    self.previous[sig] = signal.signal(sig, self._handle)
                except (ValueError, OSError):
                    pass
        return self.caught

    def _handle(self, signum, frame) -> None:
        self.caught.append(signum)

    def __exit__(self, *exc) -> None:
        for sig, prev in self.previous.items():
            signal.signal(sig, prev)


class _Job:
    """The running ranks: one loop reads their output and watches their exits."""

    def __init__(self, procs: list[subprocess.Popen], sink: OutputSink, caught: list[int]):
        self.procs = procs
        self.sink = sink
        self.caught = caught
        self.sel = selectors.DefaultSelector()
        for rank, p in enumerate(procs):
            for key, f in enumerate((p.stdout, p.stderr)):
                os.set_blocking(f.fileno(), False)
                self.sel.register(f, selectors.EVENT_READ, (rank, key))

    def pump(self, wait_s: float) -> None:
        """Passes on whatever output arrives within `wait_s`; never blocks longer."""
        if not self.sel.get_map():
            time.sleep(wait_s)
            return
        for sk, _ in self.sel.select(timeout=wait_s):
            rank, key = sk.data
            data = read_available(sk.fileobj)
            if data is None:
                continue
            if data:
                self.sink.feed(rank, key, data)
            else:
                self.sel.unregister(sk.fileobj)
                sk.fileobj.close()
                self.sink.close(rank, key)

    def supervise(
        self, start: float, timeout_s: float | None, keep_going_s: float = 0.0
    ) -> tuple[bool, int | None]:
        """Runs until all exit, one fails (and `keep_going_s` more seconds have passed or
        the rest exited too), a signal comes or time runs out.

        Returns `(timed_out, failed_rank)`: the first rank that failed.
        """
        failed: int | None = None
        failed_at = 0.0
        while True:
            self.pump(0.05)
            if self.caught:
                return False, failed
            codes = [p.poll() for p in self.procs]
            bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if bad and failed is None:
                failed, failed_at = bad[0], time.monotonic()
            if failed is not None and time.monotonic() - failed_at >= keep_going_s:
                return False, failed
            if all(c is not None for c in codes):
                return False, failed
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                return True, None

    def shutdown(self, grace_s: float) -> None:
        """Stops every process group, whatever happened: signal, wait `grace_s`, kill.

        The first caught signal is forwarded (SIGTERM otherwise); a second
        signal during the grace period kills at once. Output is read until the
        pipes close or one second after the kill, whichever is first.
        """
        sig = self.caught[0] if self.caught else signal.SIGTERM
        n_caught = len(self.caught)
        for p in self.procs:
            _kill_group(p, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and len(self.caught) == n_caught:
            self.pump(0.05)
            [p.poll() for p in self.procs]
            if not any(_group_alive(p) for p in self.procs):
                break
        for p in self.procs:
            _kill_group(p, signal.SIGKILL)
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 1.0
        while self.sel.get_map() and time.monotonic() < deadline:
            self.pump(0.05)
        for sk in list(self.sel.get_map().values()):
            self.sel.unregister(sk.fileobj)
            sk.fileobj.close()
        self.sel.close()
        self.sink.flush_all()


def launch_or_raise(cmd: Sequence[str], **kwargs) -> LaunchResult:
    """`launch`, raising `LaunchError` with the failing rank's last output lines."""
    res = launch(cmd, **kwargs)
    if not res.ok:
        raise LaunchError(describe_failure(res, kwargs.get("timeout_s")))
    return res


def describe_failure(res: LaunchResult, timeout_s: float | None) -> str:
    """One message saying why the job ended: timeout, signal, stall or a failed rank."""
    if res.timed_out:
        return (
            f"launch timed out after {timeout_s}s; every rank was killed. Raise `--timeout` "
            "if the job is slow rather than hung."
        )
    if res.signal is not None:
        return (
            f"stopped by {signal.Signals(res.signal).name}: it was forwarded to every rank's "
            "process group, and what was still running after the grace period was killed."
        )
    r = res.failed_rank if res.failed_rank is not None else 0
    tail = "\n".join(f"  {line}" for line in res.output[r][-25:])
    if res.dropped_lines and res.dropped_lines[r]:
        tail = (
            f"  ({res.dropped_lines[r]} earlier lines not kept; `--output-file` keeps all)\n" + tail
        )
    if res.returncodes[r] == STALL_EXIT_CODE:
        stalled = [i for i, c in enumerate(res.returncodes) if c == STALL_EXIT_CODE]
        return (
            f"rank {r} stalled (jaxpace on_stall='exit', exit code {STALL_EXIT_CODE}): it sat "
            f"in a collective past `stall_after_s`; ranks that stalled: {stalled}. The others "
            "were stopped. Its message names the process it was waiting for; stack dumps are "
            f"in stall-p{{i}}.json in the run directory (`jaxpace report`). Its last output:\n{tail}"
        )
    return f"rank {r} exited with code {res.returncodes[r]}; the others were stopped. Its last output:\n{tail}"
