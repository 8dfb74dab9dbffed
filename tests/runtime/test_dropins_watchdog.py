"""The stall watchdog names the process that never arrives at a `jaxpace.all_gather`."""

from __future__ import annotations

import sys

import pytest
from conftest import SCRIPTS

from jaxpace.launch import STALL_EXIT_CODE
from jaxpace.native import probes as _native


@pytest.mark.multiprocess
@pytest.mark.timeout(260)
@pytest.mark.skipif(not _native.available()[0], reason="native probes unavailable")
def test_stall_at_an_all_gather_names_the_missing_process(launch, tmp_path):
    args = ["-n", 4, "--local-devices", 2, "--timeout", 150, "--heartbeat-timeout", 60, "--"]
    args += [sys.executable, SCRIPTS / "stall_gather.py", "--run-dir", tmp_path]
    proc = launch(args, timeout_s=200)
    out = proc.stdout + proc.stderr
    assert proc.returncode == STALL_EXIT_CODE, out[-4000:]
    for r in range(4):  # each process timed the site with the native probes
        assert any(
            ln.startswith(f"[rank {r}]") and "PROBE native" in ln for ln in proc.stdout.splitlines()
        ), out[-3000:]
    for r in (0, 2, 3):
        msgs = [
            ln
            for ln in proc.stdout.splitlines()
            if ln.startswith(f"[rank {r}]") and "jaxpace: stalled" in ln
        ]
        assert len(msgs) == 1, out[-3000:]
        assert "at mp.gather step 10" in msgs[0] and "waiting for process 1 (host " in msgs[0]
