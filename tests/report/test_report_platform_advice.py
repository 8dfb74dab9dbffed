"""Issue 26, item 7: advice and units for the platform the run was on; no advice to do
what the run already did (`try pacing` after adaptive pacing ran)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from jaxpace.report import analyze, print_summary, synthetic_records
from jaxpace.report.advice import next_steps
from jaxpace.report.render.html import render_report_html

GPU_ONLY = ("nvidia-smi", "lspci", "GPU-h", "PCIe")


def _with_header(recs, **fields):
    for r in recs:
        if r["type"] == "header":
            r.update(fields)
    return recs


def _everything(rep) -> str:
    buf = io.StringIO()
    print_summary(rep, Console(file=buf, width=120), verbose=True)
    return buf.getvalue() + render_report_html(rep) + " ".join(rep.decisions)


def _straggler(platform: str | None):
    recs = synthetic_records(4, 60, late_rank=2, late_s=0.01, seed=1)
    return analyze(_with_header(recs, platform=platform) if platform else recs)


def test_cpu_run_gets_cpu_advice_and_units():
    rep = _straggler("cpu")
    assert rep.context.platform == "cpu" and rep.culprit == 2
    text = _everything(rep)
    for word in GPU_ONLY:
        assert word not in text, word
    assert "CPU-rank-h per 1,000 steps" in text
    assert any("taskset" in s for s in next_steps(rep))


def test_gpu_run_keeps_gpu_checks_and_gpu_hours():
    rep = _straggler("gpu")
    text = _everything(rep)
    assert "nvidia-smi -q -d CLOCK" in text and "GPU-h per 1,000 steps" in text


def test_tpu_run_has_no_gpu_tools():
    text = _everything(_straggler("tpu"))
    assert "nvidia-smi" not in text and "TPU-h per 1,000 steps" in text


@pytest.mark.parametrize("platform", ["cuda", "rocm"])
def test_gpu_platform_names_count_as_gpu(platform):
    assert _straggler(platform).context.platform == "gpu"


def test_records_without_a_platform_say_which_check_is_for_a_gpu():
    rep = _straggler(None)
    assert rep.context.platform == "unknown"
    assert any("on a GPU" in s and "nvidia-smi" in s for s in next_steps(rep))
    assert "device-h per 1,000 steps" in _everything(rep)


def _amplification(policy: str | None):
    recs = synthetic_records(16, 200, seed=0, straggler_prob=0.05, straggler_factor=2.0)
    return analyze(_with_header(recs, policy=policy) if policy else recs)


def test_no_try_pacing_when_adaptive_pacing_already_ran():
    rep = _amplification("adaptive(threshold_s=0.001, max_delay_s=0.005)")
    assert rep.primary_mode == "synchronization_amplification"
    assert rep.context.pacing_ran
    text = " ".join(next_steps(rep))
    assert "try pacing" not in text and "jp.adaptive" not in text
    assert "pacing already ran" in text


@pytest.mark.parametrize("policy", ["no_pacing()", None])  # None: the generator's "synthetic"
def test_try_pacing_is_offered_when_the_run_only_measured(policy):
    rep = _amplification(policy)
    assert not rep.context.pacing_ran
    assert any("try pacing" in s for s in next_steps(rep))


def test_a_fixed_delay_policy_counts_as_pacing():
    assert _amplification("fixed(delay_s=0.001)").context.pacing_ran
