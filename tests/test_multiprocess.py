"""Real multi-process runs (4 processes x 2 CPU devices) through `jaxpace launch`."""

import json
import sys

import numpy as np
import pytest
from conftest import SCRIPTS

from benchmarks.lag import WARMUP, per_step, sync_wait_ms
from jaxpace.native.probes import available as native_available

pytestmark = pytest.mark.multiprocess

LAG_S = 0.020


def _load(out, nproc=4):
    return [json.loads((out / f"result-p{i}.json").read_text()) for i in range(nproc)]


@pytest.fixture(scope="module")
def paced_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("mp")
    __import__("conftest").run_4x2(
        "mp_collective.py",
        *("--lag-s", LAG_S, "--lag-process", 1, "--steps", 50, "--phases", "unpaced,paced"),
        *("--policy", "adaptive", "--gain", "1.0", "--max-delay-s", 0.03, "--out", out),
    )
    return out, _load(out)


def test_results_bitwise_identical_in_every_phase(paced_run):
    _, results = paced_run
    for r in results:
        for phase in ("unpaced", "paced"):
            assert r[phase]["bitwise_equal"], (r["process"], phase)
            assert r[phase]["errors"] == 0


def test_lagging_process_has_smallest_wait(paced_run):
    _, results = paced_run
    waits = per_step(results, "unpaced", "waits_ns")
    assert len(waits) >= 30
    last = [int(np.argmin(w)) for w in waits.values()]
    share = last.count(1) / len(last)
    assert share >= 0.95, f"lagging process had the smallest wait in {share:.0%} of steps"
    # The path that timed it (native probes wherever the extension is built).
    native = native_available()[0]
    for r in results:
        for phase in ("unpaced", "paced"):
            assert r[phase]["probe"].startswith("native" if native else "io_callback"), r[phase]


def test_adaptive_pacing_absorbs_the_spread(paced_run):
    """Early processes' waiting for the late one drops >= 70% into bounded sleeps."""
    _, results = paced_run
    # Per process: earliness minus own sleep, median over steps (ms).
    before, after = sync_wait_ms(results, "unpaced"), sync_wait_ms(results, "paced")
    early = [0, 2, 3]
    drop = 1 - after[early] / before[early]
    print(f"sync wait before {before.round(2)} ms, after {after.round(2)} ms, drop {drop.round(2)}")
    assert (before[early] > LAG_S * 1e3 * 0.5).all(), before
    # >= 70%: with the native probes the policy runs on a drain thread, and under load
    # a delay can land a step late (docs/benchmarks.md); 0.79-0.96 seen in a CI run.
    assert (drop >= 0.70).all(), drop
    for r in results:
        assert r["paced"]["engaged"] == (r["process"] != 1) or r["paced"]["engaged"]
        # Records hold the time actually slept: the policy's 30 ms bound plus the OS's
        # wake-up latency, which reached 0.6 ms on a 2-core machine at load 15, and once
        # 13 ms in a full-suite run (one sleep of 43 ms among ~50 near 20 ms). So the bound
        # is held for 95% of the sleeps here; the bound on the requested delay itself is
        # tested on the policy and the native handler, without sleeping.
        slept = np.array(list(r["paced"]["delays_ns"].values()))
        assert np.percentile(slept, 95) <= 0.03e9 + 10e6, slept
        assert max(r["unpaced"]["delays_ns"].values()) == 0
    assert results[1]["paced"]["steps_paced"] == 0  # the late process never sleeps
    # Step-time cost of pacing: printed, not asserted (a timed assertion; the two phases run one
    # after the other on 2 shared cores, and a CI run read 1.65 where a quiet one read 1.24).
    # `python -m benchmarks lag` measures it across repeats and gains (docs/benchmarks.md).
    med = {
        ph: np.median([np.median(r[ph]["step_times_s"][WARMUP:]) for r in results])
        for ph in ("unpaced", "paced")
    }
    ratio = med["paced"] / med["unpaced"]
    print(
        f"median step time unpaced {med['unpaced'] * 1e3:.1f} ms, paced "
        f"{med['paced'] * 1e3:.1f} ms, ratio {ratio:.3f}"
    )


def test_records_exported_and_run_id_agreed(paced_run):
    out, results = paced_run
    assert len({r["paced"]["run_id"] for r in results}) == 1
    for i in range(4):
        lines = (out / "paced" / f"records-p{i}.jsonl").read_text().splitlines()
        head = json.loads(lines[0])
        assert head["type"] == "header" and head["process_index"] == i
        assert head["process_count"] == 4
        assert len(lines) > 40


def test_records_gathered_to_process_0_match_each_process_export(paced_run):
    out, _ = paced_run
    from jaxpace import report

    for i in range(4):
        own = (out / "paced" / f"records-p{i}.jsonl").read_text()
        gathered = (out / "paced-gathered" / f"records-p{i}.jsonl").read_text()
        assert gathered == own
    rep = report.analyze(out / "unpaced-gathered")
    assert rep.culprit == 1 and not rep.partial


def test_config_mismatch_fails_on_every_process(launch):
    proc = launch(
        [
            "-n",
            2,
            "--local-devices",
            1,
            "--timeout",
            120,
            "--",
            sys.executable,
            SCRIPTS / "mp_mismatch.py",
        ],
        timeout_s=150,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    for rank in (0, 1):
        assert f"[rank {rank}] MISMATCH: jaxpace settings differ" in proc.stdout, proc.stdout[
            -3000:
        ]
    assert "NO ERROR" not in proc.stdout


def test_launcher_failing_rank_fails_fast_with_its_output(launch, tmp_path):
    # Rank 1 fails only once rank 0 has printed (a file says so; bounded wait), so a
    # slow interpreter start on a loaded machine cannot reorder the two.
    ready = tmp_path / "rank0-printed"
    code = (
        "import os, sys, time; r = os.environ['JAXPACE_PROCESS_ID'];"
        "print('hello from', r, flush=True);"
        f"r == '0' and open({str(ready)!r}, 'w').close();"
        f"[time.sleep(0.05) for _ in range(600) if r == '1' and not os.path.exists({str(ready)!r})];"
        "(sys.exit('boom on rank 1') if r == '1' else time.sleep(60))"
    )
    proc = launch(["-n", 3, "--timeout", 50, "--", sys.executable, "-c", code], timeout_s=60)
    assert proc.returncode != 0
    assert "rank 1 exited with code 1" in proc.stderr
    assert "boom on rank 1" in proc.stderr
    assert "[rank 0] hello from 0" in proc.stdout


def test_launcher_kills_hung_rank_at_timeout(launch):
    proc = launch(
        [
            "-n",
            2,
            "--timeout",
            3,
            "--",
            sys.executable,
            "-c",
            "import time; print('up', flush=True); time.sleep(120)",
        ],
        timeout_s=40,
    )
    assert proc.returncode == 124
    assert "timed out after 3.0s" in proc.stderr


def test_launcher_rejects_bad_arguments(launch):
    proc = launch(["-n", 0, "--", sys.executable, "-c", "pass"], timeout_s=30)
    assert proc.returncode == 2 and "`num_processes` must be an integer in [1, 64]" in proc.stderr
    proc = launch(["-n", 1], timeout_s=30)
    assert proc.returncode == 2 and "`cmd` is empty" in proc.stderr
