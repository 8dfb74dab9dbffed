"""Locality-aware `make_mesh`, its mock-device `device_grid`, and the cost model."""

import json
import logging
import random
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxpace import topology as T

FIX = Path(__file__).parent.parent / "fixtures" / "topology"


@pytest.fixture(scope="module")
def pcie():
    return T.Topology(hosts=(T.parse_sysfs(FIX / "pcie_2socket"),), source="pcie_2socket")


@pytest.fixture(scope="module")
def dgx():
    topo, _ = T.discover(
        root=FIX / "dgx_h100", nvidia_smi_text=(FIX / "dgx_h100.topo.txt").read_text(), nvml=None
    )
    return topo


@pytest.fixture(scope="module")
def two_per_nic():
    return T.Topology(hosts=(T.parse_sysfs(FIX / "two_gpu_per_nic"),), source="two")


def gpu_of(d):
    return d.local_hardware_id


def innermost_groups(grid):
    return grid.reshape(-1, grid.shape[-1])


def axis_groups(grid, axis):
    return np.moveaxis(grid, axis, -1).reshape(-1, grid.shape[axis])


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "shapes, names, match",
    [
        (
            (2, 4),
            ("data",),
            r"`axis_shapes` \(2, 4\) has 2 axes but `axis_names` \('data',\) has 1",
        ),
        ((2, 2), ("data", "model"), r"`axis_shapes` \(2, 2\) hold 4 devices but `devices` has 8"),
        ((2, 4), ("x", "x"), r"`axis_names` \('x', 'x'\) repeat \['x'\]"),
        ((8,), "data", r"`axis_names` must be a sequence of names.*did you mean `\('data',\)`"),
        ((0, 8), ("a", "b"), r"`axis_shapes` must be positive ints"),
        ((), (), r"`axis_shapes` is empty"),
        ((8,), ("",), r"`axis_names` must be non-empty strings"),
    ],
)
def test_make_mesh_validates_inputs(shapes, names, match, pcie):
    with pytest.raises(ValueError, match=match):
        T.device_grid(shapes, names, devices=T.mock_devices(1, 8), topology=pcie)


def test_topology_without_the_device_gpu_is_rejected(pcie):
    devs = [T.MockDevice(id=0, local_hardware_id=9)]
    with pytest.raises(ValueError, match=r"no GPU with index 9; its GPUs are \[0, 1, 2"):
        T.device_grid((1,), ("data",), devices=devs, topology=pcie)
    twice = [T.MockDevice(id=0, local_hardware_id=1), T.MockDevice(id=1, local_hardware_id=1)]
    with pytest.raises(ValueError, match="both map to GPU 1 of host 0"):
        T.device_grid((2,), ("data",), devices=twice, topology=pcie)
    with pytest.raises(ValueError, match="repeat a device id"):
        T.device_grid((2,), ("data",), devices=[twice[0], twice[0]], topology=pcie)


# --------------------------------------------------------------------------- fallback


def test_no_topology_falls_back_to_jax_order_and_says_so(caplog):
    devs = T.mock_devices(1, 8)[::-1]
    with caplog.at_level(logging.WARNING, logger="jaxpace.topology"):
        plan = T.plan_mesh((2, 4), ("data", "model"), devices=devs)
    assert not plan.used_topology
    assert "no topology given" in plan.notes[0]
    assert "JAX device order" in caplog.text
    # On GPU, JAX sorts by id.
    assert [d.id for d in plan.devices.flat] == list(range(8))


def test_flat_topology_falls_back_too(tmp_path):
    topo, _ = T.discover(root=tmp_path, nvml=None)
    plan = T.plan_mesh((8,), ("data",), devices=T.mock_devices(1, 8), topology=topo)
    assert not plan.used_topology and "no locality information" in plan.notes[0]


def test_fallback_on_real_devices_matches_jax_make_mesh(caplog):
    with caplog.at_level(logging.WARNING, logger="jaxpace.topology"):
        mesh = T.make_mesh((2, 4), ("data", "model"))
    ref = jax.make_mesh((2, 4), ("data", "model"))
    assert [d.id for d in mesh.devices.flat] == [d.id for d in ref.devices.flat]
    assert mesh.axis_types == ref.axis_types


# --------------------------------------------------------------------------- locality


@pytest.mark.parametrize("shape", [(2, 4), (4, 2), (1, 2, 4), (2, 2, 2)])
def test_pcie_innermost_axis_stays_on_one_socket(pcie, shape):
    host = pcie.hosts[0]
    names = tuple("abc"[: len(shape)])
    devs = T.mock_devices(1, 8)

    def crossings(grid):
        return sum(
            1
            for g in innermost_groups(grid)
            for a in g
            for b in g
            if host.gpu(gpu_of(a)).numa_node != host.gpu(gpu_of(b)).numa_node
        )

    default = T.default_device_grid(shape, devs)
    ours = T.device_grid(shape, names, devices=devs, topology=pcie)
    assert crossings(default) > 0
    assert crossings(ours) == 0
    traffic = {names[-1]: 1e9}
    assert T.score(ours, names, traffic, pcie) < T.score(default, names, traffic, pcie)


def test_pcie_order_is_numa_then_rail(pcie):
    grid = T.device_grid((2, 4), ("data", "model"), devices=T.mock_devices(1, 8), topology=pcie)
    assert [[gpu_of(d) for d in row] for row in grid] == [[0, 2, 6, 4], [1, 3, 7, 5]]


def test_two_gpu_per_nic_pairs_share_switch_and_nic(two_per_nic):
    host = two_per_nic.hosts[0]
    # Scramble ids so that JAX's id order is not the physical order.
    perm = [0, 4, 1, 5, 2, 6, 3, 7]
    devs = [T.MockDevice(id=i, local_hardware_id=perm[i]) for i in range(8)]
    ours = T.device_grid((4, 2), ("data", "model"), devices=devs, topology=two_per_nic)
    for a, b in innermost_groups(ours):
        assert str(host.gpu_distance(gpu_of(a), gpu_of(b))) == "PIX"
        assert host.nearest_nic(gpu_of(a)) == host.nearest_nic(gpu_of(b))
    default = T.default_device_grid((4, 2), devs)
    assert {str(host.gpu_distance(gpu_of(a), gpu_of(b))) for a, b in innermost_groups(default)} != {
        "PIX"
    }
    traffic = {"model": 4e8, "data": 1e8}
    assert T.score(ours, ("data", "model"), traffic, two_per_nic) < T.score(
        default, ("data", "model"), traffic, two_per_nic
    )


def test_matrix_only_topology_keeps_numa_groups_under_nvlink():
    """From `nvidia-smi topo -m` alone (all NV18), NUMA still orders the host."""
    host = T.parse_nvidia_smi_topo((FIX / "dgx_h100.topo.txt").read_text())
    topo = T.Topology(hosts=(host,))
    devs = [T.MockDevice(id=i, local_hardware_id=(i * 5) % 8) for i in range(8)]
    grid = T.device_grid((2, 4), ("data", "model"), devices=devs, topology=topo)
    assert [[gpu_of(d) for d in row] for row in grid] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def scrambled_cluster(num_hosts, per_host):
    """Mock GPUs whose ids follow a different local order on every host."""
    return [
        T.MockDevice(id=h * per_host + (k + 3 * h) % per_host, process_index=h, local_hardware_id=k)
        for h in range(num_hosts)
        for k in range(per_host)
    ]


def rail_aligned(grid, axis, host):
    for g in axis_groups(grid, axis):
        rails_by_host = {}
        for d in g:
            rails_by_host.setdefault(d.process_index, []).append(host.nearest_nic(gpu_of(d)))
        if len({tuple(sorted(r)) for r in rails_by_host.values()}) != 1:
            return False
    return True


@pytest.mark.parametrize("shape", [(4, 8), (8, 4), (16, 2), (2, 2, 8)])
def test_dgx_four_hosts_data_axis_is_rail_aligned(dgx, shape):
    host = dgx.hosts[0]
    names = ("data", "model") if len(shape) == 2 else ("pipe", "data", "model")
    data = names.index("data")
    devs = scrambled_cluster(4, 8)
    ours = T.device_grid(shape, names, devices=devs, topology=dgx)
    assert rail_aligned(ours, data, host)
    # The model axis never leaves a host; every host contributes one rail per data group.
    for g in axis_groups(ours, names.index("model")):
        assert len({d.process_index for d in g}) == 1
    default = T.default_device_grid(shape, devs)
    assert not rail_aligned(default, data, host)
    traffic = {"data": 1e9, "model": 1e9}
    assert T.score(ours, names, traffic, dgx) < T.score(default, names, traffic, dgx)


def test_order_is_deterministic_and_ignores_input_order(dgx):
    devs = scrambled_cluster(4, 8)
    ref = T.device_grid((8, 4), ("data", "model"), devices=devs, topology=dgx)
    rng = random.Random(0)
    for _ in range(5):
        shuffled = devs[:]
        rng.shuffle(shuffled)
        got = T.device_grid((8, 4), ("data", "model"), devices=shuffled, topology=dgx)
        assert [d.id for d in got.flat] == [d.id for d in ref.flat]


def test_cuda_visible_devices_maps_local_to_physical(monkeypatch, pcie):
    d = T.MockDevice(id=0, local_hardware_id=2)
    assert T.physical_gpu_index(d) == 2
    assert T.physical_gpu_index(d, "7,6,5,4") == 5
    assert T.physical_gpu_index(d, [1, 3, 5]) == 5
    with pytest.raises(ValueError, match="UUID"):
        T.physical_gpu_index(d, "GPU-3b2f,GPU-77aa")
    with pytest.raises(ValueError, match="lists only 2 GPUs"):
        T.physical_gpu_index(d, "0,1")
    # Single process: make_mesh reads the variable. Physical GPUs 1,3,0,2 are NUMA 1,1,0,0.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3,0,2")
    devs = T.mock_devices(1, 4)
    grid = T.device_grid((2, 2), ("data", "model"), devices=devs, topology=pcie)
    assert [[d.id for d in row] for row in grid] == [[2, 3], [0, 1]]
    # Several processes: the variable is process-local, so it is ignored.
    devs = T.mock_devices(2, 2)
    grid = T.device_grid((2, 2), ("data", "model"), devices=devs, topology=pcie)
    assert [[gpu_of(d) for d in row] for row in grid] == [[0, 1], [0, 1]]


def test_explicit_placement(pcie):
    devs = T.mock_devices(1, 4)
    phys = {0: 6, 1: 7, 2: 4, 3: 5}
    grid = T.device_grid(
        (2, 2), ("data", "model"), devices=devs, topology=pcie, placement=lambda d: (0, phys[d.id])
    )
    assert [[phys[d.id] for d in row] for row in grid] == [[6, 4], [7, 5]]


# --------------------------------------------------------------------------- cost model


def test_score_units_and_formula():
    cm = T.CostModel()
    devs = T.mock_devices(1, 4)
    grid = T.default_device_grid((4,), devs)
    # Flat: every intra-host link is PHB (20 GB/s); ring 2(p-1)/p * n / B + 2(p-1) alpha.
    expect = 2 * 3 / 4 * 1e9 / 20e9 + 6 * cm.intra_host_latency_s
    assert T.score(grid, ("d",), {"d": 1e9}, None) == pytest.approx(expect)
    assert T.score(grid, ("d",), {"d": 2e9}, None) > T.score(grid, ("d",), {"d": 1e9}, None)
    assert T.score(grid, ("d",), {}, None) == 0.0
    with pytest.raises(ValueError, match=r"unknown axes \['x'\]"):
        T.score(grid, ("d",), {"x": 1.0}, None)
    with pytest.raises(ValueError, match="nvlink_gbyte_s"):
        T.CostModel(nvlink_gbyte_s=0.0)


def test_score_nvlink_beats_pcie_and_nic_sharing_costs(dgx, two_per_nic):
    devs = T.mock_devices(1, 8)
    grid = T.default_device_grid((8,), devs)
    assert T.score(grid, ("m",), {"m": 1e9}, dgx) < T.score(grid, ("m",), {"m": 1e9}, two_per_nic)
    # Across 2 hosts: 8 GPUs on 8 NICs (DGX) beat 8 GPUs on 4 NICs.
    devs = T.mock_devices(2, 8)
    grid = T.device_grid((2, 8), ("data", "model"), devices=devs, topology=dgx)
    c_dgx = T.axis_costs_s(grid, ("data", "model"), {"data": 1e9}, dgx)["data"]
    grid2 = T.device_grid((2, 8), ("data", "model"), devices=devs, topology=two_per_nic)
    c_two = T.axis_costs_s(grid2, ("data", "model"), {"data": 1e9}, two_per_nic)["data"]
    assert c_dgx < c_two


# --------------------------------------------------------------------------- real JAX


def test_make_mesh_works_in_shard_map_psum(pcie):
    devices = jax.devices()
    assert len(devices) == 8
    mesh = T.make_mesh((2, 4), ("data", "model"), devices=devices, topology=pcie)
    assert isinstance(mesh, jax.sharding.Mesh)
    # CPU device k plays GPU k; the model axis holds the same-socket GPUs.
    assert [[d.id for d in row] for row in mesh.devices] == [[0, 2, 6, 4], [1, 3, 7, 5]]
    x = jax.device_put(
        np.arange(8, dtype=np.float32).reshape(2, 4), NamedSharding(mesh, P("data", "model"))
    )
    f = jax.jit(
        jax.shard_map(
            lambda v: jax.lax.psum(v, "model"),
            mesh=mesh,
            in_specs=P("data", "model"),
            out_specs=P("data", "model"),
        )
    )
    y = np.asarray(f(x))
    np.testing.assert_array_equal(y, np.array([[6.0] * 4, [22.0] * 4], np.float32))


@pytest.mark.multiprocess
def test_every_process_builds_the_same_mesh(tmp_path, launch, pcie):
    topo_file = tmp_path / "topo.json"
    pcie.save(topo_file)
    out = tmp_path / "out"
    out.mkdir()
    res = launch(
        [
            "-n", "2", "--local-devices", "4", "--timeout", "120", "--",
            sys.executable, "tests/scripts/mesh_consistency.py",
            "--topology", topo_file, "--mesh", "4,2", "--axes", "data,model", "--out", out,
        ],
        timeout_s=180,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    results = [json.loads((out / f"mesh-p{i}.json").read_text()) for i in range(2)]
    assert results[0]["mesh"] == results[1]["mesh"]
    assert all(r["used_topology"] and r["num_processes"] == 2 for r in results)
    # Same order as the mock computation: per host, local devices 0..3 play GPUs
    # 0..3 (NUMA 0,1,0,1), so model pairs are same-socket (0,2) and (1,3).
    by_proc = {}
    for p, i in results[0]["mesh"]:
        by_proc.setdefault(p, []).append(i)
    local_pos = {i: sorted(ids).index(i) for ids in by_proc.values() for i in ids}
    pairs = [tuple(local_pos[i] for _, i in results[0]["mesh"][k : k + 2]) for k in (0, 2, 4, 6)]
    assert pairs == [(0, 2), (1, 3), (0, 2), (1, 3)]
    # psum over the model axis: position k in the flat mesh holds value k.
    flat = [i for _, i in results[0]["mesh"]]
    for r in results:
        for dev_id, v in r["psum"].items():
            k = flat.index(int(dev_id))
            assert v == (k // 2) * 4 + 1  # k0 + k1 with k0 = 2*(k//2)


def test_registry_is_bounded_most_recent_first_and_has_one_home(monkeypatch):
    """`make_mesh` registers its mesh; the registry keeps the last MAX_MESHES, newest first."""
    import importlib.util

    from jaxpace.topology import registry

    assert importlib.util.find_spec("jaxpace._mesh_registry") is None  # one home only
    monkeypatch.setattr(registry, "_MESHES", type(registry._MESHES)(maxlen=registry.MAX_MESHES))
    assert registry.recent() == []
    mesh = T.make_mesh((8,), ("data",))
    assert registry.recent() == [mesh]
    jax.make_mesh((8,), ("data",))  # jax's own meshes are never registered
    assert registry.recent() == [mesh]
    for i in range(registry.MAX_MESHES + 3):
        registry.register(f"m{i}")
    got = registry.recent()
    assert len(got) == registry.MAX_MESHES and got[0] == f"m{registry.MAX_MESHES + 2}"
    assert mesh not in got
    registry.clear()
    assert registry.recent() == []
