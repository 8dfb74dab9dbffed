"""jaxpace.sinks: Prometheus textfile and TensorBoard exporters, read back with their own parsers."""

import math
import threading

import numpy as np
import pytest
from psum_step import run_psum

import jaxpace as jp
from jaxpace.runtime.probe import RateLimitedLog
from jaxpace.runtime.sink_thread import SinkThread

prom_parser = pytest.importorskip("prometheus_client.parser")
pytest.importorskip("tensorboardX")


def _families(path):
    with open(path) as f:
        text = f.read()
    return {f.name: f for f in prom_parser.text_string_to_metric_families(text)}


def _samples(fams, name):
    return [(s.labels, s.value) for s in fams[name].samples]


def _summary(step, rank, wait, earliness=None, delay=0.0):
    return {
        "site": "grads",
        "step": step,
        "rank": rank,
        "wait_s": wait,
        "delay_s": delay,
        "engaged": delay > 0,
        "earliness_s": earliness,
        "step_time_s": 0.05,  # the exchanged median step (the small-job rule's yardstick): rank 2's 20 ms is 40%
    }


def test_public_submodule():
    import jaxpace.sinks

    assert jp.sinks is jaxpace.sinks
    assert "sinks" in jp.__all__


def test_prometheus_runs_on_the_sink_thread_and_closes_with_it(tmp_path):
    prom = jp.sinks.prometheus_textfile(tmp_path / "m.prom", write_every_s=3600)
    seen = []

    def spy(s):
        seen.append(threading.current_thread().name)

    th = SinkThread([spy, prom], RateLimitedLog())
    for k in range(10):
        # rank 2 is last (earliness 0) in 8 of 10 steps, rank 0 in the others
        e = [0.01, 0.02, 0.0, 0.03] if k % 5 else [0.0, 0.02, 0.001, 0.03]
        th.emit(_summary(k, 0, 0.01 + k * 1e-3, e, delay=0.002))
    th.close(timeout_s=10)
    assert set(seen) == {"jaxpace-sinks"} and len(seen) == 10
    fams = _families(tmp_path / "m.prom")  # written once, by close(), with write_every_s=1h
    [(labels, culprit)] = _samples(fams, "jaxpace_culprit_rank")
    assert culprit == 2 and labels["site"] == "grads" and labels["node"]
    [(_, frac)] = _samples(fams, "jaxpace_culprit_last_fraction")
    assert frac == pytest.approx(0.8)
    [(labels, steps)] = _samples(fams, "jaxpace_steps_measured")
    assert steps == 10 and labels["rank"] == "0" and labels["node"] and labels["process"] == "0"
    [(_, wait)] = _samples(fams, "jaxpace_wait_seconds")
    assert wait == pytest.approx(0.019)
    [(_, total)] = _samples(fams, "jaxpace_delay_total_seconds")
    assert total == pytest.approx(0.02)
    # Each process exports its own ranks' earliness (here rank 0); the fleet view the rest.
    early = {int(lab["rank"]): v for lab, v in _samples(fams, "jaxpace_earliness_seconds")}
    assert early == {0: pytest.approx(0.01 * 0.8)}
    quantiles = dict(
        (lab["quantile"], v) for lab, v in _samples(fams, "jaxpace_fleet_earliness_seconds")
    )
    assert quantiles["0"] == pytest.approx(0.0002) and quantiles["1"] == pytest.approx(0.03)


def test_prometheus_culprit_unknown_without_exchange(tmp_path):
    prom = jp.sinks.prometheus_textfile(tmp_path / "m.prom", write_every_s=0)
    prom(_summary(0, 3, 0.004))
    fams = _families(prom.path)
    assert _samples(fams, "jaxpace_culprit_rank")[0][1] == -1
    assert "jaxpace_earliness_seconds" not in fams or not fams["jaxpace_earliness_seconds"].samples


def test_prometheus_bad_setting_names_the_field(tmp_path):
    with pytest.raises(jp.errors.ConfigError, match="write_every_s"):
        jp.sinks.prometheus_textfile(tmp_path / "m.prom", write_every_s=-1)


def _scalars(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_single_process_pacer(tmp_path):
    """A real measured psum on 8 CPU devices; the event file is read back by tensorboard."""

    tb = jp.sinks.tensorboard(tmp_path / "tb")
    pacer = jp.Pacer(policy=jp.adaptive(max_delay_s=0.001), granularity="device", sinks=[tb])
    run_psum(pacer, "s", 6, width=2)
    pacer.flush()
    pacer.close(timeout_s=10)
    got = _scalars(tmp_path / "tb")
    steps = sorted(s for s, _ in got["jaxpace/s/wait_ms/rank3"])
    assert steps == list(range(6))
    assert all(v >= 0 and math.isfinite(v) for _, v in got["jaxpace/s/wait_ms/rank3"])
    assert {f"jaxpace/s/delay_ms/rank{r}" for r in range(8)} <= set(got)
    # each rank's own earliness, and the fleet view once per step
    assert len(got["jaxpace/s/earliness_ms/rank7"]) >= 5
    assert len(got["jaxpace/s/fleet/culprit_rank"]) >= 5


@pytest.fixture(scope="module")
def four_by_two(tmp_path_factory):
    out = tmp_path_factory.mktemp("sinks4x2")
    __import__("conftest").run_4x2("sinks_job.py", out)
    return out


@pytest.mark.multiprocess
def test_prometheus_textfile_4x2(four_by_two):
    """Each process's textfile parses; process 0's fleet view names process 1 (50 ms late)."""
    waits = {}
    for p in range(4):
        fams = _families(four_by_two / f"jaxpace.p{p}.prom")
        culprit = _samples(fams, "jaxpace_culprit_rank") if "jaxpace_culprit_rank" in fams else []
        if p == 0:  # the fleet-wide view comes from one process
            [(labels, value)] = culprit
            assert labels["site"] == "grads" and labels["node"] and value == 1
            slowest = {lab["k"]: v for lab, v in _samples(fams, "jaxpace_slowest_rank")}
            assert slowest["1"] == 1
        else:
            assert culprit == []
        for labels, v in _samples(fams, "jaxpace_wait_mean_seconds"):
            waits[int(labels["rank"])] = v
        [(_, steps)] = _samples(fams, "jaxpace_steps_measured")
        assert steps == 30
        early = {int(lab["rank"]): v for lab, v in _samples(fams, "jaxpace_earliness_seconds")}
        assert sorted(early) == [p]  # its own rank only
    assert sorted(waits) == [0, 1, 2, 3]
    # the late process waits least; the others wait for it
    assert min(waits, key=waits.get) == 1
    assert np.median([waits[r] for r in (0, 2, 3)]) > waits[1]


@pytest.mark.multiprocess
def test_tensorboard_4x2(four_by_two):
    for p in range(4):
        got = _scalars(four_by_two / "tb" / f"process-{p}")
        assert len(got[f"jaxpace/grads/wait_ms/rank{p}"]) == 30
        assert f"jaxpace/grads/earliness_ms/rank{p}" in got
        assert ("jaxpace/grads/fleet/culprit_rank" in got) == (p == 0)
