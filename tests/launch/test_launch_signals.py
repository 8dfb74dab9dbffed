"""`jaxpace launch` never orphans a process, validates `--timeout`, bounds its output, keeps lines whole.

The ranks here are plain `python -c` programs (no JAX): each prints the PIDs
it owns (itself and a helper it started) and the tests check exactly those
PIDs after the launcher is gone, never process names.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from jaxpace import launch as jl

PY = sys.executable
# A rank that starts a helper (same process group, holding the output pipe),
# says which PIDs are its own, then sleeps (or exits at once when told).
RANK = (
    "import os, subprocess, sys, time\n"
    "h = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
    "print('PIDS', os.getpid(), h.pid, flush=True)\n"
    "if sys.argv[1] == 'exit': os._exit(0)\n"
    "time.sleep(120)\n"
)


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie waiting to be reaped counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def _start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [PY, "-m", "jaxpace", "launch", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _read_pids(proc: subprocess.Popen, n: int, deadline_s: float = 120.0) -> list[int]:
    """The PIDs the launched ranks report (rank and helper), from `n` ranks."""
    pids: list[int] = []
    end = time.monotonic() + deadline_s
    seen = 0
    while seen < n and time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            break
        if " PIDS " in line:
            pids += [int(x) for x in line.split("PIDS", 1)[1].split()]
            seen += 1
    assert seen == n, f"only {seen} of {n} ranks reported their PIDs"
    return pids


def _wait_dead(pids: list[int], bound_s: float = 30.0) -> list[int]:
    end = time.monotonic() + bound_s
    while time.monotonic() < end and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def _end(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()
    proc.stdout.close()
    proc.stderr.close()


def _cleanup(pids: list[int]) -> None:
    for p in pids:
        if _alive(p):
            os.kill(p, signal.SIGKILL)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_the_launcher_stops_every_rank_and_helper(sig):
    """Issue #32 item 1: SIGTERM (SLURM, Kubernetes, `timeout`) left every rank alive with PPID 1."""
    proc = _start(["-n", "3", "--timeout", "600", "--", PY, "-c", RANK, "sleep"])
    pids: list[int] = []
    try:
        pids = _read_pids(proc, 3)
        assert all(_alive(p) for p in pids)
        proc.send_signal(sig)
        rc = proc.wait(timeout=60)
        left = _wait_dead(pids)
        assert left == [], f"still running after the launcher ended on {sig.name}: {left}"
        assert rc == 128 + sig, (rc, proc.stderr.read())
        err = proc.stderr.read()
        assert "Traceback" not in err
        if sig != signal.SIGINT:
            assert sig.name in err
    finally:
        _end(proc)
        _cleanup(pids)


@pytest.mark.timeout(200)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_launcher_killed_by_sigkill_takes_its_ranks_with_it():
    """SIGKILL (the OOM killer, a scheduler's hard kill) gives the launcher no chance to
    forward anything: each rank gets SIGTERM from the kernel when its launcher dies. (A
    helper a rank started itself is outside that: it is the rank's to end.)"""
    proc = _start(["-n", "3", "--timeout", "600", "--", PY, "-c", RANK, "sleep"])
    pids: list[int] = []
    try:
        pids = _read_pids(proc, 3)
        ranks = pids[0::2]  # each line: the rank's PID, then its helper's
        assert all(_alive(p) for p in ranks)
        proc.kill()
        proc.wait(timeout=60)
        left = _wait_dead(ranks)
        assert left == [], f"ranks still running after their launcher was SIGKILLed: {left}"
    finally:
        _end(proc)
        _cleanup(pids)


def test_a_missing_command_is_one_line_and_exit_2():
    proc = subprocess.run(
        [PY, "-m", "jaxpace", "launch", "-n", "2", "--", "no_such_command_for_jaxpace"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "jaxpace launch: cannot open or run 'no_such_command_for_jaxpace': "
        "No such file or directory"
    ]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the rank wrapper is Linux's")
def test_the_rank_wrapper_does_not_start_a_rank_whose_launcher_is_gone(tmp_path):
    """`jaxpace.launch.rank_exec` checks its parent after the prctl: a launcher that died in between (its
    SIGTERM would never come) means the rank is not started at all."""
    from jaxpace.launch import rank_exec as _rank_exec

    marker = tmp_path / "started"
    rank = [PY, "-c", f"open({str(marker)!r}, 'w')"]
    wrapper = [PY, "-I", "-S", _rank_exec.__file__]
    gone = subprocess.run([*wrapper, str(os.getpid() + 999_999), *rank], timeout=60)
    assert gone.returncode == 128 + signal.SIGTERM and not marker.exists()
    alive = subprocess.run([*wrapper, str(os.getpid()), *rank], timeout=60)  # the control
    assert alive.returncode == 0 and marker.exists()


@pytest.mark.timeout(200)
def test_helpers_of_finished_ranks_are_ended_and_do_not_delay_success():
    """Issue #32 item 2: helpers left by ranks that exited 0 outlived the launcher (41 s, rc 0)."""
    proc = _start(["-n", "3", "--timeout", "120", "--", PY, "-c", RANK, "exit"])
    pids: list[int] = []
    try:
        pids = _read_pids(proc, 3)
        rc = proc.wait(timeout=150)
        assert rc == 0, proc.stderr.read()
        left = _wait_dead(pids)
        assert left == [], f"helpers outlived a successful launch: {left}"
    finally:
        _end(proc)
        _cleanup(pids)


@pytest.mark.timeout(120)
def test_a_helper_outside_the_group_cannot_hold_the_launcher_past_its_timeout():
    """A helper in its own session keeps the pipe open; the timeout still ends the launch."""
    escapee = (
        "import os, subprocess, sys, time\n"
        "h = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(90)'],"
        " start_new_session=True)\n"
        "print('PIDS', os.getpid(), flush=True)\n"
        "print('ESCAPED', h.pid, flush=True)\n"
        "time.sleep(90)\n"
    )
    out: list[str] = []
    t0 = time.monotonic()
    try:
        res = jl.launch([PY, "-c", escapee], num_processes=1, timeout_s=3, grace_s=1, stream=None)
        out = res.output[0]
        assert res.timed_out
        # Generous bound that only guards against a hang (the old readers joined 5 s each).
        assert time.monotonic() - t0 < 60
    finally:
        for line in out:
            if line.startswith("ESCAPED"):
                _cleanup([int(line.split()[1])])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_a_bad_timeout_is_refused_with_one_line(value):
    """Issue #32 item 3: `--timeout nan` never fired; `-1` and `0` timed out at once."""
    proc = subprocess.run(
        [PY, "-m", "jaxpace", "launch", "-n", "1", "--timeout", value, "--", PY, "-c", "pass"],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "`timeout_s`" in lines[0] and "--timeout" in lines[0], lines
    assert "[rank" not in proc.stdout
    with pytest.raises(jl.ConfigError, match="timeout_s"):
        jl.launch([PY, "-c", "pass"], num_processes=1, timeout_s=float(value), stream=None)


@pytest.mark.timeout(120)
def test_kept_output_is_a_bounded_tail_and_the_file_keeps_everything(tmp_path):
    """Issue #32 item 4: the launcher kept every line (600 MB of output -> 1.17 GB RSS)."""
    n = 20_000
    prog = (
        "import sys\n"
        f"for i in range({n}): sys.stdout.write(f'line {{i}} ' + 'x' * 100 + '\\n')\n"
        "sys.stdout.write('y' * 200000)\n"
    )
    log = tmp_path / "launch.log"
    res = jl.launch(
        [PY, "-c", prog],
        num_processes=1,
        timeout_s=100,
        stream=None,
        tail_lines=50,
        output_file=log,
    )
    assert res.ok
    kept = res.output[0]
    assert len(kept) == 50
    assert res.dropped_lines[0] == n + 4 - 50  # 200,000 bytes -> 4 pieces of <= 64 KiB
    assert kept[-5].startswith(f"line {n - 1} ")
    text = log.read_text()
    assert text.count("\n") == n + 4
    assert text.count("y") == 200000
    assert all(len(line) <= 64 * 1024 + 16 for line in text.splitlines())


@pytest.mark.timeout(120)
def test_lines_are_prefixed_whole_even_when_stderr_writes_mid_line():
    """Issue #26 item 9: `[rank 1] 6 is connected to 7 peer ranks` (a line spliced into another)."""
    prog = (
        "import os, time\n"
        "os.write(1, b'stdout begins ')\n"
        "time.sleep(0.3)\n"
        "os.write(2, b'a log line from stderr\\n')\n"
        "time.sleep(0.3)\n"
        "os.write(1, b'and ends\\n')\n"
    )
    proc = subprocess.run(
        [PY, "-m", "jaxpace", "launch", "-n", "2", "--timeout", "100", "--", PY, "-c", prog],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for rank in (0, 1):
        assert f"[rank {rank}] stdout begins and ends" in lines, lines
        assert f"[rank {rank}] a log line from stderr" in lines, lines
    assert all(line.startswith("[rank ") for line in lines), lines
