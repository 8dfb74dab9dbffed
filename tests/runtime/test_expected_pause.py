"""Legitimate pauses (a checkpoint save) do not trip the stall watchdog; real stalls still do."""

import sys
import threading

import pytest

import jaxpace as jp
from jaxpace.runtime import pauses
from jaxpace.runtime import watchdog as wd

SCRIPT = "tests/scripts/pause_job.py"


# ---------------------------------------------------------------------- the API


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"name": "", "max_s": 10}, "`name`"),
        ({"name": 3, "max_s": 10}, "`name`"),
        ({"name": "ckpt", "max_s": 0}, "`max_s`"),
        ({"name": "ckpt", "max_s": -1}, "`max_s`"),
        ({"name": "ckpt", "max_s": float("nan")}, "`max_s`"),
        ({"name": "ckpt", "max_s": float("inf")}, "`max_s`"),
        ({"name": "ckpt", "max_s": True}, "`max_s`"),
        ({"name": "ckpt", "max_s": "60"}, "`max_s`"),
        ({"name": "ckpt", "max_s": 8 * 86400}, "`max_s`"),
    ],
)
def test_bad_pause_names_the_field(kwargs, field):
    name = kwargs.pop("name")
    with pytest.raises(jp.errors.ConfigError, match=field):
        with jp.expected_pause(name, **kwargs):
            pass
    assert pauses.current() is None


def test_current_pause_is_published_while_it_lasts_and_nests():
    assert pauses.current() is None
    with jp.expected_pause("checkpoint", max_s=30):
        outer = pauses.current()
        assert outer["name"] == "checkpoint" and outer["max_s"] == 30 and outer["announced"]
        with jp.expected_pause("eval", max_s=300):
            assert pauses.current()["name"] == "eval"  # the one with the most time left
        assert pauses.current()["id"] == outer["id"]
    assert pauses.current() is None


def test_an_orbax_save_on_the_main_thread_is_a_known_host_phase_without_announcement():
    """The watchdog thread reads the main thread's stack: an Orbax frame is a host phase."""
    inside, done = threading.Event(), threading.Event()
    seen = {}

    def look():
        inside.wait(30)
        seen["phase"] = pauses.current()
        done.set()

    fake_orbax = compile(
        "def save(inside, done):\n    inside.set()\n    done.wait(30)\n",
        "/site-packages/orbax/checkpoint/checkpoint_manager.py",
        "exec",
    )
    ns = {}
    exec(fake_orbax, ns)
    t = threading.Thread(target=look, daemon=True)
    t.start()
    ns["save"](inside, done)  # on the main thread, as a training loop would
    t.join(30)
    phase = seen["phase"]
    assert phase["name"] == "checkpoint (orbax)" and not phase["announced"]
    assert phase["max_s"] == pauses.HOST_PHASE_MAX_S
    assert pauses.current() is None  # out of it again


# ---------------------------------------------------------------------- the decision


def _peers(pause, age_s=0.0):
    entry = {"p": 1, "site": "g", "step": 4, "state": "left"}
    if pause is not None:
        entry["pause"] = {**pause, "age_s": age_s}
    return {0: {"p": 0, "site": "g", "step": 5, "state": "in"}, 1: entry}


CKPT = {"name": "checkpoint", "max_s": 10.0, "announced": True, "id": "checkpoint#1"}


def test_a_missing_process_in_its_pause_is_excused_until_its_bound_on_our_clock():
    tr = pauses.Tracker()
    classified = ([], [(1, "last seen at g step 4")], [])
    peers = _peers(CKPT, age_s=2.0)  # 2 s into a 10 s pause when published
    assert tr.all_excused(classified, peers, now=100.0) == {1: peers[1]["pause"]}
    # The same (never refreshed) entry later: the bound is fixed on this clock at 108.
    assert tr.all_excused(classified, peers, now=107.9)
    assert tr.all_excused(classified, peers, now=108.0) == {}
    assert "pause 'checkpoint' beyond its max_s=10" in tr.overrun([1], peers, 108.0)


def test_no_pause_or_a_divergence_is_never_excused():
    tr = pauses.Tracker()
    assert tr.all_excused(([], [(1, "x")], []), _peers(None), now=0.0) == {}
    diverged = ([], [(1, "x")], [(2, "is in the collective at g step 9 instead")])
    peers = {**_peers(CKPT), 2: {"p": 2, "pause": dict(CKPT)}}
    assert tr.all_excused(diverged, peers, now=0.0) == {}
    assert tr.all_excused(([(1, "")], [], []), _peers(CKPT), now=0.0) == {}  # nobody missing


def test_a_later_pause_of_the_same_phase_gets_a_fresh_bound():
    tr = pauses.Tracker()
    classified = ([], [(1, "x")], [])
    phase = {"name": "compile (jax)", "max_s": 5.0, "announced": False, "id": "compile (jax)"}
    assert tr.all_excused(classified, _peers(phase), now=0.0)
    assert not tr.all_excused(classified, _peers(phase), now=6.0)
    tr.all_excused(classified, _peers(None), now=7.0)  # it left the phase
    assert tr.all_excused(classified, _peers(phase), now=8.0)  # a new one: 5 s from now


# ---------------------------------------------------------------------- the job


def _run(launch, tmp_path, mode, *extra):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    args = ["-n", 4, "--local-devices", 2, "--timeout", 200, "--", sys.executable, SCRIPT]
    proc = launch([*args, "--mode", mode, "--run-dir", run_dir, *extra], timeout_s=240)
    return proc, run_dir, proc.stdout + proc.stderr


@pytest.mark.multiprocess
@pytest.mark.timeout(260)
def test_orbax_save_10s_slower_on_one_process_does_not_trip_exit(launch, tmp_path):
    pytest.importorskip("orbax.checkpoint", reason="orbax-checkpoint is a test dependency")
    proc, run_dir, out = _run(launch, tmp_path, "announced")
    assert proc.returncode == 0, out[-4000:]
    assert "SLOW_SAVE" in out  # process 1's save took 10 s longer
    for p in range(4):
        assert f"DONE p{p} stalls=0" in out, out[-4000:]
    assert "jaxpace: stalled" not in out
    # The others did wait for it past stall_after_s=3 and their watchdogs excused it.
    assert "waiting for processes in a pause" in out, out[-4000:]
    assert not list(run_dir.glob("stall-p*.json"))


@pytest.mark.multiprocess
@pytest.mark.timeout(260)
def test_the_same_delay_unannounced_is_a_stall_that_names_the_process(launch, tmp_path):
    pytest.importorskip("orbax.checkpoint", reason="orbax-checkpoint is a test dependency")
    proc, _run_dir, out = _run(launch, tmp_path, "stall")
    assert proc.returncode == wd.STALL_EXIT_CODE, out[-4000:]
    assert "waiting for process 1 (host " in out, out[-4000:]


@pytest.mark.multiprocess
@pytest.mark.timeout(260)
def test_a_pause_that_runs_over_its_bound_is_a_stall_that_says_so(launch, tmp_path):
    pytest.importorskip("orbax.checkpoint", reason="orbax-checkpoint is a test dependency")
    proc, _run_dir, out = _run(launch, tmp_path, "announced", "--max-s", 4, "--extra-s", 20)
    assert proc.returncode == wd.STALL_EXIT_CODE, out[-4000:]
    assert "waiting for process 1 (host " in out, out[-4000:]
    assert "process 1 is in pause 'checkpoint' beyond its max_s=4" in out, out[-4000:]
