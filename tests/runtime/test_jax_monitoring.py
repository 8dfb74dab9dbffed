"""jaxpace's `jax.monitoring` events reach listeners registered the way JAX and Orbax users do."""

import jax
import pytest
from psum_step import run_psum

import jaxpace as jp
from jaxpace.runtime import monitoring as names


@pytest.fixture
def listeners():
    got = {"durations": [], "events": [], "scalars": []}

    def on_duration(event, duration, **meta):
        if event.startswith("/jaxpace/"):
            got["durations"].append((event, duration, meta))

    def on_event(event, **meta):
        if event.startswith("/jaxpace/"):
            got["events"].append((event, meta))

    def on_scalar(event, value, **meta):
        if event.startswith("/jaxpace/"):
            got["scalars"].append((event, value, meta))

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    jax.monitoring.register_event_listener(on_event)
    jax.monitoring.register_scalar_listener(on_scalar)
    yield got
    jax.monitoring.unregister_event_duration_listener(on_duration)
    jax.monitoring.unregister_event_listener(on_event)
    jax.monitoring.unregister_scalar_listener(on_scalar)


@pytest.mark.timeout(300)
def test_every_measured_collective_records_its_wait_and_delay(listeners):
    steps, ranks = 12, 8
    pacer = jp.Pacer(granularity="device", sinks=[jp.sinks.jax_monitoring()])
    run_psum(pacer, "grads", steps, ranks=ranks)
    pacer.close()
    waits = [d for d in listeners["durations"] if d[0] == names.WAIT_DURATION]
    delays = [d for d in listeners["durations"] if d[0] == names.DELAY_DURATION]
    assert len(waits) == len(delays) == steps * ranks
    assert {(m["rank"], m["step"]) for _, _, m in waits} == {
        (r, s) for r in range(ranks) for s in range(steps)
    }
    assert all(m["site"] == "grads" and d >= 0 for _, d, m in waits)
    assert all(d == 0.0 for _, d, _ in delays)  # measure-only: no pacing sleep


def test_a_culprit_change_is_one_event(listeners):
    sink = jp.sinks.jax_monitoring()
    for step in range(200):
        late = 2 if step < 10 else 5  # rank 2 is last, then rank 5 for good
        e = [0.003] * 8
        e[late] = 0.0
        sink({"site": "s", "step": step, "rank": 0, "wait_s": 0.001, "delay_s": 0.0,
              "engaged": False, "earliness_s": e})  # fmt: skip
    changes = [(m["previous"], m["culprit"]) for ev, m in listeners["events"]]
    assert changes == [(-1, 2), (2, 5)]
    assert all(ev == names.CULPRIT_CHANGED for ev, _ in listeners["events"])
    assert [(ev, v) for ev, v, _ in listeners["scalars"]] == [
        (names.CULPRIT_RANK, 2),
        (names.CULPRIT_RANK, 5),
    ]


def test_without_the_sink_nothing_is_recorded(listeners):
    """Off by default: a pacer without the sink records no /jaxpace/ event."""
    pacer = jp.Pacer(granularity="device")
    run_psum(pacer, "quiet", 3)
    pacer.close()
    assert listeners == {"durations": [], "events": [], "scalars": []}
