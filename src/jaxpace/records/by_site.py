"""A run's records one site at a time (`SiteRecords`): what the report's whole step and sites table read.

The report's heavy work never holds every row: it asks for one site's rows
(`SiteRecords.site`, a `Records` of that site alone), folds them into its
(execution x rank) sums, and lets them go; what needs every row is asked as a
small summary (each site's steps, the (rank, process, device) triples, the rows
per site). Records on disk are read by the engine (`records.engine`: one
`WHERE site = ?` query per site over the run's table), so the peak memory is one
site's rows plus the sums (two sites' rows in a pass that fetches ahead, below); records already in memory (`Records`, record dicts,
`Pacer.records()`, another source's reader) are sliced by site, giving the same
rows, so both give the same report.

A pass over the sites in order (`SiteRecords.sites_in_order`) on disk fetches the next
site on a second DuckDB connection in one background thread while the caller works on
the current one (DuckDB runs a query without the GIL): one site ahead, no more, so the
rows held are the caller's site and the next one (twice one site's rows, where a lone
`site` call holds one). A fetch that fails raises its error where the caller takes
that site; `close` stops a fetch in flight and waits for its thread.
"""

from __future__ import annotations

import dataclasses
import os
import weakref
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import numpy as np

from jaxpace.errors import RecordsError
from jaxpace.records.int_keys import int_unique, unique_rows
from jaxpace.records.reader import (
    Records,
    foreign_ranks_note,
    load_records,
    run_files,
    run_meta,
)
from jaxpace.records.run_checks import rank_bound

__all__ = ["SiteRecords", "by_site", "open_run"]


class SiteRecords:
    """A run's records, read one site at a time.

    Carries what `Records` carries besides its rows (`headers`, `sites`, `run_id`,
    `process_count`, `granularity`, `partial`, `notes`, `sources`); the rows come a
    site at a time from `site`.

    Attributes:
      largest_fetch: the most rows one `site` call has returned (peak memory is one
        site's rows, two in `sites_in_order`: the tests read it).
    """

    def __init__(self, meta: Records, sites: tuple[str, ...], rows: int) -> None:
        self.meta = dataclasses.replace(meta, sites=sites)
        self.rows = rows
        self.largest_fetch = 0

    # What `Records` says of the run.
    headers = property(lambda self: self.meta.headers)
    sites = property(lambda self: self.meta.sites)
    run_id = property(lambda self: self.meta.run_id)
    process_count = property(lambda self: self.meta.process_count)
    granularity = property(lambda self: self.meta.granularity)
    partial = property(lambda self: self.meta.partial)
    notes = property(lambda self: self.meta.notes)
    sources = property(lambda self: self.meta.sources)

    def __len__(self) -> int:
        return self.rows

    def rank_groups(self) -> dict[str, dict[int, str]]:
        return self.meta.rank_groups()

    def with_notes(self, notes: tuple[str, ...], partial: bool) -> SiteRecords:
        """This run with `notes` in place of its notes and `partial` set."""
        self.meta = dataclasses.replace(self.meta, notes=notes, partial=partial)
        return self

    @property
    def has_execution(self) -> bool:
        """Whether the rows carry an `execution` column (a trace's program executions)."""
        return False

    def site(self, name: str) -> Records:
        """The rows of site `name` alone, as `Records` (its `sites` is `(name,)`)."""
        cols = self._columns(name)
        n = int(cols["step"].shape[0])
        self.largest_fetch = max(self.largest_fetch, n)
        cols["site"] = np.zeros(n, np.int64)
        return dataclasses.replace(self.meta, sites=(name,), columns=cols)

    def sites_in_order(self, names: Iterable[str]) -> Iterator[tuple[str, Records]]:
        """`(name, site(name))` for each of `names` in turn; on disk the next site is
        fetched while the caller works on this one (the module's docstring)."""
        for name in names:
            yield name, self.site(name)

    def _columns(self, name: str) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def site_steps(self) -> dict[int, np.ndarray]:
        """Per site index, its distinct steps, sorted."""
        raise NotImplementedError

    def rank_keys(self) -> np.ndarray:
        """The distinct (rank, process, device) triples, (3, K) int64 (`device` -1: none)."""
        raise NotImplementedError

    def step_ranks(self) -> dict[int, tuple[np.ndarray, np.ndarray, int]]:
        """Per site index: its distinct steps (sorted), the distinct ranks present at each,
        and its distinct ranks in all."""
        raise NotImplementedError

    def first_arrivals(self, kept: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """`(keys, first)`: over the `kept` steps of each site (site index -> steps), the
        least `arrive_ns` (as float) of each (step, process), keyed `step * 2**32 +
        process` (sorted)."""
        raise NotImplementedError

    def counts(self) -> np.ndarray:
        """Rows per site, in `sites` order."""
        raise NotImplementedError

    def executions(self) -> np.ndarray:
        """The distinct executions, sorted (only with `has_execution`)."""
        raise NotImplementedError

    def without_foreign_ranks(self) -> SiteRecords:
        """This run without the rows whose rank is outside the run's ranks (as the headers
        give them), marked partial with a note saying how many and where."""
        raise NotImplementedError

    def close(self) -> None:
        """Lets go of what the rows are read from (the engine's files); idempotent."""

    def __enter__(self) -> SiteRecords:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _InMemory(SiteRecords):
    """`Records` in memory, sliced by site."""

    def __init__(self, records: Records) -> None:
        super().__init__(records, records.sites, len(records))
        self.records = records

    @property
    def has_execution(self) -> bool:
        return "execution" in self.records.columns

    def _columns(self, name: str) -> dict[str, np.ndarray]:
        c = self.records.columns
        if len(self.records.sites) == 1:
            return dict(c)
        sel = c["site"] == self.records.sites.index(name)
        return {k: v[sel] for k, v in c.items()}

    def site_steps(self) -> dict[int, np.ndarray]:
        c = self.records.columns
        return {i: int_unique(c["step"][c["site"] == i]) for i in range(len(self.sites))}

    def rank_keys(self) -> np.ndarray:
        c = self.records.columns
        dev = c["device"] if "device" in c else np.full(c["rank"].size, -1, np.int64)
        return unique_rows(c["rank"], c["process"], dev)

    def counts(self) -> np.ndarray:
        return np.bincount(self.records.columns["site"], minlength=len(self.sites))

    def step_ranks(self) -> dict[int, tuple[np.ndarray, np.ndarray, int]]:
        c = self.records.columns
        out = {}
        for i in range(len(self.sites)):
            sel = c["site"] == i
            pairs = unique_rows(c["step"][sel], c["rank"][sel])
            steps, n = np.unique(pairs[0], return_counts=True)
            out[i] = (steps, n, int(int_unique(pairs[1]).size))
        return out

    def first_arrivals(self, kept: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        c = self.records.columns
        keys, first = [], []
        for i, steps in kept.items():
            sel = (c["site"] == i) & np.isin(c["step"], steps)
            keys.append(c["step"][sel].astype(np.int64) * (1 << 32) + c["process"][sel])
            first.append(c["arrive_ns"][sel])
        return _least(np.concatenate(keys or [np.zeros(0, np.int64)]),
                      np.concatenate(first or [np.zeros(0, np.int64)]))  # fmt: skip

    def executions(self) -> np.ndarray:
        return int_unique(self.records.columns["execution"])

    def without_foreign_ranks(self) -> SiteRecords:
        from jaxpace.records.reader import without_foreign_ranks

        recs = without_foreign_ranks(self.records)
        return self if recs is self.records else _InMemory(recs)


class _OnDisk(SiteRecords):
    """A run's files in the engine's table; each site one query."""

    def __init__(self, engine: Any, meta: Records, sites: tuple[str, ...], rows: int) -> None:
        super().__init__(meta, sites, rows)
        self.engine = engine
        self._fetching: set[_Prefetch] = set()  # the passes of `sites_in_order` under way
        self._close = weakref.finalize(self, _close_run, engine, self._fetching)
        self._memo: dict[str, Any] = {}  # the summaries, asked once

    @property
    def has_execution(self) -> bool:
        return self.engine.executions_numbered > 0

    def executions(self) -> np.ndarray:
        return np.arange(self.engine.executions_numbered, dtype=np.int64)

    def _once(self, what: str) -> Any:
        if what not in self._memo:
            self._memo[what] = getattr(self.engine, what)()
        return self._memo[what]

    def _columns(self, name: str) -> dict[str, np.ndarray]:
        for ahead in self._fetching:  # (fetched ahead by a pass of `sites_in_order`)
            if ahead.name == name:
                return self.engine.finish(ahead.result())
        return self.engine.site_columns(name)

    def sites_in_order(self, names: Iterable[str]) -> Iterator[tuple[str, Records]]:
        names = list(names)
        if len(names) < 2:
            yield from super().sites_in_order(names)
            return
        ahead = _Prefetch(self.engine)
        self._fetching.add(ahead)
        try:
            ahead.start(names[0])  # (the first too: this thread helps, `_Prefetch.result`)
            for i, name in enumerate(names):
                if ahead.stopped:
                    raise RecordsError(
                        "the run was closed while its sites were being read; open it again "
                        "(`records.by_site.open_run`) to read them."
                    )
                one = self.site(name)  # (fetched while the caller worked on the one before)
                if i + 1 < len(names):
                    ahead.start(names[i + 1])
                yield name, one
                del one  # (the caller's reference is the only one left)
        finally:
            ahead.stop()
            self._fetching.discard(ahead)

    def site_steps(self) -> dict[int, np.ndarray]:
        got = {s: v[0] for s, v in self._once("step_ranks").items()}
        empty = np.zeros(0, np.int64)
        return {i: got.get(s, empty) for i, s in enumerate(self.sites)}

    def rank_keys(self) -> np.ndarray:
        return self._once("rank_keys")

    def counts(self) -> np.ndarray:
        got = self._once("step_ranks")  # (its rows per step, summed: no scan of its own)
        return np.array([int(got[s][1].sum()) if s in got else 0 for s in self.sites], np.int64)

    def step_ranks(self) -> dict[int, tuple[np.ndarray, np.ndarray, int]]:
        got = self._once("step_ranks")
        empty = (np.zeros(0, np.int64), np.zeros(0, np.int64), 0)
        return {i: got.get(s, empty) for i, s in enumerate(self.sites)}

    def first_arrivals(self, kept: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        keys, first = self.engine.first_arrivals({self.sites[i]: s for i, s in kept.items()})
        return keys, first.astype(float)

    def without_foreign_ranks(self) -> SiteRecords:
        bound = rank_bound(self.headers, self.granularity)
        if bound is None or not self.rows:
            return self
        n, ex = self.engine.drop_ranks_outside(bound)
        if not n:
            return self
        self._memo.clear()
        note = foreign_ranks_note(self, n, bound, ex)
        self.rows -= n
        sites = tuple(s for s, k in zip(self.sites, self.counts(), strict=True) if k)
        self.meta = dataclasses.replace(self.meta, sites=sites)
        return self.with_notes((*self.notes, note), True)

    def close(self) -> None:
        self._close()


class _Prefetch:
    """One site's rows fetched ahead: `Engine.site_columns` on a second connection (the
    engine's `fetch_cursor`), in one background thread, one fetch at a time."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.cursor = engine.fetch_cursor()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="jaxpace-site-fetch")
        self.pending: Future | None = None
        self.name: str | None = None  # the site `pending` fetches
        self.stopped = False

    def start(self, name: str) -> None:
        self.pending = self.pool.submit(self.engine.site_columns, name, self.cursor)
        self.name = name

    def result(self) -> dict[str, np.ndarray]:
        """The rows of the site `start` asked for; its fetch's error, if it raised one. This
        thread helps the fetch while it is under way (`Engine.help_fetch`)."""
        pending, self.pending, self.name = self.pending, None, None
        if not pending.done():
            self.engine.help_fetch()
        return pending.result()

    def stop(self) -> None:
        """Interrupts a fetch in flight and waits for the thread to end; idempotent."""
        if self.stopped:
            return
        self.stopped = True
        pending, self.pending, self.name = self.pending, None, None
        if pending is not None and not pending.cancel():
            while not pending.done():  # (an interrupt before the query starts is lost)
                self.cursor.interrupt()
                wait([pending], timeout=0.05)
        self.pool.shutdown(wait=True)
        self.cursor.close()


def _close_run(engine: Any, fetching: set[_Prefetch]) -> None:
    """Stops the passes under way, then closes the engine (`_OnDisk.close`, or its
    finalizer)."""
    for ahead in list(fetching):
        ahead.stop()
    engine.close()


def _least(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct `keys` and the least of `values` (as float) at each."""
    uniq, inv = np.unique(keys, return_inverse=True)
    least = np.full(uniq.size, np.inf)
    np.minimum.at(least, inv.reshape(-1), values.astype(float))
    return uniq, least


def open_run(path: str | os.PathLike, **engine_kw: Any) -> SiteRecords:
    """A run's records files (Parquet, JSONL, or both) read by the engine into its table,
    to be read one site at a time. Close it (or use it in a `with`) to remove the
    engine's files.

    Raises:
      RecordsError: as `load_records` (no records, a file that is not records, mixed runs).
    """
    from jaxpace.records.engine import Engine

    p = Path(path)
    files = [str(f) for f in run_files(p)]
    engine = Engine(**engine_kw)
    try:
        loaded = engine.load(p)
        engine.cluster_by_site()
        ex_note = engine.number_executions()[1]
        meta = run_meta(
            loaded.headers,
            loaded.scan.notes() + ([ex_note] if ex_note else []),
            files,
            engine.processes(),
            loaded.scan.rows,
        )
    except BaseException:
        engine.close()
        raise
    return _OnDisk(engine, meta, loaded.sites, loaded.scan.rows)


def by_site(source: Any) -> SiteRecords:
    """`source` as `SiteRecords`: itself, `Records` sliced by site, a path through the
    engine (`open_run`), or record dicts (`load_records`)."""
    if isinstance(source, SiteRecords):
        return source
    if isinstance(source, str | os.PathLike):
        return open_run(source)
    return _InMemory(load_records(source))
