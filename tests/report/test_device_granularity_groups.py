"""`granularity="device"` at a site that runs as several groups: one rank per device.

A collective over some mesh axes runs as one group per position on the other axes (an
all-gather over `data` on a 2 x 4 (`data`, `model`) mesh is 4 groups of 2). A device's rank
used to be its index over the reduced axes only, the same numbering in every group, so the
4 devices with `data` index 0 shared rank 0: their arrivals overlapped in one record slot
("two measured arrivals ... overlap") and the step counter advanced once per group. Now a
device of a several-group site is numbered over the whole mesh, the header lists each
group's ranks, and a psum is paced within each group (the exchange's payload has a slot per
device and is reduced within the group).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxpace as jp

STEPS = 5


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 4), ("data", "model"), devices=jax.devices()[:8])


def _run(pacer, mesh, fn, out_spec):
    f = jax.jit(
        jax.shard_map(
            fn, mesh=mesh, in_specs=P("data", "model"), out_specs=out_spec, check_vma=False
        )
    )
    x = jax.device_put(
        jnp.arange(64.0, dtype=jnp.float32).reshape(8, 8), NamedSharding(mesh, P("data", "model"))
    )
    outs = [jax.block_until_ready(f(x)) for _ in range(STEPS)]
    pacer.flush()
    return outs, x


def _steps(pacer, site):
    recs = pacer.records()
    header = next(r for r in recs if r.get("type") == "header")
    steps = [r for r in recs if r.get("type") == "step" and r["site"] == site]
    return header, steps


@pytest.mark.timeout(240)
def test_several_groups_give_one_rank_per_device(probe, mesh):
    pacer = jp.Pacer(granularity="device", mesh=mesh)
    try:
        outs, x = _run(
            pacer,
            mesh,
            lambda v: pacer.all_gather(v, "data", axis=0, tiled=True, site="ag"),
            P(None, "model"),
        )
        ref = jax.jit(
            jax.shard_map(
                lambda v: jax.lax.all_gather(v, "data", axis=0, tiled=True),
                mesh=mesh,
                in_specs=P("data", "model"),
                out_specs=P(None, "model"),
                check_vma=False,
            )
        )(x)
        assert np.asarray(outs[-1]).tobytes() == np.asarray(ref).tobytes()
        header, steps = _steps(pacer, "ag")
        # Linear index over (data, model): the group at model position m is {m, 4 + m}.
        assert header["sites"]["ag"]["groups"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
        by_rank = {}
        for r in steps:
            by_rank.setdefault(r["rank"], []).append(r["step"])
        assert sorted(by_rank) == list(range(8))
        assert all(sorted(s) == list(range(STEPS)) for s in by_rank.values()), by_rank
        st = pacer.stats()["ag"]
        assert st.steps == STEPS and st.errors == 0
        assert "4 groups" in st.layout
        assert st.pacing.startswith("measure only")  # an all-gather carries no exchange
    finally:
        pacer.close()


LATE_DEVICE = 5  # linear index over (data, model): in the group {4, 5, 6, 7} of data = 1
LATE_S = 0.04


@pytest.mark.timeout(240)
def test_several_groups_psum_is_paced_within_each_group(probe, mesh):
    """A psum over `model` runs as 2 groups of 4. One device of group {4..7} is 40 ms late
    every step: the adaptive policy delays the other three of its group (the exchange is
    reduced within the group), never the late device, and not group {0..3}.

    On the io_callback path the lateness comes from an injected clock (tests/virtual_clock.py),
    so group {0..3} is balanced to within 1 ms whatever the machine's load, and is never
    delayed. The native probes read the host clock, so there the device really sleeps, and
    group {0..3} can see a loaded machine's own spread: it must then get far less than what a
    leak of the late device across groups would give it (the 30-40 ms of ranks 4, 6, 7)."""
    import time

    from jax import lax

    from jaxpace.runtime.testing import set_fault_hook

    policy = jp.adaptive(threshold_s=0.01, max_delay_s=0.08, warmup_steps=0, engage_steps=2)
    virtual = probe == "io_callback"
    if virtual:
        from virtual_clock import StepClock, jitter_ns

        clock = StepClock(
            lambda rank, step: (
                (int(LATE_S * 1e9) if rank == LATE_DEVICE else 0) + jitter_ns(rank, step)
            )
        )
        pacer = jp.Pacer(policy, granularity="device", mesh=mesh, clock=clock)
        set_fault_hook(pacer, clock.hook)  # called just before each arrival is read
    else:
        pacer = jp.Pacer(policy, granularity="device", mesh=mesh)

    def sleepy(x, idx):
        if int(np.asarray(idx).reshape(-1)[0]) == LATE_DEVICE:
            time.sleep(LATE_S)
        return x

    def body(v):
        if not virtual:
            idx = (lax.axis_index("data") * 4 + lax.axis_index("model")).reshape(1)
            v = jax.pure_callback(sleepy, jax.ShapeDtypeStruct(v.shape, v.dtype), v, idx)
        return pacer.psum(v, "model", site="tp")

    try:
        steps_run = 40
        f = jax.jit(
            jax.shard_map(
                body, mesh=mesh, in_specs=P("data", "model"), out_specs=P("data", None),
                check_vma=False,
            )
        )  # fmt: skip
        x = jax.device_put(jnp.ones((8, 8), jnp.float32), NamedSharding(mesh, P("data", "model")))
        for _ in range(steps_run):
            jax.block_until_ready(f(x))
        header, steps = _steps(pacer, "tp")
        assert header["sites"]["tp"]["groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert sorted({r["rank"] for r in steps}) == list(range(8))
        late_half = [r for r in steps if r["step"] >= steps_run // 2]
        delay = {
            k: np.median([r["delay_ns"] for r in late_half if r["rank"] == k]) / 1e9
            for k in range(8)
        }
        paced = min(delay[k] for k in (4, 6, 7))
        assert paced > 0.02, delay  # the early ranks of its group
        assert delay[LATE_DEVICE] == 0.0, delay  # the last arriver is never delayed
        if virtual:
            assert all(delay[k] == 0.0 for k in (0, 1, 2, 3)), delay  # the other group: balanced
        else:
            assert all(delay[k] < paced / 4 for k in (0, 1, 2, 3)), delay
        st = pacer.stats()["tp"]
        assert st.pacing.startswith("paced") and "2 groups" in st.layout
    finally:
        pacer.close()


@pytest.mark.timeout(240)
def test_one_group_keeps_its_numbering_and_pacing(probe, mesh):
    """A psum over both axes is one group: ranks over the reduced axes, paceable as before."""
    pacer = jp.Pacer(jp.adaptive(), granularity="device", mesh=mesh)
    try:
        _run(pacer, mesh, lambda v: pacer.psum(v, ("data", "model"), site="all"), P())
        header, steps = _steps(pacer, "all")
        assert header["sites"]["all"]["groups"] == [list(range(8))]
        assert sorted({r["rank"] for r in steps}) == list(range(8))
        st = pacer.stats()["all"]
        assert st.pacing.startswith("paced"), st.pacing
        assert "groups" not in st.layout
    finally:
        pacer.close()
