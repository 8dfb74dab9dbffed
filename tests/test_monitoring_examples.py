"""examples/monitoring: the alerting rules pass promtool (syntax and their unit tests), and
every series the rules and the Grafana dashboard query is one jaxpace's exporter writes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import prometheus_client.parser as prom_parser  # the dev extra installs it
import pytest

import jaxpace as jp

REPO = Path(__file__).resolve().parent.parent
MON = REPO / "examples" / "monitoring"
SERIES = re.compile(r"\bjaxpace_[a-z_]+\b")  # recording rules are `jaxpace:...`, not matched
LABEL_MATCH = re.compile(r"\b([a-z_]+)\s*=~?\s*\"")


def _exported(tmp_path: Path) -> dict[str, set[str]]:
    """The series (and their label names) a real fleet-view textfile holds."""
    prom = jp.sinks.prometheus_textfile(tmp_path / "m.prom", write_every_s=3600, fleet=True)
    for step in range(10):
        early = [0.01, 0.02, 0.0, 0.03]
        prom(
            {
                "site": "grads",
                "step": step,
                "rank": 0,
                "wait_s": 0.01,
                "delay_s": 0.001,
                "engaged": True,
                "earliness_s": early,
                "step_time_s": 0.1,
            }
        )
    prom.write()
    text = Path(prom.path).read_text()
    out: dict[str, set[str]] = {}
    for fam in prom_parser.text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(fam.name, set()).update(s.labels)
    return out


def _dashboard_exprs() -> list[str]:
    dash = json.loads((MON / "jaxpace-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if v.get("type") == "query"]
    return exprs


def test_every_series_the_dashboard_and_rules_query_is_exported(tmp_path):
    exported = _exported(tmp_path)
    assert "jaxpace_culprit_rank" in exported  # the fleet view was written
    rules = (MON / "jaxpace-alerts.yml").read_text()
    exprs = _dashboard_exprs()
    assert len(exprs) >= 10
    named = set(SERIES.findall(rules)) | {n for e in exprs for n in SERIES.findall(e)}
    assert named, "no jaxpace series found in the examples"
    missing = sorted(named - set(exported))
    assert not missing, f"series the examples query but jaxpace does not export: {missing}"
    # Labels the queries match on exist on the series they query.
    for e in exprs:
        for name in SERIES.findall(e):
            for label in LABEL_MATCH.findall(e):
                assert label in exported[name], f"{name} has no label {label!r} (in {e!r})"


@pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool is not installed (Debian's `prometheus` package ships it; .ci/run installs it)",
)
def test_alert_rules_pass_promtool_check_and_their_unit_tests():
    check = subprocess.run(
        ["promtool", "check", "rules", "jaxpace-alerts.yml"],
        cwd=MON,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 5 rules found" in check.stdout
    unit = subprocess.run(
        ["promtool", "test", "rules", "jaxpace-alerts.test.yml"],
        cwd=MON,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr
