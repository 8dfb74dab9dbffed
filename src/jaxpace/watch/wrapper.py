"""`Watched`: the callable `jaxpace.watch` returns; the window schedule applied to each call."""

from __future__ import annotations

import functools
import itertools
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from jaxpace._validate import check_callables, check_number
from jaxpace.errors import ConfigError
from jaxpace.watch.decide import WindowResult
from jaxpace.watch.schedule import MAX_CALLS, AutoSchedule, Schedule
from jaxpace.watch.worker import CLOSE_GATHER_S, Worker, say

__all__ = ["DEFAULT_EVERY", "DEFAULT_WINDOW", "ON_STALL", "Watched", "register_exit"]

DEFAULT_EVERY = "auto"
DEFAULT_WINDOW = 5
ON_STALL = ("log", "exit")
_CLOSE_S = CLOSE_GATHER_S + 6.0  # the thread's final gather plus one bounded store call
# The calls after a window are timed until watch's thread is done with it (its summary; on
# the deciding process its decision), at most this long: what the step lost meanwhile is
# part of the window's cost (`worker.window_cost`).
AFTER_MAX_S = 60.0
_RUN_IDS = itertools.count()  # the n-th watched function of a process: the same on every process


class Watched:
    """A function under `jaxpace.watch`: same signature, same results, same program.

    Call `k` (0-based) of the wrapper runs `fn` untouched unless it is a
    window's edge or inside a window (`jaxpace.watch.schedule.Schedule`, or
    `AutoSchedule` with `every="auto"`): the call before a window blocks on its
    outputs; a window's first call starts `jax.profiler`; its last blocks on its
    outputs and stops the profiler.
    """

    def __init__(
        self,
        fn: Callable,
        *,
        every: int | str = DEFAULT_EVERY,
        window: int = DEFAULT_WINDOW,
        stall_after_s: float | None = None,
        on_stall: str | Callable = "log",
        sinks: Iterable[Callable] = (),
        out: str | os.PathLike | None = None,
        profiler: Any = None,
        block: Callable | None = None,
    ) -> None:
        if not callable(fn):
            raise ConfigError(
                f"`fn` must be callable (a step function or a `jax.jit` function), got {fn!r}."
            )
        functools.update_wrapper(self, fn)
        self._fn = fn
        if isinstance(every, str):
            if every != "auto":
                raise ConfigError(
                    f'`every` must be "auto" or an integer >= 2 (calls between window starts), '
                    f"got {every!r}."
                )
            self.schedule: Schedule | AutoSchedule = AutoSchedule(window=window)
        else:
            self.schedule = Schedule(every=every, window=window)
        if stall_after_s is not None:
            check_number("stall_after_s", stall_after_s, lo=0.0, hi=7 * 86400.0, lo_open=True)
        if not (callable(on_stall) or on_stall in ON_STALL):
            raise ConfigError(
                f"`on_stall` must be 'log', 'exit' or a callable taking the stall dict, got "
                f"{on_stall!r}."
            )
        sinks = tuple(sinks) if not callable(sinks) else (sinks,)
        check_callables("sinks", sinks, fix="Pass callables taking one summary dict, e.g. "
                        "`jaxpace.sinks.prometheus_textfile(path)`.")  # fmt: skip
        if out is not None and not isinstance(out, str | os.PathLike):
            raise ConfigError(f"`out` must be a directory path or None, got {out!r}.")
        self.stall_after_s = None if stall_after_s is None else float(stall_after_s)
        self.on_stall = on_stall
        self.sinks = sinks
        self.out = None if out is None else Path(out)
        self.run = f"w{next(_RUN_IDS)}"
        self._profiler = profiler
        self._trace_kwargs: dict[str, Any] = {}
        self._block = block
        self._calls = 0
        self._costs: dict[str, float] = {}  # this window's edge costs (seconds)
        # Steps timed outside windows: (call, perf_counter) when call `k` began; the window's
        # blocking call before it returned at `_t_pre`.
        self._mark: tuple[int, float] | None = None
        self._t_pre = 0.0
        # After a window's end: (window, its first call after, when that began, the step
        # time before the window) until watch's thread is done with it; then what the calls
        # meanwhile took beyond that step time, for the next window's costs (`_after_done`).
        self._after: tuple[int, int, float, float] | None = None
        self._after_s: float | None = None
        # The next window the deciding process announced, `(window, first call)`, set by the
        # background thread (`every="auto"`); the step's thread adopts it before a call.
        self._announced: tuple[int, int] | None = None
        self._seen: tuple[int, int] | None = None
        self._stopped = False
        self._closed = False
        self._open: tuple[int, str | None, str | None] | None = None  # window, dir, why skipped
        self._session: tuple[Any, Any] | None = None  # the window's ProfileSession, exporter
        self._worker: Worker | None = None
        self._tmp: str | None = None
        self._lock = threading.Lock()
        self._setup_error: str | None = None
        # Whether `fn` calls jaxpace collectives (decided at call 0, the same on every
        # process: a trace-time count). With them, calls outside windows run the plain form
        # (`measure.pass_through`) and calls inside windows the measured one.
        self._dropins: bool | None = None
        self._init_quiet()

    def _init_quiet(self) -> None:
        """The state of the calls between windows (`__call__`'s short path)."""
        from jaxpace.collectives import measure  # (a JAX program's: jax is imported anyway)

        # Calls below this index are between windows with nothing due (`schedule.next_busy`
        # after the last call that took `_call`); 0: call 0 takes it.
        self._quiet_until = 0
        # The pass-through flag on this thread without a context object (`prev = set(True)`,
        # `restore(prev)`): making `pass_through(True)` was most of a call's own time.
        self._set_plain = measure.set_pass_through
        self._restore_plain = measure.restore_pass_through

    # ----------------------------------------------------------------- the call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        k = self._calls
        self._calls = k + 1
        if k < self._quiet_until and self._after is None and self._announced is self._seen:
            # Between windows (most calls): the plain form and nothing else.
            prev = self._set_plain(True)
            try:
                return self._fn(*args, **kwargs)
            finally:
                self._restore_plain(prev)
        out = self._call(k, args, kwargs)
        # The calls before the next edge take the path above (a window announced meanwhile,
        # or the timing after a window, sends them here again).
        stopped = self._stopped and self._open is None
        self._quiet_until = MAX_CALLS if stopped else self.schedule.next_busy(k + 1)
        return out

    def _run(self, plain: bool, args: tuple, kwargs: dict) -> Any:
        """`fn(*args, **kwargs)` in the plain form (`plain`: jaxpace collectives trace as
        their `jax.lax` calls) or the measured one; the flag restored after it."""
        prev = self._set_plain(plain)
        try:
            return self._fn(*args, **kwargs)
        finally:
            self._restore_plain(prev)

    def _call(self, k: int, args: tuple, kwargs: dict) -> Any:
        """Call `k` with what the schedule has it do (`__call__`'s path for the calls not
        simply between windows)."""
        if k == 0:
            if not self._closed:
                self._setup()
            return self._first_call(args, kwargs)
        announced = self._announced
        if announced is not self._seen:
            self._seen = announced
            self._adopt(announced, k)
        edge = self.schedule.edge(k)
        if not edge.busy or (self._stopped and self._open is None):
            out = self._run(True, args, kwargs)
            if self._after is not None:
                self._after_check(k)
            return out
        if self._after is not None:  # (the next window's blocking call: no later)
            self._after_done(k, time.perf_counter())
        if edge.start and not self._stopped:
            self._start(edge.window)
        try:
            # Inside a window, a program with jaxpace collectives runs its measured form;
            # the choice depends on the call count alone (every process runs the same).
            out = self._run(not (edge.window and self._dropins and not self._stopped), args, kwargs)
        except BaseException:
            if self._open is not None:
                self._end(self._open[0], why="the step raised inside the window")
            raise
        if edge.pre_block:
            t0 = time.perf_counter()
            self._block(out)
            self._t_pre = now = time.perf_counter()
            self._costs["pre_block_s"] = now - t0
            if self._mark is not None and k + 1 > self._mark[0]:  # steps since the last window
                self._costs["step_s"] = (now - self._mark[1]) / (k + 1 - self._mark[0])
            if self._after_s is not None:  # what the step lost while the window before was analyzed
                self._costs["after_prev_s"] = self._after_s
                self._after_s = None
        elif edge.end and self._open is not None:
            t0 = time.perf_counter()
            self._block(out)
            self._costs["end_block_s"] = time.perf_counter() - t0
            step_s = self._costs.get("step_s")
            submitted = self._end(edge.window)
            self._mark = (k + 1, time.perf_counter())
            if submitted and step_s:
                self._after = (edge.window, k + 1, self._mark[1], step_s)
        return out

    def _after_check(self, k: int) -> None:
        """After call `k` (outside windows) while a window's analysis is timed: done when
        watch's thread has finished the window, or after `AFTER_MAX_S`."""
        window, _k0, t0, _step = self._after  # type: ignore[misc]
        w = self._worker
        now = time.perf_counter()
        if w is None or w.done_window >= window or now - t0 >= AFTER_MAX_S:
            self._after_done(k + 1, now)

    def _after_done(self, k: int, now: float) -> None:
        """Ends the timing of the calls after a window (calls `[k0, k)`, up to `now`): what
        they took beyond the step time before the window, at least 0."""
        _w, k0, t0, step_s = self._after  # type: ignore[misc]
        self._after = None
        self._after_s = round(max(0.0, (now - t0) - (k - k0) * step_s), 6)

    def _adopt(self, announced: tuple[int, int] | None, k: int) -> None:
        """The next window the deciding process announced (`every="auto"`), at call `k`:
        taken if its blocking call is still ahead; otherwise skipped here, and said so."""
        if announced is None or not isinstance(self.schedule, AutoSchedule):
            return
        window, first = announced
        if self.schedule.adopt(window, first, k=k):
            return
        last = first + self.schedule.window - 1
        why = (
            f"process {self._process}: window {window} (steps {first}-{last}) was announced "
            f"after its start had passed here (call {k}); skipped here"
        )
        say(f"jaxpace watch: {why}")
        if self._worker is not None:
            self._worker.submit((window, first, last, None, why, {}, None))

    def _first_call(self, args: tuple, kwargs: dict) -> Any:
        """Call 0 (never in a window), in the plain form; notes whether `fn` has jaxpace
        collectives (traced in the plain form now). A traced count, the same on every
        process running the same program."""
        from jaxpace.collectives import measure

        before = measure.passed_through_count()
        out = self._run(True, args, kwargs)
        self._dropins = measure.passed_through_count() > before
        self._mark = (1, time.perf_counter())
        w = self._worker
        if self._dropins and w is not None and w._stalls is not None:
            # The first window's first call compiles the measured form: not a stall.
            w._stalls.compile_calls = frozenset({self.schedule.every})
        return out

    # ----------------------------------------------------------------- windows

    def _start(self, window: int) -> None:
        first, last = self.schedule.bounds(window)
        d = os.path.join(self._tmp or tempfile.gettempdir(), f"p{self._process}-w{window}")
        worker = self._worker
        self._costs["busy_at_start"] = float(worker is not None and worker.busy)
        t0 = time.perf_counter()
        try:
            self._session = self._new_session()
            if self._session is not None:  # collect now, write the files on watch's thread
                self._session[0].start()
            else:
                self._profiler.start_trace(d, **self._trace_kwargs)
            self._costs["start_trace_s"] = time.perf_counter() - t0
            self._open = (window, d, None)
        except Exception as e:  # noqa: BLE001 - the program's own session, or a profiler fault
            self._session = None
            busy = "already" in str(e).lower()
            why = (
                f"process {self._process}: the program's own jax.profiler session is active; "
                f"watch skips steps {first}-{last} here"
                if busy
                else f"process {self._process}: jax.profiler.start_trace failed ({e}); "
                f"watch skips steps {first}-{last} here"
            )
            say(f"jaxpace watch: {why}")
            self._open = (window, None, why)

    def _end(self, window: int, why: str | None = None) -> bool:
        _w, d, skipped = self._open or (window, None, "no window open")
        self._open = None
        why = skipped or why
        export = None
        if d is not None:
            t0 = time.perf_counter()
            try:
                export = self._stop_profiler(d)
                self._costs["stop_trace_s"] = time.perf_counter() - t0
            except Exception as e:  # noqa: BLE001 - the window is then partial
                why = f"process {self._process}: jax.profiler.stop_trace failed ({e})"
                d = export = None
        if why is not None and d is not None:  # the step raised: the trace is not the window's
            d = export = None
        first, last = self.schedule.bounds(window)
        if "pre_block_s" in self._costs:  # from the blocking call before it to its end here
            self._costs["window_s"] = time.perf_counter() - self._t_pre
        costs = {k: round(v, 6) for k, v in self._costs.items()}
        self._costs = {}
        job = (window, first, last, d, why, costs, export)
        if self._worker is not None and not self._worker.submit(job):
            say(f"jaxpace watch: steps {first}-{last}: analysis behind; window dropped here")
            return False
        return self._worker is not None

    def _new_session(self) -> tuple[Any, Any] | None:
        """With `jax.profiler` on a JAX with its public `ProfileSession`: one that collects
        without writing, and its exporter (`_jax_compat.profile_session`); else None."""
        import jax

        if self._profiler is not jax.profiler:
            return None
        from jaxpace._jax_compat import profile_session

        return profile_session(self._trace_kwargs.get("profiler_options"))

    def _stop_profiler(self, d: str) -> tuple[Any, Any, str] | None:
        """Stops the window's profiler session on this (the step's) thread. With
        `jax.profiler`: only the collection; `(exporter, data, d)` for the background
        thread to write the trace files into `d` (`exporter.export(data, d)`), the
        conversion off the step: a public `ProfileSession` (newer JAX), else the session
        state's internals (`_jax_compat.profiler_stop_collect`). Otherwise (another
        profiler, or a JAX whose profiler state moved) `stop_trace()`."""
        import jax

        if self._session is not None:  # a public ProfileSession (newer JAX)
            (session, exporter), self._session = self._session, None
            return exporter, session.stop(), d
        if self._profiler is jax.profiler:
            from jaxpace._jax_compat import profiler_stop_collect

            got = profiler_stop_collect()
            if got is not None:
                return got
        self._profiler.stop_trace()
        return None

    # ----------------------------------------------------------------- set-up and end

    def _setup(self) -> None:
        """At the first call (after the program initialized JAX): who we are, where to publish."""
        try:
            import jax

            from jaxpace._jax_compat import distributed_client
            from jaxpace.watch import exchange

            if self._profiler is None:
                self._profiler = jax.profiler
                self._trace_kwargs = {"profiler_options": lean_profile_options()}
            self._block = self._block or jax.block_until_ready
            self._process, count = int(jax.process_index()), int(jax.process_count())
            client = distributed_client() if count > 1 else None
            if client is not None:
                ex: Any = exchange.KVExchange(client)
            elif self.out is not None:
                ex = exchange.DirExchange(self.out / "exchange")
            else:
                ex = exchange.LocalExchange()
                if count > 1:
                    say(
                        "jaxpace watch: jax.distributed is not initialized and no `out=` "
                        f"folder is shared: process {self._process} decides on its own window."
                    )
            self._tmp = tempfile.mkdtemp(prefix="jaxpace-watch-")
            self._worker = Worker(
                self, ex, process=self._process, count=count, host=socket.gethostname()
            )
            self._worker.start()
            register_exit(self)
        except Exception as e:  # noqa: BLE001 - watch never breaks the program
            self._setup_error = repr(e)
            self._stopped = True
            say(f"jaxpace watch: cannot start ({e!r}); the program runs unwatched.")

    _process = 0

    def history(self) -> tuple[WindowResult, ...]:
        """The windows analyzed so far, oldest first (at most `worker.MAX_HISTORY`).

        On the deciding process (process 0) as they are decided; on the others
        as they read the published result (every couple of seconds).
        """
        w = self._worker
        if w is None:
            return ()
        with w.lock:
            return tuple(w.history)

    def stalls(self) -> tuple[dict, ...]:
        """The stalls named so far (deciding process), each a dict as the stall log line says."""
        w = self._worker
        if w is None:
            return ()
        with w.lock:
            return tuple(w.stalls)

    def close(self) -> None:
        """Ends watching: a window still open is closed, the last windows are analyzed
        (bounded), the thread ends. Idempotent; also runs at interpreter exit."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stopped = True
        if self._open is not None:
            self._end(self._open[0], why="closed inside the window")
        if self._worker is not None:
            self._worker.stop(_CLOSE_S)
            self._worker.ex.close()
        if self._tmp is not None:
            import shutil

            shutil.rmtree(self._tmp, ignore_errors=True)

    def stop_at_exit(self) -> None:
        """`close()`, for `jaxpace.runtime.signals` at interpreter exit; never raises."""
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never fail an exit
            pass

    def __repr__(self) -> str:
        s = self.schedule
        every = "'auto'" if s.auto else s.every
        return f"jaxpace.watch({getattr(self._fn, '__name__', self._fn)!r}, every={every}, window={s.window})"

    def __getattr__(self, name: str) -> Any:
        """`fn`'s other attributes (`lower`, `trace`, `eval_shape` of a `jax.jit` function)."""
        fn = self.__dict__.get("_fn")
        if fn is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(fn, name)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        """Watched methods bind like functions."""
        return self if obj is None else functools.partial(self, obj)


def lean_profile_options() -> Any:
    """`jax.profiler.ProfileOptions` without the Python tracer and with host events at level 1:
    the collectives' events stay (CPU thunks; device activity on GPU) and a 5-step CPU window's
    trace was 19 KB instead of 213 KB (read in 14 ms instead of 84 ms). Without the HLO
    protos (the reader never reads them), which the session otherwise copies at its stop.
    None if this JAX has no such options (the defaults are used then)."""
    try:
        import jax

        o = jax.profiler.ProfileOptions()
        o.python_tracer_level = 0
        o.host_tracer_level = 1
        o.enable_hlo_proto = False  # the reader uses the events' own args (stop: 17 -> 12 ms)
        return o
    except Exception:  # noqa: BLE001 - an older or newer JAX: its defaults
        return None


# ----------------------------------------------------------------- at exit


def register_exit(w: Watched) -> None:
    """Closes `w` at interpreter exit, through `jaxpace.runtime.signals` (the one owner of
    the exit hooks; it calls `w.stop_at_exit()`, weakly held). Registered at the first
    call, after `jax.distributed.initialize`, so it runs before JAX's own shutdown."""
    from jaxpace.runtime import signals

    signals.stop_at_exit(w)
