"""Issue 47: every source knows its platform (CPU traces, GPU traces, NCCL Inspector), and
trace sites know their collective: no `?`, no `None`, no GPU advice or `device-h` on CPU."""

from __future__ import annotations

import gzip
import io
import json

import numpy as np
from rich.console import Console

from jaxpace.records.sources.synthetic import write_inspector_logs
from jaxpace.report import analyze, print_summary
from jaxpace.report.render.html import render_report_html

GPU_ONLY = ("nvidia-smi", "lspci", "GPU-h", "PCIe")


def _everything(rep) -> str:
    buf = io.StringIO()
    print_summary(rep, Console(file=buf, width=120), verbose=True)
    return buf.getvalue() + render_report_html(rep) + " ".join(rep.decisions)


def _cpu_trace(tmp_path, steps=60, late=3, late_us=400.0):
    """One process, 8 CPU devices, two collectives a step (an all-reduce, then an
    all-gather), device `late` entering each late; one `run_id` per step."""
    rng = np.random.default_rng(5)
    events = [{"ph": "M", "pid": 7, "name": "process_name", "args": {"name": "/host:CPU"}}]
    t = 0.0
    for k in range(steps):
        for op in ("all-reduce.1", "all-gather.2"):
            arrive = t + 1000.0 + rng.exponential(20.0, 8)
            arrive[late] += late_us
            leave = arrive.max() + 50.0
            for d in range(8):
                args = {"device_ordinal": str(d), "hlo_module": "jit_step", "hlo_op": op}
                events.append(
                    {"ph": "X", "pid": 7, "tid": d, "ts": arrive[d], "dur": leave - arrive[d]}
                    | {"name": op, "args": args | {"run_id": str(500 + k)}}
                )
            t = leave
    run = tmp_path / "plugins" / "profile" / "2026_01_01_00_00_00"
    run.mkdir(parents=True)
    with gzip.open(run / "cpu-host.trace.json.gz", "wt") as f:
        json.dump({"displayTimeUnit": "ns", "traceEvents": events}, f)
    return tmp_path


def test_cpu_trace_is_cpu_and_its_sites_know_their_collective(tmp_path):
    rep = analyze(_cpu_trace(tmp_path))
    assert rep.context.platform == "cpu"
    assert {r.site: r.kind for r in rep.sites_table} == {
        "jit_step/all-reduce.1": "all-reduce",
        "jit_step/all-gather.2": "all-gather",
    }
    text = _everything(rep)
    assert "(None)" not in text and " ? " not in text and "None" not in text
    for word in (*GPU_ONLY, "device-h"):
        assert word not in text, word


def test_nccl_inspector_logs_are_a_gpu_run(tmp_path):
    write_inspector_logs(tmp_path, 16, 60, late_ranks=[5], late_us=2000.0)
    rep = analyze(tmp_path)
    assert rep.context.platform == "gpu"
    assert "device-h" not in _everything(rep)
