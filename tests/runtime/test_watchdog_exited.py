"""The stall watchdog reports a process that left as exited, with its last real position and age (issue #32 item 9)."""

from __future__ import annotations

import json
import re
import sys

import pytest
from conftest import SCRIPTS

from jaxpace.runtime import watchdog as wd

STALL_AFTER_S = 3.0


def _job(launch, tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(
        [
            "-n", 2, "--timeout", 150, "--heartbeat-timeout", 60, "--",
            sys.executable, SCRIPTS / "stall_exit_job.py",
            "--at-step", 20, "--stall-after-s", STALL_AFTER_S, "--run-dir", run_dir,
        ],
        timeout_s=200,
    )  # fmt: skip
    return proc, run_dir


@pytest.mark.multiprocess
@pytest.mark.timeout(260)
def test_a_process_that_left_is_reported_as_exited_with_its_last_position(launch, tmp_path):
    """Item 9: "waiting for process 1 ..., last seen at grads step 42, 0.0 s ago" for a rank
    that had exited after step 59 seven seconds earlier.

    Process 1 leaves through `sys.exit` (its process then waits in JAX's shutdown
    barrier, so process 0's collective stalls instead of failing). An `os._exit`
    on CPU makes Gloo fail process 0's all-reduce at once ("Connection closed by
    peer"): no stall to report; `test_a_dead_pid_on_this_host_is_exited` covers it.
    """
    proc, run_dir = _job(launch, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == wd.STALL_EXIT_CODE, out[-4000:]
    assert "[rank 1] LEFT_AFTER 19" in proc.stdout, out[-3000:]
    [msg] = [ln for ln in proc.stdout.splitlines() if ln.startswith("[rank 0] jaxpace: stalled")]
    assert "at mp.grads step 20" in msg, msg
    verb = "closed its pacer (or exited)"
    m = re.search(rf"process 1 \(host [^)]+\), {re.escape(verb)}, last after mp.grads step 19, "
                  r"(more than )?([\d.]+) s ago; it will not arrive", msg)  # fmt: skip
    assert m, msg
    # It left step 19 together with process 0, which then sat >= STALL_AFTER_S in step 20
    # (less one watchdog tick for when process 0 noticed it left).
    assert float(m.group(2)) >= STALL_AFTER_S - 0.5, msg
    rec = json.loads((run_dir / "stall-p0.json").read_text())
    assert rec["missing"][0]["process"] == 1 and "will not arrive" in rec["missing"][0]["why"]


def test_ages_come_from_the_shared_exit_of_the_collective():
    from jaxpace.runtime.stall_peers import PeerAges, classify

    ages = PeerAges()
    ages.note_left("g", 18, 100.0)
    ages.note_left("g", 19, 101.0)
    ages.note_left("g", 25, 107.0)
    peers = {
        1: {"site": "g", "step": 19, "state": "left", "age_s": 0.0, "host": "elsewhere"},
        2: {"site": "g", "step": 20, "state": "left", "age_s": 0.0, "host": "elsewhere"},
        3: {"site": "g", "step": 26, "state": "in", "age_s": 0.4, "host": "elsewhere"},
    }
    ages.refresh(peers, 110.0, host="here")
    assert peers[1]["age_s"] == 9.0 and not peers[1]["age_over"]
    assert peers[2]["age_s"] == 3.0 and peers[2]["age_over"]  # left before step 25 ended
    assert peers[3]["age_s"] is None  # a stale "in" entry: its age is unknown
    peers[1]["closed"] = True
    _, missing, _ = classify(0, "g", 26, {"g": 27}, {1: peers[1]})
    assert missing == [(1, "closed its pacer (or exited), last after g step 19, 9.0 s ago; "
                           "it will not arrive")]  # fmt: skip


@pytest.mark.timeout(60)
def test_a_dead_pid_on_this_host_is_exited():
    import subprocess

    from jaxpace.runtime.stall_peers import PeerAges, classify

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    ages = PeerAges()
    ages.note_left("g", 4, 10.0)
    peers = {1: {"site": "g", "step": 4, "state": "left", "host": "h", "pid": child.pid}}
    ages.refresh(peers, 12.5, host="h")
    assert peers[1]["exited"] and peers[1]["age_s"] == 2.5
    _, missing, _ = classify(0, "g", 5, {"g": 6}, peers)
    assert missing == [(1, "exited, last after g step 4, 2.5 s ago; it will not arrive")]


def test_a_peer_that_closed_before_any_collective_is_not_called_unreached():
    from jaxpace.runtime.stall_peers import classify

    peers = {1: {"site": None, "step": None, "state": "none", "host": "h", "closed": True}, 2: None}
    _, missing, _ = classify(0, "g", 0, {"g": 1}, peers)
    assert missing == [
        (1, "closed its pacer (or exited) before any measured collective; it will not arrive"),
        (2, "has not reached a measured collective"),
    ]
