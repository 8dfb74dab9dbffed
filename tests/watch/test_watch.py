"""`jaxpace.watch` in one process: the window schedule, the profiler's one session, bad input,
the stall rule and the decision's log line (a fake profiler; no trace is read)."""

import dataclasses
import inspect
import math
import time

import jax
import jax.numpy as jnp
import pytest

import jaxpace
from jaxpace.errors import ConfigError
from jaxpace.watch import WindowResult
from jaxpace.watch.decide import FLEET_LEVEL, LEVEL, log_line, verdict
from jaxpace.watch.heartbeat import WARMUP_CALLS, StallDetector
from jaxpace.watch.schedule import MAX_CALLS, Schedule
from jaxpace.watch.wrapper import Watched


class FakeProfiler:
    def __init__(self, events, busy=False):
        self.events, self.busy = events, busy

    def start_trace(self, logdir):
        if self.busy:
            raise RuntimeError("Profile has already been started. Only one profile may be run.")
        self.events.append(("start", logdir))

    def stop_trace(self):
        self.events.append(("stop",))


def _watched(events, **kw):
    def step(k):
        events.append(("call", k))
        return k

    busy = kw.pop("busy", False)
    return Watched(
        step, profiler=FakeProfiler(events, busy), block=lambda o: events.append(("block", o)), **kw
    )


def test_profiler_starts_and_stops_on_window_calls_and_blocks_only_at_edges():
    events = []
    w = _watched(events, every=5, window=2)
    assert [w(k) for k in range(13)] == list(range(13))
    w.close()
    seq = [e[0] if e[0] in ("start", "stop") else e for e in events]
    # Call 4 blocks before window 1 (calls 5-6); the trace starts before call 5; call 6
    # blocks, then the trace stops; the same for window 2 (calls 10-11); nothing else.
    assert seq == [
        *[("call", k) for k in range(4)],
        ("call", 4), ("block", 4), "start", ("call", 5), ("call", 6), ("block", 6), "stop",
        ("call", 7), ("call", 8),
        ("call", 9), ("block", 9), "start", ("call", 10), ("call", 11), ("block", 11), "stop",
        ("call", 12),
    ]  # fmt: skip
    assert ("call", 0) in events and ("block", 0) not in events  # the first call is untouched


def test_window_equal_to_every_blocks_once_between_windows():
    s = Schedule(every=3, window=3)
    edges = [s.edge(k) for k in range(9)]
    assert [k for k, e in enumerate(edges) if e.pre_block] == [2]
    assert [k for k, e in enumerate(edges) if e.start] == [3, 6]
    assert [k for k, e in enumerate(edges) if e.end] == [5, 8]


def test_programs_own_profiler_session_skips_the_window_and_marks_it_partial():
    events = []
    w = _watched(events, every=3, window=2, busy=True)
    assert [w(k) for k in range(6)] == list(range(6))
    w.close()
    assert not [e for e in events if e[0] in ("start", "stop")]
    (r,) = w.history()
    assert (r.first_step, r.last_step, r.partial, r.culprit_process) == (3, 4, True, None)
    assert any("own jax.profiler session" in n for n in r.notes), r.notes
    # The window's last call still blocks (every process runs the same edges).
    assert ("block", 4) in events


def test_signature_and_results_of_a_jit_function_are_kept():
    @jax.jit
    def step(w, x, *, lr=0.1):
        return w - lr * x

    w = jaxpace.watch(step, every=2, window=1)
    assert inspect.signature(w) == inspect.signature(step)
    assert w.__wrapped__ is step and w.__name__ == "step"
    a, b = jnp.arange(4.0), jnp.ones(4)
    for _ in range(5):
        assert (w(a, b, lr=0.5) == step(a, b, lr=0.5)).all()
    w.close()
    w.close()  # idempotent


def test_package_import_keeps_jaxpace_watch_callable():
    import jaxpace.watch as pkg

    w = pkg(lambda x: x, every=4, window=2)
    assert jaxpace.watch(lambda x: x, every=4, window=2)(3) == 3
    assert w(1) == 1
    w.close()


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"every": 1}, "every"),
        ({"every": 2.5}, "every"),
        ({"every": "often"}, "every"),
        ({"window": 100}, "window"),  # every="auto": the first window starts at call 100
        ({"window": 0}, "window"),
        ({"every": 4, "window": 5}, "window"),
        ({"stall_after_s": -1.0}, "stall_after_s"),
        ({"stall_after_s": math.nan}, "stall_after_s"),
        ({"on_stall": "abort"}, "on_stall"),
        ({"sinks": [1]}, "sinks\\[0\\]"),
        ({"out": 3}, "out"),
    ],
)
def test_bad_arguments_name_the_field(kw, field):
    with pytest.raises(ConfigError, match=f"`{field}`"):
        jaxpace.watch(lambda x: x, **kw)


def test_stall_rule_names_the_process_behind_once_and_never_in_its_first_calls():
    d = StallDetector(stall_after_s=5.0)
    behind = {0: {"calls": 40, "host": "a"}, 1: {"calls": 39, "host": "b"}}
    assert d.observe(behind, 0.0) == [] and d.observe(behind, 4.9) == []
    (s,) = d.observe(behind, 5.1)
    assert (s["process"], s["host"], s["last_step"], s["waiting_step"]) == (1, "b", 38, 39)
    assert d.observe(behind, 60.0) == []  # named once
    compiling = {0: {"calls": 5}, 1: {"calls": WARMUP_CALLS - 1}}
    assert StallDetector(1.0).observe(compiling, 0.0) == []
    d2 = StallDetector(1.0)
    assert d2.observe(compiling, 0.0) == [] and d2.observe(compiling, 100.0) == []


def test_stall_rule_excuses_an_announced_pause_within_its_bound():
    d = StallDetector(stall_after_s=1.0)
    pause = {"name": "checkpoint", "max_s": 10.0, "age_s": 0.0, "announced": True, "id": "c#1"}
    beats = {0: {"calls": 20}, 1: {"calls": 19, "pause": pause}}
    assert d.observe(beats, 0.0) == [] and d.observe(beats, 5.0) == []
    (s,) = d.observe(beats, 16.0)  # past its max_s (its end fixed when first needed, at 5 s)
    assert s["process"] == 1 and "beyond its max_s" in s["overrun"]


def test_a_window_that_names_nobody_says_what_its_mode_means():
    # A healthy window's mode alone read as a finding: "nobody named
    # (synchronization_amplification)" on every window of a healthy job.
    def line(mode):
        return log_line(
            WindowResult(window=1, first_step=10, last_step=14, mode=mode, windows_pooled=1)
        )

    assert line("synchronization_amplification") == (
        "jaxpace watch: steps 10-14: nobody named; the last process changes from step to "
        "step (synchronization_amplification)"
    )
    assert line("balanced") == "jaxpace watch: steps 10-14: nobody named; arrivals balanced"


def test_log_line_and_verdict_of_a_likely_process():
    r = WindowResult(
        window=2, first_step=20, last_step=24, likely=3, mode="balanced", windows_pooled=2,
        analyzed_steps=10, late_by_s=0.004, last_fraction=1.0,
    )  # fmt: skip
    assert log_line(r) == (
        "jaxpace watch: steps 20-24: nobody named (2 windows pooled); likely process 3: last "
        "in every step of this window, late by 4.0 ms, not yet significant"
    )
    v = verdict(r, run="w0", process_count=4)
    assert (v["version"], v["confidence"], v["culprit_process"], v["since_window"]) == (
        1,
        "likely",
        3,
        None,
    )


def _summary(p, window=1, n_exec=5, late=False, devices=2):
    """A process's window summary: `n_exec` executions of one all-reduce on its devices;
    a late process spends 1 ms inside it, the others 21 ms."""
    rows = [
        [0, e, p * devices + d, e * 30_000, 1_000 if late else 21_000]
        for e in range(n_exec)
        for d in range(devices)
    ]
    return {
        "v": 1, "process": p, "host": f"h{p}", "window": window, "first_step": 10,
        "last_step": 14, "sites": ["jit_step/all-reduce.1"], "rows": rows, "notes": [],
        "partial": False,
    }  # fmt: skip


def test_the_windows_know_their_platform_so_cpu_runs_get_no_gpu_advice():
    """The trace's platform travels in each summary: a CPU job's windows read as CPU (no
    `nvidia-smi` advice), pooled windows too; a platform the processes disagree on, or an
    unknown word, reads as unknown."""
    from jaxpace.report.analyze import analyze
    from jaxpace.report.render.terminal import summary_lines
    from jaxpace.watch.summary import combine, merge

    def window(w, platforms):
        got = {
            p: {**_summary(p, window=w, late=p == 2), "platform": platforms[p]} for p in range(4)
        }
        return combine(got, process_count=4, window=w, first=10 * w, last=10 * w + 4, run_id="t")[0]

    cpu = [window(w, ["cpu"] * 4) for w in (1, 2)]
    assert {h["platform"] for h in cpu[0].headers} == {"cpu"}
    pooled = merge(cpu, run_id="t")
    assert {h["platform"] for h in pooled.headers} == {"cpu"}
    text = "\n".join(summary_lines(analyze(pooled, warmup_steps=0), verbose=True))
    assert "nvidia-smi" not in text, text
    mixed = window(3, ["cpu", "gpu", "cpu", "cpu"])
    assert {h["platform"] for h in mixed.headers} == {"unknown"}
    odd = window(4, ["cpu", "cpu", "cpu", "<script>"])
    assert {h["platform"] for h in odd.headers} == {"unknown"}


def test_summaries_combine_into_one_window_of_every_process():
    from jaxpace.watch.summary import combine

    got = {p: _summary(p, late=p == 2) for p in range(4)}
    recs, notes = combine(got, process_count=4, window=1, first=10, last=14, run_id="t")
    assert notes == [] and not recs.partial
    c = recs.columns
    assert sorted(set(c["step"].tolist())) == [10, 11, 12, 13, 14]
    assert sorted(set(c["rank"].tolist())) == list(range(8))
    assert recs.process_of_rank()[4] == 2 and recs.hosts()[5] == "h2"
    late = c["process"] == 2
    assert (c["wait_ns"][late] == 1_000_000).all() and (c["wait_ns"][~late] == 21_000_000).all()


def test_a_missing_process_or_unmatched_executions_make_the_window_partial():
    from jaxpace.watch.summary import combine

    got = {p: _summary(p) for p in range(3)}  # process 3 sent nothing
    got[1] = _summary(1, n_exec=4)  # one execution fewer: cannot be matched
    recs, notes = combine(got, process_count=4, window=1, first=10, last=14, run_id="t")
    assert recs is None
    assert any("process 3: no summary" in n for n in notes), notes
    assert any("left out" in n and "different numbers" in n for n in notes), notes
    got[1] = _summary(1, window=2)  # another window's summary is not this window's
    recs, notes = combine(got, process_count=4, window=1, first=10, last=14, run_id="t")
    assert recs.partial and sorted(set(recs.columns["process"].tolist())) == [0, 2]


def test_malformed_summaries_are_left_out_not_raised():
    from jaxpace.watch.summary import combine

    bad = [{"rows": "x"}, {"rows": [[0, 0, 0, 0, -5]]}, {"rows": [[9, 0, 0, 0, 1]]}]
    for b in bad:
        got = {0: _summary(0), 1: {**_summary(1), **b}}
        recs, notes = combine(got, process_count=2, window=1, first=10, last=14, run_id="t")
        assert recs.partial and any("process 1: malformed" in n for n in notes), (b, notes)


def test_the_decision_names_the_late_process_and_the_sinks_get_every_step_and_rank():
    from jaxpace.watch.decide import decide
    from jaxpace.watch.summary import combine

    rng = __import__("numpy").random.default_rng(0)
    windows = []
    for w in (1, 2):
        got = {p: _summary(p, window=w, late=p == 2) for p in range(4)}
        for s in got.values():  # per-step jitter, so the decision has noise to test against
            for r in s["rows"]:
                r[4] += int(rng.integers(0, 500))
        recs, notes = combine(got, process_count=4, window=w, first=10 * w, last=10 * w + 4,
                              run_id="t")  # fmt: skip
        windows.append((w, 10 * w, 10 * w + 4, recs, tuple(notes)))
    # The first window's decision names process 2: a candidate, likely, not yet named
    # (`CONFIRM_WINDOWS`); the second window's names it too: named, 2 in a row.
    first = decide(windows[:1], [])
    assert first.candidate == 2 and first.likely == 2 and first.culprit_process is None
    assert first.in_a_row == 1 and "nobody named yet" in log_line(first), log_line(first)
    assert verdict(first, run="w0", process_count=4)["confidence"] == "likely"
    r = decide(windows, [first])
    assert r.culprit_process == 2 and r.culprit_ranks == (4, 5) and r.culprit_host == "h2"
    assert r.windows_pooled >= 1 and r.analyzed_steps >= 5 and 0.015 < r.late_by_s < 0.025
    assert (r.in_a_row, r.since_window) == (2, 1)
    # No decision before it, but the newest window alone and both windows pooled name 2:
    # named at once, from the pooled evidence.
    r = decide(windows, [])
    assert r.culprit_process == 2 and r.windows_pooled == 2
    assert (r.in_a_row, r.since_window) == (1, 2)
    # The window before had 2 as `likely` only: that alone no longer confirms a lone window.
    pointed = WindowResult(window=1, first_step=10, last_step=14, likely=2, windows_pooled=1)
    assert decide(windows[1:], [pointed]).culprit_process is None


def test_dir_exchange_round_trips_and_refuses_a_symlink(tmp_path):
    from jaxpace.watch.exchange import DirExchange, key

    ex = DirExchange(tmp_path / "x")
    assert ex.put(key("w0", "summary", 1, 0), '{"a": 1}')
    assert ex.put(key("w0", "summary", 12, 1), '{"a": 2}')
    got = ex.get_dir("jaxpace/watch/w0/summary/")
    assert got == [("jaxpace/watch/w0/summary/0/p1", '{"a": 1}'),
                   ("jaxpace/watch/w0/summary/1/p12", '{"a": 2}')]  # fmt: skip
    assert ex.get_dir("jaxpace/watch/w0/summary/1/") == [
        ("jaxpace/watch/w0/summary/1/p12", '{"a": 2}')
    ]
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    link = ex._path(key("w0", "beat", 3))
    link.symlink_to(target)
    assert not ex.put(key("w0", "beat", 3), "{}")
    assert target.read_text() == "keep"


def test_an_optax_train_step_under_watch_gives_the_same_state_and_real_windows(tmp_path):
    """A real `jax.profiler` window on 8 CPU devices of one process: the step's all-reduce
    (inserted by XLA for the sharded batch) is summarized and analyzed."""
    import numpy as np
    import optax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
    opt = optax.adam(1e-2)
    params = {"w": jnp.ones((16, 4)) * 0.1}
    x = jax.device_put(np.ones((64, 16), np.float32), NamedSharding(mesh, P("d")))

    @jax.jit
    def train_step(params, opt_state, x):
        loss, g = jax.value_and_grad(lambda p: jnp.mean(jnp.tanh(x @ p["w"]) ** 2))(params)
        updates, opt_state = opt.update(g, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss

    watched = jaxpace.watch(train_step, every=4, window=2, out=tmp_path)
    assert watched.lower(params, opt.init(params), x).compile() is not None  # jit's own API
    p1, s1 = params, opt.init(params)
    p2, s2 = params, opt.init(params)
    for _ in range(10):
        p1, s1, _ = train_step(p1, s1, x)
        p2, s2, _ = watched(p2, s2, x)
        jax.block_until_ready(p2)
    watched.close()
    assert np.asarray(p1["w"]).tobytes() == np.asarray(p2["w"]).tobytes()
    hist = watched.history()
    assert [(h.first_step, h.last_step) for h in hist] == [(4, 5), (8, 9)]
    assert all(h.analyzed_steps >= 2 and h.windows_pooled >= 1 for h in hist), hist
    import json

    v = json.loads((tmp_path / "verdict.json").read_text())
    assert (v["version"], v["kind"], v["window"], v["process_count"]) == (
        1, "jaxpace.watch.verdict", 2, 1,
    )  # fmt: skip
    assert len((tmp_path / "verdicts.ndjson").read_text().splitlines()) == 2
    assert (tmp_path / "windows" / "records-p0.parquet").is_file()
    # The step's thread only collected the trace; watch's thread wrote its files (JAX 0.10:
    # the session state's internals; newer JAX: its public ProfileSession).
    assert v["cost_s"]["max_export_s"] is not None, v["cost_s"]


def test_exporters_take_what_watch_delivers(tmp_path):
    """`jaxpace.sinks`' Prometheus, TensorBoard and jax.monitoring sinks accept the
    per-step summaries process 0 delivers after a window."""
    from jaxpace import sinks
    from jaxpace.watch.summary import combine
    from jaxpace.watch.worker import Worker

    got = {p: _summary(p, late=p == 2) for p in range(4)}
    recs, _ = combine(got, process_count=4, window=1, first=10, last=14, run_id="t")
    seen = []
    prom = sinks.prometheus_textfile(tmp_path / "watch.prom", write_every_s=0)
    tb = sinks.tensorboard(tmp_path / "tb")
    w = Watched(lambda x: x, sinks=[seen.append, prom, tb, sinks.jax_monitoring()])
    worker = Worker(w, None, process=0, count=4, host="h0")
    worker._deliver(recs, {"culprit_process": 2})
    tb.close()
    assert worker.sink_errors == 0 and len(seen) == 5 * 8
    assert {s["site"] for s in seen} == {"watch/jit_step/all-reduce.1"}
    assert all(s["earliness_s"][4] == 0.0 and s["watch"]["culprit_process"] == 2 for s in seen)
    text = (tmp_path / "watch.prom").read_text()
    assert "jaxpace_wait_seconds{" in text and 'site="watch/jit_step/all-reduce.1"' in text


class _HungClient:
    """A coordination client whose calls never return (the service is gone)."""

    def __init__(self):
        import threading

        self.release = threading.Event()

    def key_value_set(self, *a):
        self.release.wait(30)

    def key_value_dir_get(self, *a):
        self.release.wait(30)
        return []


def test_a_coordination_service_that_does_not_answer_stops_watch_and_never_blocks_a_step(
    capsys,
):
    from jaxpace.watch.exchange import KVExchange
    from jaxpace.watch.worker import Worker

    client = _HungClient()
    events = []
    w = _watched(events, every=3, window=1, stall_after_s=1.0)
    w(0)  # the set-up (a one-process job: memory exchange); swap in the hung service
    w._worker.stop(5.0)
    w._worker = Worker(w, KVExchange(client, timeout_s=0.2), process=1, count=4, host="h1")
    w._worker.start()
    for k in range(1, 60):
        w(k)
        if w._stopped:
            break
        __import__("time").sleep(0.05)
    assert w._stopped, "watch did not notice that the coordination service is gone"
    stopped_at = w._calls
    before = len(events)
    more = [w(k) for k in range(100, 110)]  # runs untouched: no window, no block
    assert more == list(range(100, 110))
    assert events[before:] == [("call", k) for k in range(100, 110)]
    client.release.set()
    w.close()
    err = capsys.readouterr().err
    assert "coordination service does not answer" in err and "watch stops" in err, err
    assert stopped_at < 60


def test_a_process_whose_own_watch_work_overlapped_the_windows_is_likely_not_named():
    from jaxpace.watch.decide import decide
    from jaxpace.watch.summary import combine

    got = {p: _summary(p, late=p == 2) for p in range(4)}
    for s in got.values():
        for i, r in enumerate(s["rows"]):
            r[4] += (i * 37) % 300
    recs, _ = combine(got, process_count=4, window=1, first=10, last=14, run_id="t")
    prev = decide([(0, 0, 4, recs, (), frozenset())], [])  # window 0's decision named 2
    named = decide([(1, 10, 14, recs, (), frozenset())], [prev])
    assert named.culprit_process == 2
    r = decide([(1, 10, 14, recs, (), frozenset({2}))], [prev])
    assert r.culprit_process is None and r.likely == 2 and r.culprit_ranks == ()
    assert any("own watch work" in n for n in r.notes), r.notes
    assert "likely process 2" in log_line(r)


def test_on_stall_callable_gets_the_stall_and_a_raising_one_does_not_stop_watch(capsys):
    from jaxpace.watch.worker import Worker

    got = []
    stall = {"process": 2, "host": "h2", "last_step": 11, "waiting_step": 12, "stalled_s": 6.0,
             "ahead": [0, 1, 3], "overrun": ""}  # fmt: skip
    for how in (got.append, lambda s: 1 / 0):
        w = Watched(lambda x: x, stall_after_s=5.0, on_stall=how)
        worker = Worker(w, None, process=0, count=4, host="h0")
        worker._stall(dict(stall))
        assert worker.stalls[-1]["process"] == 2
    assert got and got[0]["waiting_step"] == 12 and "has not entered step 12" in got[0]["message"]
    err = capsys.readouterr().err
    assert "stall: process 2 (host h2) has not entered step 12 for 6.0 s" in err
    assert "on_stall callable raised ZeroDivisionError" in err


def _trace(path, sites, runs=3, devices=(0, 1), dur=lambda s, r, d: 100 + d):
    """A Chrome trace as `jax.profiler` writes on CPU: one all-reduce event per site, run
    and device."""
    import gzip
    import json

    events = [
        {"ph": "X", "name": op, "ts": 1000 * r + 10 * i, "dur": dur(i, r, d),
         "args": {"device_ordinal": d, "hlo_module": "jit_step", "hlo_op": op, "run_id": 7 + r}}
        for i, op in enumerate(sites) for r in range(runs) for d in devices
    ]  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)


def test_a_summary_keeps_the_same_sites_on_every_process_whatever_their_timing(tmp_path):
    from jaxpace.watch.summary import MAX_SITES, combine, summarize

    ops = [f"all-reduce.{i}" for i in range(MAX_SITES + 4)]
    got = {}
    for p in range(2):  # different times inside each site on the two processes
        d = tmp_path / f"p{p}" / "plugins" / "profile" / "r" / "h.trace.json.gz"
        _trace(
            d,
            ops,
            devices=(2 * p, 2 * p + 1),
            dur=lambda i, r, dv, p=p: 50 + (i * 7 * (p + 1)) % 40,
        )
        got[p] = summarize(tmp_path / f"p{p}", process=p, host="h", window=1, first=10, last=12)
        assert len(got[p]["sites"]) == len(ops) and len(got[p]["rows"]) == MAX_SITES * 3 * 2
    kept = [{got[p]["sites"][r[0]] for r in got[p]["rows"]} for p in range(2)]
    assert kept[0] == kept[1] and len(kept[0]) == MAX_SITES
    recs, notes = combine(got, process_count=2, window=1, first=10, last=12, run_id="t")
    assert notes == [] and len(recs.sites) == MAX_SITES
    assert sorted(set(recs.columns["step"].tolist())) == [10, 11, 12]


def test_a_process_waiting_in_a_collective_is_not_named_when_a_peer_moves_on_first():
    """Process 2 pauses 6 s; 0 and 1 wait in call 15 meanwhile. When the pause ends, 0's
    heartbeat (in call 16) can arrive before 1's: 1 was not behind for 6 s, only from then."""
    d = StallDetector(stall_after_s=3.0)
    pause = {"name": "ckpt", "max_s": 60.0, "age_s": 0.0, "announced": True, "id": "c#1"}
    waiting = {0: {"calls": 16}, 1: {"calls": 16}, 2: {"calls": 15, "pause": pause}}
    assert d.observe(waiting, 0.0) == [] and d.observe(waiting, 5.9) == []
    moved = {0: {"calls": 17, "age_s": 0.05}, 1: {"calls": 16}, 2: {"calls": 16}}
    assert d.observe(moved, 6.0) == [] and d.observe(moved, 8.9) == []
    assert d.observe({0: {"calls": 17}, 1: {"calls": 17}, 2: {"calls": 17}}, 9.5) == []
    # A process really stuck: the others' published age counts (they entered before we saw).
    stuck = {0: {"calls": 26, "age_s": 2.5}, 1: {"calls": 26, "age_s": 2.4}, 2: {"calls": 25}}
    d2 = StallDetector(stall_after_s=3.0)
    assert d2.observe(stuck, 100.0) == []
    (s,) = d2.observe(stuck, 100.6)
    assert s["process"] == 2 and s["ahead"] == [0, 1] and 3.0 <= s["stalled_s"] <= 3.1


def test_an_unclosed_watch_is_closed_at_exit_and_its_last_window_decided(tmp_path):
    """Through `jaxpace.runtime.signals` (the one owner of exit hooks): the program never
    calls `close()`, and the window still pending at exit is decided and written."""
    import subprocess
    import sys

    code = (
        "import jax, jax.numpy as jnp, jaxpace\n"
        f"step = jaxpace.watch(jax.jit(lambda x: x + 1), every=2, window=1, out={str(tmp_path)!r})\n"
        "x = jnp.zeros(())\n"
        "for _ in range(3):\n"
        "    x = step(x)\n"
    )
    env = {**__import__("os").environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "jaxpace watch: steps 2-2:" in proc.stderr, proc.stderr[-2000:]
    assert (tmp_path / "verdict.json").is_file()


def test_a_dropin_program_is_measured_only_inside_windows_and_bit_equal_to_lax():
    """`Pacer.pmean` in shard_map under watch: calls outside windows run the plain `lax`
    form (no probe), calls inside windows the measured form, chosen by the call count;
    the result bits equal `jax.lax.pmean`'s in both forms."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxpace.collectives import measure

    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    pc = jaxpace.Pacer()
    spec = dict(mesh=mesh, in_specs=P("data"), out_specs=P())

    def body(reduce):
        return lambda x: reduce(jnp.sin(x) * 1.7 + x)

    ours = jax.jit(jax.shard_map(body(lambda v: pc.pmean(v, "data", site="s")), **spec))
    ref = jax.jit(jax.shard_map(body(lambda v: jax.lax.pmean(v, "data")), **spec))
    x = jax.device_put(
        jnp.arange(8 * jax.device_count(), dtype=jnp.float32).reshape(jax.device_count(), 8) / 7.0,
        NamedSharding(mesh, P("data")),
    )
    events = []
    w = Watched(ours, every=4, window=2, profiler=FakeProfiler(events), block=jax.block_until_ready)
    before = measure.passed_through_count()
    outs = [w(x) for _ in range(11)]  # windows: calls 4-5 and 8-9
    want = ref(x)
    for k, o in enumerate(outs):
        assert bool(jnp.all(jax.lax.bitcast_convert_type(o, jnp.int32) ==
                            jax.lax.bitcast_convert_type(want, jnp.int32))), k  # fmt: skip
    assert w._dropins is True and measure.passed_through_count() > before
    st = pc.stats()["s"]
    assert st.measured and st.steps == 4, st  # the 4 window calls, none outside
    w.close()


def test_a_plain_program_under_watch_keeps_one_compiled_form():
    """No jaxpace collective: the pass-through flag is set on every call, windows included,
    so the jit function compiles once under watch."""
    traces = []

    @jax.jit
    def step(x):
        traces.append(1)
        return x * 2

    w = Watched(step, every=3, window=2, profiler=FakeProfiler([]), block=jax.block_until_ready)
    for _ in range(9):
        w(jnp.ones(()))
    assert w._dropins is False and len(traces) == 1
    w.close()


@pytest.mark.parametrize("every,window", [(2, 1), (3, 3), (5, 2), (10, 3), (7, 1)])
def test_next_busy_is_the_first_call_whose_edge_is_not_nothing(every, window):
    from jaxpace.watch.schedule import AutoSchedule, Edge

    s = Schedule(every=every, window=window)
    busy = [k for k in range(6 * every) if s.edge(k) != Edge()]
    for k in range(5 * every):
        assert s.next_busy(k) == min(b for b in busy if b >= k), k
    a = AutoSchedule(window=window, first=every + window)
    for k, announce in [(0, None), (every, (2, 4 * every)), (3 * every, (3, 6 * every))]:
        if announce is not None:
            assert a.adopt(*announce, k=k)
        busy = [j for j in range(k, 8 * every) if a.edge(j) != Edge()]
        for j in range(k, busy[-1] + 1):
            assert a.next_busy(j) == min(b for b in busy if b >= j), (k, j)
        assert a.next_busy(busy[-1] + 1) == MAX_CALLS  # nothing until the next announcement


def test_calls_between_windows_run_the_plain_form_without_consulting_the_schedule():
    """The calls between windows take the wrapper's short path: the pass-through flag set
    for the step and restored after it (after a raising step too), and the schedule asked
    only about the calls at or after the next edge."""
    from jaxpace.collectives import measure

    seen, events = [], []

    def step(k):
        seen.append(measure._PASS_THROUGH.value)
        if k == "raise":
            raise ValueError("the step's own error")
        return k

    w = Watched(step, every=10, window=2, profiler=FakeProfiler(events), block=lambda o: None)
    asked = []
    edge = w.schedule.edge
    object.__setattr__(w.schedule, "edge", lambda k: asked.append(k) or edge(k))
    assert [w(k) for k in range(25)] == list(range(25))
    assert measure._PASS_THROUGH.value is False  # restored after every call
    # Asked: the call before each window and the window's calls, then the calls after a
    # window while watch's thread still analyzes it (they are timed: a run from the
    # window's end, as long as its analysis), until one finds the next edge.
    assert [k for k in asked if k < 9] == [] and {9, 10, 11, 19, 20, 21} <= set(asked)
    after = [k for k in asked if 12 <= k < 19]
    assert after == list(range(12, 12 + len(after))), asked
    assert seen == [True] * 25  # (no jaxpace collective: the plain form throughout)
    assert [e[0] for e in events] == ["start", "stop", "start", "stop"]
    with pytest.raises(ValueError, match="own error"):
        w("raise")  # call 25: between windows
    assert measure._PASS_THROUGH.value is False
    w.close()


def test_the_first_window_call_of_a_dropin_program_compiles_and_is_not_a_stall():
    d = StallDetector(stall_after_s=1.0)
    d.compile_calls = frozenset({10})
    beats = {0: {"calls": 12}, 1: {"calls": 11}}  # 1 is inside call 10: compiling
    assert d.observe(beats, now=0.0) == [] and d.observe(beats, now=5.0) == []
    beats = {0: {"calls": 13}, 1: {"calls": 12}}  # 1 inside call 11: a stall
    d.observe(beats, now=6.0)
    assert [s["process"] for s in d.observe(beats, now=8.0)] == [1]


def test_watch_says_the_reports_likely_in_its_words():
    # A small job, process 1 always last at 2% of the step: the report's `likely`, with
    # its figure and threshold, is watch's `likely` and its log line.
    from jaxpace.records.synthetic import synthetic_step_records
    from jaxpace.report.analyze import load_step_records
    from jaxpace.watch.decide import decide, verdict

    recs = load_step_records(
        synthetic_step_records(4, 40, 2, late_s={1: 0.015}, compute_s=0.85, jitter_s=0.002)
    )
    r = decide([(1, 0, 39, recs, ())], [])
    assert r.culprit_process is None and r.likely == 1
    assert r.likely_text.startswith("likely: process 1, last in")
    line = log_line(r)
    assert "likely: process 1" in line and "24% of the step" in line
    v = verdict(r, run="t", process_count=4)
    assert v["confidence"] == "likely" and v["likely_text"] == r.likely_text


def test_the_deciding_process_takes_its_own_summary_from_memory_when_a_stall_cuts(tmp_path):
    """Process 0 is inside window 11 when a stall is named; its window 10 is closed but not
    yet summarized (held while 11 is open). The cut decides window 10 with process 0's own
    summary, made then and taken from memory, not left out as late: 10 is not partial."""
    import json

    from jaxpace.watch import exchange
    from jaxpace.watch.worker import Worker

    ex = exchange.LocalExchange()
    w = Watched(lambda x: x, every=20, window=5, stall_after_s=5.0)
    worker = Worker(w, ex, process=0, count=2, host="h0")
    one = {**_summary(1, window=10), "first_step": 200, "last_step": 204}
    ex.put(exchange.key(w.run, "summary", 1, 10 % 4), json.dumps(one))
    # Process 0's own trace of window 10 (devices 0-1, the same 5 executions).
    _trace(tmp_path / "p0" / "plugins" / "profile" / "r" / "h.trace.json.gz",
           ["all-reduce.1"], runs=5, devices=(0, 1), dur=lambda s, r, d: 21_000)  # fmt: skip
    assert worker.submit((10, 200, 204, str(tmp_path / "p0"), None, {}))
    worker._held = worker.jobs.get_nowait()  # held: window 11 is open on this process
    w._open = (11, None, None)
    stall = {"process": 1, "host": "h1", "last_step": 219, "waiting_step": 220,
             "stalled_s": 6.0, "ahead": [0], "overrun": ""}  # fmt: skip
    worker._stall(stall)
    by_window = {r.window: r for r in worker.history}
    assert set(by_window) == {10, 11}, by_window
    ten = by_window[10]
    assert not ten.partial and ten.windows_pooled == 1 and ten.analyzed_steps == 5, ten
    assert by_window[11].partial and by_window[11].notes[0].startswith("window cut")


def test_auto_cadence_spaces_windows_by_their_measured_cost_and_every_process_adopts_it():
    """`every="auto"`: process 0 decides window 1 (calls 100-104) and announces window 2
    where a window costing 50 ms (its slowest process: 25 ms of extra time on the step's
    thread + 25 ms of trace CPU; process 0's decision adds its own) is `BUDGET` of the time
    between windows at 5 ms per step; process 1 reads it with the result and its wrapper
    blocks and profiles on the announced calls."""
    from jaxpace.watch import exchange, schedule
    from jaxpace.watch.worker import Worker

    ex = exchange.LocalExchange()
    ws, workers = [], []
    for p in range(2):
        events = []
        w = _watched(events)
        assert w.schedule.auto and w.schedule.every == schedule.FIRST_WINDOW_AT == 100
        w._process, w.run = p, "w-auto"  # the same watched function on both processes
        ws.append((w, events))
        workers.append(Worker(w, ex, process=p, count=2, host=f"h{p}"))
    costs = {"step_s": 0.005, "window_s": 5 * 0.005 + 0.020, "pre_block_s": 0.005,
             "summary_cpu_s": 0.020}  # fmt: skip
    mine = {p: {**_summary(p, window=1), "costs": dict(costs)} for p in range(2)}
    mine[1]["costs"]["summary_cpu_s"] = 0.025  # process 1 is the costlier
    ws[0][0]._calls = 130
    workers[0]._decide(1, 100, 104, mine, [])
    v = workers[0]._verdicts[-1]
    cost = v["cost_s"]["window_cost_s"]
    assert 0.050 <= cost < 0.050 + 1.0, v["cost_s"]  # + process 0's decision CPU
    gap = math.ceil(cost / (schedule.BUDGET * 0.005))
    assert v["next_window"] == {"window": 2, "first_step": max(100 + gap, 130 + 2001)}, v
    assert ws[0][0]._announced == (2, v["next_window"]["first_step"])
    workers[1]._read_result(100.0)
    w1, events = ws[1]
    assert w1._announced == ws[0][0]._announced
    start = v["next_window"]["first_step"]
    w1._calls = start - 3
    for k in range(start - 3, start + 6):
        w1(k)
    assert w1.schedule.bounds(2) == (start, start + 4)
    seq = [e[0] if e[0] in ("start", "stop") else e for e in events]
    assert seq[seq.index(("call", start - 1)) :][:4] == [
        ("call", start - 1), ("block", start - 1), "start", ("call", start)]  # fmt: skip
    assert ("block", start + 4) in events and "stop" in seq


class _StubWorker:
    """A watch thread that takes each window and is done with it when the test says."""

    def __init__(self):
        self.done_window, self.busy, self.jobs = 0, False, []

    def submit(self, job):
        self.jobs.append(job)
        return True


def _stubbed(events, step, **kw) -> Watched:
    w = Watched(step, profiler=FakeProfiler(events), block=lambda o: None, **kw)
    w(0)  # (sets up its real thread: stopped, and the stub put in its place)
    w.close()
    w._closed, w._stopped, w._worker = False, False, _StubWorker()
    w._mark = (1, time.perf_counter())  # (the steps timed from here, not from the close)
    return w


def test_the_calls_after_a_window_are_charged_to_the_next_windows_cost():
    """What the step lost after window 1 while watch's thread analyzed it (calls timed from
    the window's end until the thread is done with the window) goes into window 2's costs
    as `after_prev_s`, and `window_cost` takes it when it exceeds the thread's CPU time."""
    from jaxpace.watch.worker import window_cost

    events = []
    slow = {"on": False}

    def step(k):
        events.append(("call", k))
        if slow["on"]:
            time.sleep(0.02)
        return k

    w = _stubbed(events, step, every=20, window=2)
    for k in range(1, 22):  # through window 1 (calls 20-21)
        w(k)
    assert [j[0] for j in w._worker.jobs] == [1]
    assert w._after is not None and w._after[:2] == (1, 22), w._after
    slow["on"] = True
    for k in range(22, 27):  # 5 calls of at least 20 ms each, window 1 not done
        w(k)
    slow["on"] = False
    assert w._after is not None  # still analyzing: still timed
    w._worker.done_window = 1
    w(27)
    assert w._after is None and w._after_s is not None and w._after_s >= 5 * 0.02 - 0.01
    got = w._after_s
    for k in range(28, 42):  # to window 2's end (calls 40-41)
        w(k)
    two = [j for j in w._worker.jobs if j[0] == 2]
    assert len(two) == 1 and two[0][5]["after_prev_s"] == got, two
    assert "after_prev_s" not in w._worker.jobs[0][5]  # (window 1: none before it)
    base = {"step_s": 0.005, "window_s": 0.010 + 0.020, "pre_block_s": 0.005,
            "summary_cpu_s": 0.030}  # fmt: skip
    assert window_cost(base, 2) == pytest.approx(0.020 + 0.005 + 0.030)
    assert window_cost({**base, "after_prev_s": 0.100}, 2) == pytest.approx(0.025 + 0.100)
    assert window_cost({**base, "after_prev_s": 0.001}, 2, 0.010) == pytest.approx(0.025 + 0.040)


def test_a_window_never_done_is_timed_at_most_to_the_next_windows_blocking_call():
    """The calls after a window are timed until the next window's blocking call when watch's
    thread never finishes it; a window the thread would not take is not timed at all."""
    events = []
    w = _stubbed(events, lambda k: k, every=10, window=2)
    for k in range(1, 12):
        w(k)
    assert w._after is not None
    for k in range(12, 20):  # call 19 is window 2's blocking call
        w(k)
    assert w._after is None and "after_prev_s" in w._costs
    w._worker.submit = lambda job: False  # (analysis behind: window 2 dropped)
    for k in range(20, 22):
        w(k)
    assert w._after is None


def test_an_announcement_after_its_window_began_is_skipped_and_said():
    """A process that reads the announced window only after its blocking call passed does
    not start it late: it skips it (its window is partial) and keeps the call untouched."""
    events = []
    w = _watched(events)
    w(0)
    w._calls = 500
    w._announced = (2, 400)
    got = [w(k) for k in range(500, 505)]
    assert got == list(range(500, 505)) and events[-5:] == [("call", k) for k in range(500, 505)]
    job = w._worker.jobs.get_nowait()
    assert job[:3] == (2, 400, 404) and job[3] is None and "announced after its start" in job[4]
    w.close()


def test_one_process_of_8_devices_names_its_late_device_from_a_shard_map_psum():
    """A single-process jit step whose `shard_map` `lax.psum` jax 0.10.2 names
    `psum_invariant.N` in the trace (the reader once took it for no collective): watch
    reads it, and names device 3, which computes 40 matmuls where the others compute one,
    as the late rank (not all 8 ranks of the only process) from the second window on."""
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((8,), ("data",))
    m = jnp.ones((256, 256)) / 256

    def f(v):
        def heavy(v):
            for _ in range(40):
                v = jnp.tanh(v @ m)
            return v

        late = jax.lax.axis_index("data") == 3
        return jax.lax.psum(jax.lax.cond(late, heavy, lambda v: jnp.tanh(v @ m), v), "data")

    g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("data"), out_specs=P("data")))
    x = jax.device_put(jnp.ones((8 * 256, 256)), jax.NamedSharding(mesh, P("data")))
    step = jaxpace.watch(lambda v: jax.block_until_ready(g(v)) / 8, every=10, window=5)
    for _ in range(55):
        x = step(x)
    step.close()
    hist = step.history()
    assert [r.window for r in hist] == [1, 2, 3, 4, 5], hist
    assert all(r.analyzed_steps >= 5 for r in hist), hist
    for r in hist[2:]:  # named once two windows in a row name it (`CONFIRM_WINDOWS`)
        assert r.culprit_process == 0 and r.culprit_ranks == (3,), r


def _fake_analyze(names_by_windows, also=()):
    """An `analyze` for `decide` that names `names_by_windows[n]` (or nobody) when given the
    records of n pooled windows (5 steps each), and then the processes `also` too (their
    first rank), with process 3 its finding below the line."""
    import types

    def analyze(recs, warmup_steps=0, alpha=None, fleet_alpha=None):
        assert (alpha, fleet_alpha) == (LEVEL, FLEET_LEVEL)  # (watch's levels)
        n = len(set(recs.columns["step"].tolist())) // 5
        named = names_by_windows.get(n)
        ranks = [
            types.SimpleNamespace(rank=r, process=r // 2, host=f"h{r // 2}", excess_lateness_s=0.01)
            for r in range(8)
        ]
        below = types.SimpleNamespace(process=3, last_fraction=0.9, text="process 3 below")
        likely = None if named is not None else below
        culprits = (2 * named, *(2 * p for p in also)) if named is not None else ()
        return types.SimpleNamespace(
            culprit_process=named, likely=likely, primary_mode="persistent_straggler",
            analyzed_steps=5 * n, culprits=culprits, ranks=ranks,
        )  # fmt: skip

    return analyze


def _windows(n):
    from jaxpace.watch.summary import combine

    out = []
    for w in range(1, n + 1):
        got = {p: _summary(p, window=w) for p in range(4)}
        recs, notes = combine(got, process_count=4, window=w, first=10 * w, last=10 * w + 4,
                              run_id="t")  # fmt: skip
        out.append((w, 10 * w, 10 * w + 4, recs, tuple(notes)))
    return out


def test_a_lone_window_naming_a_process_the_pooled_windows_do_not_name_is_only_likely():
    # The false alarms of healthy fleets (benchmarks/watch_alarms.py): a lone 5-step window
    # names the fleet's slowest process while the pooled windows put it below the line.
    from jaxpace.watch.decide import WindowResult, decide, log_line, verdict

    windows = _windows(4)
    prev = WindowResult(window=3, first_step=30, last_step=34, likely=2, windows_pooled=3)
    r = decide(windows, [prev], analyze=_fake_analyze({1: 2}))  # pooled (4) names nobody
    assert r.culprit_process is None and r.candidate == 2 and r.likely == 2, r
    assert r.windows_pooled == 1 and "nobody named yet" in log_line(r)
    assert verdict(r, run="t", process_count=4)["confidence"] == "likely"
    # The pooled windows name it too: named at once.
    r = decide(windows, [prev], analyze=_fake_analyze({1: 2, 4: 2}))
    assert r.culprit_process == 2 and r.windows_pooled == 4 and not r.held, r
    # The pooled windows name another process: this window's decision is the lone one's.
    r = decide(windows, [prev], analyze=_fake_analyze({1: 2, 4: 1}))
    assert r.culprit_process is None and r.candidate == 2 and r.windows_pooled == 1, r


def test_a_named_process_is_held_while_the_decision_points_at_it_and_released_after():
    from jaxpace.watch.decide import WindowResult, decide, log_line, verdict

    windows = _windows(4)
    named = WindowResult(window=3, first_step=30, last_step=34, culprit_process=3,
                         culprit_host="h3", culprit_ranks=(6, 7), windows_pooled=3,
                         in_a_row=2, since_window=2, candidate=3)  # fmt: skip
    # Nobody named this window; process 3 is its finding below the line: still named.
    r = decide(windows, [named], analyze=_fake_analyze({}))
    assert r.culprit_process == 3 and r.held and r.since_window == 2 and r.likely is None, r
    assert r.culprit_ranks == (6, 7) and r.culprit_host == "h3"
    assert "still named (since window 2)" in log_line(r), log_line(r)
    v = verdict(r, run="t", process_count=4)
    assert v["confidence"] == "named" and v["held"] and v["since_window"] == 2
    # The decision names it again: named (not held), since the same window.
    r = decide(windows, [named], analyze=_fake_analyze({1: 3}))
    assert r.culprit_process == 3 and not r.held and r.since_window == 2 and r.windows_pooled == 1
    # Another process is this window's finding: still held for one window (`quiet` 1; a
    # decision near the line flips), released at the second in a row.
    other = WindowResult(**{**named.__dict__, "culprit_process": 0, "culprit_ranks": (0, 1)})
    r = decide(windows, [other], analyze=_fake_analyze({}))
    assert r.culprit_process == 0 and r.held and r.quiet == 1 and r.culprit_ranks == (0, 1), r
    assert "does not point at it (1 of the 2 windows" in log_line(r), log_line(r)
    assert verdict(r, run="t", process_count=4)["quiet"] == 1
    r = decide(windows, [dataclasses.replace(r, window=3)], analyze=_fake_analyze({}))
    assert r.culprit_process is None and r.likely == 3 and not r.held and r.quiet == 0, r
    # A report naming two processes keeps the one named before (no taking turns).
    r = decide(windows, [other], analyze=_fake_analyze({1: 3}, also=(0,)))
    assert r.culprit_process == 0 and not r.held and r.since_window == 2, r
    # A gap (the window before is not the previous one): nothing is held.
    gap = WindowResult(**{**named.__dict__, "window": 2})
    assert decide(windows, [gap], analyze=_fake_analyze({})).culprit_process is None


def test_a_process_named_again_after_its_release_needs_twice_the_quiet_windows_next_time():
    # A healthy 8-process fleet with a device near the line was named, released and named
    # again 137 times in a job-week with a release after 2 quiet windows (watch_alarms.py).
    from jaxpace.watch.decide import (
        MAX_RELEASE_WINDOWS,
        RELEASE_WINDOWS,
        WindowResult,
        decide,
        log_line,
        verdict,
    )
    from jaxpace.watch.worker import _from_verdict

    windows = _windows(4)
    after = WindowResult(window=3, first_step=30, last_step=34, windows_pooled=3, released=3)
    both = _fake_analyze({1: 3, 4: 3})  # (the lone window and the pooled ones name 3)
    r = decide(windows, [after], analyze=both)
    assert r.culprit_process == 3 and r.release_after == 2 * RELEASE_WINDOWS and r.released == 3
    back = _from_verdict(verdict(r, run="t", process_count=4))
    assert (back.release_after, back.released) == (r.release_after, 3)
    # Another process named anew: no doubling; at the cap: no more.
    r = decide(windows, [after], analyze=_fake_analyze({1: 1, 4: 1}))
    assert r.culprit_process == 1 and r.release_after == RELEASE_WINDOWS, r
    capped = dataclasses.replace(after, release_after=MAX_RELEASE_WINDOWS)
    assert decide(windows, [capped], analyze=both).release_after == MAX_RELEASE_WINDOWS
    # Held through 3 quiet windows when 4 release it; released at the 4th, and remembered.
    held = WindowResult(window=3, first_step=30, last_step=34, culprit_process=0,
                        culprit_ranks=(0, 1), windows_pooled=3, in_a_row=2, since_window=2,
                        candidate=0, release_after=4)  # fmt: skip
    for quiet in (1, 2, 3):
        held = decide(windows, [dataclasses.replace(held, window=3)], analyze=_fake_analyze({}))
        assert held.culprit_process == 0 and held.held and held.quiet == quiet, held
    assert "(3 of the 4 windows in a row that release it)" in log_line(held), log_line(held)
    r = decide(windows, [dataclasses.replace(held, window=3)], analyze=_fake_analyze({}))
    assert r.culprit_process is None and r.released == 0 and r.release_after == 4, r
