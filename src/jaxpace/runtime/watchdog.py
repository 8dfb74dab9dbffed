"""Stall watchdog: when this process sits in a measured collective too long, name who is missing.

One daemon thread per `Pacer` (started at its first trace, stopped by `close`).
It never runs inside a JAX callback and never blocks one: the probes only
store two integers per step, which this thread reads on its own clock. The
io_callback probes set `RankState.wd_in` after the pacing sleep and
`RankState.wd_out` when the collective is done; the native probes keep the same
marks in atomics inside their library (with the arrival's steady-clock time),
read here lock-free with `jaxpace.native.probes.site_progress`. A pacing sleep never
counts: the arrival is marked after it, on both paths.

Every key-value store call runs on a helper thread with a bounded wait, so a
hung or dead coordinator gives "the coordinator does not answer", never a hang.

Keys (under `jaxpace/watchdog/{run_id}/`):
  `last/p{i}`   this process's last arrival, published at most once per second
                and only when it changed (refreshed with its age while a stall
                is reported).
  `stall/p{i}`  process i declared a stall at (site, step): every process that
                reads it turns pacing off and answers with a fresh `last/p{j}`
                and its own stall record (stack dumps of all its threads).
  `done/p{i}`   process i has printed its message and written its record.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import socket
import sys
import threading
import time
import weakref
from typing import Any

import numpy as np

from jaxpace import _jax_compat
from jaxpace._text import ranges
from jaxpace.errors import StallError
from jaxpace.native import probes as nat
from jaxpace.records import stall as stall_record
from jaxpace.records.stall import stall_filename
from jaxpace.runtime import pauses, signals
from jaxpace.runtime.bounded_kv import KV_TIMEOUT_S, BoundedKV
from jaxpace.runtime.config import ON_STALL, WatchdogConfig
from jaxpace.runtime.stall_peers import PeerAges, classify, secs

__all__ = [
    "ON_STALL",
    "STALL_EXIT_CODE",
    "Watchdog",
    "WatchdogConfig",
    "exit_stalled",
    "stall_filename",
]

log = logging.getLogger("jaxpace")

STALL_EXIT_CODE = 75  # EX_TEMPFAIL: "try again"; `jaxpace launch` names it a stall
PUBLISH_EVERY_S = 1.0  # at most one `last/p{i}` write per second per process
ANSWER_WAIT_S = 1.5  # how long a declarer waits for peers to refresh their entries
EXIT_GRACE_S = 5.0
# The first steps of a site include the other processes' compile and connection set-up.
WARMUP_STEPS = 2
WARMUP_STALL_S = 60.0  # on_stall="exit": wait at most this for peers at the same collective


class Watchdog:
    """The stall watchdog of one `Pacer` (see the module docstring)."""

    def __init__(self, pacer: Any, config: WatchdogConfig) -> None:
        self._pacer = weakref.ref(pacer)
        self.config = config
        self._thread: threading.Thread | None = None
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self.stalls: list[dict] = []  # stall records this process wrote (declared or answered)
        self._open: dict[tuple[str, int], tuple[int, float]] = {}  # (site, rank) -> (step, seen)
        self._marks: dict[tuple[str, int], tuple[int, int]] = {}  # (site, rank) -> (in, out)
        self._last: dict[str, Any] | None = None  # latest change: site, step, state, at
        self._declared: set[tuple[str, int]] = set()
        self._answered: set[int] = set()
        self._published: tuple | None = None
        self._published_at = -1e18
        self._progress_bufs: dict[int, Any] = {}  # native site id -> reused progress buffer
        self._ages = PeerAges()  # when this process left each recent step, for peers' ages
        self._exit_published = False
        self.ticks = 0
        self._kv: BoundedKV | None = None
        self.me, self.nproc, self.host = 0, 1, socket.gethostname()
        self.prefix = ""
        self._pauses = pauses.Tracker()  # peers' announced pauses and host phases
        self._quiet_until = -1e18  # no new declaration before (a peer's pause excused the last)

    @property
    def tick_s(self) -> float:
        s = self.config.stall_after_s or 1.0
        return min(PUBLISH_EVERY_S, max(0.01, s / 10))

    # ------------------------------------------------------------------ lifecycle

    def start(self, run_id: str | None) -> bool:
        """Starts the thread (once; no-op when off). Called at the pacer's first trace."""
        if self.config.stall_after_s is None:
            return False
        with self._lock:
            if self._thread is not None:
                return True
            try:
                import jax

                self.me, self.nproc = jax.process_index(), jax.process_count()
            except Exception:  # noqa: BLE001
                self.me, self.nproc = 0, 1
            client = _jax_compat.distributed_client() if self.nproc > 1 else None
            self._kv = BoundedKV(client) if client is not None else None
            self.prefix = f"jaxpace/watchdog/{run_id or 'run'}"
            self._thread = threading.Thread(target=self._loop, name="jaxpace-watchdog", daemon=True)
            self._thread.start()
            # At interpreter exit its key-value calls must be over before Python
            # finalizes: a daemon thread that returns from a jaxlib (C++) call during
            # finalization is ended by a forced unwind through C++ frames, which aborts
            # the whole process ("terminate called ... FATAL: exception not rethrown",
            # exit -6). `signals` runs `stop_at_exit` before JAX's shutdown.
            signals.stop_at_exit(self)
            return True

    def stop(self, timeout_s: float = 1.0, join_kv_s: float = 0.0) -> None:
        """Stops the thread, waiting at most `timeout_s` (it is a daemon either way).

        `join_kv_s`: also wait that long for a key-value store call in flight (at exit).
        """
        self._halt.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout_s)
        try:
            self.publish_exit(wait_s=max(0.1, min(timeout_s, 1.0)))
        except Exception:  # noqa: BLE001 - never fail a close
            pass
        if self._kv is not None:
            self._kv.close(join_s=join_kv_s)

    def stop_at_exit(self) -> None:
        """`stop`, waiting for a key-value call in flight too (`signals` calls it at exit)."""
        self.stop(timeout_s=1.0, join_kv_s=KV_TIMEOUT_S)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        while not self._halt.wait(self.tick_s):
            try:
                if not self.tick(time.monotonic()):
                    return
            except Exception as e:  # noqa: BLE001 - the watchdog must never die loudly
                log.warning("jaxpace: stall watchdog error %r (it keeps running)", e)

    # ------------------------------------------------------------------ one tick

    def tick(self, now: float) -> bool:
        """One scan (the thread calls it every `tick_s`; tests call it directly).

        Returns False once the pacer is gone.
        """
        p = self._pacer()
        if p is None:
            return False
        counts = self._scan(p, now)
        del p
        self.ticks += 1
        if self._kv is not None:
            self._exchange(now, counts)
        for (site, _rank), (step, seen) in list(self._open.items()):
            stalled = now - seen
            limit = self.config.stall_after_s
            if step < WARMUP_STEPS:
                limit = max(limit, WARMUP_STALL_S)
            quiet = now < self._quiet_until
            if stalled >= limit and (site, step) not in self._declared and not quiet:
                self._declared.add((site, step))
                self.declare(site, step, stalled, counts)
        return True

    def _marks_of(self, site: Any) -> list[tuple[int, int, float | None, int, int]]:
        """`(rank, arrived step, its age in s or None, done step, arrivals)` of a site's ranks.

        Native sites: read from the library (lock-free, one call, bounded by the site's ranks),
        the age measured on the handlers' own clock. io_callback sites: the Python marks.
        """
        native = getattr(site, "native", None)
        if native is not None and (getattr(site, "probe", "") or "").startswith("native"):
            sid = native[0]
            try:
                buf = self._progress_bufs.get(sid)
                if buf is None:
                    buf = self._progress_bufs[sid] = np.zeros((site.num_slots, 4), np.int64)
                rows = nat.site_progress(sid, site.num_slots, out=buf)
                t = nat.now_ns()
            except (RuntimeError, ValueError):
                rows = None
            if rows is not None:
                active = np.flatnonzero((rows[:, 0] >= 0) | (rows[:, 2] >= 0) | (rows[:, 3] > 0))
                return [
                    (
                        int(r),
                        int(rows[r, 0]),
                        max(0.0, (t - int(rows[r, 1])) / 1e9) if rows[r, 0] >= 0 else None,
                        int(rows[r, 2]),
                        int(rows[r, 3]),
                    )
                    for r in active
                ]
        return [
            (rank, st.wd_in, None, st.wd_out, st.next_step) for rank, st in list(site.ranks.items())
        ]

    def _scan(self, p: Any, now: float) -> dict[str, int]:
        counts: dict[str, int] = {}
        for name, site in list(p.sites.items()):
            for rank, a, age, d, arrivals in self._marks_of(site):
                counts[name] = max(counts.get(name, 0), arrivals)
                key = (name, rank)
                if self._marks.get(key) != (a, d):
                    self._marks[key] = (a, d)
                    state = "in" if a > d else "left"
                    step = a if a > d else d
                    last = self._last
                    if step >= 0 and (
                        last is None
                        or state == "in"
                        or last["state"] != "in"
                        or key == (last["site"], last["rank"])
                    ):
                        self._last = {
                            "site": name,
                            "rank": rank,
                            "step": step,
                            "state": state,
                            "at": now,
                        }
                if d >= 0:
                    self._ages.note_left(name, d, now)
                if a > d:
                    prev = self._open.get(key)
                    if prev is None or prev[0] != a:
                        # Native: the arrival's own time; io_callback: when first seen here.
                        self._open[key] = (a, now - age if age is not None else now)
                else:
                    self._open.pop(key, None)
        return counts

    def publish_exit(self, wait_s: float) -> None:
        """Publishes this process's final position as closed (once; at close and exit)."""
        if self._exit_published or self._kv is None:
            return
        self._exit_published = True
        now = time.monotonic()
        p = self._pacer()
        counts = self._scan(p, now) if p is not None else {}
        del p
        entry = {**self._entry(now, counts), "closed": True}
        self._kv.call(
            lambda c: c.key_value_set(f"{self.prefix}/last/p{self.me}", json.dumps(entry), True),
            wait_s=wait_s,
        )

    def _entry(self, now: float, counts: dict, answered: bool = False) -> dict:
        last = self._last or {}
        return {
            "p": self.me,
            "host": self.host,
            "pid": os.getpid(),
            "site": last.get("site"),
            "step": last.get("step"),
            "state": last.get("state", "none"),
            "age_s": round(now - last["at"], 3) if last else None,
            "counts": counts,
            "answered": answered,
            "pause": pauses.current(),
        }

    # ------------------------------------------------------------------ key-value store

    def _exchange(self, now: float, counts: dict) -> None:
        """Publishes this process's last arrival (bounded rate) and reads peers' stall notices."""
        if now - self._published_at < PUBLISH_EVERY_S:
            return
        self._published_at = now
        kv = self._kv
        assert kv is not None
        notices = self._read_dir("stall/")
        peer_stall = [n for n in (notices or []) if n.get("p") != self.me]
        key = (
            (self._last or {}).get("site"),
            (self._last or {}).get("step"),
            (self._last or {}).get("state"),
            (pauses.current() or {}).get("id"),
        )
        if key != self._published or peer_stall:
            entry = self._entry(now, counts, answered=bool(peer_stall))
            ok, _ = kv.call(
                lambda c: c.key_value_set(f"{self.prefix}/last/p{self.me}", json.dumps(entry), True)
            )
            if ok:
                self._published = key
        for n in peer_stall:
            if n.get("confirmed") and n["p"] not in self._answered:
                self._answered.add(n["p"])
                self._answer(n, now, counts)

    def _still_in(self, site: str, step: int) -> bool:
        p = self._pacer()
        s = p.sites.get(site) if p is not None else None
        if s is None:
            return False
        return any(a == step and a > d for _r, a, _age, d, _n in self._marks_of(s))

    def _read_dir(self, sub: str) -> list[dict] | None:
        ok, got = self._kv.call(lambda c: c.key_value_dir_get(f"{self.prefix}/{sub}"))
        if not ok:
            return None
        out = []
        for _k, v in got:
            try:
                out.append(json.loads(v))
            except (TypeError, ValueError):
                pass
        return out

    def _answer(self, notice: dict, now: float, counts: dict) -> None:
        """A peer declared a stall: pacing off here too, and a stall record with our stacks."""
        self._pacing_off()
        # A process itself inside a collective reports on its own if it stalls there.
        if len(self._answered) == 1 and not self._open and not self._declared:
            self._say(
                f"jaxpace: process {notice['p']} (host {notice.get('host')}) reports a stall at "
                f"{notice.get('site')} step {notice.get('step')}; pacing is off. This process "
                f"was last at {self._where()}."
            )
            self._write_record(
                {
                    "role": "answered",
                    "notice": notice,
                    "entry": self._entry(now, counts, answered=True),
                    "message": None,
                }
            )

    def _where(self) -> str:
        last = self._last
        if not last:
            return "no measured collective yet"
        verb = "inside" if last["state"] == "in" else "after"
        return f"{verb} {last['site']} step {last['step']}"

    # ------------------------------------------------------------------ a stall

    def declare(self, site: str, step: int, stalled_s: float, counts: dict) -> dict | None:
        """This process has sat in (site, step) for `stalled_s`: report, record, act.

        With peers, a tentative notice first asks them to refresh their entries;
        if this process left (site, step) meanwhile, the notice is withdrawn and
        nothing is reported (returns None).
        """
        t0 = time.monotonic()
        coordinator = "ok"
        peers: dict[int, dict | None] = {}
        if self._kv is not None:
            key = f"{self.prefix}/stall/p{self.me}"
            notice = {"p": self.me, "host": self.host, "site": site, "step": step}
            ok, err = self._kv.call(
                lambda c: c.key_value_set(key, json.dumps({**notice, "confirmed": False}), True)
            )
            if ok:
                self._halt.wait(ANSWER_WAIT_S)  # peers' watchdogs refresh their entries
                if not self._still_in(site, step):
                    self._kv.call(lambda c: c.key_value_delete(key))
                    log.info("jaxpace: %s step %d finished after %.1f s", site, step, stalled_s)
                    return None
                got = self._read_dir("last/")
                if got is None:
                    coordinator = "does not answer"
                else:
                    peers = {p: None for p in range(self.nproc)}
                    for e in got:
                        peers[int(e["p"])] = e
                    self._ages.refresh(peers, time.monotonic(), self.host)
                    if self._excused(key, site, step, counts, peers):
                        return None
                    self._kv.call(
                        lambda c: c.key_value_set(
                            key, json.dumps({**notice, "confirmed": True}), True
                        )
                    )
            else:
                coordinator = f"does not answer ({err})"
        self._pacing_off()
        stalled_s += time.monotonic() - t0
        message = self._message(site, step, stalled_s, counts, peers, coordinator)
        here, missing, diverged = (
            classify(self.me, site, step, counts, peers) if peers else ([], [], [])
        )
        self._say(message)
        rec = self._write_record(
            {
                "role": "stalled",
                "site": site,
                "step": step,
                "stalled_s": round(stalled_s, 3),
                "declared_monotonic": time.monotonic(),
                "message": message,
                "coordinator": coordinator,
                "here": [p for p, _ in here],
                "missing": [{"process": p, "why": w} for p, w in missing],
                "diverged": [{"process": p, "why": w} for p, w in diverged],
                "peers": {str(k): v for k, v in peers.items()},
            }
        )
        self._act(message, [p for p, _ in here])
        return rec

    def _excused(self, key: str, site: str, step: int, counts: dict, peers: dict) -> bool:
        """Every process this stall waits for is in a pause within its bound: withdraw, retry."""
        now = time.monotonic()
        got = self._pauses.all_excused(classify(self.me, site, step, counts, peers), peers, now)
        if not got:
            return False
        self._kv.call(lambda c: c.key_value_delete(key))
        self._declared.discard((site, step))
        self._quiet_until = now + PUBLISH_EVERY_S
        log.info("jaxpace: at %s step %d waiting for processes in a pause: %s", site, step, got)
        return True

    def _message(self, site, step, stalled_s, counts, peers, coordinator) -> str:
        head = f"jaxpace: stalled {secs(stalled_s)} s at {site} step {step}"
        if self.nproc == 1:
            return head + " (single process: a device or host callback is stuck)."
        if coordinator != "ok":
            return (
                f"{head}; the jax.distributed coordinator (the key-value service on process 0) "
                f"{coordinator}, so who is missing cannot be told: the coordinator process is "
                "hung or gone. JAX ends this process when its heartbeat times out."
            )
        here, missing, diverged = classify(self.me, site, step, counts, peers)

        def host(p):
            return (peers.get(p) or {}).get("host") or "?"

        parts = [head]
        if diverged:
            parts.append(
                "the program diverged (processes ran different collectives): "
                + "; ".join(f"process {p} (host {host(p)}) {w}" for p, w in diverged)
            )
        if missing:
            parts.append(
                "waiting for " + "; ".join(f"process {p} (host {host(p)}), {w}" for p, w in missing)
            )
            over = self._pauses.overrun([p for p, _ in missing], peers, time.monotonic())
            parts += [over] if over else []
        parts.append(
            f"processes {ranges(sorted([self.me] + [p for p, _ in here]), sep=',')} are here."
        )
        return "; ".join(parts)

    def _pacing_off(self) -> None:
        p = self._pacer()
        if p is not None:
            p.release()  # pending and future pacing sleeps become zero

    def _say(self, message: str) -> None:
        try:
            print(message, file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001
            pass

    def _write_record(self, fields: dict) -> dict:
        p = self._pacer()
        rec = {
            "type": "stall",
            "format": 1,
            "process_index": self.me,
            "process_count": self.nproc,
            "host": self.host,
            "pid": os.getpid(),
            "run_id": getattr(p, "run_id", None),
            "on_stall": self.config.on_stall,
            "stall_after_s": self.config.stall_after_s,
            **fields,
            "stacks": stall_record.stacks(),
        }
        del p
        self.stalls.append(rec)
        d = self.config.directory()
        try:
            rec["path"] = stall_record.write(d, self.me, rec)
        except OSError as e:
            self._say(f"jaxpace: could not write the stall record in {d!r}: {e}")
        if rec.get("role") == "stalled" and self._kv is not None:
            self._kv.call(lambda c: c.key_value_set(f"{self.prefix}/done/p{self.me}", "1", True))
        return rec

    def _act(self, message: str, here: list[int]) -> None:
        how = self.config.on_stall
        if how == "raise":
            _raise_in_main_thread(message)
        elif how == "exit":
            self._wait_for_peers(here)
            exit_stalled()

    def _wait_for_peers(self, here: list[int]) -> None:
        """Bounded: lets processes stalled at the same collective finish their report first."""
        if self._kv is None or not here:
            return
        deadline = time.monotonic() + EXIT_GRACE_S
        while time.monotonic() < deadline:
            ok, got = self._kv.call(lambda c: c.key_value_dir_get(f"{self.prefix}/done/"))
            if not ok:
                return
            done = {k.rsplit("/", 1)[-1] for k, _ in got}
            if all(f"p{p}" in done for p in here):
                return
            time.sleep(0.1)


def exit_stalled() -> None:
    """Ends this process at once with `STALL_EXIT_CODE` (`on_stall="exit"`, the watchdog's
    and watch's alike), its stdout and stderr flushed first so the stall's lines are kept."""
    try:
        sys.stderr.flush()
        sys.stdout.flush()
    except Exception:  # noqa: BLE001
        pass
    os._exit(STALL_EXIT_CODE)


def _raise_in_main_thread(message: str) -> bool:
    """Raises `StallError(message)` in the main thread when it next runs Python.

    A callback must not raise (it would hang the peers), so the watchdog thread
    delivers the error to the main thread instead (CPython's
    `PyThreadState_SetAsyncExc`). A main thread blocked inside a hung
    collective only sees it if that collective returns: use `on_stall="exit"`
    to end a process that is truly stuck.
    """

    class _Stall(StallError):
        def __init__(self, *args: Any) -> None:
            super().__init__(*(args or (message,)))

    _Stall.__name__ = _Stall.__qualname__ = "StallError"
    _Stall.__module__ = "jaxpace.errors"
    tid = threading.main_thread().ident
    if tid is None:
        return False
    n = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), ctypes.py_object(_Stall))
    return n == 1
