"""`python -m benchmarks watch --interleaved`: the arithmetic of its ratios and its table."""

import pytest

wi = pytest.importorskip("benchmarks.watch_interleaved")
interval = pytest.importorskip("benchmarks.watch").interval


def _block(plain_s, watch_s, calls=1000, thread_s=0.0, cost=0.1):
    return {"plain_s": plain_s, "plain_calls": calls, "watch_s": watch_s, "watch_calls": calls,
            "thread_cpu_in_plain_s": thread_s, "decided_in_block": 1,
            "window_cost_s": cost}  # fmt: skip


def test_a_periods_ratio_is_the_watched_calls_mean_over_the_unwatched_and_charged_adds_the_thread():
    """Means per call (the arms may hold different numbers of calls); `charged` adds the
    watch thread's CPU time during the unwatched calls to the watched arm."""
    run = {"blocks": [_block(4.0, 4.04), {**_block(4.0, 8.08, thread_s=0.04), "watch_calls": 2000}]}
    ratios, charged = wi.pair_ratios(run)
    assert ratios == pytest.approx([1.01, 1.01])
    assert charged == pytest.approx([1.01, (8.08 / 2000 + 0.04 / 1000) / (4.0 / 1000)])
    got = interval([1.01, 1.02, 1.03])
    assert got["n"] == 3 and got["mean_pct"] == pytest.approx(2.0)
    lo, hi = got["ci95_pct"]
    assert lo < 2.0 < hi and hi - 2.0 == pytest.approx(2.0 - lo)


def test_the_table_decides_within_1_percent_by_the_charged_interval():
    fig = {
        "by_process": {"n": 4, "mean_pct": 0.5, "ci95_pct": [0.2, 0.8]},
        "by_process_charged": {"n": 4, "mean_pct": 0.6, "ci95_pct": [0.3, 1.2]},
        "by_pair": {"n": 4, "mean_pct": 0.5, "ci95_pct": [0.2, 0.8]},
        "plain_call_ms": 4.0, "watch_call_ms": 4.02, "period_calls": [7000, 9000],
        "period_s": [30.0, 36.0], "decided_in_block": [1, 1, 0, 1],
        "window_cost_s": [0.1, 0.14, None, 0.12], "thread_cpu_between_ms_per_s": 0.3,
        "load": [1.0, 1.0, 1.0], "processes": 4, "pairs": 1,
    }  # fmt: skip
    text = wi.markdown({"demo": fig, "machine": "m", "date": "d"})
    row = next(line for line in text.splitlines() if line.startswith("| demo's model"))
    assert "| undecided at this n |" in row and "| 3 of 4 |" in row and "| 120 ms |" in row
    fig["by_process_charged"]["ci95_pct"] = [0.3, 0.9]
    row = next(
        line
        for line in wi.markdown({"demo": fig, "machine": "m", "date": "d"}).splitlines()
        if line.startswith("| demo's model")
    )
    assert "| met |" in row


def test_a_period_splits_into_the_chunks_near_a_window_and_the_rest():
    """Far chunks' mean call against the unwatched chunks' mean; each part's extra seconds."""
    block = {"chunk_log": [["p", 100, 1.0, 0], ["w", 100, 1.01, 0], ["w", 120, 1.5, 1],
                           ["p", 100, 1.0, 0], ["w", 100, 1.02, 0]]}  # fmt: skip
    got = wi.where_it_goes(block)
    assert got["far_ratio"] == pytest.approx(2.03 / 2.0)
    assert got["far_extra_s"] == pytest.approx(0.03)
    assert got["near_extra_s"] == pytest.approx(1.5 - 1.2)
    assert wi.where_it_goes({"plain_s": 1.0}) is None


def test_the_outside_table_has_a_row_per_process_between_its_markers(tmp_path):
    from benchmarks import watch
    from benchmarks.fsdp import write_section

    runs = [
        {"rounds": 30, "calls": 250, "held_us": 160.0, "watch_us": 170.0, "extra_us": 9.7,
         "ci95_us": [8.1, 11.3]},
        {"rounds": 30, "calls": 250, "held_us": 177.0, "watch_us": 185.0, "extra_us": 7.7,
         "ci95_us": [-1.0, 16.4]},
    ]  # fmt: skip
    text = watch.markdown_outside(runs, "vm")
    assert text.startswith(watch.BEGIN_OUTSIDE) and text.endswith(watch.END_OUTSIDE)
    assert "| 0 | 160 us | 170 us | +9.7 us [+8.1, +11.3] |" in text
    assert "| 1 | 177 us | 185 us | +7.7 us [-1.0, +16.4] |" in text
    doc = tmp_path / "b.md"
    doc.write_text(f"top\n{watch.BEGIN_OUTSIDE}\nold\n{watch.END_OUTSIDE}\nbottom\n")
    write_section(text, doc, watch.BEGIN_OUTSIDE, watch.END_OUTSIDE)
    assert doc.read_text() == f"top\n{text}\nbottom\n"
