"""`python -m benchmarks watch-alarms`: healthy windows through watch's live decision path."""

import numpy as np
import pytest

alarms = pytest.importorskip("benchmarks.watch_alarms")


def test_window_summaries_combine_into_the_runs_own_window():
    """Each process's summary of window 2 (steps 10-14 of the run) combines, as live, into
    records holding exactly those executions: every process, its waits to the microsecond,
    the steps at the window's call indices, nothing partial."""
    from benchmarks.accuracy import fleet_run
    from jaxpace.watch.summary import combine

    rec = fleet_run(8, 20, seed=5)
    got = alarms.summaries_of(rec, 2)
    recs, notes = combine(got, process_count=8, window=3, first=300, last=304, run_id="t")
    assert notes == [] and not recs.partial
    c, r = recs.columns, rec.columns
    assert sorted(set(c["step"].tolist())) == [300, 301, 302, 303, 304]
    sel = (r["step"] >= 10) & (r["step"] < 15)
    want = sorted(
        zip(r["step"][sel] - 10, r["process"][sel], r["wait_ns"][sel] // 1000, strict=True)
    )
    have = sorted(zip(c["step"] - 300, c["process"], c["wait_ns"] // 1000, strict=True))
    assert np.array_equal(np.array(want), np.array(have))


def test_the_path_names_a_late_process_and_the_block_is_written_between_its_markers(tmp_path):
    """A process 30% of a step late is named in every window after the first through the
    same path that counts false alarms (so zero alarms on healthy runs is not a path that
    never names); the script writes its block after the text it finds and replaces only
    that block."""
    late = alarms.run_one(8, 6, seed=11, late=3, late_fraction=0.3)
    assert late["names"][1:] == [3] * 5, late
    doc = tmp_path / "diagnostics.md"
    doc.write_text("# Diagnostics\n\n<!-- END accuracy -->\n")
    args = ["--sizes", "4", "--runs", "1", "--windows", "3", "--out", str(tmp_path),
            "--markdown", str(doc)]  # fmt: skip
    assert alarms.main(args) == 0
    text = doc.read_text()
    assert text.startswith("# Diagnostics\n\n<!-- END accuracy -->\n")
    assert text.count(alarms.BEGIN) == 1 and "| 4 | 3 |" in text
    assert alarms.main(args) == 0 and doc.read_text() == text
    new = tmp_path / "new" / "alarms.md"  # (a markdown file not there yet: written)
    new.parent.mkdir()
    assert alarms.main([*args[:-1], str(new)]) == 0
    assert new.read_text().count(alarms.BEGIN) == 1 and "| 4 | 3 |" in new.read_text()


def test_onsets_count_a_process_named_window_after_window_once():
    assert alarms._onsets([None, 3, 3, 3, None, 3, 2, 2]) == 3
    assert alarms._onsets([None] * 5) == 0


def test_jobs_run_the_same_seeds_in_parallel_with_the_same_result():
    one = alarms.run([4], 3, 3, 7, jobs=1)["sizes"]["4"]
    two = alarms.run([4], 3, 3, 7, jobs=2)["sizes"]["4"]
    one.pop("seconds"), two.pop("seconds")
    assert one == two and one["windows"] == 9


def test_late_runs_write_the_recall_table_between_its_markers(tmp_path):
    """`--late`: the same fleets with process 3 late by half a step; the table counts the
    windows after the first that named it (all of them here) and none naming another."""
    doc = tmp_path / "diagnostics.md"
    doc.write_text(f"# D\n\n{alarms.BEGIN_RECALL}\nold\n{alarms.END_RECALL}\ntail\n")
    args = ["--late", "0.5", "--sizes", "8", "--runs", "2", "--windows", "4", "--out",
            str(tmp_path), "--markdown", str(doc)]  # fmt: skip
    assert alarms.main(args) == 0
    text = doc.read_text()
    assert text.startswith(f"# D\n\n{alarms.BEGIN_RECALL}\n") and text.endswith("tail\n")
    assert "old" not in text
    assert "| 8 | 0.001, fleet line 0.0001 (watch's) | 50% | 6 | 6 (100%) | 0 |" in text, text


def test_alpha_takes_watchs_levels_by_name_and_refuses_a_level_outside(tmp_path, capsys):
    """`--alpha watch 0.001`: one row at watch's own levels, one with both tests at 0.001;
    a level outside (0, 0.5] is refused, naming what is expected."""
    doc = tmp_path / "diagnostics.md"
    doc.write_text(f"{alarms.BEGIN_RECALL}\n{alarms.END_RECALL}\n")
    args = ["--late", "0.5", "--sizes", "8", "--runs", "1", "--windows", "3", "--out",
            str(tmp_path), "--markdown", str(doc), "--alpha", "watch", "0.001"]  # fmt: skip
    assert alarms.main(args) == 0
    text = doc.read_text()
    assert "--alpha watch 0.001`" in text, text
    assert "| 8 | 0.001, fleet line 0.0001 (watch's) | 50% |" in text, text
    assert "| 8 | 0.001 | 50% |" in text, text
    with pytest.raises(SystemExit):
        alarms.main(["--alpha", "0.7"])
    assert "expected a level in (0, 0.5] or 'watch'" in capsys.readouterr().err
