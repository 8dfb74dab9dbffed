"""`jaxpace report` on NCCL Inspector logs (`<host>-pid<pid>.log`, one JSON object a line).

`tests/fixtures/nccl_inspector/` holds two ranks' logs written by hand in the
plugin's format (`inspector_json.cc`); larger runs come from
`jaxpace.records.sources.synthetic.write_inspector_logs`: every rank leaves a
collective when the last has arrived, so its kernel time is its wait plus the
transfer.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import run_report

from jaxpace.errors import RecordsError
from jaxpace.records.sources import detect
from jaxpace.records.sources import load as load_source
from jaxpace.records.sources.synthetic import Comm, write_inspector_logs
from jaxpace.report import analyze

FIXTURE = Path(__file__).parent.parent / "fixtures" / "nccl_inspector"


def test_fixture_in_the_documented_format():
    """Hand-written lines: `"nan"` bandwidths, a p2p line, a cut last line."""
    assert detect(FIXTURE) == "nccl_inspector"
    rep = analyze(FIXTURE, warmup_steps=0)
    assert rep.sites == ("AllReduce on DP Group 0 (0x7f8c496ae9f661)",)
    assert (rep.num_ranks, rep.num_processes, rep.num_steps) == (2, 2, 10)
    assert rep.partial  # the cut line
    assert rep.ranking[0] == 1 and rep.ranks[1].host == "node-b"
    notes = " ".join(rep.notes)
    assert "1 last line cut short" in notes and "node-b-pid438776.log:12" in notes
    assert "2 point-to-point records" in notes
    # Kernel times are the waits: rank 1 spent ~3 ms less in every collective.
    d = rep.data
    assert np.allclose(d.wait[:, 0] - d.wait[:, 1], 3.06e-3, atol=0.1e-3)
    assert np.isnan(d.compute).all()  # no `event_trace_ts`: no arrival times


def test_late_rank_is_named(tmp_path):
    write_inspector_logs(tmp_path, 32, 120, ranks_per_host=4, late_ranks=[13], late_us=1500.0)
    rep = analyze(tmp_path)
    assert rep.culprit == 13 and rep.culprit_process == 13
    assert rep.rank_stats(13).host == "node-3"
    assert rep.rank_stats(13).excess_lateness_s == pytest.approx(1.5e-3, rel=0.2)
    assert rep.source.startswith("NCCL Inspector logs: 32 files (processes) on 8 hosts")


def test_late_host_is_named(tmp_path):
    late = list(range(16, 24))  # every rank of node-2
    write_inspector_logs(tmp_path, 32, 120, ranks_per_host=8, late_ranks=late, late_us=1200.0)
    rep = analyze(tmp_path)
    assert [g.name for g in rep.late_groups][:1] == ["host node-2"]
    assert set(rep.late_groups[0].ranks) == set(late)
    assert rep.culprit is None or rep.culprit in late


def test_healthy_run_names_nobody(tmp_path):
    write_inspector_logs(tmp_path, 32, 120, ranks_per_host=8, seed=3)
    rep = analyze(tmp_path)
    assert rep.culprit is None and rep.culprits == () and rep.late_groups == ()
    assert rep.primary_mode == "balanced"


def test_several_communicators_are_several_sites(tmp_path):
    comms = [
        Comm("0xd0", "DP", tuple(range(16))),
        Comm("0x70", "TP 0", tuple(range(8)), ("AllGather", "ReduceScatter")),
        Comm("0x71", "TP 1", tuple(range(8, 16)), ("AllGather", "ReduceScatter")),
    ]
    write_inspector_logs(tmp_path, 16, 100, comms=comms, late_ranks=[11], late_us=1500.0)
    rep = analyze(tmp_path)
    assert len(rep.sites) == 5 and rep.site == "(whole step)"
    # The whole step numbers the communicators' local ranks globally: rank 3 of TP 1 is 11.
    assert rep.culprit == 11 and rep.culprit_process == 11 and rep.num_ranks == 16
    assert not rep.partial  # not being a member of TP 0 is not a missing record
    dp = analyze(tmp_path, site="AllReduce on DP (0xd0)")
    assert dp.culprit == 11 and dp.num_ranks == 16
    tp1 = analyze(tmp_path, site="ReduceScatter on TP 1 (0x71)")
    # Rank 3 of TP 1 is global rank 11: its process (and host) says so.
    assert tp1.num_ranks == 8 and tp1.culprit == 3 and tp1.culprit_process == 11
    assert tp1.rank_stats(3).host == "node-1"
    tp0 = analyze(tmp_path, site="AllGather on TP 0 (0x70)")
    assert tp0.culprit is None


def test_ring_overflow_gaps_skip_steps(tmp_path):
    paths = write_inspector_logs(tmp_path, 16, 150, late_ranks=[4], late_us=1500.0, seed=5)
    rng = np.random.default_rng(0)
    dropped = 0
    for p in paths[::3]:  # some ranks lost a run of records between two dumps
        lines = p.read_text().splitlines(keepends=True)
        start = int(rng.integers(20, 120))
        p.write_text("".join(lines[:start] + lines[start + 10 :]))
        dropped += 10
    rep = analyze(tmp_path)
    assert rep.culprit == 4 and rep.partial
    notes = " ".join(rep.notes)
    assert f"{dropped} collectives missing inside the `coll_sn` ranges" in notes
    # Steps lacking some ranks are used, comparing the ranks present (issue 46).
    assert "PARTIAL" in notes and "lack some ranks" in notes and rep.num_steps == 150


def test_cut_last_line_and_bad_lines_are_counted(tmp_path):
    paths = write_inspector_logs(tmp_path, 8, 60, ranks_per_host=4, late_ranks=[6], late_us=1500.0)
    text = paths[2].read_text()
    paths[2].write_text(text[: len(text) - 40])  # killed mid-line
    lines = paths[5].read_text().splitlines(keepends=True)
    lines[10] = "garbage\n"
    lines[20] = lines[20].replace('"coll_exec_time_us":', '"coll_exec_time_us":"nan","x":')
    lines[30] = lines[30].replace('"rank":5', '"rank":9')
    paths[5].write_text("".join(lines))
    rep = analyze(tmp_path)
    assert rep.culprit == 6 and rep.partial
    notes = " ".join(rep.notes)
    assert f"1 last line cut short (a process killed while writing?), skipped: {paths[2]}:60" in (
        notes
    )
    assert "3 bad lines skipped" in notes
    assert f"{paths[5]}:11: not JSON" in notes
    assert f"{paths[5]}:21: `coll_exec_time_us` should be a number" in notes
    assert "`header.rank` 9 is not below `n_ranks` 8" in notes


def test_p2p_lines_are_counted_not_compared(tmp_path):
    write_inspector_logs(tmp_path, 8, 40, p2p_every=5)
    loaded = load_source(tmp_path)
    assert loaded.records.sites == ("AllReduce on world (0x5eed00000000a11)",)
    assert any("64 point-to-point records" in n for n in loaded.records.notes)


def test_verbose_kernel_times_measure_compute_across_host_clocks(tmp_path):
    """`event_trace_ts` gives each rank's kernel start on its own host's clock."""
    write_inspector_logs(tmp_path, 16, 60, verbose=True, late_ranks=[9], late_us=1500.0)
    loaded = load_source(tmp_path)
    assert loaded.timed and "kernel times only" not in loaded.source
    rep = analyze(tmp_path)
    assert rep.culprit == 9
    assert rep.iteration.mean_s == pytest.approx(0.020, rel=0.05)  # the 20 ms step
    assert rep.rank_stats(9).compute_s > rep.rank_stats(0).compute_s + 1e-3


def test_cli_reports_inspector_logs_of_one_folder_per_node(tmp_path):
    for node in range(2):  # as collected: one folder per node
        write_inspector_logs(tmp_path / f"node{node}", 16, 60, late_ranks=[3], late_us=1500.0)
        for f in (tmp_path / f"node{node}").iterdir():
            if not f.name.startswith(f"node-{node}-"):
                f.unlink()
    proc = run_report(str(tmp_path), "--json", tmp_path / "r.json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "NCCL Inspector logs: 16 files" in proc.stdout
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["culprit"] == 3 and rep["num_ranks"] == 16 and rep["iteration"]["mean_s"] is None
    assert (tmp_path / "report.html").stat().st_size > 0
    assert '"ph":"X"' in (tmp_path / "trace.json").read_text()


def test_unusable_logs_give_one_line_and_rc_2(tmp_path):
    (tmp_path / "n1-pid7.log").write_text("not json\n{}\n")
    with pytest.raises(RecordsError, match="no collective records"):
        analyze(tmp_path)
    one = tmp_path / "one"
    write_inspector_logs(one, 2, 10, comms=[Comm("0x1", "solo", (0,))])
    with pytest.raises(RecordsError, match="reported by two ranks"):
        analyze(one)
    proc = run_report(str(tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "n1-pid7.log:1" in proc.stderr


def test_an_empty_directory_names_every_source(tmp_path):
    (tmp_path / "notes.txt").write_text("nothing here")
    with pytest.raises(RecordsError, match="jax.profiler.*NCCL Inspector"):
        analyze(tmp_path)
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "vm.xplane.pb").write_bytes(b"\x00")
    with pytest.raises(RecordsError, match=r"XPlane files .* but no Chrome trace"):
        analyze(tmp_path)


def test_readers_do_not_import_jax(tmp_path):
    code = (
        "import sys\n"
        "from jaxpace.report import analyze\n"
        "from jaxpace.records.sources.synthetic import write_inspector_logs, write_xprof_traces\n"
        f"write_inspector_logs({str(tmp_path / 'i')!r}, 4, 20)\n"
        f"write_xprof_traces({str(tmp_path / 'x')!r}, 2, 2, 20)\n"
        f"analyze({str(tmp_path / 'i')!r}); analyze({str(tmp_path / 'x')!r})\n"
        "assert 'jax' not in sys.modules, sorted(m for m in sys.modules if 'jax.' in m)[:5]\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
