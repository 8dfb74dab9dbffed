"""`jaxpace.report.model.Report`: three parts the renderers take, one flat JSON."""

from __future__ import annotations

import dataclasses
import json

import pytest

from jaxpace.report import analyze, synthetic_records
from jaxpace.report.model import Findings, Report, RunInfo, StepTiming
from jaxpace.report.render import tables

# The JSON's keys, in order, as users and tests read them (unchanged by the grouping).
JSON_KEYS = [
    "run_id", "site", "sites", "granularity", "num_ranks", "num_processes", "num_steps",
    "warmup_steps", "analyzed_steps", "partial", "notes", "iteration", "amplification",
    "ranks", "ranking", "culprit", "culprit_process", "noise_floor_s", "failure_modes",
    "primary_mode", "periodic", "what_if", "forecast", "pacing", "culprits", "late_groups",
    "costs", "decisions", "source", "fleet", "context", "likely", "sites_table",
]  # fmt: skip


@pytest.fixture(scope="module")
def rep() -> Report:
    return analyze(synthetic_records(16, 80, late_rank=5, late_s=0.004, seed=3))


def test_the_report_is_three_parts_and_reads_flat(rep):
    names = [f.name for f in dataclasses.fields(Report)]
    assert names == ["run", "timing", "findings", "sites_table", "data"]
    parts = {"run": RunInfo, "timing": StepTiming, "findings": Findings}
    for part, cls in parts.items():
        assert isinstance(getattr(rep, part), cls)
        for f in dataclasses.fields(cls):  # every attribute of a part reads from the report
            assert getattr(rep, f.name) is getattr(getattr(rep, part), f.name), f.name
    flat = {f.name for cls in parts.values() for f in dataclasses.fields(cls)}
    assert flat | {"sites_table"} == set(JSON_KEYS)
    assert rep.culprit == rep.findings.culprit == 5
    assert rep.rank_stats(5) is rep.findings.rank_stats(5) and rep.mode("balanced").name


def test_the_json_keeps_its_flat_keys_in_order(rep):
    d = json.loads(rep.to_json())
    assert list(d) == JSON_KEYS
    assert d["culprit"] == 5 and d["num_ranks"] == 16 and d["context"]["platform"] == "unknown"
    assert d["iteration"]["num_steps"] == rep.analyzed_steps


def test_tables_take_the_part_they_read(rep):
    assert tables.ranking_rows(rep.findings, 3)[1][0] == "5 *"
    assert tables.failure_mode_rows(rep.findings)[0] == ["mode", "score", "detected", "evidence"]
    cost = tables.cost_rows(rep.findings, rep.context.hours_unit)
    assert cost[0][-1] == "device-h per 1,000 steps" and cost[1][0] == "rank 5"
    assert tables.site_rows(rep.sites_table) == []  # one site
