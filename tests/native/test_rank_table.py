"""Each device's rank from the site's table (no rank computed in the program) on CPU.

With a concrete mesh (`jax.set_mesh` or `Pacer(mesh=...)`) in a single-process job, a native
site holds the rank of each local device ordinal and the program passes `RANK_FROM_DEVICE`:
the compiled program holds no `partition-id` and no rank arithmetic. Without one the program
computes the rank, as before. Either way every rank records every step, with the same
numbering. (Multi-process CPU jobs compute the rank too: XLA's ordinal there is the global
device id; `tests/test_first_hour.py` runs one under `jaxpace launch`.)
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxpace as jp
from jaxpace.collectives import kinds as _kinds
from jaxpace.collectives import native_program as _measured_native
from jaxpace.native import probes as nat

pytestmark = pytest.mark.skipif(
    not nat.available()[0], reason=f"native probes unavailable: {nat.available()[1]}"
)

STEPS = 4


def _step(pacer, mesh):
    f = jax.jit(
        jax.shard_map(
            lambda v: pacer.psum(v * 2.0, ("data", "model"), site="s"),
            mesh=mesh,
            in_specs=P("data", "model"),
            out_specs=P(),
        )
    )
    x = jax.device_put(jnp.ones((2, 4), jnp.float32), NamedSharding(mesh, P("data", "model")))
    return f, x


def _ranks_recorded(pacer) -> dict[int, int]:
    pacer.flush()
    steps = [r for r in pacer.records() if r.get("type") == "step" and r["site"] == "s"]
    out: dict[int, int] = {}
    for r in steps:
        out[r["rank"]] = out.get(r["rank"], 0) + 1
    return out


@pytest.mark.parametrize("where", ["set_mesh", "pacer_mesh"])
def test_with_a_concrete_mesh_the_program_computes_no_rank(where):
    mesh = jax.make_mesh((2, 4), ("data", "model"), devices=jax.devices()[:8])
    pacer = jp.Pacer(granularity="device", mesh=mesh if where == "pacer_mesh" else None)
    try:
        f, x = _step(pacer, mesh)
        with jax.set_mesh(mesh) if where == "set_mesh" else contextlib.nullcontext():
            text = f.lower(x).compile().as_text()
            for _ in range(STEPS):
                jax.block_until_ready(f(x))
        assert "jaxpace_arrive_cpu" in text
        assert "partition-id" not in text, "the program still computes the rank"
        assert f"s32[] constant({nat.RANK_FROM_DEVICE})" in text
        assert _ranks_recorded(pacer) == {r: STEPS for r in range(8)}
    finally:
        pacer.close()


def test_without_a_concrete_mesh_the_program_computes_the_rank():
    mesh = jax.make_mesh((2, 4), ("data", "model"), devices=jax.devices()[:8])
    pacer = jp.Pacer(granularity="device")
    try:
        f, x = _step(pacer, mesh)
        text = f.lower(x).compile().as_text()
        for _ in range(STEPS):
            jax.block_until_ready(f(x))
        assert "jaxpace_arrive_cpu" in text
        assert "partition-id" in text
        assert _ranks_recorded(pacer) == {r: STEPS for r in range(8)}
    finally:
        pacer.close()


def _plan(mesh, granularity, axes, table=None):
    names, shape = tuple(mesh.axis_names), tuple(mesh.devices.shape)
    return _measured_native.TracePlan(
        call=_kinds.Call("psum", None),
        axis_name=axes,
        axis_index_groups=None,
        granularity=granularity,
        num_slots=8,
        n_pay=0,
        scale=1.0,
        table=table,
        am=mesh.abstract_mesh,
        axes=axes,
        sizes=dict(zip(names, shape, strict=True)),
    )


class _Rt:
    def __init__(self, mesh):
        self.mesh = mesh


def test_the_table_maps_each_device_ordinal_to_its_mesh_rank(monkeypatch):
    """A mesh whose devices are in reverse order: device ordinal 7 holds shard 0. The table
    gives each ordinal the rank its shard has in the mesh (row-major over the axes), and the
    process's leader (its first shard in mesh order) at process granularity."""
    devs = np.array(jax.devices()[:8])[::-1].reshape(2, 4)
    mesh = Mesh(devs, ("data", "model"))
    seen = {}
    monkeypatch.setattr(nat, "set_site_devices", lambda nid, arr, cuda: seen.__setitem__(nid, arr))
    assert (
        _measured_native._device_table(_Rt(mesh), 1, _plan(mesh, "device", ("data", "model")))
        is None
    )
    ordinal_rank = {int(d.local_hardware_id): i for i, d in enumerate(devs.reshape(-1))}
    assert {o: int(seen[1][o]) for o in ordinal_rank} == ordinal_rank
    # Over `model` only (one group per `data` row): the rank is the index along `model`.
    assert _measured_native._device_table(_Rt(mesh), 2, _plan(mesh, "device", ("model",))) is None
    want = {int(d.local_hardware_id): i % 4 for i, d in enumerate(devs.reshape(-1))}
    assert {o: int(seen[2][o]) for o in want} == want
    # Process granularity: only the leader shard (linear index 0) measures.
    table = np.arange(8) == 0
    assert (
        _measured_native._device_table(_Rt(mesh), 3, _plan(mesh, "process", ("data",), table))
        is None
    )
    want = {int(d.local_hardware_id): (0 if i == 0 else -1) for i, d in enumerate(devs.reshape(-1))}
    assert {o: int(seen[3][o]) for o in want} == want


def test_no_fitting_mesh_means_no_table(monkeypatch):
    mesh = jax.make_mesh((2, 4), ("data", "model"), devices=jax.devices()[:8])
    other = jax.make_mesh((8,), ("i",), devices=jax.devices()[:8])
    monkeypatch.setattr(nat, "set_site_devices", lambda nid, arr, cuda: pytest.fail("table set"))
    why = _measured_native._device_table(_Rt(other), 1, _plan(mesh, "device", ("data", "model")))
    assert why is not None and "concrete mesh" in why
