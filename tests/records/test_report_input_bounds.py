"""`jaxpace report` bounds its input: declared sizes, file kinds, file sizes (issue #32 items 5 and 8).

Each case runs the real command in a subprocess with a 2 GiB address-space
limit and a timeout, so a regression fails (MemoryError traceback, hang)
instead of taking the machine down.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxpace.errors import RecordsError
from jaxpace.records.synthetic import synthetic_run
from jaxpace.report import load_records

LIMIT = 2 << 30


# The limit is set inside the child (no `preexec_fn`: forking a process that runs JAX's
# threads warns, and the suite turns warnings into errors).
_LIMITED = (
    "import resource, runpy, sys; "
    f"resource.setrlimit(resource.RLIMIT_AS, ({LIMIT}, {LIMIT})); "
    "sys.argv = ['jaxpace', *sys.argv[1:]]; runpy.run_module('jaxpace', run_name='__main__')"
)


def _report(run: Path, timeout_s: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _LIMITED, "report", str(run)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def _run_dir(tmp_path: Path, processes: int = 2) -> Path:
    run = tmp_path / "run"
    synthetic_run(num_ranks=processes, num_steps=40).write_jsonl(run)
    return run


def _one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("count", [10**8, 10**9])
def test_a_huge_declared_process_count_is_refused_fast_and_small(tmp_path, count):
    """Item 5: `process_count` 1e8 built `set(range(1e8))` (12 GB); 1e9 gave a MemoryError traceback."""
    run = _run_dir(tmp_path)
    for f in sorted(run.glob("records-p*.jsonl")):
        lines = f.read_text().splitlines()
        head = json.loads(lines[0])
        head["process_count"] = count
        f.write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    _one_line_error(_report(run), "`process_count`", str(count))


@pytest.mark.timeout(60)
def test_a_process_index_outside_the_declared_count_is_refused(tmp_path):
    run = _run_dir(tmp_path)
    f = run / "records-p1.jsonl"
    lines = f.read_text().splitlines()
    head = json.loads(lines[0])
    head["process_index"] = 7
    f.write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    with pytest.raises(RecordsError, match="`process_index` is 7"):
        load_records(run)


@pytest.mark.timeout(200)
def test_a_fifo_among_the_records_is_refused_not_waited_on(tmp_path):
    """Item 8: a FIFO named `records-p1.jsonl` hung `jaxpace report` in `open()`."""
    run = _run_dir(tmp_path)
    (run / "records-p1.jsonl").unlink()
    os.mkfifo(run / "records-p1.jsonl")
    _one_line_error(_report(run), "records-p1.jsonl", "FIFO")
    _one_line_error(_report(run / "records-p1.jsonl"), "FIFO")


@pytest.mark.timeout(200)
def test_a_stall_file_linked_to_dev_zero_is_refused_not_read_forever(tmp_path):
    """Item 8: `stall-p0.json -> /dev/zero` was read without bound (`read_text()`)."""
    run = _run_dir(tmp_path)
    os.symlink("/dev/zero", run / "stall-p0.json")
    _one_line_error(_report(run), "stall-p0.json", "character device")


@pytest.mark.timeout(200)
def test_a_fifo_or_device_where_the_report_writes_is_refused_not_waited_on(tmp_path):
    """A FIFO named `report.html` in the run directory hung the report in `open(..., "w")`."""
    run = _run_dir(tmp_path)
    os.mkfifo(run / "report.html")
    _one_line_error(_report(run), "report.html", "FIFO", "--html")
    os.unlink(run / "report.html")
    os.symlink("/dev/null", run / "trace.json")
    _one_line_error(_report(run), "trace.json", "character device", "--trace")


@pytest.mark.timeout(60)
def test_oversized_and_special_files_are_refused_by_the_reader(tmp_path):
    from jaxpace.records.safe_io import open_regular, read_capped

    big = tmp_path / "stall-p0.json"
    big.write_bytes(b" " * 2048)
    with pytest.raises(RecordsError, match="larger than 1024 bytes"):
        read_capped(big, "stall record", 1024)
    assert read_capped(big, "stall record", 4096) == b" " * 2048
    with pytest.raises(RecordsError, match="a directory"):
        open_regular(tmp_path, "records file")
    with pytest.raises(RecordsError, match="cannot read records file"):
        open_regular(tmp_path / "missing", "records file")
