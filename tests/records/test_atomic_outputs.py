"""Every file jaxpace writes goes through one atomic writer (issue 49 item 11).

Before: the report wrote in place (`Path.write_text`): on a full disk the
earlier `report.html` became a truncated file and the error read "No space left
on device: None"; a `report.html` that is a symlink was written through, and a
dangling one created its target. Now `records.safe_io.write_atomic` writes a
temporary file beside the target and renames it; it refuses symlinks and
special files, and a failed write leaves the earlier file whole.

A full disk is made two real ways: the temporary file's descriptor is pointed
at `/dev/full` (the kernel answers ENOSPC to the writer's own flush), and, for
the command end to end, a child process runs under `RLIMIT_FSIZE` (the kernel
answers EFBIG to the write of `report.html`).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from jaxpace.records import format as record_format
from jaxpace.records import safe_io, stall
from jaxpace.records.synthetic import synthetic_run
from jaxpace.report import analyze, write_html, write_json, write_trace
from jaxpace.sim._record_writer import write_records

OLD = "<!DOCTYPE html><p>the earlier, good report</p>\n"


@pytest.fixture
def full_disk(monkeypatch):
    """Call it to fill the disk: from then on every temporary file `write_atomic` makes is
    created, but writes to it go to /dev/full."""
    real = tempfile.mkstemp

    def mkstemp_on_a_full_disk(*args, **kwargs):
        fd, name = real(*args, **kwargs)
        full = os.open("/dev/full", os.O_WRONLY)
        os.dup2(full, fd)
        os.close(full)
        return fd, name

    return lambda: monkeypatch.setattr(safe_io.tempfile, "mkstemp", mkstemp_on_a_full_disk)


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    synthetic_run(num_ranks=2, num_steps=40).write_jsonl(run)
    return run


def _leftovers(d: Path) -> list[str]:
    return [p.name for p in d.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.timeout(60)
def test_a_full_disk_leaves_the_earlier_file_whole_and_names_path_and_error(tmp_path, full_disk):
    target = tmp_path / "report.html"
    target.write_text(OLD)
    full_disk()
    with pytest.raises(OSError) as info:
        safe_io.write_atomic(target, "<html>" + "x" * 100_000, what="HTML report", flag="--html")
    assert info.value.errno == errno.ENOSPC
    msg = str(info.value)
    assert str(target) in msg and "No space left on device" in msg and "--html" in msg
    assert "None" not in msg
    assert target.read_text() == OLD
    assert _leftovers(tmp_path) == []


@pytest.mark.timeout(60)
def test_every_report_output_on_a_full_disk_keeps_the_earlier_file(tmp_path, full_disk):
    run = _run(tmp_path)
    report = analyze(run)
    full_disk()
    for name, write in [
        ("report.html", lambda p: write_html(report, p)),
        ("trace.json", lambda p: write_trace(report, p)),
        ("report.json", lambda p: write_json(report, p)),
        ("records-p0.jsonl", lambda p: record_format.write_jsonl(p, [{"type": "header"}])),
        ("stall-p0.json", lambda p: stall.write(str(p.parent), 0, {"stacks": "x" * 10_000})),
    ]:
        out = tmp_path / "out" / name
        out.parent.mkdir(exist_ok=True)
        out.write_text(OLD)
        with pytest.raises(OSError, match="No space left on device") as info:
            write(out)
        assert str(out) in str(info.value), name
        assert out.read_text() == OLD, name
    assert _leftovers(tmp_path / "out") == []


# The limit is set inside the child (no `preexec_fn`: forking a process that runs JAX's
# threads warns). Python ignores SIGXFSZ, so a write past the limit fails with EFBIG.
_FSIZE_LIMITED = (
    "import resource, runpy, sys; "
    "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096)); "
    "sys.argv = ['jaxpace', *sys.argv[1:]]; runpy.run_module('jaxpace', run_name='__main__')"
)


@pytest.mark.timeout(200)
def test_jaxpace_report_that_cannot_write_keeps_the_earlier_report(tmp_path):
    """The real command, the real kernel error: the HTML is larger than the file-size limit."""
    run = _run(tmp_path)
    (run / "report.html").write_text(OLD)
    proc = subprocess.run(
        [sys.executable, "-c", _FSIZE_LIMITED, "report", str(run)],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert str(run / "report.html") in err[0] and "File too large" in err[0], err[0]
    assert "`--html`" in err[0], err[0]
    assert "None" not in err[0]
    assert (run / "report.html").read_text() == OLD
    assert _leftovers(run) == []


@pytest.mark.timeout(200)
@pytest.mark.parametrize("name", ["report.html", "trace.json"])
@pytest.mark.parametrize("dangling", [False, True])
def test_a_symlinked_report_output_is_refused_and_its_target_untouched(tmp_path, name, dangling):
    run = _run(tmp_path)
    target = tmp_path / "elsewhere.txt"
    if not dangling:
        target.write_text("precious\n")
    os.symlink(target, run / name)
    proc = subprocess.run(
        [sys.executable, "-m", "jaxpace", "report", str(run)],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1, err
    flag = "--html" if name == "report.html" else "--trace"
    assert name in err[0] and "symlink" in err[0] and flag in err[0], err[0]
    if dangling:
        assert "dangling" in err[0]
        assert not target.exists(), "a dangling link's target was created"
    else:
        assert target.read_text() == "precious\n"
    assert os.path.islink(run / name)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dangling", [False, True])
def test_every_writer_refuses_a_symlink(tmp_path, dangling):
    run = _run(tmp_path)
    report = analyze(run)
    target = tmp_path / "target.txt"
    if not dangling:
        target.write_text("precious\n")
    out = tmp_path / "out"
    out.mkdir()
    writers = {
        "report.html": lambda p: write_html(report, p),
        "trace.json": lambda p: write_trace(report, p),
        "report.json": lambda p: write_json(report, p),
        "stall-p0.json": lambda p: stall.write(str(out), 0, {"x": 1}),
        "records-p0.parquet": lambda p: write_records(synthetic_run(num_ranks=2, num_steps=4), out),
        "records-p1.jsonl": lambda p: write_records(
            synthetic_run(num_ranks=2, num_steps=4), out, format="jsonl"
        ),
    }
    for name, write in writers.items():
        link = out / name
        os.symlink(target, link)
        with pytest.raises(FileExistsError, match="it is a symlink to") as info:
            write(link)
        assert str(link) in str(info.value)
        assert os.path.islink(link), name
        if dangling:
            assert not target.exists(), f"{name}: the dangling link's target was created"
        else:
            assert target.read_text() == "precious\n", name
        link.unlink()
    assert _leftovers(out) == []


@pytest.mark.timeout(60)
def test_the_atomic_writer_keeps_permissions_and_replaces_a_regular_file(tmp_path):
    p = tmp_path / "a.json"
    p.write_text("old")
    os.chmod(p, 0o600)
    safe_io.write_atomic(p, json.dumps({"a": 1}), what="JSON")
    assert json.loads(p.read_text()) == {"a": 1}
    assert os.stat(p).st_mode & 0o777 == 0o600
    safe_io.write_atomic(tmp_path / "b.bin", b"\x00\x01", what="bytes")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert os.stat(tmp_path / "b.bin").st_mode & 0o777 == 0o644
    assert _leftovers(tmp_path) == []


@pytest.mark.timeout(200)
def test_simulate_refuses_a_symlinked_output_before_simulating(tmp_path):
    target = tmp_path / "target.json"
    target.write_text("precious\n")
    link = tmp_path / "sim.json"
    os.symlink(target, link)
    proc = subprocess.run(
        [sys.executable, "-m", "jaxpace", "simulate", "--nodes", "2", "--steps", "50"]
        + ["--json", str(link)],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "symlink" in proc.stderr and "--json" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert target.read_text() == "precious\n"
    assert os.path.islink(link)


@pytest.mark.timeout(200)
def test_simulate_on_a_full_disk_names_the_path_and_keeps_the_earlier_file(
    tmp_path, full_disk, capsys
):
    from jaxpace.cli import main

    out = tmp_path / "sim.json"
    out.write_text(OLD)
    full_disk()
    rc = main(["simulate", "--nodes", "2", "--steps", "50", "--json", str(out)])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert str(out) in err[0] and "No space left on device" in err[0] and "--json" in err[0]
    assert "None" not in err[0]
    assert out.read_text() == OLD
