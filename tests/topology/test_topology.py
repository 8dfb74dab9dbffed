"""Topology model and discovery: sysfs, `nvidia-smi topo -m`, NVML, JSON, `jaxpace topo`."""

import argparse
import json
import os
import shutil
import types
from pathlib import Path

import pytest

from jaxpace import topology as T
from jaxpace.errors import TopologyError

FIX = Path(__file__).parent.parent / "fixtures" / "topology"
DGX, PCIE, TWO = FIX / "dgx_h100", FIX / "pcie_2socket", FIX / "two_gpu_per_nic"


def labels(host):
    idx = [g.index for g in host.gpus]
    return [[str(host.gpu_distance(a, b)) for b in idx] for a in idx]


# --------------------------------------------------------------------------- model


def test_distance_total_order_follows_nvidia_smi_closeness():
    order = ["X", "NV18", "NV4", "NV", "PIX", "PXB", "PHB", "NODE", "SYS", "NET"]
    ds = [T.Distance.parse(s) for s in order]
    assert sorted(reversed(ds)) == ds
    assert [str(d) for d in ds] == order


def test_distance_rejects_unknown_label_listing_choices():
    with pytest.raises(ValueError, match=r"'QPI'.*X, NV#, PIX"):
        T.Distance.parse("QPI")


def test_host_rejects_duplicate_gpu_index_and_bad_matrix():
    with pytest.raises(ValueError, match="repeat a GPU index"):
        T.Host(gpus=(T.Gpu(index=0), T.Gpu(index=0)))
    with pytest.raises(ValueError, match="gpu_links.*2x2"):
        T.Host(gpus=(T.Gpu(index=0), T.Gpu(index=1)), gpu_links=((T.Distance(T.Link.X),),))


# --------------------------------------------------------------------------- sysfs


def test_sysfs_dgx_finds_gpus_nics_numa_and_switches():
    h = T.parse_sysfs(DGX)
    assert h.name == "dgx_h100"
    # NVSwitch functions (vendor 0x10de, class 0x0680) and bridges are not GPUs.
    assert [g.pci_bus_id for g in h.gpus] == [
        "0000:13:00.0", "0000:23:00.0", "0000:33:00.0", "0000:43:00.0",
        "0000:93:00.0", "0000:a3:00.0", "0000:b3:00.0", "0000:c3:00.0",
    ]  # fmt: skip
    assert [g.numa_node for g in h.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert h.gpus[0].pcie_path == (
        "pci0000:10", "0000:10:01.0", "0000:11:00.0", "0000:12:00.0", "0000:13:00.0"
    )  # fmt: skip
    assert h.gpus[0].pcie_switch == "0000:11:00.0"
    # RDMA devices first (netdevs on the same function are merged), then eno1.
    assert [n.name for n in h.nics] == [f"mlx5_{k}" for k in range(8)] + ["eno1"]
    assert h.nics[0].link_rate_gbps == 400.0
    assert h.nics[-1].link_rate_gbps == 1.0  # 1000 Mb/s
    assert [h.nearest_nic(g.index) for g in h.gpus] == list(range(8))
    # No NVLink information in sysfs: GPU pairs are PCIe classes.
    assert labels(h)[0] == ["X", "NODE", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS"]
    assert str(h.nic_distance(0, 0)) == "PIX"


def test_sysfs_two_level_switch_gives_pix_and_pxb():
    h = T.parse_sysfs(TWO)
    assert labels(h)[0] == ["X", "PIX", "PXB", "PXB", "SYS", "SYS", "SYS", "SYS"]
    assert [h.nearest_nic(g.index) for g in h.gpus] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [str(h.nic_distance(0, k)) for k in range(4)] == ["PIX", "PXB", "SYS", "SYS"]
    assert {n.link_rate_gbps for n in h.nics} == {200.0}


def test_sysfs_pcie_ids_alternate_sockets():
    h = T.parse_sysfs(PCIE)
    assert [g.numa_node for g in h.gpus] == [0, 1, 0, 1, 0, 1, 0, 1]
    assert [n.numa_node for n in h.nics] == [0, 1, 0, 1]


def test_sysfs_empty_root_finds_nothing(tmp_path):
    h = T.parse_sysfs(tmp_path)
    assert h.gpus == () and h.nics == ()


def test_sysfs_malformed_attribute_names_the_file(tmp_path):
    root = tmp_path / "m"
    shutil.copytree(PCIE, root, symlinks=True)
    bad = (
        root
        / "sys/devices/pci0000:30/0000:30:01.0/0000:31:00.0/0000:32:00.0/0000:33:00.0/numa_node"
    )
    bad.write_text("zero\n")
    with pytest.raises(TopologyError, match=r"0000:33:00.0/numa_node:1: expected an integer"):
        T.parse_sysfs(root)


def test_sysfs_malformed_rate_names_the_file(tmp_path):
    root = tmp_path / "m"
    shutil.copytree(TWO, root, symlinks=True)
    (root / "sys/class/infiniband/mlx5_1/ports/1/rate").write_text("fast\n")
    with pytest.raises(TopologyError, match=r"mlx5_1/ports/1/rate:1: expected a link rate"):
        T.parse_sysfs(root)


# --------------------------------------------------------------------------- nvidia-smi


def test_nvidia_smi_dgx_text_with_escape_codes_and_nic_legend():
    h = T.parse_nvidia_smi_topo((FIX / "dgx_h100.topo.txt").read_text())
    assert [g.index for g in h.gpus] == list(range(8))
    assert {str(h.gpu_distance(a, b)) for a in range(8) for b in range(8) if a != b} == {"NV18"}
    assert {g.nvlink_clique for g in h.gpus} == {0}
    assert [g.numa_node for g in h.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [n.name for n in h.nics] == [f"mlx5_{k}" for k in range(8)]
    assert [n.numa_node for n in h.nics] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [str(h.nic_distance(5, k)) for k in range(8)] == ["SYS"] * 4 + [
        "NODE",
        "PIX",
        "NODE",
        "NODE",
    ]


def test_nvidia_smi_matches_sysfs_on_pcie_server():
    """Two independent sources (the text and the sysfs paths) agree on every cell."""
    smi = T.parse_nvidia_smi_topo((FIX / "pcie_2socket.topo.txt").read_text())
    sysfs = T.parse_sysfs(PCIE)
    assert labels(smi) == labels(sysfs)
    assert [n.name for n in smi.nics] == [n.name for n in sysfs.nics]
    for g in range(8):
        assert [smi.nic_distance(g, k) for k in range(4)] == [
            sysfs.nic_distance(g, k) for k in range(4)
        ]
    assert all(g.nvlink_clique is None for g in smi.gpus)


@pytest.mark.parametrize(
    "edit, match",
    [
        (
            lambda ls: ls[:2] + [ls[2].replace("NODE", "QPI", 1)] + ls[3:],
            r"x.txt:3: row `GPU1`.*'QPI'",
        ),
        (
            lambda ls: ls[:4] + [" ".join(ls[4].split()[:5])] + ls[5:],
            r"x.txt:5: row `GPU3` has 4 link cells, expected 12",
        ),
        (
            lambda ls: ls[:3] + ["GPU9 X X"] + ls[3:],
            r"x.txt:4: row `GPU9` is not one of the header",
        ),
        (lambda ls: ["garbage"] + ls[1:], r"x.txt:1: no `nvidia-smi topo -m` header"),
        (
            lambda ls: ls[:1] + [ls[1].replace("SYS", "NODE", 1)] + ls[2:],
            r"x.txt:2: matrix is not symmetric: GPU0-GPU1",
        ),
    ],
    ids=["bad-label", "short-row", "unknown-row", "no-header", "asymmetric"],
)
def test_nvidia_smi_malformed_names_file_and_line(edit, match):
    lines = (FIX / "pcie_2socket.topo.txt").read_text().splitlines()
    with pytest.raises(TopologyError, match=match):
        T.parse_nvidia_smi_topo("\n".join(edit(lines)), path="x.txt")


# --------------------------------------------------------------------------- NVML


class FakeNVMLError(Exception):
    pass


def fake_nvml(n_gpus=8, nvswitch=True, calls=None):
    """A stand-in for `pynvml` modelled on a DGX H100: 18 NVLinks per GPU to NVSwitch."""
    calls = calls if calls is not None else []
    bus = [f"00000000:{b:02X}:00.0" for b in (0x13, 0x23, 0x33, 0x43, 0x93, 0xA3, 0xB3, 0xC3)]

    def link_remote(h, link):
        if not nvswitch:
            # NVLink bridges pair GPUs (0,1), (2,3), ...: 4 links each.
            if link >= 4:
                raise FakeNVMLError("not supported")
            return types.SimpleNamespace(busId=bus[h ^ 1].encode())
        return types.SimpleNamespace(busId=b"00000000:E1:00.0")  # an NVSwitch

    def ancestor(a, b):
        return 40 if (a < 4) == (b < 4) else 50  # NODE / SYSTEM

    return types.SimpleNamespace(
        NVML_NVLINK_MAX_LINKS=18,
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: n_gpus,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=bus[h].encode()),
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetNumaNodeId=lambda h: 0 if h < 4 else 1,
        nvmlDeviceGetNvLinkState=lambda h, link: 1,
        nvmlDeviceGetNvLinkRemotePciInfo=link_remote,
        nvmlDeviceGetTopologyCommonAncestor=ancestor,
    )


def test_nvml_nvswitch_gives_nv18_all_to_all():
    calls = []
    h = T.parse_nvml(fake_nvml(calls=calls))
    assert calls == ["init", "shutdown"]
    assert h.gpus[0].pci_bus_id == "0000:13:00.0"
    assert h.gpus[0].name == "NVIDIA H100 80GB HBM3"
    assert [g.numa_node for g in h.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert labels(h)[0] == ["X"] + ["NV18"] * 7
    assert {g.nvlink_clique for g in h.gpus} == {0}


def test_nvml_bridged_pairs_form_two_gpu_cliques():
    h = T.parse_nvml(fake_nvml(nvswitch=False))
    assert labels(h)[0] == ["X", "NV4", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS"]
    assert [g.nvlink_clique for g in h.gpus] == [0, 0, 2, 2, 4, 4, 6, 6]


# --------------------------------------------------------------------------- JSON


def test_json_round_trip_of_merged_dgx():
    topo, _ = T.discover(root=DGX, nvidia_smi_text=(FIX / "dgx_h100.topo.txt").read_text())
    back = T.Topology.from_json(topo.to_json())
    assert back == topo
    assert json.loads(topo.to_json())["format"] == "jaxpace.topology/1"


def test_json_load_and_save(tmp_path):
    topo = T.Topology(hosts=(T.parse_sysfs(TWO),), source="sysfs")
    p = tmp_path / "t.json"
    topo.save(p)
    assert T.Topology.load(p) == topo


@pytest.mark.parametrize(
    "text, match",
    [
        ('{"format": "jaxpace.topology/1",\n "hosts": [\n', r"t.json:3:1: invalid JSON"),
        (
            '{"format": "other/2", "hosts": []}',
            r"t.json:1: `format`: expected 'jaxpace.topology/1'",
        ),
        (
            '{"format": "jaxpace.topology/1", "hosts": [\n {"gpus": [\n  {"index": 0},\n  {"index": 1, "numa_node": "zero"}]}]}',
            r"t.json:4: `hosts\[0\].gpus\[1\].numa_node`: expected int, got 'zero'",
        ),
        (
            '{"format": "jaxpace.topology/1", "hosts": [\n {"gpus": [{"index": 0}, {"index": 1}],\n  "gpu_links": [["X", "NV2"], ["NV2", "QPI"]]}]}',
            r"t.json:2: `hosts\[0\].gpu_links\[1\]`: unknown link class 'QPI'",
        ),
        (
            '{"format": "jaxpace.topology/1", "hosts": [\n {"gpus": [{"index": 0}, {"index": 0}]}]}',
            r"t.json:2: `hosts\[0\]`: .*repeat a GPU index",
        ),
        (
            '{"format": "jaxpace.topology/1",\n "hosts": [{"nics": [{"rate": 1}]}]}',
            r"t.json:2: `hosts\[0\].nics\[0\]`: missing required field `name`",
        ),
    ],
    ids=["truncated", "format", "type", "label", "duplicate", "missing"],
)
def test_json_malformed_names_file_and_line(text, match):
    with pytest.raises(TopologyError, match=match):
        T.Topology.from_json(text, path="t.json")


def test_json_missing_file_is_a_topology_error(tmp_path):
    with pytest.raises(TopologyError, match="cannot read topology file"):
        T.Topology.load(tmp_path / "nope.json")


# --------------------------------------------------------------------------- discover


def test_discover_merges_sysfs_with_nvidia_smi():
    topo, notes = T.discover(root=DGX, nvidia_smi_text=(FIX / "dgx_h100.topo.txt").read_text())
    (h,) = topo.hosts
    assert topo.source == "sysfs+nvidia-smi"
    assert h.gpus[3].pci_bus_id == "0000:43:00.0" and h.gpus[3].nvlink_clique == 0
    assert str(h.gpu_distance(0, 7)) == "NV18"
    assert str(h.pcie_distance(0, 7)) == "SYS"  # PCIe facts survive the merge
    assert str(h.nic_distance(0, 8)) == "NODE"  # eno1, not in the text: from sysfs
    assert any("eno1" in n for n in notes)


def test_discover_uses_nvml_when_no_text():
    topo, notes = T.discover(root=DGX, nvml=fake_nvml())
    assert topo.source == "sysfs+nvml"
    assert str(topo.hosts[0].gpu_distance(2, 5)) == "NV18"
    assert "NVML: 8 GPU(s)" in notes


def test_discover_reports_failing_nvml_and_gpu_count_mismatch():
    broken = types.SimpleNamespace(
        nvmlInit=lambda: (_ for _ in ()).throw(FakeNVMLError("no driver"))
    )
    topo, notes = T.discover(root=TWO, nvml=broken)
    assert topo.source == "sysfs"
    assert any("NVML failed: FakeNVMLError: no driver" in n for n in notes)
    topo, notes = T.discover(root=TWO, nvml=fake_nvml(n_gpus=4))
    assert all(g.nvlink_clique is None for g in topo.hosts[0].gpus)
    assert any("lists 4 GPUs but sysfs has 8" in n for n in notes)


def test_discover_without_anything_is_flat_and_says_so(tmp_path):
    topo, notes = T.discover(root=tmp_path, nvml=None)
    assert topo.is_flat and topo.hosts == ()
    assert "no NVIDIA GPUs" in notes[0]
    assert "flat topology" in notes[-1]


def test_discover_on_this_machine_does_not_fail():
    """The dev/CI machine: whatever it has, discovery returns notes and a topology."""
    topo, notes = T.discover()
    assert notes and isinstance(topo, T.Topology)


def test_discover_prefers_json_file_from_env(tmp_path, monkeypatch):
    p = tmp_path / "t.json"
    T.Topology(hosts=(T.parse_sysfs(PCIE),), source="pcie").save(p)
    monkeypatch.setenv("JAXPACE_TOPOLOGY", str(p))
    topo, notes = T.discover(root=tmp_path, nvml=None)
    assert topo.source == "pcie" and len(topo.hosts[0].gpus) == 8
    assert notes[0] == f"$JAXPACE_TOPOLOGY={p}"


def test_flat_topology_and_host_for_process():
    assert T.Topology.flat().is_flat
    t1 = T.Topology(hosts=(T.parse_sysfs(TWO),))
    assert t1.host_for_process(17) is t1.hosts[0]
    t2 = T.Topology(hosts=(t1.hosts[0], t1.hosts[0]))
    with pytest.raises(ValueError, match="2 hosts but a device belongs to process 5"):
        t2.host_for_process(5)


# --------------------------------------------------------------------------- CLI


def run_cli(argv, capsys):
    p = argparse.ArgumentParser()
    T.configure_parser(p)
    rc = T.cli_main(p.parse_args(argv))
    return rc, capsys.readouterr()


def test_cli_prints_topology_mesh_and_both_scores(capsys):
    rc, out = run_cli(
        ["--from", str(FIX / "pcie_2socket.topo.txt"), "--mesh", "2,4", "--axes", "data,model"],
        capsys,
    )
    assert rc == 0, out.err
    assert "GPU7" in out.out and "mlx5_3" in out.out
    assert "suggested mesh" in out.out
    assert "JAX default order" in out.out and "jaxpace order" in out.out
    assert "faster than JAX's default" in out.out


def test_cli_json_and_sysfs_root(capsys):
    rc, out = run_cli(["--sysfs-root", str(TWO), "--json"], capsys)
    assert rc == 0
    assert len(T.Topology.from_json(out.out).hosts[0].gpus) == 8


def test_cli_bad_input_exits_2(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": 1}')
    rc, out = run_cli(["--from", str(bad)], capsys)
    assert rc == 2 and "bad.json:1" in out.err
    rc, out = run_cli(["--from", str(FIX / "pcie_2socket.topo.txt"), "--mesh", "3,3"], capsys)
    assert rc == 2 and "`axis_shapes` (3, 3) hold 9 devices" in out.err


def test_cli_on_empty_machine(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("JAXPACE_TOPOLOGY", raising=False)
    monkeypatch.setenv("PATH", os.fspath(tmp_path))  # no nvidia-smi
    rc, out = run_cli(["--sysfs-root", str(tmp_path)], capsys)
    assert rc == 0 and "No GPU topology found" in out.out
