"""`jaxpace launch` checks its output file and its JAX timeouts before any rank starts (issue 49 item 12).

Before: `--output-file FIFO` blocked in `open()` before any rank started,
past `--timeout`; `--heartbeat-timeout 0` and `-5` were accepted;
`--output-file /dev/full` gave an error blaming the command (`'echo'`).
Every wait is bounded by `subprocess.run(timeout=...)`; nothing asserts a duration.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jaxpace import launch as jl
from jaxpace.errors import ConfigError

PY = sys.executable


def _launch_cli(*args: str, timeout_s: float = 60, prefix=("-m", "jaxpace")):
    """`jaxpace launch -n 1 --timeout 20 ARGS` (`prefix`: how Python starts `jaxpace`)."""
    return subprocess.run(
        [PY, *prefix, "launch", "-n", "1", "--timeout", "20", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def _one_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    assert "[rank" not in proc.stdout, "a rank ran although the arguments were refused"
    return lines[0]


@pytest.mark.timeout(120)
def test_a_fifo_output_file_is_refused_before_any_rank_starts(tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    proc = _launch_cli("--output-file", str(fifo), "--", "echo", "hi")
    line = _one_line(proc, "`--output-file`", str(fifo), "FIFO")
    assert "'echo'" not in line
    with pytest.raises(ConfigError, match="FIFO"):
        jl.launch(["echo", "hi"], num_processes=1, stream=None, output_file=fifo)


@pytest.mark.timeout(60)
def test_a_fifo_with_a_reader_is_refused_too(tmp_path):
    """With a reader, a non-blocking open succeeds: the fstat check refuses it."""
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(ConfigError, match="`--output-file`.*FIFO"):
            jl.launch(["echo", "hi"], num_processes=1, stream=None, output_file=fifo)
        try:
            got = os.read(reader, 100)
        except BlockingIOError:
            got = b""
        assert got == b""
    finally:
        os.close(reader)


@pytest.mark.timeout(120)
def test_dev_full_as_output_file_blames_the_option_not_the_command():
    proc = _launch_cli("--output-file", "/dev/full", "--", "echo", "hi")
    line = _one_line(proc, "`--output-file`", "/dev/full", "a device node")
    assert "'echo'" not in line


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dangling", [False, True])
def test_a_symlinked_output_file_is_refused_and_its_target_untouched(tmp_path, dangling):
    target = tmp_path / "target.log"
    if not dangling:
        target.write_text("precious\n")
    link = tmp_path / "out.log"
    os.symlink(target, link)
    with pytest.raises(ConfigError, match="`--output-file`.*symlink"):
        jl.launch(["echo", "hi"], num_processes=1, stream=None, output_file=link)
    if dangling:
        assert not target.exists()
    else:
        assert target.read_text() == "precious\n"


@pytest.mark.timeout(60)
def test_a_regular_output_file_is_truncated_and_written(tmp_path):
    log = tmp_path / "out.log"
    log.write_text("an earlier, longer run's output\n" * 100)
    res = jl.launch(
        [PY, "-c", "print('hello')"], num_processes=1, stream=None, output_file=log, timeout_s=50
    )
    assert res.ok and res.output_file_error is None
    assert log.read_text() == "[rank 0] hello\n"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("value", ["0", "-5"])
def test_a_heartbeat_timeout_below_one_second_is_refused(value):
    proc = _launch_cli("--heartbeat-timeout", value, "--", PY, "-c", "pass")
    _one_line(proc, "`heartbeat_timeout_s`", "--heartbeat-timeout", value)
    with pytest.raises(ConfigError, match="heartbeat_timeout_s"):
        jl.launch([PY, "-c", "pass"], num_processes=1, stream=None, heartbeat_timeout_s=int(value))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("value", [0, -5, 1.5, float("nan"), True])
def test_an_init_timeout_below_one_second_or_not_whole_is_refused(value):
    with pytest.raises(ConfigError, match="init_timeout_s"):
        jl.launch([PY, "-c", "pass"], num_processes=1, stream=None, init_timeout_s=value)


# The limit is set inside the child (no `preexec_fn`); Python ignores SIGXFSZ, so a write
# past the limit fails with EFBIG, as one on a full disk fails with ENOSPC.
_FSIZE_LIMITED = (
    "import resource, runpy, sys; "
    "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096)); "
    "sys.argv = ['jaxpace', *sys.argv[1:]]; runpy.run_module('jaxpace', run_name='__main__')"
)


@pytest.mark.timeout(120)
def test_an_output_file_that_fills_up_is_reported_and_the_job_goes_on(tmp_path):
    log = tmp_path / "out.log"
    prog = "for i in range(2000): print(f'line {i} ' + 'x' * 40)"
    proc = _launch_cli(
        "--output-file", str(log), "--", PY, "-c", prog, prefix=("-c", _FSIZE_LIMITED)
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("[rank 0] line ") == 2000  # the console got every line
    warn = [x for x in proc.stderr.splitlines() if "warning" in x]
    assert len(warn) == 1, proc.stderr
    assert "`--output-file`" in warn[0] and str(log) in warn[0] and "File too large" in warn[0]
    assert os.path.getsize(log) <= 4096


@pytest.mark.parametrize("bad", ["-1", "601", "nan"])
def test_a_bad_keep_going_is_refused_with_one_line_naming_it(bad):
    _one_line(_launch_cli("--keep-going", bad, "--", PY, "-c", "print(1)"), "keep_going_s")


def test_keep_going_lets_the_other_ranks_finish_after_one_fails(tmp_path):
    """Rank 0 fails at once; rank 1 writes a file after 1 s. Without `--keep-going` it is
    stopped first (no file); with `--keep-going 30` it finishes (the file, and the launcher
    still reports rank 0's failure)."""
    code = (
        "import os, sys, time\n"
        "r = int(os.environ['JAXPACE_PROCESS_ID'])\n"
        "sys.exit(3) if r == 0 else None\n"
        f"time.sleep(1); open(r'{tmp_path}/done', 'w').close()\n"
    )
    res = jl.launch([PY, "-c", code], num_processes=2, timeout_s=30, stream=None)
    assert res.failed_rank == 0 and not (tmp_path / "done").exists()
    res = jl.launch([PY, "-c", code], num_processes=2, timeout_s=30, stream=None, keep_going_s=30)
    assert res.failed_rank == 0 and res.returncodes == [3, 0] and (tmp_path / "done").exists()
