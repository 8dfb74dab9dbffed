"""The report's per-site array work (issue 46) equals a plain reference computation bit
for bit: the whole step's first arrivals and last exits without `ufunc.at`, a site's grid
by gather, the sites table's reuse of that grid, its step order by a table lookup, and its
latest-rank counts and medians without a full sort. Each case holds what could make a
faster path differ: lost records, steps with one rank, a record twice, a site run twice an
execution, executions out of order, ties, a rank that changes process, a key not found."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from jaxpace.diagnosis.earliness import earliness
from jaxpace.errors import RecordsError
from jaxpace.records.reader import load_records
from jaxpace.records.site_data import _grid as site_grid
from jaxpace.records.site_data import grid_column, site_data_grid
from jaxpace.records.synthetic import synthetic_records, synthetic_step_records
from jaxpace.report.stages import links
from jaxpace.report.stages.whole import _Span

HI, LO = np.iinfo(np.int64).max, np.iinfo(np.int64).min


def _site_rows(rng, S: int, ranks: np.ndarray, lost: float = 0.0) -> dict[str, np.ndarray]:
    """One site's rows (step, rank, arrive_ns, done_ns) in a shuffled order, `lost` of
    them dropped."""
    step, rank = (x.ravel() for x in np.meshgrid(np.arange(S), ranks, indexing="ij"))
    keep = rng.random(step.size) >= lost
    arrive = rng.integers(10**12, 10**12 + 10**9, step.size)
    c = {"step": step, "rank": rank, "arrive_ns": arrive, "done_ns": arrive + 10**6}
    order = rng.permutation(np.flatnonzero(keep))
    return {k: v[order] for k, v in c.items()}


def _span_reference(E: int, R: int, sites) -> tuple[np.ndarray, ...]:
    """What `_Span.add` computed before: `np.minimum.at` / `np.maximum.at`, record by record."""
    origin, first, done = np.full(R, HI), np.full((E, R), HI), np.full((E, R), LO)
    for c, e, steps_u, col in sites:
        ex = e[np.searchsorted(steps_u, c["step"])]
        np.minimum.at(origin, col, c["arrive_ns"])
        np.minimum.at(first, (ex, col), c["arrive_ns"])
        np.maximum.at(done, (ex, col), c["done_ns"])
    return origin, first, done


SPAN_CASES = [
    "once an execution",
    "twice an execution",
    "executions out of order",
    "lost records",
    "some ranks, not in order",
    "a record twice",
    "one rank a step",
]


def _span_case(name: str, rng) -> tuple[int, int, list]:
    """(E, R, sites) for `_Span.add`: each site its rows, the execution of each of its
    steps, its steps and each row's column."""
    R = 12
    all_ranks = np.arange(R)
    if name == "once an execution":
        sites = [(_site_rows(rng, 10, all_ranks), np.arange(10))]
    elif name == "twice an execution":
        sites = [
            (_site_rows(rng, 10, all_ranks), np.arange(10)),
            (_site_rows(rng, 20, all_ranks), np.arange(20) // 2),
        ]
    elif name == "executions out of order":  # (an execution column's numbering)
        sites = [(_site_rows(rng, 10, all_ranks), rng.permutation(np.arange(10) // 2))]
    elif name == "lost records":
        sites = [
            (_site_rows(rng, 10, all_ranks, lost=0.3), np.arange(10)),
            (_site_rows(rng, 20, all_ranks, lost=0.1), np.arange(20) // 2),
        ]
    elif name == "some ranks, not in order":
        sites = [(_site_rows(rng, 10, np.array([9, 2, 5, 7])), np.arange(10))]
    elif name == "a record twice":  # (the site is refused later; its span still counts)
        c = _site_rows(rng, 10, all_ranks)
        dup = {k: np.r_[v, v[3] + (7 if k == "arrive_ns" else 0)] for k, v in c.items()}
        sites = [(dup, np.arange(10))]
    elif name == "one rank a step":  # (a grid mostly empty: record by record)
        c = _site_rows(rng, 60, all_ranks)
        keep = c["rank"] == c["step"] % R
        sites = [({k: v[keep] for k, v in c.items()}, np.arange(60))]
    else:
        raise AssertionError(name)
    E = max(int(e.max()) + 1 for _, e in sites)
    out = []
    for c, e in sites:
        steps_u = np.unique(c["step"])
        out.append((c, e[: steps_u.size], steps_u, c["rank"].astype(np.intp)))
    return E, R, out


@pytest.mark.parametrize("name", SPAN_CASES)
def test_span_equals_ufunc_at_record_by_record(name):
    E, R, sites = _span_case(name, np.random.default_rng(len(name)))
    span = _Span(E, R)
    for c, e, steps_u, col in sites:
        span.add(c, e, steps_u, col)
    origin, first, done = _span_reference(E, R, sites)
    assert np.array_equal(span.origin, origin)
    assert np.array_equal(span.first, first)
    assert np.array_equal(span.done, done)


@pytest.mark.parametrize("name", SPAN_CASES)
def test_span_from_the_sites_own_grid_equals_placing_the_rows_again(name):
    """`_Span.add_placed` (the grid `site_evidence_grid` placed) gives `add`'s sums; a site
    its analysis refuses (a record twice) is added row by row, as before; columns out of
    order are not taken."""
    E, R, sites = _span_case(name, np.random.default_rng(len(name)))
    placed, again = _Span(E, R), _Span(E, R)
    meta = _records()
    for c, e, steps_u, col in sites:
        again.add(c, e, steps_u, col)
        cols = {**c, "site": np.zeros(c["step"].size, np.int64)}
        one = dataclasses.replace(meta, sites=("s",), columns=cols)
        try:
            g = site_grid(one, "s", [])
        except RecordsError:
            assert name in ("a record twice", "one rank a step")  # (refused: row by row)
            placed.add(c, e, steps_u, col)
            continue
        assert placed.add_placed(one, e, steps_u, g, g.ranks.astype(np.intp))
        if g.ranks.size > 1:
            assert not _Span(E, R).add_placed(one, e, steps_u, g, g.ranks[::-1].astype(np.intp))
    for k in ("origin", "first", "done", "breaks"):
        assert np.array_equal(getattr(placed, k), getattr(again, k)), k


def _records(lost: float = 0.0, one_rank_step: bool = False, sites: int = 1, seed: int = 0):
    """Records of 8 ranks (2 a process) with pacing delays from step 20; `lost` of the step
    records dropped, step 7 with one rank left when `one_rank_step`."""
    if sites == 1:
        recs = synthetic_records(
            8, 60, late_rank=3, late_s=0.002, engaged_from_step=20, ranks_per_process=2, seed=seed
        )
    else:
        recs = synthetic_step_records(8, 40, sites, ranks_per_process=2, seed=seed)
    rng = np.random.default_rng(seed)
    out = []
    for r in recs:
        if r.get("type") == "step":
            if rng.random() < lost or (one_rank_step and r["step"] == 7 and r["rank"] != 0):
                continue
        out.append(r)
    return load_records(out)


def _dense_reference(records, site: str):
    """The site's columns placed the plain way: `np.full`, then assignment by index."""
    c = records.columns
    sel = c["site"] == records.sites.index(site)
    steps, ranks = np.unique(c["step"][sel]), np.unique(c["rank"][sel])
    flat = np.searchsorted(steps, c["step"][sel]) * ranks.size + np.searchsorted(
        ranks, c["rank"][sel]
    )

    def dense(col, dtype=np.int64, fill=0):
        a = np.full(steps.size * ranks.size, fill, dtype)
        a[flat] = c[col][sel]
        return a.reshape(steps.size, ranks.size)

    present = np.zeros(steps.size * ranks.size, bool)
    present[flat] = True
    return dense, present.reshape(steps.size, ranks.size)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bytes (so -0.0 differs from 0.0, and NaN equals NaN)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"lost": 0.05},
        {"lost": 0.02, "one_rank_step": True},
        {"sites": 3},
        {"sites": 3, "lost": 0.1},
    ],
)
def test_site_grid_by_gather_equals_placement_by_index(kw):
    records = _records(**kw)
    site = records.sites[-1]
    dense, present = _dense_reference(records, site)
    data, _, _, g = site_data_grid(records, site)
    assert _same(g.wait_s, dense("wait_ns", np.float64, np.nan) / 1e9)
    assert _same(g.process, dense("process", np.int64, -1))
    assert _same(
        grid_column(records, g, "arrive_ns", np.float64, np.nan),
        dense("arrive_ns", np.float64, np.nan),
    )
    assert _same(grid_column(records, g, "engaged", bool, False), dense("engaged", bool, False))
    # Each rank's own clock, as it was computed with the masks.
    rows = g.complete
    missing = ~present[rows]
    assert missing.any() == bool(kw.get("lost"))
    arrive_i, done_i = dense("arrive_ns")[rows], dense("done_ns")[rows]
    origin = np.where(missing, HI, arrive_i).min(axis=0, keepdims=True)
    assert _same(data.arrive, np.where(missing, np.nan, (arrive_i - origin) / 1e9))
    assert _same(data.done, np.where(missing, np.nan, (done_i - origin) / 1e9))
    if not missing.any():  # (with records missing the waits are filled: other tests)
        wait = dense("wait_ns", np.float64, np.nan)[rows] / 1e9
        delay = dense("delay_ns", np.float64, np.nan)[rows] / 1e9
        entered = np.maximum(wait - delay, 0.0)
        assert _same(data.wait, wait) and _same(data.delay, delay)
        assert _same(data.transfer, entered.min(axis=1))
        assert _same(data.sync_wait, earliness(entered, axis=-1))


def test_a_record_twice_is_still_refused_naming_it():
    recs = synthetic_records(4, 10, seed=0)
    twice = next(r for r in recs if r.get("type") == "step" and r["step"] == 3 and r["rank"] == 2)
    records = load_records([*recs, dict(twice)])
    with pytest.raises(
        RecordsError, match="1 duplicate records, e.g. step 3 of rank 2 appears 2 times"
    ):
        site_data_grid(records, records.sites[0])


@pytest.mark.parametrize(
    "kw",
    [{}, {"lost": 0.05}, {"lost": 0.02, "one_rank_step": True}, {"sites": 3, "lost": 0.1}],
)
def test_sites_table_grid_reused_equals_placed_again(kw):
    """`SiteTable.add` with the site's own grid (`placed`) reads the same arrays as
    placing the records again."""
    records = _records(**kw)
    for site in records.sites:
        one = dataclasses.replace(
            records,
            sites=(site,),
            columns={
                k: v[records.columns["site"] == records.sites.index(site)]
                for k, v in records.columns.items()
            },
        )
        one.columns["site"] = np.zeros(one.columns["step"].size, np.int64)
        _, _, _, g = site_data_grid(one, site)
        for warmup in (0, 5):
            got = links._grid(one, 0, warmup, g)
            want = links._grid(one, 0, warmup)
            for x, y in zip(got, want, strict=True):
                assert _same(np.ascontiguousarray(x), np.ascontiguousarray(y))


def _late_of_size_reference(wait, ranks, members, min_lead_s):
    """`_late_of_size` as it was: a count by comparison, a full sort of the others."""
    G, m = members.shape
    n = wait.shape[0]
    w = wait[:, members]
    latest = np.argmin(w, axis=2)
    counts = (latest[:, :, None] == np.arange(m)).sum(axis=0)
    j = np.argmax(counts, axis=1)
    g = np.arange(G)
    wj = w[:, g, j]
    others = w.copy()
    others[:, g, j] = np.inf
    others.sort(axis=2)
    lo, hi = (m - 2) // 2, (m - 1) // 2
    med = np.median((others[:, :, lo] + others[:, :, hi]) / 2 - wj, axis=0)
    out = [None] * G
    for i in np.flatnonzero(med > min_lead_s).tolist():
        k = int(counts[i, j[i]])
        p = links._binomial_tail(n, k, 1.0 / m)
        if p < links.ALPHA:
            group = tuple(int(r) for r in ranks[members[i]])
            out[i] = links.GroupLate(group[j[i]], group, float(med[i]), k / n, p)
    return out


@pytest.mark.parametrize(
    "layout",
    [
        "every rank in order",
        "301 ranks in order",
        "strided groups of 5",
        "pairs",
        "threes",
        "sixes",
    ],
)
def test_latest_in_group_equals_sort_and_count(layout):
    rng = np.random.default_rng(3)
    R, n = (301, 400) if layout.startswith("301") else (30, 80)
    members = {
        "every rank in order": lambda: np.arange(R)[None, :],
        # (an odd group has two middles among its others; a small one hides a partition
        # at one of them only, 301 does not)
        "301 ranks in order": lambda: np.arange(R)[None, :],
        "strided groups of 5": lambda: np.arange(R).reshape(5, 6).T,
        "pairs": lambda: rng.permutation(R).reshape(15, 2),
        "threes": lambda: np.arange(R).reshape(10, 3),
        "sixes": lambda: rng.permutation(R).reshape(5, 6),
    }[layout]()
    # Waits on a coarse grid (ties for the least), one member of each group often least.
    wait = np.round(rng.random((n, R)) * 8 * R) / (1000 * R)
    late = members[:, 0]
    wait[:, late] = np.where(rng.random((n, late.size)) < 0.8, 0.0, wait[:, late])
    ranks = np.arange(100, 100 + R)
    for min_lead in (-np.inf, 0.0, 0.002):
        got = links._late_of_size(wait, ranks, members, min_lead)
        assert got == _late_of_size_reference(wait, ranks, members, min_lead)
    assert any(x is not None for x in links._late_of_size(wait, ranks, members, -np.inf))


def _order_reference(order: links._StepOrder, g) -> float:
    """`_StepOrder.order` as it was: a search of every cell's key in `keys`."""
    ok = (g[4] >= 0).ravel()
    steps = np.broadcast_to(g[0][:, None], g[4].shape).ravel()[ok]
    key = steps.astype(np.int64) * (1 << 32) + g[4].ravel()[ok]
    if not key.size:
        return np.nan
    arrive = g[3].ravel()[ok]
    return float(np.median(arrive - order.first[np.searchsorted(order.keys, key)])) / 1e9


@pytest.mark.parametrize(
    "case",
    [
        "each rank one process",
        "processes interleaved",
        "processes of unequal size",
        "a rank moves",
        "missing cells",
        "a key not found",
        "many processes",
    ],
)
def test_step_order_by_table_equals_search(case):
    rng = np.random.default_rng(5)
    S, R = 30, 16
    steps = np.sort(rng.choice(np.arange(100, 200), S, replace=False))
    proc = np.broadcast_to(np.arange(R) // 4, (S, R)).copy()
    if case == "processes interleaved":
        proc = proc.reshape(S, 4, 4).transpose(0, 2, 1).reshape(S, R).copy()
    if case == "processes of unequal size":  # (2, 3, 3, 4 and 4 ranks)
        proc[:] = np.repeat(np.arange(5), [2, 3, 3, 4, 4])
    if case == "a rank moves":
        proc[S // 2 :, 3] = 2
    if case == "missing cells":
        proc[rng.random((S, R)) < 0.1] = -1
    if case == "many processes":
        proc = proc * 10**6
    arrive = rng.integers(10**12, 10**12 + 10**10, (S, R)).astype(float)
    arrive[proc < 0] = np.nan
    # The first arrivals: every (step, process) of this site, and other sites' steps too.
    all_steps = np.r_[steps, steps.max() + 1 + np.arange(5)]
    pairs = {(int(s), int(p)) for s in all_steps for p in np.unique(proc[proc >= 0])}
    if case == "a key not found":
        pairs.discard((int(steps[4]), int(proc[4, 0])))
    keys = np.array(sorted(s * (1 << 32) + p for s, p in pairs), np.int64)
    order = links._StepOrder.__new__(links._StepOrder)
    order.keys, order.first = keys, rng.integers(10**12 - 10**9, 10**12, keys.size).astype(float)
    g = (steps, np.arange(R), None, arrive, proc)
    got, want = order.order(g), _order_reference(order, g)
    assert got == want and np.isfinite(want)
    # Again on fewer steps (the table kept for the steps before is not theirs), then
    # on the first ones again.
    fewer = (steps[::2], g[1], None, arrive[::2], proc[::2])
    assert order.order(fewer) == _order_reference(order, fewer)
    assert order.order(g) == want


@pytest.mark.parametrize(
    "a",
    [
        np.random.default_rng(0).integers(0, 8192, 200_000),
        np.repeat(np.arange(64), 25)[::-1].copy(),
        np.random.default_rng(1).integers(-5, 5, 100),
        np.array([3]),
        np.zeros(0, np.int64),
        np.random.default_rng(2).integers(0, 2**40, 1000),  # (a wide range: np.unique)
    ],
    ids=["ranks", "reversed", "negative", "one", "empty", "wide"],
)
def test_first_of_each_is_np_unique_with_return_index(a):
    from jaxpace.records.site_data import first_of_each

    want, got = np.unique(a, return_index=True), first_of_each(a)
    for w, g in zip(want, got, strict=True):
        assert w.dtype == g.dtype and np.array_equal(w, g)


@pytest.mark.parametrize("cols", ["every rank in order", "some ranks", "every rank reordered"])
@pytest.mark.parametrize("repeats", [False, True])
def test_whole_step_counts_by_execution_equal_counts_by_cell(cols, repeats):
    """`_Sums.count` counts a site with every rank in order once per execution and adds the
    counts to the cells when the pass ends (`count_rows`): the same counts as one per cell
    (`_add_cells`), executions repeated or not, mixed with per-cell counts."""
    from jaxpace.report.stages.whole import _add_cells, _Sums

    rng = np.random.default_rng(7)
    E, R = 12, 10
    got, want = _Sums.zeros(E, R), np.zeros((E, R), np.int32)
    for _ in range(5):
        e = rng.choice(E, 6, replace=repeats)
        c = {
            "every rank in order": np.arange(R),
            "some ranks": np.sort(rng.choice(R, 4, replace=False)),
            "every rank reordered": rng.permutation(R),
        }[cols]
        got.count(got.expected, got.expected_rows, e, c)
        _add_cells(want, e, c, 1)
        present = rng.random((e.size, c.size)) < 0.7  # (a partial site: counted per cell)
        _add_cells(got.expected, e, c, present)
        _add_cells(want, e, c, present)
    got.count_rows()
    np.testing.assert_array_equal(got.expected, want)
    assert got.expected.dtype == np.int32 and not got.expected_rows.any()
