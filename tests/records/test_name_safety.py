"""Names from records and sites are data: never rich markup, never terminal escapes (issue #32 items 6, 7)."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest
from conftest import run_report
from rich.console import Console

from jaxpace.records.synthetic import synthetic_records
from jaxpace.report import analyze, load_records
from jaxpace.report.render.terminal import print_summary

MARKUP = "grads[/]"
ESCAPES = "grads\x1b]0;PWNED-TITLE\x07\x1b[2J\x1b[31mRED"


def _run(tmp_path: Path, site: str, host: str) -> Path:
    recs = synthetic_records(2, 40, late_rank=1, late_s=0.004, site=site)
    for r in recs:
        if r["type"] == "header":
            r["host"] = host
    run = tmp_path / "run"
    load_records(recs).write_jsonl(run)
    return run


def _report(run: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_report(str(run), *extra, timeout_s=240)


@pytest.mark.timeout(300)
def test_rich_markup_in_site_and_host_names_is_printed_not_parsed(tmp_path):
    """Item 6: `site="grads[/]"` (or host `node[/]`) ended the report with a MarkupError, rc 1."""
    run = _run(tmp_path, MARKUP, "node[/]")
    proc = _report(run, "--json", str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert MARKUP in proc.stdout and "node[/]" in proc.stdout
    assert (run / "report.html").exists() and (run / "trace.json").exists()
    assert json.loads((tmp_path / "r.json").read_text())["site"] == MARKUP


@pytest.mark.timeout(300)
def test_terminal_escapes_in_names_are_shown_escaped_not_sent(tmp_path):
    """Item 7: a site carrying OSC/ESC/BEL sequences set the window title and cleared the screen."""
    run = _run(tmp_path, ESCAPES, "vm\x1b[2J")
    proc = _report(run, "--json", str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for raw in ("\x1b", "\x07"):
        assert raw not in proc.stdout and raw not in proc.stderr
    assert "grads\\x1b]0;PWNED-TITLE\\x07\\x1b[2J" in proc.stdout
    # The data itself is kept exactly: the JSON carries the real name.
    assert json.loads((tmp_path / "r.json").read_text())["site"] == ESCAPES


@pytest.mark.timeout(120)
def test_a_real_terminal_gets_rich_styles_but_no_sequence_from_a_name():
    recs = synthetic_records(2, 30, site=ESCAPES)
    buf = io.StringIO()
    print_summary(analyze(recs), Console(file=buf, width=160, force_terminal=True))
    out = buf.getvalue()
    assert "\x1b]0;" not in out and "\x07" not in out and "\x1b[2J" not in out
    assert "PWNED-TITLE" in out


def test_printable_keeps_distinct_names_distinct():
    from jaxpace.report.render.terminal import printable

    names = ["a\x1bb", "a\\x1bb", "a\u202eb", "a\nb", "a\tb", "a b", "a\x9bb"]
    shown = [printable(n) for n in names[:1] + names[2:]]
    assert len(set(shown)) == len(shown)
    assert all(not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in s) for s in shown)


def _summary(site: str, step: int, rank: int = 0) -> dict:
    return {
        "site": site,
        "step": step,
        "rank": rank,
        "wait_s": 0.001,
        "delay_s": 0.0,
        "engaged": False,
    }


@pytest.mark.timeout(120)
def test_distinct_sites_stay_distinct_tensorboard_series(tmp_path):
    """Item 10: `layer[0]` and `layer(0)` both became `jaxpace/layer_0_/...` (60 points, no warning).

    Also issue #26 item 8: `:` is mapped by a documented rule (`--`), not silently to `_`.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import jaxpace.sinks as sinks

    sites = ["layer[0]", "layer(0)", "layer_0_", "a:b", "a--b", "a/b", MARKUP, ESCAPES]
    tb = sinks.tensorboard(tmp_path / "tb")
    for step in range(30):
        for site in sites:
            tb(_summary(site, step))
    tb.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    series = [t for t in acc.Tags()["scalars"] if t.endswith("/wait_ms/rank0")]
    assert len(series) == len(sites), series  # one series per site, none merged
    assert all(len(acc.Scalars(t)) == 30 for t in series)
    assert {f"jaxpace/{sinks.site_tag(s)}/wait_ms/rank0" for s in sites} == set(series)
    assert sinks.site_tag("train.py:12:step") == "train.py--12--step"


@pytest.mark.timeout(120)
def test_prometheus_labels_carry_hostile_names_exactly(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    import jaxpace.sinks as sinks

    sites = ["layer[0]", "layer(0)", 'q"uote\\', "new\nline", ESCAPES]
    prom = sinks.prometheus_textfile(tmp_path / "m.prom", write_every_s=0)
    for site in sites:
        prom(_summary(site, 0))
    path = prom.write()
    fams = {f.name: f for f in text_string_to_metric_families(Path(path).read_text())}
    got = {s.labels["site"] for s in fams["jaxpace_wait_seconds"].samples}
    assert got == set(sites)


def test_the_sites_table_on_the_cli_shows_escapes_not_sends_them(tmp_path, capsys):
    """With two sites `jaxpace report` prints a table of sites: its names are data too."""
    import argparse

    from jaxpace.report import cli as report_cli

    first = synthetic_records(4, 30, site=ESCAPES, seed=1)
    second = [r for r in synthetic_records(4, 30, site="pp", seed=2) if r["type"] != "header"]
    run = tmp_path / "run"
    load_records(first + second).write_jsonl(run)
    ap = argparse.ArgumentParser()
    report_cli.configure_parser(ap)
    assert report_cli.cli_main(ap.parse_args([str(run), "--site", "pp"])) == 0
    out = capsys.readouterr().out
    assert "Sites, in step order" in out
    assert "\x1b" not in out and "\x07" not in out
    assert "grads\\x1b]0;PWNED-TITLE\\x07" in out.split("Sites, in step order")[1]
