"""The live decision over consecutive windows: the report's analysis on pooled windows.

The deciding process runs `jaxpace.report.analyze` (the one culprit decision
the report makes; test 1 at the report's level `LEVEL`, the fleet line at the
stricter `FLEET_LEVEL`) on the newest window's combined records; when it names
nobody, on the consecutive windows kept (up to `MAX_POOLED`) pooled (the
evidence of one 5-step window is too little for that decision), and says how
many it used. At most two analyses per window: their cost lands on process 0.
A process not (yet) named is reported as `likely`: the report's own `likely`
(last in most steps, significant, below what the job's size names) when it has
one, else the process whose devices were last in every execution of the newest
window.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxpace.diagnosis.culprit import ALPHA, WATCH_ALPHA
from jaxpace.records.reader import Records
from jaxpace.watch.summary import merge

__all__ = [
    "CONFIRM_WINDOWS",
    "FLEET_LEVEL",
    "LEVEL",
    "MAX_POOLED",
    "MAX_RELEASE_WINDOWS",
    "RELEASE_WINDOWS",
    "VERDICT_VERSION",
    "WindowResult",
    "decide",
    "log_line",
    "verdict",
]

MAX_POOLED = 8  # windows pooled at most for one decision
# The decision's family-wise levels. Test 1 (late against per-step noise) at the report's
# `ALPHA`: at `WATCH_ALPHA` a 20 ms straggler on a 4 x 2 CPU job's 29 ms step was not
# named in its 2nd window of 10 steps (tests/watch/test_watch_multiprocess.py failed in 1
# of 2 fresh-clone runs). Test 2 (outside the fleet's own spread) at `WATCH_ALPHA`: the
# false alarms of healthy fleets are their static outliers, devices persistently a little
# slower that pass test 1 over pooled windows and sit near the fleet line; the report's
# line named them 9.3e-5 a window at 8 processes (upper bound 1.3e-4), where one a
# job-week needed 6.6e-5 at the 0.5% cadence these levels were chosen for, and needs
# 1.3e-4 at today's 0.25% (docs/diagnostics.md, "Watch's false alarms").
LEVEL = ALPHA
FLEET_LEVEL = WATCH_ALPHA
# A process is named once the decisions of this many consecutive windows name it, or when
# the newest window's decision alone names it and so do the consecutive windows pooled.
# A lone 5-step window is noisy: on healthy 8-process fleets (benchmarks/watch_alarms.py,
# seeds 1000-2149) two false alarms came from a lone window naming the fleet's slowest
# process (last in every step of the window before, below the line) while the 35-40
# steps pooled put it below the line; "the window before pointed at it" then named it.
# Once named, a process stays named while each window's decision names it or has it as
# `likely` (`held`): a slow device near the line, named and not named by turns, raised
# 2-6 alarms in one run (a scheduler sees each new naming as a new alarm).
CONFIRM_WINDOWS = 2
# A held process is released once this many windows in a row neither name it nor have it
# as likely (one window that does not point at it is not enough: the pooled decision on a
# device near the line flips from window to window).
RELEASE_WINDOWS = 2
# A process named again after it was released needs twice the quiet windows to be released
# the next time, up to this many: a healthy 8-process fleet with a device near the line
# (benchmarks/watch_alarms.py, seed 2225, 15,120 windows: one to two job-weeks) was named,
# released and named again 137 times with a fixed release after 2 windows.
MAX_RELEASE_WINDOWS = 64
VERDICT_VERSION = 1
_ORDINAL = {1: "st", 2: "nd", 3: "rd"}


@dataclasses.dataclass(frozen=True)
class WindowResult:
    """One analyzed window (as `Watched.history()` returns them).

    Attributes:
      window: the window's index (>= 1; window `i` starts at call `i * every`).
      first_step, last_step: the wrapper's call indices (0-based) the window held.
      culprit_process: the process the decision names, or None.
      culprit_host: that process's host, or None.
      culprit_ranks: its ranks (global device ids in order), () when nobody is named.
      likely: a process not named (yet): the report's `Report.likely` process when
        the report has one, else one last in every execution of this window; the
        finding below the line; None otherwise.
      likely_text: the report's sentence for it (`Likely.text`: its figure and the
        threshold it is below), "" when the likely process is watch's own.
      mode: the report's primary failure mode (`persistent_straggler`,
        `balanced`, ...), or `"unanalyzed"` when nothing could be analyzed.
      windows_pooled: how many consecutive windows the decision used (0: none).
      analyzed_steps: executions (steps) the decision analyzed.
      partial: this window's data is incomplete: a process's summary was missing,
        cut, or its window skipped (`notes` says which).
      late_by_s: the culprit's (or the likely process's) excess lateness,
        seconds (NaN when nobody).
      in_a_row: consecutive analyzed windows whose decision named the same process
        (`candidate`), this one included (0 when this one's named nobody); the
        process is named (`culprit_process`) from `CONFIRM_WINDOWS` on, or at once
        when the newest window alone and the consecutive windows pooled both name it.
      since_window: the first window of the naming (None when nobody is named).
      held: the process stays named from the window before: this window's decision
        has it as `likely` (or as a candidate) without naming it on its own, or is the
        first of `RELEASE_WINDOWS` in a row that do not point at it (`quiet`).
      quiet: windows in a row, this one included, whose decision did not point at the
        held process (0 when it did, or when nothing is held).
      release_after: the windows in a row that release a held process now:
        `RELEASE_WINDOWS`, doubled each time the process last released is named again
        (at most `MAX_RELEASE_WINDOWS`).
      released: the process last released, or None.
      candidate: the process this window's decision named, confirmed or not (a
        candidate not yet confirmed is also `likely`).
      last_fraction: the share in [0, 1] of analyzed steps in which the named
        (or likely) process's devices arrived last; NaN when nobody.
      notes: what was missing or left out.
    """

    window: int
    first_step: int
    last_step: int
    culprit_process: int | None = None
    culprit_host: str | None = None
    culprit_ranks: tuple[int, ...] = ()
    likely: int | None = None
    likely_text: str = ""
    mode: str = "unanalyzed"
    windows_pooled: int = 0
    analyzed_steps: int = 0
    partial: bool = False
    late_by_s: float = math.nan
    in_a_row: int = 0
    since_window: int | None = None
    last_fraction: float = math.nan
    notes: tuple[str, ...] = ()
    candidate: int | None = None
    held: bool = False
    quiet: int = 0
    release_after: int = RELEASE_WINDOWS
    released: int | None = None


def _likely(recs: Records) -> tuple[int | None, float]:
    """The process whose devices had the least time inside every execution of `recs`
    (last to arrive each time), and the share of executions it was last in; None in a
    one-process job (it is trivially last every time)."""
    c = recs.columns
    if (recs.process_count or 0) <= 1:
        return None, math.nan
    key = c["site"] * (1 << 40) + c["step"]
    order = np.lexsort((c["wait_ns"], key))
    k = key[order]
    first = np.ones(k.size, bool)
    first[1:] = k[1:] != k[:-1]
    last_proc = c["process"][order][first]
    if last_proc.size == 0:
        return None, math.nan
    procs, counts = np.unique(last_proc, return_counts=True)
    top = int(np.argmax(counts))
    frac = float(counts[top] / last_proc.size)
    return (int(procs[top]) if frac == 1.0 else None), frac


def decide(
    windows: Sequence[tuple[int, int, int, Records | None, tuple[str, ...]]],
    history: Sequence[WindowResult],
    *,
    analyze: Any = None,
) -> WindowResult:
    """The result of the newest window given the windows so far (oldest first).

    Args:
      windows: `(window, first_step, last_step, records or None, notes[, busy])`,
        the newest last; only the newest `MAX_POOLED` are used, and only a run of
        consecutive analyzable windows ending at the newest. `busy`: the processes
        whose own watch work was running when the window began (never named from it).
      history: the results so far (for "in a row" and "since").
      analyze: the analysis (default `jaxpace.report.analyze`); a test may pass another.
    """
    if analyze is None:
        from jaxpace.report.analyze import analyze
    w, first, last, recs, notes = windows[-1][:5]
    partial = bool(notes) or (recs is not None and recs.partial)
    base = WindowResult(window=w, first_step=first, last_step=last, partial=partial, notes=notes)
    if recs is None:
        return base
    run: list[Records] = []
    busy: list[frozenset] = []
    for i, entry in enumerate(reversed(windows[-MAX_POOLED:])):
        if entry[3] is None or entry[0] != w - i:
            break
        run.insert(0, entry[3])
        busy.insert(0, frozenset(entry[5]) if len(entry) > 5 else frozenset())
    likely, frac = _likely(recs)
    prev = history[-1] if history and history[-1].window == w - 1 else None
    rep, pooled, by_pool, notes = _analyses(run, recs.run_id or "watch", prev, notes, analyze)
    if rep is None:
        return dataclasses.replace(base, notes=notes, partial=True, likely=likely)
    named = _pick(rep, _preferred(prev))
    likely_text = ""
    if named is None and rep.likely is not None:  # the report's finding below the line
        likely, frac = rep.likely.process, rep.likely.last_fraction
        likely_text = rep.likely.text
    # One process: its own watch work delays all its devices alike, and the ranks named
    # are the report's late devices (not all of the process's).
    single = (recs.process_count or 0) <= 1
    overlapped = sum(named in b for b in busy[-pooled:]) if named is not None and not single else 0
    if overlapped:  # its own watch work may have made it late: not named from these windows
        notes = (
            *notes,
            f"process {named}'s own watch work (window summary, decision) was still running "
            f"when {overlapped} of the {pooled} pooled windows began; it is not named from "
            "them (a larger `every` leaves that work room between windows).",
        )
        named, likely, by_pool = None, named, False
    candidate = named
    in_a_row, since = _streak(history, candidate, w)
    named, likely, since, held, quiet = _naming(
        rep, prev, candidate, likely, in_a_row, since, by_pool, busy_now=overlapped > 0
    )
    release_after, released = _release(prev, named)
    if named is not None or likely == candidate:
        likely_text = ""
    who = named if named is not None else likely
    ranks, host, late = _process_figures(rep, who, tuple(rep.culprits) if single else ())
    return dataclasses.replace(
        base,
        culprit_process=named,
        culprit_host=host if named is not None else None,
        culprit_ranks=ranks if named is not None else (),
        likely=None if named is not None else likely,
        likely_text="" if named is not None else likely_text,
        mode=str(rep.primary_mode),
        windows_pooled=pooled,
        analyzed_steps=int(rep.analyzed_steps),
        partial=partial,
        late_by_s=late,
        in_a_row=in_a_row,
        since_window=since,
        last_fraction=frac if who is not None else math.nan,
        notes=notes,
        candidate=candidate,
        held=held,
        quiet=quiet,
        release_after=release_after,
        released=released,
    )


def _release(prev: WindowResult | None, named: int | None) -> tuple[int, int | None]:
    """`(release_after, released)` after this window: the process named the window before
    and not now was released (`_naming` released it); a process named anew that is the one
    last released doubles the windows the next release needs."""
    if prev is None:
        return RELEASE_WINDOWS, None
    after, released = prev.release_after, prev.released
    before = prev.culprit_process
    if before is not None and named is None:  # (released this window)
        released = before
    elif named is not None and named != before and named == released:  # named again
        after = min(2 * after, MAX_RELEASE_WINDOWS)
    return after, released


def _preferred(prev: WindowResult | None) -> tuple[int | None, int | None]:
    """The processes a report naming several keeps: the one named the window before, then
    the one its decision proposed."""
    return (prev.culprit_process, prev.candidate) if prev is not None else (None, None)


def _analyses(
    run: list[Records], run_id: str, prev: WindowResult | None, notes: tuple, analyze: Any
) -> tuple[Any, int, bool, tuple]:
    """`(report, windows pooled, named by the pool, notes)`: the newest window alone, then
    (when it names nobody, or somebody the windows before have not) every consecutive
    window kept: at most two analyses a window. `named by the pool`: the pooled windows
    name the process the newest alone names (that confirms it). Report None: the newest
    window could not be analyzed (the note says why)."""
    prefer = _preferred(prev)
    rep, pooled, by_pool, alone = None, 0, False, None
    for n in sorted({1, len(run)}):
        try:
            recs = merge(run[-n:], run_id=run_id)
            got = analyze(recs, warmup_steps=0, alpha=LEVEL, fleet_alpha=FLEET_LEVEL)
        except Exception as e:  # noqa: BLE001 - a window that cannot be analyzed is partial
            notes = (*notes, f"analysis failed on {n} windows: {type(e).__name__}: {e}")
            break
        if rep is None:  # the newest alone
            rep, pooled = got, n
            alone = _pick(got, prefer)
            if alone is not None and alone in prefer:
                break  # confirmed by the windows before: no second analysis
        elif alone is None or alone in _processes(got):
            rep, pooled, by_pool = got, n, alone is not None
    return rep, pooled, by_pool, notes


def _naming(
    rep: Any,
    prev: WindowResult | None,
    candidate: int | None,
    likely: int | None,
    in_a_row: int,
    since: int | None,
    by_pool: bool,
    busy_now: bool,
) -> tuple[int | None, int | None, int | None, bool, int]:
    """`(named, likely, since, held, quiet)` from this window's decision (`candidate`,
    `likely`) and the window before: named from `CONFIRM_WINDOWS` in a row or when the
    pooled windows confirm a lone window's naming (`by_pool`); a process named before is
    kept (since its first window) and held while the decision points at it, released after
    `release_after` in a row that do not (`_release`)."""
    named_before = prev.culprit_process if prev is not None else None
    named = candidate
    if named is not None and named == named_before:  # still named
        since = prev.since_window if prev.since_window is not None else since
    elif named is not None and in_a_row < CONFIRM_WINDOWS and not by_pool:  # not yet: likely
        named, likely = None, candidate
    held, quiet = False, 0
    if named is None and named_before is not None and not busy_now:
        points = named_before in (candidate, likely) or named_before in _processes(rep)
        quiet = 0 if points else prev.quiet + 1
        if quiet < prev.release_after:  # held: named before, not released yet
            named, likely, held, since = named_before, None, True, prev.since_window
        else:
            quiet = 0
    return named, likely, since, held, quiet


def _process_figures(
    rep: Any, who: int | None, only: tuple[int, ...] = ()
) -> tuple[tuple[int, ...], str | None, float]:
    """`(ranks, host, how late)` of process `who` in the report (late: its latest rank's
    lateness against the median rank); of its ranks `only` when given."""
    if who is None:
        return (), None, math.nan
    stats = [r for r in rep.ranks if r.process == who and (not only or r.rank in only)]
    finite = [r.excess_lateness_s for r in stats if math.isfinite(r.excess_lateness_s)]
    host = stats[0].host if stats else None
    return tuple(sorted(r.rank for r in stats)), host, (max(finite) if finite else math.nan)


def _streak(history: Sequence[WindowResult], named: int | None, w: int) -> tuple[int, int | None]:
    """`(windows in a row, since which window)` the decisions have named the same process."""
    if named is None:
        return 0, None
    prev = history[-1] if history else None
    if prev is not None and prev.candidate == named and prev.window == w - 1:
        return prev.in_a_row + 1, prev.since_window
    return 1, w


def _processes(rep: Any) -> tuple[int, ...]:
    """The processes the report names: its culprit process, then those of its culprit
    ranks (a report may name several outliers), in order; () when it names nobody."""
    if rep.culprit_process is None:
        return ()
    of = {r.rank: r.process for r in rep.ranks}
    found = [rep.culprit_process, *(of.get(c) for c in rep.culprits)]
    return tuple(dict.fromkeys(int(p) for p in found if p is not None))


def _pick(rep: Any, prefer: Sequence[int | None]) -> int | None:
    """The process the report names, preferring the first of `prefer` it also names."""
    named = _processes(rep)
    return next((p for p in prefer if p is not None and p in named), rep.culprit_process)


def _ranks_text(ranks: Sequence[int]) -> str:
    if not ranks:
        return "ranks ?"
    if list(ranks) == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 1:
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))


def _nth(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else _ORDINAL.get(n % 10, "th")
    return f"{n}{suffix}"


def log_line(r: WindowResult) -> str:
    """One line per window, e.g.
    `jaxpace watch: steps 300-304: process 2 (host h2, ranks 4-5) late by 20.1 ms, 3rd window in a row`.

    >>> log_line(WindowResult(window=3, first_step=300, last_step=304, culprit_process=2,
    ...     culprit_host="h2", culprit_ranks=(4, 5), mode="persistent_straggler",
    ...     windows_pooled=1, analyzed_steps=5, late_by_s=0.0201, in_a_row=3, since_window=1))
    'jaxpace watch: steps 300-304: process 2 (host h2, ranks 4-5) late by 20.1 ms, 3rd window in a row'
    """
    head = f"jaxpace watch: steps {r.first_step}-{r.last_step}: "
    late = f"{r.late_by_s * 1e3:.1f} ms" if math.isfinite(r.late_by_s) else "?"
    pooled = f" ({r.windows_pooled} windows pooled)" if r.windows_pooled > 1 else ""
    partial = " [partial: " + "; ".join(r.notes[:3]) + "]" if r.partial else ""
    if r.culprit_process is not None and r.held:
        where = f"host {r.culprit_host}, {_ranks_text(r.culprit_ranks)}"
        why = (
            "this window's decision points at it without naming it"
            if not r.quiet
            else f"this window's decision does not point at it ({r.quiet} of the "
            f"{r.release_after} windows in a row that release it)"
        )
        return (
            f"{head}process {r.culprit_process} ({where}) late by {late}, still named (since "
            f"window {r.since_window}): {why}{pooled}{partial}"
        )
    if r.culprit_process is not None:
        where = f"host {r.culprit_host}, {_ranks_text(r.culprit_ranks)}"
        row = "window" if r.in_a_row == 1 else "window in a row"
        return (
            f"{head}process {r.culprit_process} ({where}) late by {late}, "
            f"{_nth(r.in_a_row)} {row}{pooled}{partial}"
        )
    if r.windows_pooled == 0:
        return f"{head}not analyzed{partial}"
    if r.candidate is not None and r.likely == r.candidate:
        return (
            f"{head}nobody named yet{pooled}; process {r.candidate} late by {late} in this "
            f"window's decision ({r.in_a_row} of the {CONFIRM_WINDOWS} windows in a row it "
            f"takes){partial}"
        )
    if r.likely is not None and r.likely_text:  # the report's own words
        return f"{head}nobody named{pooled}; {r.likely_text}{partial}"
    if r.likely is not None:
        return (
            f"{head}nobody named{pooled}; likely process {r.likely}: last in every step of "
            f"this window, late by {late}, not yet significant{partial}"
        )
    return f"{head}nobody named{pooled}{_mode_words(r.mode)}{partial}"


# What the window's failure mode says when nobody is named: the mode's name alone read as a
# finding ("nobody named (synchronization_amplification)" on every healthy window).
_MODE_WORDS = {
    "synchronization_amplification": "the last process changes from step to step",
    "topology_contention": "transfers, not arrivals, vary",
    "locality": "a group of ranks is later than the rest, below the line",
    "persistent_straggler": "one rank is later than the rest, below the line",
    "likely_straggler": "one process is last in most steps, below the line",
    "balanced": "arrivals balanced",
}


def _mode_words(mode: str) -> str:
    """`; <what the mode means> (<mode>)`, or nothing without a mode."""
    if not mode:
        return ""
    words = _MODE_WORDS.get(mode)
    return f"; {words} ({mode})" if words and mode != "balanced" else f"; {words or mode}"


def verdict(r: WindowResult, *, run: str, process_count: int) -> dict[str, Any]:
    """The machine-readable verdict (version `VERDICT_VERSION`) for a scheduler or a script.

    `confidence`: `"named"` (the report's decisions on `CONFIRM_WINDOWS`
    consecutive windows name the process, or the newest window's decision and
    the pooled windows' both do; it stays named, `held`, while each window's
    decision names it or has it as likely), `"likely"` (named by this window's
    decision only, `candidate`; or the report's finding below the line; or last
    in every step of the newest window, not significant yet) or `"none"`.
    """
    who = r.culprit_process if r.culprit_process is not None else r.likely
    return {
        "version": VERDICT_VERSION,
        "kind": "jaxpace.watch.verdict",
        "run": run,
        "process_count": int(process_count),
        "window": r.window,
        "first_step": r.first_step,
        "last_step": r.last_step,
        "culprit_process": who,
        "culprit_host": r.culprit_host,
        "culprit_ranks": list(r.culprit_ranks),
        "confidence": "named"
        if r.culprit_process is not None
        else ("likely" if r.likely is not None else "none"),
        "since_window": r.since_window,
        "windows_in_a_row": r.in_a_row,
        "late_by_s": r.late_by_s if math.isfinite(r.late_by_s) else None,
        "last_fraction": r.last_fraction if math.isfinite(r.last_fraction) else None,
        "mode": r.mode,
        "windows_pooled": r.windows_pooled,
        "analyzed_steps": r.analyzed_steps,
        "partial": r.partial,
        "likely_text": r.likely_text,
        "candidate": r.candidate,
        "held": r.held,
        "quiet": r.quiet,
        "release_after": r.release_after,
        "released": r.released,
        "notes": list(r.notes[:8]),
    }
