"""The report's per-group view: who arrives last within each group, and slow ppermute pairs.

Synthetic records with known lateness (and a balanced negative control), plus the site
layout that the records' header carries (groups of a 2 x 4 mesh, ppermute pairs).
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from conftest import run_4x2
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxpace.collectives import layout as _site_layout
from jaxpace.records import format as _record_format
from jaxpace.records.reader import load_records
from jaxpace.report.stages import links

SITES = {
    "ag": {"kind": "all_gather", "groups": [[0, 2], [1, 3]]},
    "pp": {"kind": "ppermute", "groups": [[0, 1, 2, 3]], "pairs": [[0, 1], [1, 2], [2, 3], [3, 0]]},
}


def _run(late: bool, steps: int = 30, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for p in range(4):
        out.append(
            _record_format.header_record(
                run_id="r", process_index=p, process_count=4, host="h", pid=p,
                granularity="process", jaxpace_version="0", policy="no_pacing()",
                local_devices=[p], rank_groups=None, sites=SITES,
            )
        )  # fmt: skip
    for k in range(steps):
        t0 = k * 100_000_000
        ag = rng.uniform(0.004, 0.012, 4)
        if late:
            ag[3] += 0.05  # rank 1 arrives 50 ms after rank 3: 3 waits, 1 does not
        pp = rng.uniform(0.0005, 0.0015, 4)
        if late:
            pp[2] += 0.04  # destination 2 waits for source 1 (the slow pair 1 -> 2)
        for r in range(4):
            for site, wait, off in (("ag", ag[r], 0), ("pp", pp[r], 60_000_000)):
                a = t0 + off + int(rng.integers(0, 1000))
                out.append(
                    _record_format.step_record(
                        site=site, step=k, rank=r, process=r, arrive_ns=a,
                        done_ns=a + int(wait * 1e9), delay_ns=0, engaged=False,
                    )
                )  # fmt: skip
    return load_records(out)


def test_late_rank_within_its_group_and_slow_pair_are_named():
    rows = {r.site: r for r in links.site_table(_run(late=True))}
    assert [r.site for r in links.site_table(_run(late=True))] == ["ag", "pp"]  # step order
    (late,) = rows["ag"].late
    assert (late.rank, late.group) == (1, (1, 3))
    assert 0.04 < late.lead_s < 0.06 and late.p_value < links.ALPHA
    assert rows["pp"].slow_link is not None
    assert (rows["pp"].slow_link.source, rows["pp"].slow_link.destination) == (1, 2)
    text = links.format_site_table(list(rows.values()))
    assert "rank 1 by" in text and "slow pair 1->2" in text
    assert "First late in the step: rank 1 at `ag`" in text


def test_balanced_run_names_nobody():
    for seed in range(5):
        rows = links.site_table(_run(late=False, seed=seed))
        assert all(not r.late and r.slow_link is None for r in rows), seed


def test_too_few_steps_name_nobody():
    # 4 analyzed steps: even always-latest has chance 1/16, far above ALPHA.
    rows = {r.site: r for r in links.site_table(_run(late=True, steps=5), warmup_steps=1)}
    assert not rows["ag"].late


def test_layout_groups_and_pairs_on_a_2x4_mesh():
    procs = np.repeat(np.arange(4), 2)  # 4 processes x 2 devices, process-contiguous
    names, shape = ("data", "model"), (2, 4)
    ag = _site_layout.describe("all_gather", names, shape, ("data",), procs, None, None)
    assert ag == {"kind": "all_gather", "groups": [[0, 2], [1, 3]]}
    tp = _site_layout.describe("psum", names, shape, ("model",), procs, None, None)
    assert tp["groups"] == [[0, 1], [2, 3]]
    pp = _site_layout.describe("ppermute", names, shape, ("data",), procs, None, [(0, 1), (1, 0)])
    assert pp["pairs"] == [[0, 2], [1, 3], [2, 0], [3, 1]]
    dev = _site_layout.describe("ppermute", names, shape, ("model",), None, None, [(0, 1)])
    assert dev == {"kind": "ppermute", "groups": [[0, 1, 2, 3]], "pairs": [[0, 1]]}


@pytest.mark.multiprocess
def test_4x2_ppermute_names_the_slow_pair(tmp_path):
    """Processes 0 and 1 swap data (so do 2 and 3); process 1 is late: 0 waits for it."""
    out = tmp_path / "p2p"
    run_4x2("exchange_job.py", "--out", out, "--lag-process", 1, "--lag-s", 0.1)
    recs = load_records(out)
    assert recs.headers[0]["sites"]["p2p"]["pairs"] == [[0, 1], [1, 0], [2, 3], [3, 2]]
    (row,) = links.site_table(recs)
    assert row.kind == "ppermute" and row.slow_link is not None
    assert (row.slow_link.source, row.slow_link.destination) == (1, 0)
    assert row.slow_link.wait_s > 0.05


def test_4x2_all_to_all_names_the_late_process(tmp_path):
    """A mixture-of-experts routing step (every device sends a slice to every other) with
    process 1 late: at an all-to-all everyone waits for everyone, so the site's one group
    names rank 1, and the culprit analysis of the site names it too (process granularity:
    rank = process)."""
    import jaxpace as jp

    out = tmp_path / "a2a"
    run_4x2("exchange_job.py", "--op", "all_to_all", "--out", out, "--lag-process", 1)
    recs = load_records(out)
    assert recs.headers[0]["sites"]["a2a"]["kind"] == "all_to_all"
    assert recs.headers[0]["sites"]["a2a"]["groups"] == [[0, 1, 2, 3]]
    (row,) = links.site_table(recs)
    assert row.kind == "all_to_all"
    assert [(g.rank, g.group) for g in row.late] == [(1, (0, 1, 2, 3))], row.late
    assert row.late[0].lead_s > 0.05
    rep = jp.report.analyze(recs)
    assert rep.culprits == (1,), rep.culprits


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.floats(-1e6, 1e6, allow_nan=False, width=64),
            st.sampled_from([0.0, 1.0, 2.5, -3.0]),  # (ties)
        ),
        min_size=1,
        max_size=400,
    ),
    st.booleans(),
)
def test_the_banded_median_is_numpys(values, with_nan):
    """`links._median` (a sample's band, then a partition of what falls in it) is
    `np.median`: the band made small enough to be used here, ties, NaN, any size."""
    x = np.asarray(values + [float("nan")] * with_nan, np.float64)
    want = float(np.median(x))
    with _band_from(8):
        got = links._median(x.copy())
    assert got == want or (np.isnan(got) and np.isnan(want))


@pytest.mark.parametrize("n", [2_000_000, 300_001, 70_000])
@pytest.mark.parametrize(
    "kind", ["lognormal", "sorted", "reversed", "rounded", "tied", "tied_nan", "tied_off"]
)
def test_the_banded_median_is_numpys_on_large_arrays(n, kind):
    rng = np.random.default_rng(n)
    x = rng.lognormal(0, 1, n)
    if kind.startswith("tied"):  # (most values one value, as a coarse clock's periods)
        x = np.where(rng.random(n) < 0.9, 1e7, x * 1e7)
        if kind == "tied_nan":
            x[n // 3] = np.nan
        elif kind == "tied_off":  # (the sample sees only the tie; the middle is not it)
            x[:] = 1.0
            x[:: n // (links._BAND_MEDIAN_MIN // 2)] = 1e7
    if kind == "sorted":
        x.sort()
    elif kind == "reversed":
        x = np.sort(x)[::-1].copy()
    elif kind == "rounded":  # (many ties at the middle)
        x = np.round(x, 1)
    got, want = links._median(x.copy()), float(np.median(x))
    assert got == want or (np.isnan(got) and np.isnan(want)), (got, want)


@contextlib.contextmanager
def _band_from(n: int):
    was = links._BAND_MEDIAN_MIN
    links._BAND_MEDIAN_MIN = n
    try:
        yield
    finally:
        links._BAND_MEDIAN_MIN = was
