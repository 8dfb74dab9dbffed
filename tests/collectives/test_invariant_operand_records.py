"""Issue 26, item 2: an operand already invariant over the axis goes into the records,
and the report refuses to name a culprit from that site, saying why.

Once the runtime only warned on stderr; the report then named rank 0 with high
confidence (and GPU advice) while process 1 was the slow one.
"""

from __future__ import annotations

import io
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SCRIPTS, run_launch
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from rich.console import Console

import jaxpace as jp
from jaxpace.records.reader import load_records
from jaxpace.report import analyze, print_summary, synthetic_records
from jaxpace.report.advice import next_steps
from jaxpace.report.render.html import render_report_html


def _grad_step(pacer, mesh, *, pcast):
    def loss_fn(w, x):
        return jnp.mean((x @ w) ** 2)

    def local(w, x):
        lw = jax.lax.pcast(w, "data", to="varying") if pcast else w
        # Its own site name: the runtime warns once per site and process, and
        # tests/test_first_hour.py checks that warning for "grads".
        return w - 0.1 * pacer.pmean(jax.grad(loss_fn)(lw, x), "data", site="inv_grads")

    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data")), out_specs=P()))


@pytest.mark.parametrize("pcast", [False, True])
def test_records_header_says_whether_the_operand_was_invariant(pcast, caplog):
    mesh = jax.make_mesh((8,), ("data",))
    pacer = jp.Pacer(granularity="device", mesh=mesh)
    step = _grad_step(pacer, mesh, pcast=pcast)
    x = jax.device_put(np.ones((16, 3), np.float32), NamedSharding(mesh, P("data")))
    w = jnp.ones(3)
    for _ in range(3):
        w = step(w, x)
    header = pacer.records()[0]
    pacer.close()
    assert header["type"] == "header" and header["platform"] == "cpu"
    assert header["sample_every"] == 1
    site = header["sites"]["inv_grads"]
    assert site["invariant_over"] == (None if pcast else "data")
    assert site["probe"]  # which probes timed it, as stats() says


def _invariant_records(**kw):
    recs = synthetic_records(4, 60, late_rank=2, late_s=0.01, seed=3, **kw)
    for r in recs:
        if r["type"] == "header":
            r["platform"] = "cpu"
            r["sites"] = {r_site: {"probe": "native: test", "invariant_over": "data"}
                          for r_site in {x["site"] for x in recs if x["type"] == "step"}}  # fmt: skip
    return recs


def test_report_names_no_culprit_from_an_invariant_site_and_says_why():
    rep = analyze(_invariant_records())
    assert rep.culprit is None and rep.culprits == () and rep.late_groups == ()
    assert not any(r.late for r in rep.ranks)
    assert rep.context.invariant_over == "data"
    assert rep.primary_mode != "persistent_straggler"
    assert not rep.mode("persistent_straggler").detected
    assert any(n.startswith("NO CULPRIT") for n in rep.notes)
    assert rep.decisions[0].startswith("NO CULPRIT")
    steps = next_steps(rep)
    assert "pcast" in steps[0] and not any("nvidia-smi" in s for s in steps)
    buf = io.StringIO()
    print_summary(rep, Console(file=buf, width=100))
    out = buf.getvalue()
    assert "NO CULPRIT" in out and "pcast" in out and "rank 2 (process 2" not in out
    page = render_report_html(rep)
    assert "NO CULPRIT" in page and "nvidia-smi" not in page


def test_same_records_without_the_flag_still_name_the_culprit():
    recs = [
        {k: v for k, v in r.items() if k != "sites"} if r["type"] == "header" else r
        for r in _invariant_records()
    ]
    assert analyze(recs).culprit == 2


@pytest.mark.multiprocess
def test_two_processes_without_pcast_report_no_culprit(tmp_path):
    """The issue's program: 2 processes, no `pcast`, process 1 sleeps 20 ms a step."""
    out = tmp_path / "run"
    proc = run_launch(
        ["-n", 2, "--local-devices", 1, "--timeout", 200, "--",
         sys.executable, SCRIPTS / "invariant_job.py", out],
        timeout_s=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "already invariant over 'data'" in proc.stdout + proc.stderr
    for p in (0, 1):
        header = load_records(out / f"records-p{p}.parquet").headers[0]  # the native format
        assert header["sites"]["grads"]["invariant_over"] == "data"
        assert header["platform"] == "cpu"
    rep = analyze(out)
    assert rep.culprit is None and any(n.startswith("NO CULPRIT") for n in rep.notes)
    buf = io.StringIO()
    print_summary(rep, Console(file=buf, width=100))
    text = buf.getvalue()
    assert "NO CULPRIT" in text and "nvidia-smi" not in text and "GPU-h" not in text


def test_sampling_and_a_stopped_policy_are_noted():
    recs = synthetic_records(4, 40, seed=0)
    for r in recs:
        if r["type"] == "header":
            r["sample_every"] = 4
            r["sites"] = {"train.py:1:train_step": {"backed_off": True, "invariant_over": None}}
    rep = analyze(recs)
    assert rep.context.sample_every == 4 and rep.context.policy_stopped
    assert any(n.startswith("SAMPLED: every 4th step") for n in rep.notes)
    assert any("stopped pacing" in n for n in rep.notes)
    buf = io.StringIO()
    print_summary(rep, Console(file=buf, width=100))
    assert "SAMPLED" in buf.getvalue()  # a tagged note: shown without --verbose


def test_pacer_writes_its_sampling_into_the_header():
    mesh = jax.make_mesh((8,), ("data",))
    pacer = jp.Pacer(granularity="device", mesh=mesh, sample_every=2)
    step = _grad_step(pacer, mesh, pcast=True)
    x = jax.device_put(np.ones((16, 3), np.float32), NamedSharding(mesh, P("data")))
    w = jnp.ones(3)
    for _ in range(4):
        w = step(w, x)
    header = pacer.records()[0]
    pacer.close()
    assert header["sample_every"] == 2
