"""Exporters hold at 8192 ranks: series and tags per site do not grow with the job.

The sinks are fed synthetic summaries (no JAX devices): one process owning 8
ranks of a job of N ranks, with the exchanged earliness vector of all N.
"""

import math
from pathlib import Path

import numpy as np
import pytest

import jaxpace as jp
from jaxpace.sinks import QUANTILES, SLOWEST_K, WINDOW_STEPS

prom_parser = pytest.importorskip("prometheus_client.parser")
pytest.importorskip("tensorboardX")

LOCAL = range(40, 48)  # this process's 8 ranks (process 5 of a job of 8-rank processes)
STEPS = WINDOW_STEPS + 6
LATE = 4321  # the rank that is (almost) always last


def _feed(sink, num_ranks, seed=0):
    rng = np.random.default_rng(seed)
    for step in range(STEPS):
        e = rng.uniform(0.001, 0.004, num_ranks)
        e[LATE % num_ranks] = 0.0 if step % 10 else 0.002
        e[(LATE + 7) % num_ranks] = 0.0005  # second latest on average
        vec = e.tolist()
        for r in LOCAL:
            sink(
                {
                    "site": "grads",
                    "step": step,
                    "rank": r,
                    "wait_s": 0.001,
                    "delay_s": 0.0,
                    "engaged": False,
                    "earliness_s": vec,
                }
            )


def _prom(tmp_path, num_ranks, fleet):
    sink = jp.sinks.prometheus_textfile(
        tmp_path / f"n{num_ranks}-{fleet}.prom", write_every_s=3600, fleet=fleet
    )
    _feed(sink, num_ranks)
    sink.close()
    text = Path(sink.path).read_text()
    return {f.name: f.samples for f in prom_parser.text_string_to_metric_families(text)}


def _tb(tmp_path, num_ranks, fleet):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    d = tmp_path / f"tb-n{num_ranks}-{fleet}"
    sink = jp.sinks.tensorboard(d, fleet=fleet)
    _feed(sink, num_ranks)
    sink.close()
    acc = EventAccumulator(str(d), size_guidance={"scalars": 0})
    acc.Reload()
    return {t: acc.Scalars(t) for t in acc.Tags()["scalars"]}


PER_RANK = 7  # steps, wait, wait_mean, delay, delay_total, engaged, earliness
FLEET = 3 + 2 * SLOWEST_K + len(QUANTILES)  # ranks, culprit, fraction; slowest; quantiles


@pytest.mark.parametrize("fleet", [True, False])
def test_prometheus_series_per_site_do_not_grow_with_the_job(tmp_path, fleet):
    small, big = _prom(tmp_path, 16 * 8, fleet), _prom(tmp_path, 8192, fleet)
    count = {n: sum(len(s) for s in fams.values()) for n, fams in (("small", small), ("big", big))}
    want = PER_RANK * len(LOCAL) + (FLEET if fleet else 0)
    assert count == {"small": want, "big": want}
    ranks = {int(s.labels["rank"]) for s in big["jaxpace_earliness_seconds"]}
    assert ranks == set(LOCAL)  # this process's ranks only, never the job's 8192
    if fleet:
        assert big["jaxpace_fleet_ranks"][0].value == 8192
        assert big["jaxpace_culprit_rank"][0].value == LATE
        assert big["jaxpace_culprit_last_fraction"][0].value == pytest.approx(58 / 64)
        slowest = {int(s.labels["k"]): s.value for s in big["jaxpace_slowest_rank"]}
        assert slowest[1] == LATE and slowest[2] == LATE + 7 and len(slowest) == SLOWEST_K
        q = {s.labels["quantile"]: s.value for s in big["jaxpace_fleet_earliness_seconds"]}
        assert set(q) == {f"{x:g}" for x in QUANTILES} and q["0"] < q["0.5"] <= q["1"]
    every = [s for samples in big.values() for s in samples]
    assert all(s.labels["node"] for s in every)


def test_prometheus_labels_include_the_slurm_job_when_there_is_one(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "123456")
    fams = _prom(tmp_path, 64, True)
    every = [s for samples in fams.values() for s in samples]
    assert {s.labels["slurm_job_id"] for s in every} == {"123456"}


def test_tensorboard_tags_per_site_do_not_grow_with_the_job(tmp_path):
    small, big = _tb(tmp_path, 16 * 8, True), _tb(tmp_path, 8192, True)
    assert len(small) == len(big) == 4 * len(LOCAL) + 2 + 2 * SLOWEST_K + len(QUANTILES)
    assert sorted(small) == sorted(big)
    assert all(len(v) == STEPS for v in big.values())  # every step of every tag
    assert big["jaxpace/grads/fleet/culprit_rank"][-1].value == LATE
    assert not _tb(tmp_path, 8192, False).keys() & {"jaxpace/grads/fleet/culprit_rank"}


def test_culprit_fraction_is_minus_one_without_an_exchange_as_documented(tmp_path):
    sink = jp.sinks.prometheus_textfile(tmp_path / "m.prom", write_every_s=0, fleet=True)
    sink({"site": "s", "step": 0, "rank": 0, "wait_s": 0.0, "delay_s": 0.0, "engaged": False})
    text = Path(sink.path).read_text()
    fams = {f.name: f.samples for f in prom_parser.text_string_to_metric_families(text)}
    assert fams["jaxpace_culprit_rank"][0].value == -1
    frac = fams["jaxpace_culprit_last_fraction"][0].value
    assert not math.isnan(frac) and frac == -1


def test_bad_fleet_setting_names_the_field(tmp_path):
    with pytest.raises(jp.errors.ConfigError, match="`fleet`"):
        jp.sinks.prometheus_textfile(tmp_path / "m.prom", fleet="yes")
