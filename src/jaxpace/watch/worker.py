"""The one background thread of a watched function: summaries, the decision, heartbeats.

It never blocks a step: the wrapper hands it finished window traces through a
bounded queue (a full queue drops the window, which is then partial) and it
reads the call count the wrapper keeps. Every store call is bounded
(`exchange`); three failed calls in a row mean the coordination service is
gone: it says so and watch stops on this process. Its memory is bounded: the
newest `MAX_POOLED` windows' records, the history (`MAX_HISTORY` results).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import queue
import shutil
import sys
import threading
import time
from typing import Any

from jaxpace.records.safe_io import write_atomic
from jaxpace.runtime import pauses
from jaxpace.runtime.watchdog import exit_stalled
from jaxpace.watch import decide as _decide
from jaxpace.watch import exchange as _ex
from jaxpace.watch import heartbeat, schedule, store, summary

__all__ = ["BEAT_EVERY_S", "CLOSE_GATHER_S", "GATHER_S", "MAX_HISTORY", "TICK_S", "Worker"]

TICK_S = 0.25  # the thread's loop period
BEAT_EVERY_S = 1.0  # a process publishes its call count at most this often
RESULT_EVERY_S = 2.0  # a non-deciding process reads the latest result at most this often
GATHER_S = 30.0  # the deciding process waits at most this for a window's summaries
GATHER_EVERY_S = 0.25  # ... reading them at most this often
CLOSE_GATHER_S = 5.0  # ... and at most this once closing
FAILS_TO_STOP = 3  # store calls failed in a row: the coordination service is gone
MAX_HISTORY = 1024
SINK_TIMEOUT_S = 5.0
QUEUE_WINDOWS = 4
SLOTS = 4  # summary keys per process (window % SLOTS): the deciding process may lag this many
# The thread's nice value (Linux, this thread only): the step's threads (nice 0) get about
# three times its CPU share when they compete. Not 19: on 2 cores loaded by other jobs a
# thread at 19 got so little CPU that 3 windows of a 60-call run were still unsummarized at
# close (decided partial); at 0 none were.
WORKER_NICE = 5


def say(message: str) -> None:
    """One line on stderr (the job's log)."""
    try:
        print(message, file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001 - never fail on a closed stream
        pass


class Worker:
    """The background thread of one `Watched` (`w`; see the module docstring)."""

    def __init__(self, w: Any, exchange: _ex.Exchange, *, process: int, count: int, host: str):
        self.w = w
        self.ex = exchange
        self.process, self.count, self.host = process, count, host
        self.leader = process == 0
        self.jobs: queue.Queue = queue.Queue(maxsize=QUEUE_WINDOWS)
        self.history: collections.deque = collections.deque(maxlen=MAX_HISTORY)
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._drain = False
        self._fails = 0
        self._beat_at = -math.inf
        self._beat_key: tuple | None = None
        self._result_at = -math.inf
        self._pending: dict[int, tuple[float, int, int]] = {}  # window -> (deadline, first, last)
        self._got: dict[int, dict[int, dict]] = {}  # window -> process -> its summary
        self._lost: dict[int, set[int]] = {}  # window -> processes whose summary was replaced
        self._windows: collections.deque = collections.deque(maxlen=_decide.MAX_POOLED)
        self._kept: collections.deque = collections.deque(maxlen=store.KEEP_WINDOWS)
        self._verdicts: collections.deque = collections.deque(maxlen=store.KEEP_WINDOWS)
        self._stalls = (
            heartbeat.StallDetector(w.stall_after_s) if w.stall_after_s is not None else None
        )
        self._sinks = list(w.sinks)
        self.sink_errors = 0
        self.gone: str | None = None
        self.busy = False  # summarizing or deciding now (the wrapper reads it at a window start)
        # The newest window this thread is done with (its summary published; on the deciding
        # process, decided): the wrapper times the calls after a window until then.
        self.done_window = 0
        self.stalls: list[dict] = []
        self._closing_at: float | None = None
        self._count_seen: tuple[int, float] = (-1, 0.0)
        self._stalls_at = -math.inf
        self._cut_windows: set[int] = set()  # windows decided partial at a stall (see _cut)
        self._gather_at = -math.inf
        self._held: tuple | None = None  # a finished window waiting for the open one to close
        self._window_costs: collections.deque = collections.deque(maxlen=5)  # every="auto"
        self._step_s = math.nan
        self.thread = threading.Thread(target=self._loop, name="jaxpace-watch", daemon=True)

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self.thread.start()

    def submit(self, job: tuple) -> bool:
        """Hands a finished window to the thread; False (window dropped) when it is behind."""
        if self.leader:  # gathered from now on, even while this process's own job waits
            with self.lock:
                self._pending.setdefault(job[0], (time.monotonic() + GATHER_S, job[1], job[2]))
        try:
            self.jobs.put_nowait(job)
            return True
        except queue.Full:
            if self.leader:
                with self.lock:
                    self._lost.setdefault(job[0], set()).add(self.process)
            return False

    def stop(self, timeout_s: float) -> None:
        """Finishes queued windows (and, deciding, gathers them within `timeout_s`), then ends."""
        self._drain = True
        self._stop.set()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout_s)

    def _quiet(self) -> bool:
        """No window is open on this process (or windows are back to back, or closing):
        the heavy work (summary, decision) waits for this, so it never slows a window."""
        s = self.w.schedule
        return self.w._open is None or s.window == s.every or self._stop.is_set()

    def _loop(self) -> None:
        _lower_priority()
        if self.leader:  # the report's modules load now, not during the first decision
            try:
                import jaxpace.report.analyze  # noqa: F401
            except Exception:  # noqa: BLE001 - the decision says so when it runs
                pass
        while True:
            if self._held is None:
                try:
                    self._held = self.jobs.get(timeout=TICK_S)
                except queue.Empty:
                    pass
            else:
                self._stop.wait(TICK_S)
            try:
                quiet = self._quiet()
                if self._held is not None and quiet:
                    job, self._held = self._held, None
                    self.busy = True
                    self._window(*job)
                now = time.monotonic()
                if self.gone is None:
                    self._beat(now)
                    if self.leader:
                        self._gather(now, final=self._stop.is_set(), quiet=quiet)
                        self._check_stalls(now)
                    else:
                        self._read_result(now)
            except Exception as e:  # noqa: BLE001 - the thread never dies of a bad window
                say(f"jaxpace watch: internal error on process {self.process}: {e!r}")
            finally:
                self.busy = False
            if self.gone is not None:
                return
            if self._stop.is_set() and self._held is None and self.jobs.empty():
                if not self.leader or not self._pending:
                    return

    # ----------------------------------------------------------------- store calls

    def _ok(self, ok: bool) -> bool:
        self._fails = 0 if ok else self._fails + 1
        if not ok and self._fails >= FAILS_TO_STOP and self.gone is None:
            err = getattr(self.ex, "last_error", None)
            self.gone = f"{err!r}" if err is not None else "no answer"
            say(
                f"jaxpace watch: the job's {self.ex.kind} does not answer ({self.gone}) on "
                f"process {self.process}; watch stops here (the program goes on unwatched)."
            )
            self.w._stopped = True
        return ok

    def _put(self, k: str, value: Any) -> bool:
        return self._ok(self.ex.put(k, json.dumps(value, separators=(",", ":"))))

    def _get_dir(self, prefix: str, parse: Any = None) -> dict[int, dict]:
        """`{process: value}` under `prefix`, values JSON objects (each through `parse` as it is
        read, when given); {} when the store failed."""
        got = self.ex.get_dir(prefix)
        if not self._ok(got is not None):
            return {}
        out: dict[int, dict] = {}
        got = got or []
        while got:  # each answer's text is dropped once parsed (8192 summaries: 34 MiB of it)
            k, v = got.pop()
            part = k[len(prefix) :].split("/", 1)[0]
            try:
                p, val = int(part.removeprefix("p")), json.loads(v)
                val = parse(val) if parse is not None else val
            except (ValueError, TypeError):
                continue
            if isinstance(val, dict) and 0 <= p < self.count:
                out.setdefault(p, {})[k] = val
        return out

    # ----------------------------------------------------------------- windows

    def _window(self, window, first, last, trace_dir, why, costs, export=None) -> None:
        """Summarizes and publishes one window of this process (with its edge costs, seconds).

        `export`: `(session, xspace, dir)` when the step's thread only collected the trace:
        the files are written here first. The deciding process keeps its own summary in
        memory (its decision never waits for it through the store)."""
        where = dict(process=self.process, host=self.host, window=window, first=first, last=last)
        cpu0 = time.thread_time()
        if trace_dir is not None and export is not None:
            t0 = time.perf_counter()
            try:
                export[0].export(export[1], export[2])
                costs = {**costs, "export_s": round(time.perf_counter() - t0, 6)}
            except Exception as e:  # noqa: BLE001 - the window is then partial
                why, trace_dir = (
                    f"process {self.process}: writing the window trace failed ({e})",
                    None,
                )
            export = None  # the XSpace's bytes are no longer held
        if trace_dir is None:
            s = summary.empty(**where, why=why or f"process {self.process}: no trace")
        else:
            t0 = time.perf_counter()
            s = summary.summarize(trace_dir, **where)
            s["summarize_s"] = round(time.perf_counter() - t0, 4)
            shutil.rmtree(trace_dir, ignore_errors=True)
        s["costs"] = {**costs, "summary_cpu_s": round(time.thread_time() - cpu0, 6)}
        self._put(_ex.key(self.w.run, "summary", self.process, window % SLOTS), s)
        if self.leader:
            with self.lock:
                pending = window in self._pending
            if pending and window not in self._cut_windows:
                own = summary.compact({**s, "rows": list(s["rows"])})
                self._got.setdefault(window, {})[self.process] = own
                self._lost.get(window, set()).discard(self.process)
            if not pending:  # (decided already, at a stall: done with it)
                self.done_window = max(self.done_window, window)
        else:
            self.done_window = max(self.done_window, window)

    def _gather(self, now: float, final: bool, quiet: bool) -> None:
        """Reads the pending windows' summaries (keeping what it read: a later window may
        replace them in the store) and, when no window is open, decides them in order."""
        with self.lock:
            pending = dict(self._pending)
        if not pending:
            return
        if final and self._closing_at is None:
            self._closing_at = now
        if now - self._gather_at >= GATHER_EVERY_S or final:
            self._gather_at = now
            for window in sorted(pending):
                have = self._got.setdefault(window, {})
                lost = self._lost.setdefault(window, set())
                if len(have) + len(lost) >= self.count:
                    continue
                got = self._get_dir(
                    f"jaxpace/watch/{self.w.run}/summary/{window % SLOTS}/", summary.compact
                )
                for p, vals in got.items():
                    v = next(iter(vals.values()))
                    w = v.get("window")
                    if w == window:
                        have[p] = v
                        lost.discard(p)
                    elif isinstance(w, int) and not isinstance(w, bool) and w > window:
                        if p not in have:  # replaced before it was read: gone
                            lost.add(p)
        if not quiet:
            return
        for window in sorted(pending):  # in window order: a later one waits
            deadline, first, last = pending[window]
            if self._closing_at is not None:  # closing: the others' last summaries are on their way
                deadline = min(deadline, self._closing_at + CLOSE_GATHER_S)
            have, lost = self._got.get(window, {}), self._lost.get(window, set())
            if len(have) + len(lost) < self.count and now < deadline:
                return
            with self.lock:
                del self._pending[window]
            self._got.pop(window, None)
            self._lost.pop(window, None)
            self.busy = True
            self._decide(window, first, last, have, sorted(lost))

    def _decide(
        self, window, first, last, mine: dict[int, dict], lost: list[int], cut: str = ""
    ) -> None:
        try:
            self._decide_one(window, first, last, mine, lost, cut)
        finally:
            self.done_window = max(self.done_window, window)

    def _decide_one(self, window, first, last, mine, lost, cut) -> None:
        """`_decide`'s work: the decision, its verdict, the next window, the deliveries."""
        if window in self._cut_windows:  # decided partial at a stall already: that stands
            return
        t0, cpu0 = time.perf_counter(), time.thread_time()
        recs, notes = summary.combine(
            mine,
            lost=lost,
            process_count=self.count,
            window=window,
            first=first,
            last=last,
            run_id=f"watch-{self.w.run}",
        )
        busy = frozenset(p for p, s in mine.items() if (s.get("costs") or {}).get("busy_at_start"))
        self._windows.append((window, first, last, recs, tuple(notes), busy))
        with self.lock:
            hist = list(self.history)
        result = _decide.decide(list(self._windows), hist)
        if cut:
            self._cut_windows.add(window)
            result = dataclasses.replace(result, partial=True, notes=(cut, *result.notes))
        result = dataclasses.replace(result, notes=result.notes[:16])
        with self.lock:
            self.history.append(result)
        analysis_s = time.perf_counter() - t0
        say(_decide.log_line(result))
        v = _decide.verdict(result, run=self.w.run, process_count=self.count)
        v["cost_s"] = _costs(mine, analysis_s)
        if self.w.schedule.auto and not cut:
            nxt = self._announce(window, mine, time.thread_time() - cpu0)
            if nxt is not None:
                v["next_window"] = {"window": nxt[0], "first_step": nxt[1]}
                v["cost_s"]["window_cost_s"] = round(self._window_costs[-1], 6)
                self.w._announced = nxt
        self._verdicts.append(v)
        self._put(f"jaxpace/watch/{self.w.run}/result/p0", v)
        if self.w.out is not None:
            try:
                store.write_verdict(self.w.out, self._verdicts)
                if recs is not None:
                    self._kept.append(recs)
                    store.store_windows(self.w.out, self._kept, run_id=f"watch-{self.w.run}")
            except OSError as e:
                say(f"jaxpace watch: cannot write under out={self.w.out!s}: {e}")
        if recs is not None:
            self._deliver(recs, v)

    def _announce(self, window: int, mine: dict[int, dict], decide_cpu_s: float):
        """`every="auto"`: the next window, `(window, first call)`, from this window's cost
        (`window_cost`, plus this decision's CPU time on this process) and the time per
        step, as `schedule.spacing` and `schedule.next_start` place it; None when
        `window` is not the newest one announced."""
        s = self.w.schedule
        first = s.bounds(window)[0]
        if first < 0 or window < s._next[0]:
            return None
        costs = {p: (m.get("costs") or {}) for p, m in mine.items()}
        cost = max([window_cost(c, s.window) for c in costs.values()] or [0.0])
        cost = max(cost, window_cost(costs.get(self.process, {}), s.window, decide_cpu_s))
        self._window_costs.append(cost)
        steps = [c.get("step_s") for c in costs.values()]
        steps = [x for x in steps if _finite(x) and x > 0]
        step_s = float(sorted(steps)[len(steps) // 2]) if steps else math.nan
        if math.isfinite(step_s):
            self._step_s = step_s
        typical = sorted(self._window_costs)[len(self._window_costs) // 2]
        gap = schedule.spacing(typical, self._step_s, window=s.window)
        return window + 1, schedule.next_start(first, gap, self.w._calls, self._step_s)

    def _read_result(self, now: float) -> None:
        if now - self._result_at < RESULT_EVERY_S:
            return
        self._result_at = now
        got = self._get_dir(f"jaxpace/watch/{self.w.run}/result/")
        for v in (got.get(0) or {}).values():
            r = _from_verdict(v)
            with self.lock:
                if r is not None and (not self.history or self.history[-1].window < r.window):
                    self.history.append(r)
            nxt = v.get("next_window") if self.w.schedule.auto else None
            if isinstance(nxt, dict):
                win, first = nxt.get("window"), nxt.get("first_step")
                if all(isinstance(x, int) and not isinstance(x, bool) for x in (win, first)):
                    if 0 < win and 0 <= first < schedule.MAX_CALLS:
                        if self.w._announced is None or self.w._announced[0] < win:
                            self.w._announced = (win, first)

    # ----------------------------------------------------------------- sinks

    def _deliver(self, recs: Any, v: dict) -> None:
        """Per analyzed step and rank, the summary the existing sinks take (`jaxpace.sinks`):
        site `watch/<site>`, the wait, no delay, every rank's earliness in that step."""
        if not self._sinks:
            return
        c = recs.columns
        ranks = int(c["rank"].max()) + 1
        items = []
        for si, site in enumerate(recs.sites):
            sel = c["site"] == si
            for step in sorted(set(c["step"][sel].tolist())):
                m = sel & (c["step"] == step)
                wait = [math.nan] * ranks
                for r, wt in zip(c["rank"][m].tolist(), c["wait_ns"][m].tolist(), strict=True):
                    wait[r] = wt / 1e9
                lo = min((x for x in wait if x == x), default=math.nan)
                early = [x - lo for x in wait]
                for r in range(ranks):
                    if wait[r] == wait[r]:
                        items.append(
                            {
                                "site": f"watch/{site}",
                                "step": int(step),
                                "rank": r,
                                "wait_s": wait[r],
                                "delay_s": 0.0,
                                "engaged": False,
                                "earliness_s": early,
                                "watch": v,
                            }
                        )
        self._call_sinks(items)

    def _call_sinks(self, items: list[dict]) -> None:
        for sink in list(self._sinks):
            try:
                for s in items:
                    sink(s)
            except BaseException as e:  # noqa: BLE001 - a user's sink may raise anything
                self.sink_errors += 1
                self._sinks.remove(sink)
                say(f"jaxpace watch: sink {sink!r} raised {e!r}; it is disabled.")

    # ----------------------------------------------------------------- heartbeat

    def _own_beat(self, now: float) -> dict:
        """This process's heartbeat: calls entered, seconds since that count was first seen
        here (on this process's clock; within one tick), its pause."""
        calls = self.w._calls
        if self._count_seen[0] != calls:
            self._count_seen = (calls, now)
        age = round(now - self._count_seen[1], 3)
        return {"calls": calls, "age_s": age, "host": self.host, "pause": pauses.current(now)}

    def _beat(self, now: float) -> None:
        if self.w.stall_after_s is None or self.leader:
            return
        beat = self._own_beat(now)
        k = (beat["calls"], (beat["pause"] or {}).get("id"))
        if k == self._beat_key or now - self._beat_at < BEAT_EVERY_S:
            return
        self._beat_at = now
        if self._put(_ex.key(self.w.run, "beat", self.process), beat):
            self._beat_key = k

    def _check_stalls(self, now: float) -> None:
        if self._stalls is None or now - self._stalls_at < BEAT_EVERY_S:
            return
        self._stalls_at = now
        got = self._get_dir(f"jaxpace/watch/{self.w.run}/beat/")
        beats = {p: next(iter(vals.values())) for p, vals in got.items()}
        if not got:
            return
        beats[self.process] = self._own_beat(now)
        for s in self._stalls.observe(beats, now):
            self._stall(s)

    def _stall(self, s: dict) -> None:
        message = heartbeat.stall_message(s)
        say(message)
        record = {"version": _decide.VERDICT_VERSION, "kind": "jaxpace.watch.stall", **s}
        record["message"] = message
        with self.lock:
            self.stalls.append(record)
        how = self.w.on_stall
        if self.w.out is not None:
            try:
                write_atomic(
                    os.path.join(os.fspath(self.w.out), "stall.json"),
                    json.dumps(record) + "\n",
                    what="watch stall record",
                    make_parents=True,
                )
            except OSError as e:
                say(f"jaxpace watch: cannot write the stall record: {e}")
        self._cut(s, message)
        if callable(how):
            self._call_sinks_bounded(lambda: how(dict(record)))
        sink_items = [
            {"site": "watch/stall", "step": s["last_step"], "rank": s["process"],
             "wait_s": s["stalled_s"], "delay_s": 0.0, "engaged": False, "stall": record}
        ]  # fmt: skip
        if how == "exit":
            self._call_sinks_bounded(lambda: self._call_sinks(sink_items))
            exit_stalled()
        self._call_sinks(sink_items)

    def _cut(self, s: dict, message: str) -> None:
        """A stall while this (deciding) process is inside a window: its step waits in a
        collective for the stalled process (or a dead one: JAX's heartbeat abort may end
        the job any moment). The windows before it are decided now with the summaries
        read so far, and the open window as partial, naming the stall; never waits."""
        self._own_closed_windows()
        now = time.monotonic()
        with self.lock:
            for window, (_d, first, last) in list(self._pending.items()):
                self._pending[window] = (now, first, last)  # due now: decided with what is in
        self._gather_at = -math.inf
        self._gather(now, final=False, quiet=True)
        opened = self.w._open
        if opened is None or opened[0] in self._cut_windows:
            return
        window = opened[0]
        first, last = self.w.schedule.bounds(window)
        why = (
            f"window cut: process {self.process} was inside it when "
            f"{message.removeprefix('jaxpace watch: ')}"
        )
        self._decide(window, first, last, {}, [], cut=why)

    def _own_closed_windows(self) -> None:
        """Summarizes this process's windows that are closed but not yet summarized (held
        while a later window is open, or queued), so the decisions made now have them."""
        while True:
            job, self._held = self._held, None
            if job is None:
                try:
                    job = self.jobs.get_nowait()
                except queue.Empty:
                    return
            self._window(*job)

    def _call_sinks_bounded(self, fn: Any) -> None:
        """Runs `fn` on a helper thread and waits at most `SINK_TIMEOUT_S` for it."""
        t = threading.Thread(target=_quietly, args=(fn,), name="jaxpace-watch-sink", daemon=True)
        t.start()
        t.join(SINK_TIMEOUT_S)


def window_cost(costs: dict, calls: int, decide_cpu_s: float = 0.0) -> float:
    """What one process's window of `calls` calls cost, seconds, from its summary's `costs`: its extra
    time on the step's thread (from the blocking call before the window to the end of
    the collection, less the window's calls at the time per step outside windows; the
    block before it), and the analysis: the larger of its CPU time on watch's thread
    (writing and reading the trace; `decide_cpu_s`, the deciding process's decision) and
    what the calls after the window before took beyond the step time while watch's
    thread analyzed that one (`after_prev_s`: on 2 busy cores the step lost more than
    the thread's CPU time, and a step waiting on a GPU loses less)."""

    def get(k: str) -> float:
        v = costs.get(k)
        return float(v) if _finite(v) and v >= 0 else 0.0

    step_s = get("step_s")
    extra = max(0.0, get("window_s") - calls * step_s) if step_s else 0.0
    analysis = max(get("summary_cpu_s") + decide_cpu_s, get("after_prev_s"))
    return extra + get("pre_block_s") + analysis


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _lower_priority() -> None:
    """This thread at a lower CPU priority (`WORKER_NICE`; Linux: a thread's own nice
    value), so the step's threads get the cores first; nothing elsewhere (no per-thread
    nice)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WORKER_NICE)
    except (AttributeError, OSError):
        pass


def _costs(summaries: dict[int, dict], analysis_s: float) -> dict[str, float | None]:
    """The window's costs, seconds: per edge the largest over processes; the analysis here."""
    out: dict[str, float | None] = {"analysis_s": round(analysis_s, 4)}
    keys = (
        "pre_block_s",
        "start_trace_s",
        "end_block_s",
        "stop_trace_s",
        "export_s",
        "summarize_s",
        "after_prev_s",
    )
    for k in keys:
        vals = []
        for s in summaries.values():
            v = s.get(k, (s.get("costs") or {}).get(k))
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
                vals.append(float(v))
        out[f"max_{k}"] = round(max(vals), 4) if vals else None
    return out


def _quietly(fn: Any) -> None:
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - a user's callable may raise anything
        say(f"jaxpace watch: on_stall callable raised {e!r}")


def _from_verdict(v: dict) -> _decide.WindowResult | None:
    """The `WindowResult` the deciding process published (a non-deciding process's history)."""
    try:
        named = v.get("confidence") == "named"
        return _decide.WindowResult(
            window=int(v["window"]),
            first_step=int(v["first_step"]),
            last_step=int(v["last_step"]),
            culprit_process=int(v["culprit_process"]) if named else None,
            culprit_host=v.get("culprit_host") if named else None,
            culprit_ranks=tuple(int(r) for r in v.get("culprit_ranks", [])),
            likely=int(v["culprit_process"]) if v.get("confidence") == "likely" else None,
            mode=str(v.get("mode")),
            windows_pooled=int(v.get("windows_pooled", 0)),
            analyzed_steps=int(v.get("analyzed_steps", 0)),
            partial=bool(v.get("partial")),
            late_by_s=float(v["late_by_s"]) if v.get("late_by_s") is not None else math.nan,
            in_a_row=int(v.get("windows_in_a_row", 0)),
            since_window=v.get("since_window"),
            last_fraction=(
                float(v["last_fraction"]) if v.get("last_fraction") is not None else math.nan
            ),
            notes=tuple(str(n) for n in v.get("notes", [])),
            candidate=int(v["candidate"]) if v.get("candidate") is not None else None,
            held=bool(v.get("held", False)),
            quiet=int(v.get("quiet", 0)),
            release_after=int(v.get("release_after", _decide.RELEASE_WINDOWS)),
            released=int(v["released"]) if v.get("released") is not None else None,
        )
    except (KeyError, TypeError, ValueError):
        return None
