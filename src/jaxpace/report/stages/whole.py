"""Stage 1 (the default): the whole step, every collective of one program execution.

A step is one execution of the program. Each site's records number that site's own
executions (`step`), so a collective that runs k times an execution (inside a
`lax.scan` or a loop) has k times the steps of one that runs once. The sites are
folded into executions by their counts: the site with fewest steps runs once an
execution, a site with k times as many runs k times, and its j-th step belongs to
execution ``j // k`` (j counted over the site's steps in order). When a site's
count is not a whole multiple of the fewest, it is not folded (the note says so)
and its steps are taken as executions. A source that knows each record's execution
(an `execution` column, e.g. a trace's `run_id`) folds by it instead, which also
folds a program whose only collective runs several times an execution.

A rank's lateness in a step is the sum, over the step's collectives, of its
lateness within each collective's group (`site_data`). A rank that took part in
only some of a step's collectives (records lost, or not a member) is estimated
from those it took part in: its mean lateness over them times the number of
collectives in the step, so a missing collective never makes it look less late.
Wait, delay and sync wait are summed the same way, and the transfer is the sum of
the collectives' transfers. A rank's step time is the time between the exits of
its last collective of two consecutive executions (its own clock); its compute is
that step time less its time inside the step's collectives (their summed waits, at
most the span from its first arrival to its last exit in the step, so collectives
that overlap each other count once).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxpace.errors import RecordsError
from jaxpace.records.reader import Records
from jaxpace.records.site_data import fill_missing, index_in, int_unique, site_data, site_grid
from jaxpace.report.model import SiteData
from jaxpace.report.stages.context import run_context

__all__ = ["WHOLE_STEP", "execution_of", "refused_sites", "whole_step"]

# `RunInfo.site` of a report on the whole step.
WHOLE_STEP = "(whole step)"


def refused_sites(records: Records) -> tuple[str, ...]:
    """The sites whose waits are not evidence (the headers' `invariant_over` or
    `no_culprit`): the whole step leaves them out."""
    out = []
    for site in records.sites:
        for h in records.headers:
            info = h.get("sites") if isinstance(h.get("sites"), dict) else None
            i = (info or {}).get(site)
            if isinstance(i, dict) and (i.get("invariant_over") or i.get("no_culprit")):
                out.append(site)
                break
    return tuple(out)


def execution_of(records: Records) -> tuple[dict[int, np.ndarray], list[str]]:
    """Per site index, the execution of each of its steps in order (its unique steps'
    order), and the notes on how the sites were folded.

    With an `execution` column (a source that knows each record's program execution,
    e.g. a trace's `run_id`) that is the execution, numbered 0, 1, ... in order;
    else the sites are folded by their step counts (the module's docstring)."""
    c = records.columns
    per_site = {i: int_unique(c["step"][c["site"] == i]) for i in range(len(records.sites))}
    if "execution" in c:
        return _by_column(records, per_site)
    counts = {i: s.size for i, s in per_site.items() if s.size}
    fewest = min(counts.values())
    out: dict[int, np.ndarray] = {}
    folded, unfolded = [], []
    for i, n in counts.items():
        k = n // fewest if n % fewest == 0 else 1
        if n % fewest:
            unfolded.append(records.sites[i])
        elif k > 1:
            folded.append(f"`{records.sites[i]}` x{k}")
        out[i] = np.arange(n) // k
    notes = []
    if folded:
        notes.append(
            f"a step is one execution of the program: {', '.join(folded)} run several times "
            f"an execution (their step counts are that multiple of the fewest, {fewest}); "
            "their repeats are folded into one step."
        )
    if unfolded:
        notes.append(
            f"site(s) {', '.join(f'`{s}`' for s in unfolded)}: step counts not a multiple of "
            f"the fewest ({fewest}); their steps are taken as executions, not folded."
        )
    return out, notes


def _by_column(
    records: Records, per_site: dict[int, np.ndarray]
) -> tuple[dict[int, np.ndarray], list[str]]:
    """`execution_of` from the records' `execution` column."""
    c = records.columns
    ex = c["execution"]
    uniq = int_unique(ex)
    out: dict[int, np.ndarray] = {}
    folded = []
    for i, steps_u in per_site.items():
        if not steps_u.size:
            continue
        sel = c["site"] == i
        e = np.zeros(steps_u.size, np.int64)
        e[index_in(steps_u, c["step"][sel])] = index_in(uniq, ex[sel])
        out[i] = e
        k = steps_u.size / max(np.unique(e).size, 1)
        if k > 1:
            folded.append(f"`{records.sites[i]}` x{k:.3g}")
    notes = []
    if folded:
        notes.append(
            f"a step is one execution of the program (the records' execution ids): "
            f"{', '.join(folded)} run several times an execution; their repeats are folded "
            "into one step."
        )
    return out, notes


def whole_step(records: Records) -> tuple[SiteData, list[str], bool]:
    """The whole step's (execution x rank) `SiteData`; returns (data, notes, partial).

    With one site this is `site_data` of it. Raises `RecordsError` when no site has a
    step with records of two ranks."""
    c = records.columns
    if len(records.sites) == 1 and (
        "execution" not in c or int_unique(c["execution"]).size == int_unique(c["step"]).size
    ):  # one site, once an execution: the site is the step
        return site_data(records, records.sites[0])
    gid, notes = _global_ranks(records)
    ranks = int_unique(gid)
    R = ranks.size
    exec_of, fold_notes = execution_of(records)
    notes += fold_notes
    E = max(int(e[-1]) + 1 for e in exec_of.values() if e.size)
    a = _Sums.zeros(E, R)
    used, partial = _add_sites(records, exec_of, gid, ranks, a, notes)
    if not used:
        raise RecordsError(
            "no site has a step with records of two or more ranks; nothing to compare."
        )
    lat, wait, delay, sync, cnt, expected = a.lat, a.wait, a.delay, a.sync, a.cnt, a.expected
    ncoll, transfer, engaged, processes, hosts = (
        a.ncoll,
        a.transfer,
        a.engaged,
        a.processes,
        a.hosts,
    )
    keep = ncoll > 0
    missing = (cnt == 0)[keep]
    scale = np.where(cnt > 0, ncoll[:, None] / np.maximum(cnt, 1), np.nan)[keep]
    lat, wait, delay, sync = (
        fill_missing(a[keep] * scale, missing) for a in (lat, wait, delay, sync)
    )
    if (cnt[keep] < expected[keep]).any():
        short = float(1.0 - cnt[keep].sum() / expected[keep].sum())
        notes.append(
            f"PARTIAL: {short:.2%} of the (collective, member rank) records of the whole "
            "step are missing; a rank's lateness in a step is its mean over the collectives "
            "it took part in times the step's collectives (never less late for a missing one)."
        )
        partial = True
    if (expected[keep] < ncoll[keep, None]).any():
        notes.append(
            "some ranks are not members of every collective of the step: a rank's lateness "
            "in a step is its mean over the collectives it took part in times the step's "
            "collectives, so ranks in fewer collectives compare on the same scale."
        )
    first, done, breaks = _span(records, exec_of, gid, ranks, E)
    # Step numbers: executions in order, one number left out at a break (no step time
    # across a trace window's end).
    steps = (np.arange(E) + np.cumsum(breaks))[keep]
    first, done = first[keep], done[keep]
    step_time = np.full(done.shape, np.nan)
    step_time[1:] = done[1:] - done[:-1]
    step_time[1:][np.diff(steps) != 1] = np.nan
    # Time inside the step's collectives: their summed waits, at most the span from the
    # first arrival to the last exit (collectives that overlap each other count once).
    inside = np.fmin(wait, done - first)
    compute = step_time - inside
    arrive = done - inside
    data = SiteData(
        steps=steps,
        ranks=ranks,
        processes=processes,
        hosts=tuple(hosts),
        arrive=arrive,
        done=done,
        wait=wait,
        delay=delay,
        engaged=engaged[keep],
        compute=compute,
        step_time=step_time,
        transfer=transfer[keep],
        sync_wait=sync,
        lateness=lat,
    )
    return data, notes, partial


@dataclasses.dataclass
class _Sums:
    """The whole step's sums over its sites, (execution x rank) or per execution."""

    lat: np.ndarray
    wait: np.ndarray
    delay: np.ndarray
    sync: np.ndarray
    cnt: np.ndarray  # records present
    expected: np.ndarray  # the sites' member ranks
    ncoll: np.ndarray  # collectives per execution
    transfer: np.ndarray
    engaged: np.ndarray
    processes: np.ndarray
    hosts: list

    @classmethod
    def zeros(cls, E: int, R: int) -> _Sums:
        z = lambda: np.zeros((E, R))  # noqa: E731
        return cls(z(), z(), z(), z(), z(), z(), np.zeros(E), np.zeros(E), np.zeros(E, bool),
                   np.full(R, -1, np.int64), ["?"] * R)  # fmt: skip


def _add_sites(records, exec_of, gid, ranks, a: _Sums, notes: list[str]) -> tuple[int, bool]:
    """Adds every site that is evidence into `a`; returns (sites used, partial)."""
    c = records.columns
    partial, used = False, 0
    for si, site in enumerate(records.sites):
        try:
            d, site_notes, p = site_data(records, site)
        except RecordsError as e:
            notes.append(f"`{site}` left out of the whole step: {e}")
            continue
        ctx = run_context(records, site, d)
        if ctx.invariant_over is not None or ctx.no_culprit is not None:
            why = ctx.no_culprit or f"its operand was already invariant over `{ctx.invariant_over}`"
            notes.append(
                f"`{site}` left out of the whole step: {why} (its waits are not evidence)."
            )
            continue
        used += 1
        partial |= p
        notes.extend(n for n in site_notes if not n.startswith("PARTIAL"))
        g = site_grid(records, site, [])
        steps_u = int_unique(c["step"][c["site"] == si])
        e = exec_of[si][index_in(steps_u, d.steps)]
        local, first = np.unique(c["rank"][c["site"] == si], return_index=True)
        cols = index_in(ranks, gid[c["site"] == si][first][index_in(local, d.ranks)])
        present = g.present.astype(float)
        for acc, x in ((a.lat, d.lateness), (a.wait, d.wait), (a.delay, d.delay),
                       (a.sync, d.sync_wait)):  # fmt: skip
            np.add.at(acc, (e[:, None], cols[None, :]), np.where(g.present, x, 0.0))
        np.add.at(a.cnt, (e[:, None], cols[None, :]), present)
        np.add.at(a.expected, (e[:, None], cols[None, :]), 1.0)  # the site's members
        np.add.at(a.ncoll, e, 1.0)
        np.add.at(a.transfer, e, np.nan_to_num(d.transfer))
        np.logical_or.at(a.engaged, e, d.engaged)
        a.processes[cols] = d.processes
        for j, h in zip(cols.tolist(), d.hosts, strict=True):
            a.hosts[j] = h
    return used, partial


def _global_ranks(records: Records) -> tuple[np.ndarray, list[str]]:
    """Each record's rank across the whole step, and a note when it is not `rank`.

    A site's `rank` is its position in the collective's group: global in jaxpace's
    records and traces, local to a communicator in NCCL Inspector's logs. When one
    `rank` stands for different (process, device) pairs at different sites, the ranks
    are local: the whole step numbers the (process, device) pairs in order instead."""
    c = records.columns
    dev = c["device"] if "device" in c else np.full(c["rank"].size, -1, np.int64)
    key = c["process"].astype(np.int64) * (1 << 32) + (dev.astype(np.int64) + 1)
    pairs = np.unique(np.stack([c["rank"], key]), axis=1)
    if np.unique(pairs[0]).size == pairs.shape[1]:
        return c["rank"], []
    uniq, gid = np.unique(key, return_inverse=True)
    return gid.reshape(-1).astype(np.int64), [
        "the sites number their ranks within each communicator: the whole step numbers "
        f"its {uniq.size} ranks by (process, device) in order; `site=` shows one "
        "communicator's own ranks."
    ]


def _span(
    records: Records,
    exec_of: dict[int, np.ndarray],
    gid: np.ndarray,
    ranks: np.ndarray,
    E: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first arrival (E, R), last exit (E, R), breaks (E,)): each rank's first arrival
    and last exit in each execution, seconds since its own first arrival (NaN where it
    has no record); `breaks[e]`: some site's steps skip a number just before execution
    e (a trace window's end), so e does not follow e - 1."""
    c = records.columns
    ex = np.zeros(c["step"].size, np.int64)
    breaks = np.zeros(E, bool)
    for si, e in exec_of.items():
        sel = c["site"] == si
        steps_u = int_unique(c["step"][sel])
        ex[sel] = e[index_in(steps_u, c["step"][sel])]
        gap = np.flatnonzero(np.diff(steps_u) != 1) + 1  # first step after a gap
        breaks[e[gap]] = True
    if "execution" in c:  # executions not recorded in between (a trace window's end)
        uniq = int_unique(c["execution"])
        breaks[1:] |= np.diff(uniq)[: E - 1] != 1
    col = index_in(ranks, gid)
    hi, lo = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    origin = np.full(ranks.size, hi)
    np.minimum.at(origin, col, c["arrive_ns"])
    first = np.full((E, ranks.size), hi)
    np.minimum.at(first, (ex, col), c["arrive_ns"])
    done = np.full((E, ranks.size), lo)
    np.maximum.at(done, (ex, col), c["done_ns"])
    first_s = np.where(first == hi, np.nan, (first - origin[None, :]) / 1e9)
    done_s = np.where(done == lo, np.nan, (done - origin[None, :]) / 1e9)
    return first_s, done_s, breaks
