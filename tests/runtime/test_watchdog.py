"""Stall watchdog (issue 16): settings, detection, messages, records, actions.

Single-process tests here (8 CPU devices, one process); the four multi-process
cases (a process that never arrives, a skipped collective, a healthy run, a
hung coordinator) run through `jaxpace launch` at the bottom.
"""

import json
import re
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SCRIPTS
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxpace as jp
from jaxpace.errors import ConfigError, StallError
from jaxpace.native import probes as nat
from jaxpace.runtime import hooks
from jaxpace.runtime import watchdog as wd
from jaxpace.runtime.bounded_kv import BoundedKV
from jaxpace.runtime.config import RUN_DIR_ENV
from jaxpace.runtime.testing import set_fault_hook

# ---------------------------------------------------------------------- settings


@pytest.mark.parametrize("bad", [-1.0, 0.0, float("nan"), float("inf"), True, "300", 1e9])
def test_stall_after_s_rejects_bad_values_naming_the_field(bad):
    with pytest.raises(ConfigError, match="`stall_after_s`"):
        jp.Pacer(stall_after_s=bad)


@pytest.mark.parametrize("bad", ["crash", "", None, 1])
def test_on_stall_rejects_bad_values_listing_the_choices(bad):
    with pytest.raises(ConfigError, match="`on_stall` must be one of 'warn', 'raise', 'exit'"):
        jp.Pacer(on_stall=bad)


def test_run_dir_must_be_a_path():
    with pytest.raises(ConfigError, match="`run_dir` must be a directory path"):
        jp.Pacer(run_dir=3)


def test_run_dir_defaults_to_env_then_cwd(monkeypatch, tmp_path):
    monkeypatch.delenv(RUN_DIR_ENV, raising=False)
    assert wd.WatchdogConfig().directory() == "."
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path))
    assert wd.WatchdogConfig().directory() == str(tmp_path)
    assert wd.WatchdogConfig(run_dir="/x").directory() == "/x"


def test_ranges():
    from jaxpace._text import ranges

    assert ranges([0, 1, 2, 4, 6, 7], sep=",") == "0-2,4,6-7"
    assert ranges([3], sep=",") == "3"


# ---------------------------------------------------------------------- a real measured loop


# A Python clock keeps the io_callback probes (their marks are Python attributes); the
# native-path cases below leave the clock alone and read the library's marks.
def PY_CLOCK():
    return time.perf_counter_ns()


def _step_fn(pacer):
    mesh = jax.make_mesh((8,), ("data",))
    f = jax.jit(
        jax.shard_map(
            lambda v: pacer.psum(v, "data", site="s"), mesh=mesh, in_specs=P("data"), out_specs=P()
        )
    )
    x = jax.device_put(jnp.arange(16.0).reshape(8, 2), NamedSharding(mesh, P("data")))
    return f, x


def _stall_at(step_no, seconds):
    """Fault hook: the post-callback of `step_no` sleeps (the rank stays "in" the collective)."""

    def hook(where, site, rank, step):
        if where == "post" and step == step_no:
            time.sleep(seconds)

    return hook


def test_thread_starts_at_first_trace_not_in_constructor_and_close_stops_it(tmp_path):
    pacer = jp.Pacer(stall_after_s=5.0, run_dir=tmp_path, clock=PY_CLOCK)
    assert not pacer.watchdog.running
    f, x = _step_fn(pacer)
    f(x).block_until_ready()
    assert pacer.watchdog.running
    pacer.close(timeout_s=2.0)
    assert not pacer.watchdog.running


def test_off_when_stall_after_s_is_none():
    pacer = jp.Pacer(stall_after_s=None)
    f, x = _step_fn(pacer)
    f(x).block_until_ready()
    assert not pacer.watchdog.running
    pacer.close()


def test_a_stuck_collective_is_reported_recorded_and_turns_pacing_off(tmp_path, capfd):
    pacer = jp.Pacer(policy=jp.fixed(0.001), stall_after_s=0.3, run_dir=tmp_path, clock=PY_CLOCK)
    set_fault_hook(pacer, _stall_at(3, 1.5))
    f, x = _step_fn(pacer)
    for _ in range(6):
        out = f(x).block_until_ready()
    pacer.close(timeout_s=2.0)
    np.testing.assert_array_equal(np.asarray(out).reshape(-1), np.arange(16.0).reshape(8, 2).sum(0))
    err = capfd.readouterr().err
    assert re.search(r"jaxpace: stalled \d\.\d s at s step 3", err), err
    assert "single process" in err
    [rec] = [r for r in pacer.watchdog.stalls if r["role"] == "stalled"]
    assert (rec["site"], rec["step"]) == ("s", 3)
    assert rec["stalled_s"] >= 0.3
    on_disk = json.loads((tmp_path / "stall-p0.json").read_text())
    assert on_disk["type"] == "stall" and on_disk["step"] == 3
    # faulthandler's dump of every thread: the callback thread sleeping in the hook.
    assert "in hook" in on_disk["stacks"] and "jaxpace-watchdog" not in on_disk["message"]
    assert pacer.stop_event.is_set()  # pacing off: pending and later sleeps are zero
    after = [r for r in pacer.records() if r["type"] == "step" and r["step"] > 3]
    assert after and all(r["delay_ns"] == 0 for r in after)


def test_a_pacing_sleep_never_counts_as_a_stall(tmp_path, capfd, monkeypatch):
    # Every step sleeps 0.4 s before the collective; the threshold is 0.1 s.
    pacer = jp.Pacer(policy=jp.fixed(0.4), stall_after_s=0.1, run_dir=tmp_path, clock=PY_CLOCK)
    real_sleep = hooks.interruptible_sleep
    during = []  # watchdog ticks seen while a pacing sleep was in progress

    def watched_sleep(delay_s, stop):
        # Handshake, not timing: the sleep lasts until the watchdog has ticked 5 times in it
        # (at most 30 s), so a loaded machine cannot make it end before anyone watched.
        start, give_up = pacer.watchdog.ticks, time.monotonic() + 30
        while delay_s > 0 and pacer.watchdog.ticks < start + 5 and time.monotonic() < give_up:
            stop.wait(0.01)
        during.append(pacer.watchdog.ticks - start)
        return real_sleep(delay_s, stop)

    monkeypatch.setattr(hooks, "interruptible_sleep", watched_sleep)
    f, x = _step_fn(pacer)
    for _ in range(4):
        f(x).block_until_ready()
    ticks = max(during)
    pacer.close(timeout_s=2.0)
    assert ticks >= 5  # it was watching (tick 0.01 s) during the sleeps
    assert pacer.stats()["s"].total_delay_s >= 1.1
    assert pacer.watchdog.stalls == []
    assert "stalled" not in capfd.readouterr().err
    assert not (tmp_path / "stall-p0.json").exists()


def test_on_stall_raise_delivers_stall_error_to_the_main_thread(tmp_path):
    pacer = jp.Pacer(stall_after_s=0.2, on_stall="raise", run_dir=tmp_path, clock=PY_CLOCK)
    set_fault_hook(pacer, _stall_at(2, 1.0))
    f, x = _step_fn(pacer)
    steps = 0
    with pytest.raises(StallError, match=r"stalled [\d.]+ s at s step 2"):
        for _ in range(10_000):
            f(x).block_until_ready()
            steps += 1
    pacer.close(timeout_s=2.0)
    assert 2 <= steps < 10_000  # raised in the main thread at the stuck step, not before
    assert pacer.stats()["s"].errors == 0  # no callback raised


# ---------------------------------------------------------------------- native probes

NATIVE_OK, NATIVE_WHY = nat.available()
needs_native = pytest.mark.skipif(not NATIVE_OK, reason=f"native probes unavailable: {NATIVE_WHY}")


def _native_site(name="n"):
    """A registered one-rank native site, plus one jitted arrive and one jitted done on it."""
    from jaxpace.native import primitive as prim
    from jaxpace.runtime.sites import Site

    sid = nat.allocate_site_id()
    nat.register_site(sid, 1)
    site = Site(name, 1, 64, jp.no_pacing(), None)
    site.native, site.probe = (sid, None), "native XLA FFI probes (test)"
    arrive = jax.jit(lambda t: prim.arrive(t, sid, jnp.int32(0))[0])
    done = jax.jit(lambda f: prim.done(jnp.float32(1.0), f, sid, jnp.int32(0)))
    return sid, site, arrive, done


def _row(sid):
    [(arrived, arrived_ns, done_step, arrivals)] = nat.site_progress(sid, 1).tolist()
    return arrived, arrived_ns, done_step, arrivals


@needs_native
def test_native_progress_shows_an_open_step_until_done_and_stamps_after_the_sleep():
    sid, _site, arrive, done = _native_site()
    assert _row(sid) == (-1, 0, -1, 0)  # nothing arrived yet
    t0 = nat.now_ns()
    flag = arrive(jnp.float32(0.0)).block_until_ready()
    arrived, arrived_ns, done_step, arrivals = _row(sid)
    assert (arrived, done_step, arrivals) == (0, -1, 1)  # open: arrived, not done
    assert t0 <= arrived_ns <= nat.now_ns()
    done(flag).block_until_ready()
    assert _row(sid)[0::2] == (0, 0)  # closed
    # A pacing sleep: the arrival is stamped after it, so it never counts as time inside.
    nat.set_site_max_delay(sid, 1.0)
    nat.set_delay(sid, 0, 0.3)
    t1 = nat.now_ns()
    flag = arrive(jnp.float32(0.0)).block_until_ready()
    arrived, arrived_ns, done_step, arrivals = _row(sid)
    assert (arrived, done_step, arrivals) == (1, 0, 2)
    assert arrived_ns - t1 >= 0.3e9
    done(flag).block_until_ready()
    assert _row(sid)[0::2] == (1, 1)


@needs_native
def test_native_steady_clock_is_time_monotonic():
    # The handlers' steady_clock and Python's time.monotonic read one clock (CLOCK_MONOTONIC).
    a = time.monotonic_ns()
    b = nat.now_ns()
    c = time.monotonic_ns()
    assert a <= b <= c


@needs_native
def test_watchdog_reports_a_stall_at_a_native_site_from_the_library_marks(tmp_path, capfd):
    sid, site, arrive, done = _native_site("native.site")
    pacer = jp.Pacer(stall_after_s=0.5, run_dir=tmp_path)
    pacer.add_site("native.site", site)  # the pacer's own sites carry the same fields
    w = pacer.watchdog
    for _ in range(wd.WARMUP_STEPS):  # warm-up steps allow 60 s: leave them behind
        done(arrive(jnp.float32(0.0))).block_until_ready()
    now = time.monotonic()
    assert w.tick(now) and w._open == {} and w._last["state"] == "left"
    arrive(jnp.float32(0.0)).block_until_ready()  # step 2 arrives and never finishes
    w.tick(now)
    assert w._open[("native.site", 0)][0] == wd.WARMUP_STEPS
    assert w._last == {**w._last, "site": "native.site", "step": 2, "state": "in"}
    assert w.stalls == []  # not yet stalled_after_s inside
    w.tick(now + 1.0)
    [rec] = w.stalls
    assert (rec["role"], rec["site"], rec["step"]) == ("stalled", "native.site", 2)
    assert rec["stalled_s"] >= 0.5
    err = capfd.readouterr().err
    assert "jaxpace: stalled" in err and "at native.site step 2" in err, err
    assert "cannot see" not in err
    pacer.close(timeout_s=2.0)


@needs_native
def test_a_pacing_sleep_never_counts_as_a_stall_on_the_native_path(tmp_path, capfd, caplog):
    pacer = jp.Pacer(policy=jp.fixed(0.4), stall_after_s=0.1, run_dir=tmp_path)
    f, x = _step_fn(pacer)
    # Under load the drain thread may set a delay a step late: run (a bounded number
    # of) steps until three sleeps of 0.4 s, each 4x stall_after_s, have happened.
    for _ in range(20):
        f(x).block_until_ready()
        stats = pacer.stats()["s"]
        if stats.total_delay_s >= 1.1:
            break
    ticks = pacer.watchdog.ticks
    pacer.close(timeout_s=2.0)
    assert stats.probe.startswith("native"), stats.probe
    assert ticks >= 5
    assert stats.total_delay_s >= 1.1  # the native arrivals slept
    assert pacer.watchdog.stalls == []
    assert "stalled" not in capfd.readouterr().err
    assert "cannot see" not in caplog.text
    assert not (tmp_path / "stall-p0.json").exists()


# ---------------------------------------------------------------------- who is missing


def _entry(site, step, state, counts, host="h"):
    return {
        "site": site,
        "step": step,
        "state": state,
        "counts": counts,
        "age_s": 7.0,
        "host": host,
    }


def test_classify_here_missing_diverged():
    counts = {"a": 21, "b": 20}
    peers = {
        0: _entry("a", 20, "in", counts),
        1: _entry("b", 19, "left", {"a": 20, "b": 20}),  # behind: never arrived
        2: _entry("b", 20, "in", {"a": 20, "b": 21}),  # in another collective
        3: _entry("b", 20, "left", {"a": 20, "b": 21}),  # passed ours without us
        4: None,
    }
    here, missing, diverged = wd.classify(5, "a", 20, counts, peers)
    assert [p for p, _ in here] == [0]
    assert dict(missing) == {
        1: "last seen at b step 19, 7.0 s ago",
        4: "has not reached a measured collective",
    }
    assert dict(diverged)[2] == "is in the collective at b step 20 instead"
    assert "b: 21 arrivals vs 20 here" in dict(diverged)[3]


class _HungClient:
    def __init__(self):
        self.release = threading.Event()

    def key_value_set(self, *a):
        self.release.wait(30)

    key_value_dir_get = key_value_set


def test_bounded_kv_call_never_hangs_on_a_hung_coordinator():
    c = _HungClient()
    kv = BoundedKV(c, timeout_s=0.2)
    ok, err = kv.call(lambda cl: cl.key_value_set("k", "v", True))
    assert not ok and isinstance(err, TimeoutError)
    reached = []  # the second call must not even reach the client (no wait, no queue)
    ok, err = kv.call(lambda cl: reached.append(1) or cl.key_value_dir_get("k"))
    assert not ok and "never returned" in str(err)
    assert not reached  # fails at once while the first call is stuck
    c.release.set()


def test_declare_with_a_hung_coordinator_says_so(tmp_path, capfd):
    pacer = jp.Pacer(stall_after_s=1.0, run_dir=tmp_path)
    w = pacer.watchdog
    c = _HungClient()
    w._kv, w.me, w.nproc, w.prefix = BoundedKV(c, timeout_s=0.2), 1, 4, "t"
    rec = w.declare("train.py:88:step", 20, 3.0, {"train.py:88:step": 21})
    c.release.set()
    assert rec["coordinator"].startswith("does not answer")
    assert "coordinator" in rec["message"] and "cannot be told" in rec["message"]
    assert re.search(
        r"jaxpace: stalled 3\.\d s at train.py:88:step step 20", capfd.readouterr().err
    )
    assert json.loads((tmp_path / "stall-p1.json").read_text())["role"] == "stalled"


# ---------------------------------------------------------------------- multi-process

STALL_AFTER_S = 3.0


def _job(
    launch,
    tmp_path,
    mode,
    *,
    on_stall="exit",
    stall_after_s=STALL_AFTER_S,
    extra=(),
    probes="python",
):
    run_dir = tmp_path / f"{mode}-{probes}"
    proc = launch(
        [
            "-n",
            4,
            "--local-devices",
            2,
            "--timeout",
            150,
            "--heartbeat-timeout",
            60,
            "--",
            sys.executable,
            SCRIPTS / "stall_job.py",
            "--mode",
            mode,
            "--stall-after-s",
            stall_after_s,
            "--on-stall",
            on_stall,
            "--run-dir",
            run_dir,
            "--probes",
            probes,
            *extra,
        ],
        timeout_s=200,
    )
    return proc, run_dir


def _lines(proc, rank, needle):
    return [
        ln for ln in proc.stdout.splitlines() if ln.startswith(f"[rank {rank}]") and needle in ln
    ]


def _records(run_dir):
    return {
        int(p.stem.split("-p")[1]): json.loads(p.read_text()) for p in run_dir.glob("stall-p*.json")
    }


@pytest.mark.multiprocess
@pytest.mark.timeout(260)
@pytest.mark.parametrize("probes", ["python", pytest.param("native", marks=needs_native)])
def test_mp_process_that_never_arrives_is_named_and_exit_ends_the_job(launch, tmp_path, probes):
    proc, run_dir = _job(
        launch, tmp_path, "sleep", extra=["--process", 1, "--at-step", 20], probes=probes
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == wd.STALL_EXIT_CODE, out[-4000:]
    for r in range(4):  # the path the job asked for is the one that timed it
        want = "native" if probes == "native" else "io_callback"
        assert _lines(proc, r, f"PROBE mp.grads {want}"), out[-3000:]
    assert "stalled (jaxpace on_stall='exit'" in proc.stderr, proc.stderr[-2000:]
    [sleep_line] = _lines(proc, 1, "SLEEPING_AT")
    slept_at = float(sleep_line.split()[-1])
    recs = _records(run_dir)
    for r in (0, 2, 3):
        [msg] = _lines(proc, r, "jaxpace: stalled")
        assert "at mp.grads step 20" in msg, msg
        assert "waiting for process 1 (host " in msg and "last seen at mp.grads step 19" in msg
        assert "processes 0,2-3 are here" in msg, msg
        rec = recs[r]
        assert rec["role"] == "stalled" and rec["missing"][0]["process"] == 1
        assert rec["here"] == sorted({0, 2, 3} - {r})
        # Named within stall_after_s + 5 s of the moment process 1 stopped (one host: one clock).
        assert rec["declared_monotonic"] - slept_at <= STALL_AFTER_S + 5, rec
        assert "Thread" in rec["stacks"] or "thread" in rec["stacks"]
    if 1 in recs:  # the stuck process answered with its own stacks (when it got the time)
        assert recs[1]["role"] == "answered" and "sleep_forever" in recs[1]["stacks"]


@pytest.mark.multiprocess
@pytest.mark.timeout(260)
def test_mp_skipped_collective_is_named_as_divergence(launch, tmp_path):
    proc, run_dir = _job(launch, tmp_path, "skip", extra=["--process", 2, "--at-step", 20])
    assert proc.returncode == wd.STALL_EXIT_CODE, (proc.stdout + proc.stderr)[-4000:]
    for r in (0, 1, 3):
        [msg] = _lines(proc, r, "jaxpace: stalled")
        assert "the program diverged" in msg and "process 2 (host " in msg, msg
        assert "mp.grads: 39 arrivals vs 40 here" in msg, msg  # where: the skipped site
        assert "at mp.loss step 39" in msg, msg
        assert _records(run_dir)[r]["diverged"][0]["process"] == 2


@pytest.mark.multiprocess
@pytest.mark.timeout(260)
def test_mp_healthy_run_reports_no_stall(launch, tmp_path):
    proc, run_dir = _job(launch, tmp_path, "healthy", stall_after_s=0, extra=["--steps", 200])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    thresholds = [float(ln.split()[-1]) for ln in proc.stdout.splitlines() if "STALL_AFTER_S" in ln]
    assert len(thresholds) == 4, out[-3000:]
    assert len(_lines(proc, 0, "HEALTHY_DONE 200")) == 1
    assert "jaxpace: stalled" not in out and "reports a stall" not in out
    assert _records(run_dir) == {}


@pytest.mark.multiprocess
@pytest.mark.timeout(260)
def test_mp_hung_coordinator_is_reported_and_nothing_hangs(launch, tmp_path):
    proc, run_dir = _job(launch, tmp_path, "coordinator", extra=["--at-step", 20])
    assert proc.returncode == wd.STALL_EXIT_CODE, (proc.stdout + proc.stderr)[-4000:]
    said = [r for r in (1, 2, 3) if _lines(proc, r, "coordinator (the key-value service")]
    assert said, proc.stdout[-4000:]
    for r in said:
        [msg] = _lines(proc, r, "jaxpace: stalled")
        assert "does not answer" in msg and "at mp.grads step 20" in msg
        assert _records(run_dir)[r]["coordinator"].startswith("does not answer")


def test_report_shows_the_stall_records_first(tmp_path, capsys):
    from jaxpace import cli

    pacer = jp.Pacer(policy=jp.fixed(0.001), stall_after_s=0.3, run_dir=tmp_path, clock=PY_CLOCK)
    set_fault_hook(pacer, _stall_at(3, 1.0))
    f, x = _step_fn(pacer)
    for _ in range(40):
        f(x).block_until_ready()
    pacer.close(timeout_s=2.0)
    pacer.export(tmp_path)
    capsys.readouterr()
    cli.main(["report", str(tmp_path), "--warmup", "2"])
    out = capsys.readouterr().out
    assert out.startswith("STALLED: this run hung"), out[:500]
    assert "process 0: jaxpace: stalled" in out.splitlines()[1]
