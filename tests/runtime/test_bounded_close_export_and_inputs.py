"""Bounded close, safe export, and checked inputs: one bounded test per promise.

Shutdown never hangs, export never clobbers, CLIs bound their work, every
public input is validated. Each test has a pytest timeout; waits inside the
tests are bounded (`join(timeout)`, `communicate(timeout)`), never timed
assertions.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import threading
import time

import jax
import numpy as np
import pytest

import jaxpace as jp
from jaxpace.errors import ConfigError
from jaxpace.records import format as _record_format
from jaxpace.runtime import export as _export
from jaxpace.runtime.sink_thread import QUEUE_SLOTS

# --------------------------------------------------------------------- 1. bounded shutdown


@pytest.mark.timeout(60)
def test_close_with_a_blocking_sink_is_bounded_and_counts_dropped(caplog):
    """A sink that never returns: close() still returns, and says how many were dropped."""
    entered, release = threading.Event(), threading.Event()

    def stuck_sink(summary):
        entered.set()
        release.wait()  # "never" returns (until the test ends)

    pacer = jp.Pacer(sinks=[stuck_sink])
    n = QUEUE_SLOTS + 2_000
    try:
        pacer.sink_thread.emit({"i": 0})
        assert entered.wait(30), "the sink thread never started"
        for i in range(1, n):
            pacer.sink_thread.emit({"i": i})
        closer = threading.Thread(target=pacer.close, daemon=True)
        with caplog.at_level(logging.WARNING, "jaxpace"):
            closer.start()
            closer.join(30)  # a bound, not a speed claim: the old close() never returned
            assert not closer.is_alive(), "Pacer.close() hung on a blocking sink"
        # One summary is inside the stuck sink; every other one was dropped and counted.
        assert pacer.sink_dropped == n - 1
        assert f"{n - 1} summaries dropped" in caplog.text
        # After close, emit neither blocks nor restarts anything; it counts.
        pacer.sink_thread.emit({"late": True})
        assert pacer.sink_dropped == n
    finally:
        release.set()


@pytest.mark.timeout(60)
def test_close_delivers_what_a_working_sink_can_take():
    got = []
    pacer = jp.Pacer(sinks=[got.append])
    for i in range(100):
        pacer.sink_thread.emit({"i": i})
    pacer.close()
    assert [s["i"] for s in got] == list(range(100))
    assert pacer.sink_dropped == 0
    t = pacer.sink_thread._thread
    t.join(10)
    assert not t.is_alive()


# --------------------------------------------------------------------- 2. export never clobbers


def _special(kind, path, tmp_path):
    """Makes a non-regular file at `path`; returns a cleanup callable."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        return s.close
    elif kind == "symlink":
        target = tmp_path / "target.txt"
        target.write_text("precious\n")
        os.symlink(target, path)
    elif kind == "device":
        try:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # like /dev/null
        except (PermissionError, OSError) as e:
            pytest.skip(f"cannot make a device node here ({e})")
    elif kind == "directory":
        os.mkdir(path)
        (path / "keep.txt").write_text("x")
    return lambda: None


_KIND_TEST = {
    "fifo": stat.S_ISFIFO,
    "socket": stat.S_ISSOCK,
    "symlink": stat.S_ISLNK,
    "device": stat.S_ISCHR,
    "directory": stat.S_ISDIR,
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "socket", "symlink", "device"])
def test_export_refuses_to_replace_a_non_regular_file(kind, tmp_path):
    path = tmp_path / "records.jsonl"
    cleanup = _special(kind, path, tmp_path)
    try:
        name = {"fifo": "a FIFO", "device": "a device node"}.get(kind, f"a {kind}")
        with pytest.raises(FileExistsError, match=f"it is {name}"):
            jp.Pacer().export(path)
        with pytest.raises(FileExistsError, match="only a regular file"):
            _record_format.write_jsonl(path, [{"type": "header"}])
        assert _KIND_TEST[kind](os.lstat(path).st_mode), f"{kind} was replaced"
        if kind == "symlink":
            assert (tmp_path / "target.txt").read_text() == "precious\n"
        assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    finally:
        cleanup()


@pytest.mark.timeout(60)
def test_write_jsonl_refuses_a_directory_and_replaces_a_regular_file(tmp_path):
    d = tmp_path / "d"
    _special("directory", d, tmp_path)
    with pytest.raises(IsADirectoryError, match="it is a directory"):
        _record_format.write_jsonl(d, [{"a": 1}])
    assert (d / "keep.txt").read_text() == "x"
    f = tmp_path / "r.jsonl"
    f.write_text("old\n")
    _record_format.write_jsonl(f, [{"a": 1}])
    assert f.read_text() == '{"a":1}\n'


# --------------------------------------------------------------------- 3. concurrent exports


@pytest.mark.timeout(60)
def test_concurrent_exports_to_one_path_never_collide(tmp_path, monkeypatch):
    """8 writers all hold their temp file open at once; all succeed, the last one wins whole."""
    n = 8
    barrier = threading.Barrier(n, timeout=30)
    real = _export.records

    def records_with_barrier(pacer, *args, **kwargs):
        rows = real(pacer, *args, **kwargs)

        def gen():
            yield rows[0]
            barrier.wait()  # every writer is mid-write before any renames
            yield from rows[1:]
            yield {"type": "writer", "id": pacer._writer_id}

        return gen()

    monkeypatch.setattr(_export, "records", records_with_barrier)
    path = tmp_path / "same.jsonl"
    errors, threads = [], []
    for i in range(n):
        p = jp.Pacer()
        p._writer_id = i

        def work(p=p):
            try:
                p.export(path)
            except Exception as e:  # noqa: BLE001 - collected and asserted below
                errors.append(e)

        threads.append(threading.Thread(target=work, daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["type"] == "header" and lines[-1]["type"] == "writer"
    assert os.listdir(tmp_path) == ["same.jsonl"]


# --------------------------------------------------------------------- 9. every Pacer argument

BAD_PACER_ARGS = [
    ("mesh", 42, "jax.sharding.Mesh"),
    ("mesh", "data", "jax.sharding.Mesh"),
    ("clock", "x", "callable"),
    ("clock", 42, "callable"),
    ("sinks", ["x"], r"sinks\[0\]` must be callable"),
    ("sinks", 42, "list of callables"),
    ("sinks", "print", "list of callables"),
    ("sinks", print, "Wrap it in a list"),
    ("rank_groups", 42, r"\{kind: \{rank: label\}\}"),
    ("rank_groups", {"numa": 42}, r"rank_groups\['numa'\]` must be a dict"),
    ("rank_groups", {"numa": {"zero": "a"}}, "integers >= 0"),
    ("rank_groups", {"numa": {-1: "a"}}, "integers >= 0"),
    ("rank_groups", {"numa": {True: "a"}}, "integers >= 0"),
    ("rank_groups", {"numa": {0: 7}}, "non-empty string label"),
    ("rank_groups", {3: {0: "a"}}, "non-empty strings"),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("field,value,expected", BAD_PACER_ARGS, ids=lambda v: repr(v)[:30])
def test_every_pacer_argument_is_validated_at_construction(field, value, expected):
    with pytest.raises(ConfigError, match=expected) as e:
        jp.Pacer(**{field: value})
    msg = str(e.value)
    assert f"`{field}" in msg  # names the field
    assert "Pass" in msg or "Wrap" in msg  # says how to fix it


@pytest.mark.timeout(30)
@pytest.mark.parametrize("field,value,expected", BAD_PACER_ARGS[:9], ids=lambda v: repr(v)[:30])
def test_configure_validates_the_same_way_and_changes_nothing(field, value, expected, monkeypatch):
    from jaxpace.runtime import pacer as pacer_module

    monkeypatch.setattr(pacer_module, "_DEFAULT", None)
    p = jp.default_pacer()
    before = (p.clock, p.mesh, p.rank_groups, list(p.sink_thread.sinks), p.policy)
    with pytest.raises(ConfigError, match=expected):
        jp.configure(policy=jp.fixed(0.001), **{field: value})
    assert (p.clock, p.mesh, p.rank_groups, list(p.sink_thread.sinks), p.policy) == before


@pytest.mark.timeout(30)
def test_good_pacer_arguments_are_accepted_and_rank_groups_reach_the_header():
    mesh = jax.make_mesh((8,), ("data",))
    p = jp.Pacer(
        mesh=mesh,
        clock=time.perf_counter_ns,
        sinks=(f for f in [print]),  # any iterable of callables
        rank_groups={"numa": {np.int64(0): "socket0", 1: "socket1"}},
    )
    assert p.mesh is mesh and p.sink_thread.sinks == [print]

    class MeshLike:  # what the runtime reads of a mesh; tests fake process layouts so
        axis_names = ("data",)
        devices = np.array(jax.devices(), dtype=object)

    assert isinstance(jp.Pacer(mesh=MeshLike()).mesh, MeshLike)
    groups = p.records()[0]["topology"]["rank_groups"]
    assert groups["numa"] == {"0": "socket0", "1": "socket1"}


# --------------------------------------------------------------------- 11. missing directories


@pytest.mark.timeout(60)
def test_export_creates_missing_directories(tmp_path):
    out = jp.Pacer().export(tmp_path / "a" / "b" / "r.jsonl")
    with open(out) as f:
        assert json.loads(f.readline())["type"] == "header"


@pytest.mark.timeout(60)
def test_export_to_a_new_path_ending_in_slash_makes_a_folder(tmp_path, monkeypatch):
    """Issue 18: `export("run/")` makes run/ and writes records-p0.jsonl, no run/.tmp."""
    monkeypatch.chdir(tmp_path)
    out = jp.Pacer().export("run/")
    assert os.path.normpath(out) == os.path.join("run", _record_format.records_filename(0))
    assert os.listdir(tmp_path / "run") == [_record_format.records_filename(0)]
    assert os.listdir(tmp_path) == ["run"]


@pytest.mark.timeout(60)
def test_export_under_a_file_says_what_is_wrong(tmp_path):
    (tmp_path / "plain").write_text("x")
    with pytest.raises(NotADirectoryError, match="not a directory"):
        jp.Pacer().export(tmp_path / "plain" / "sub" / "r.jsonl")
    with pytest.raises(NotADirectoryError, match="not a directory"):
        jp.Pacer().export(tmp_path / "plain" / "r.jsonl")
    assert (tmp_path / "plain").read_text() == "x"


# --------------------------------------------------------------------- 6-8. record hygiene


def _header_line():
    h = _record_format.header_record(
        run_id="r",
        process_index=0,
        process_count=1,
        host="h",
        pid=1,
        granularity="process",
        jaxpace_version="0",
        policy="no_pacing",
        local_devices=[0],
        rank_groups=None,
    )
    return json.dumps(h) + "\n"


def _report_cli(path, capsys):
    from jaxpace.cli import main

    out = os.path.dirname(path)
    rc = main(["report", str(path), "--html", f"{out}/r.html", "--trace", f"{out}/t.json"])
    return rc, capsys.readouterr().err


@pytest.mark.timeout(120)
def test_a_huge_records_line_is_refused_without_reading_it_whole(tmp_path, capsys):
    import tracemalloc

    from jaxpace.records import reader as _reader

    MAX_LINE_BYTES = getattr(_reader, "MAX_LINE_BYTES", 8 << 20)  # (so it can fail on old code)
    path = tmp_path / "records-p0.jsonl"
    huge = 4 * MAX_LINE_BYTES
    with open(path, "w") as f:
        f.write(_header_line())
        f.write('{"type":"step","site":"' + "a" * huge + '"}\n')
    tracemalloc.start()
    try:
        with pytest.raises(jp.errors.RecordsError, match="line is longer than") as e:
            jp.report.load_records(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "records-p0.jsonl:2" in str(e.value)
    # Bounded by the cap (about one capped line in memory), not by the line's length.
    assert peak < 2 * MAX_LINE_BYTES + (4 << 20) < huge, peak
    rc, err = _report_cli(path, capsys)
    assert rc == 2 and "line is longer than" in err


@pytest.mark.timeout(60)
def test_deeply_nested_records_line_is_dropped_and_located_and_rc_2(tmp_path, capsys):
    """A line nested too deeply is a bad line: dropped, counted and located (issue 46:
    partial data is read, never refused for one line); with nothing else, rc 2."""
    path = tmp_path / "records-p0.jsonl"
    path.write_text(_header_line() + "[" * 100_000 + "]" * 100_000 + "\n")
    recs = jp.report.load_records(path)
    assert len(recs) == 0 and recs.partial
    assert any("records-p0.jsonl:2: JSON nested too deeply" in n for n in recs.notes)
    rc, err = _report_cli(path, capsys)
    assert rc == 2 and "no step records" in err and "Traceback" not in err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("field", ["wait_ns", "delay_ns"])
def test_negative_durations_in_records_are_skipped_counted_and_noted(field, tmp_path):
    dicts = jp.report.synthetic_records(num_ranks=4, num_steps=40, seed=3)
    n_steps = sum(d["type"] == "step" for d in dicts)
    bad = [d for d in dicts if d["type"] == "step" and d["step"] in (20, 21) and d["rank"] == 1]
    for d in bad:
        d[field] = -5_000_000
    loaded = jp.report.load_records(dicts)
    assert len(loaded) == n_steps - 2  # both lines dropped, as the runtime drops them
    assert (loaded.columns["wait_ns"] >= 0).all() and (loaded.columns["delay_ns"] >= 0).all()
    assert loaded.partial
    assert any("skipped 2 step record(s) with a negative" in n for n in loaded.notes)
    rep = jp.report.analyze(dicts)
    assert rep.partial and any("negative" in n for n in rep.notes)
    # From a file too, with the file and line named.
    d = tmp_path / "run"
    _record_format.write_jsonl(d / _record_format.records_filename(0, "jsonl"), dicts)
    loaded = jp.report.load_records(d)
    assert any("records-p0.jsonl:" in n and "negative" in n for n in loaded.notes)


# --------------------------------------------------------------------- 4, 5, 10. simulate CLI


def _simulate_cli(capsys, *argv):
    import argparse

    from jaxpace.sim import cli as sim_cli

    args = sim_cli.configure_parser(argparse.ArgumentParser()).parse_args(list(map(str, argv)))
    rc = sim_cli.cli_main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "argv,expected",
    [
        (["--nodes", "2000"], "from 1 to 1024"),  # issue 18
        (["--nodes", "100000"], "from 1 to 1024"),
        (["--nodes", "1,0"], "from 1 to 1024"),
        (
            ["--nodes", "1", "--steps", "1000000000"],
            r"`steps` must be an integer in \[1, 10000000\]",
        ),
        (["--nodes", "1", "--steps", "0"], "`steps` must be"),
    ],
)
def test_simulate_enforces_node_and_step_bounds(capsys, argv, expected, monkeypatch):
    import re

    from jaxpace.sim import cli as sim_cli

    def boom(*a, **k):  # nothing may be simulated (or allocated) for a refused run
        raise AssertionError("simulate ran")

    monkeypatch.setattr(sim_cli, "simulate", boom)
    rc, _, err = _simulate_cli(capsys, "--scenario", "pure-bsp", *argv)
    assert rc == 2 and re.search(expected, err), err


@pytest.mark.timeout(60)
def test_simulate_estimates_memory_first_and_refuses_with_the_estimate(capsys, monkeypatch):
    from jaxpace.sim import cli as sim_cli

    monkeypatch.setattr(sim_cli, "simulate", lambda *a, **k: pytest.fail("simulate ran"))
    rc, _, err = _simulate_cli(
        capsys, "--scenario", "pure-bsp", "--nodes", "1024", "--max-memory-gb", "0.05"
    )
    assert rc == 2 and "would need about" in err and "more than 50.0 MB" in err, err
    # Without --max-memory-gb the limit is half of the memory available now.
    monkeypatch.setattr(sim_cli, "_available_bytes", lambda: 10_000_000)
    rc, _, err = _simulate_cli(capsys, "--scenario", "pure-bsp", "--nodes", "1024")
    assert rc == 2 and "half of the 0.0 GB available" in err, err


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "scenario,nodes,steps,policy",
    [("pure-bsp", 2, 300, None), ("paper", 4, 40, "adaptive"), ("pure-bsp", 16, 40, "adaptive")],
)
def test_memory_estimate_bounds_the_measured_peak(scenario, nodes, steps, policy):
    import tracemalloc

    from jaxpace.sim._engine import estimate_peak_bytes, simulate

    est = estimate_peak_bytes(scenario, nodes=nodes, steps=steps, policy=policy)
    tracemalloc.start()
    try:
        simulate(scenario, nodes=nodes, steps=steps, policy=policy)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= est <= 12 * peak + (2 << 20), (peak, est)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "argv,expected",
    [
        (["--policy", "fixed:-1"], "`--policy fixed:-1`: expected `fixed:SECONDS`"),
        (["--policy", "fixed:nan"], "`--policy fixed:nan`: expected `fixed:SECONDS`"),
        (["--policy", "fixed:inf"], "`--policy fixed:inf`"),
        (["--seed", "-1"], "`seed` must be an integer >= 0"),
        (["--scenario", "LIST"], "top level must be a JSON object"),
        (["--scenario", "DEEP"], "nested too deeply"),
        (["--html", "TMP"], "is a directory"),
        (["--json", "/nonexistent-jaxpace-dir/x.json"], "does not exist"),
    ],
)
def test_simulate_error_paths_give_rc_2_before_any_run(
    capsys, argv, expected, tmp_path, monkeypatch
):
    from jaxpace.sim import cli as sim_cli

    monkeypatch.setattr(sim_cli, "simulate", lambda *a, **k: pytest.fail("simulate ran"))
    (tmp_path / "list.json").write_text('[{"gpus_per_node": 8}]')
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    subst = {"LIST": tmp_path / "list.json", "DEEP": tmp_path / "deep.json", "TMP": tmp_path}
    argv = [subst.get(a, a) for a in argv]
    if "--scenario" not in argv:
        argv = ["--scenario", "pure-bsp", *argv]
    rc, _, err = _simulate_cli(capsys, "--nodes", "1", "--steps", "10", *argv)
    assert rc == 2 and expected in err and "Traceback" not in err, err


class _FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


@pytest.mark.timeout(30)
def test_progress_lines_are_rate_limited_and_go_to_stderr():
    import io

    from jaxpace.sim.cli import _Progress

    clock, stream = _FakeClock(), io.StringIO()
    p = _Progress(2, 1000, stream=stream, every_s=10.0, clock=clock)
    with p:
        p.start(0, "1 node, baseline")
        for k in range(1, 1001):
            clock.t = k * 0.1  # 100 s over 1000 steps: at most one line per 10 s
            p.update(k)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 10, lines
    assert (
        lines[0]
        == "jaxpace simulate: run 1 of 2 (1 node, baseline): step 100 of 1,000, 10 s elapsed"
    )


@pytest.mark.timeout(60)
def test_simulate_shows_progress_for_long_runs_on_stderr(capsys):
    rc, out, err = _simulate_cli(
        capsys, "--scenario", "pure-bsp", "--nodes", "1", "--steps", "300", "--progress-every", "0"
    )
    assert rc == 0 and "scaling eff." in out
    assert "jaxpace simulate: run 1 of 2 (1 node, baseline): step 1 of 300" in err
    assert "run 2 of 2 (1 node, paced): step 300 of 300" in err
    assert "jaxpace simulate: run" not in out  # the table stays clean on stdout


@pytest.mark.timeout(60)
def test_interrupt_in_process_says_what_finished(capsys, monkeypatch):
    from jaxpace.sim import cli as sim_cli

    real, calls = sim_cli.simulate, []

    def interrupted_second_run(*a, **k):
        calls.append(k["nodes"])
        if len(calls) == 3:
            k["progress"](7)
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(sim_cli, "simulate", interrupted_second_run)
    try:
        rc, _, err = _simulate_cli(
            capsys, "--scenario", "pure-bsp", "--nodes", "1,2", "--steps", "20"
        )
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped `jaxpace simulate` (a raw traceback for the user)")
    assert rc == 130
    assert err.strip().splitlines() == [
        "jaxpace simulate: interrupted in run 3 of 4 (2 nodes, baseline) at step 7 of 20; "
        "finished 2 of 4 runs (1 node, baseline; 1 node, paced); nothing written."
    ]


def _ctrl_c_during_a_run(capsys, monkeypatch, presses: int):
    """Runs `jaxpace simulate` whose first run gets `presses` SIGINTs between its steps
    1 and 2; returns `(rc, stderr lines, what ran after the signals)`."""
    import signal

    from jaxpace.sim import cli as sim_cli

    after = []

    def sim(*a, **k):
        k["progress"](1)
        for _ in range(presses):
            signal.raise_signal(signal.SIGINT)  # e.g. while a lock of the draw thread is held
        after.append("the rest of step 2")
        k["progress"](2)
        after.append("step 3")
        raise AssertionError("the run went on after Ctrl-C")

    monkeypatch.setattr(sim_cli, "simulate", sim)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        rc, _, err = _simulate_cli(
            capsys, "--scenario", "pure-bsp", "--nodes", "1", "--steps", "20"
        )
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    finally:
        signal.signal(signal.SIGINT, before)
    return rc, err.strip().splitlines(), after


def test_ctrl_c_ends_the_run_between_steps_not_where_the_main_thread_is(capsys, monkeypatch):
    # A KeyboardInterrupt raised inside concurrent.futures/threading code can leave a lock
    # held that the draw thread or the interpreter's exit then waits for: a hang (seen once
    # in CI). The first Ctrl-C is a flag the step loop reads after the step it came in.
    rc, err, after = _ctrl_c_during_a_run(capsys, monkeypatch, presses=1)
    assert after == ["the rest of step 2"]
    assert rc == 130
    assert err == [
        "jaxpace simulate: interrupted in run 1 of 2 (1 node, baseline) at step 2 of 20; "
        "finished 0 of 2 runs; nothing written."
    ]


def test_a_second_ctrl_c_interrupts_at_once(capsys, monkeypatch):
    rc, err, after = _ctrl_c_during_a_run(capsys, monkeypatch, presses=2)
    assert after == []
    assert rc == 130
    assert err == [
        "jaxpace simulate: interrupted in run 1 of 2 (1 node, baseline) at step 1 of 20; "
        "finished 0 of 2 runs; nothing written."
    ]


@pytest.mark.timeout(120)
def test_ctrl_c_ends_a_long_simulation_cleanly_rc_130():
    import signal
    import subprocess
    import sys

    from conftest import REPO

    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    # A shell may start background jobs with SIGINT ignored, and Python then never raises
    # KeyboardInterrupt; restore Python's handler, as in an interactive shell. (No
    # preexec_fn: JAX warns about fork.)
    argv = ["jaxpace", "simulate", "--scenario", "pure-bsp", "--nodes", "1"]
    argv += ["--steps", "10000000", "--progress-every", "0.2"]
    code = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        f"sys.argv = {argv!r}; runpy.run_module('jaxpace', run_name='__main__')"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )
    try:
        first = proc.stderr.readline()  # blocks until the run is under way (bounded by timeout)
        assert "jaxpace simulate: run 1 of 2" in first, first
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("jaxpace simulate: interrupted in run 1 of 2 (1 node, baseline)")
    assert "finished 0 of 2 runs; nothing written." in last
