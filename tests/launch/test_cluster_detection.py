"""`init_from_env()` joins the cluster JAX's own detection finds, for every cluster type JAX knows.

Each case fakes one cluster's environment (variables, and the metadata or API
calls that cluster type makes) and replaces only what would connect: the
distributed runtime service and client of `jax._src.distributed`. JAX's own
`jax.distributed.initialize()` and its cluster classes run for real, so the
address, process count and id below are what JAX derived from the environment.
"""

import importlib.machinery
import logging
import sys
import types

import jax
import pytest

import jaxpace as jp

CLUSTER_VARS = (
    "JAX_COORDINATOR_ADDRESS", "JAX_LOCAL_DEVICE_IDS", "JAX_COORDINATOR_PORT",
    "SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID",
    "SLURM_STEP_NUM_NODES", "OMPI_MCA_orte_hnp_uri", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "KUBERNETES_SERVICE_HOST",
    "JOB_COMPLETION_INDEX", "TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES", "TPU_WORKER_ID",
    "TPU_SKIP_MDS_QUERY", "MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_NUM_SLICES",
    "MEGASCALE_SLICE_ID", "JAXPACE_NUM_PROCESSES", "JAXPACE_COORDINATOR", "JAXPACE_PROCESS_ID",
    "JAXPACE_LOCAL_DEVICES",
)  # fmt: skip


class _Anything:
    """Stands in for the runtime objects JAX calls methods on after connecting."""

    def __getattr__(self, name):
        return lambda *a, **k: None


class _FakeRuntime:
    """Replaces `jax._src.distributed._jax`: records what would have connected."""

    def __init__(self):
        self.service = None
        self.client = None

    def get_distributed_runtime_service(self, address, num_processes, **kw):
        self.service = (address, num_processes)
        return _Anything()

    def get_distributed_runtime_client(self, address, process_id, **kw):
        self.client = (address, process_id, kw)
        return _Anything()

    def __getattr__(self, name):
        return lambda *a, **k: _Anything()


@pytest.fixture
def fake(monkeypatch):
    from jax._src import distributed, xla_bridge

    for var in CLUSTER_VARS:
        monkeypatch.delenv(var, raising=False)
    rt = _FakeRuntime()
    monkeypatch.setattr(distributed, "_jax", rt)
    monkeypatch.setattr(distributed, "global_state", distributed.State())
    # This test process started its (8 CPU device) backend already; JAX would refuse.
    monkeypatch.setattr(xla_bridge, "backends_are_initialized", lambda: False)
    names = ("jax_cuda_visible_devices", "jax_rocm_visible_devices")
    visible = {n: jax.config.read(n) for n in names}
    yield rt
    for n, v in visible.items():  # JAX sets them from the cluster's local device ids
        jax.config.update(n, v)


def test_no_cluster_runs_as_one_process(fake, caplog):
    with caplog.at_level(logging.INFO, "jaxpace"):
        assert jp.launch.init_from_env() == (0, 1)
    assert fake.client is None and fake.service is None
    assert "found no cluster" in caplog.text


def test_slurm(fake, monkeypatch):
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_NODELIST": "node[003-006]",
        "SLURM_NTASKS": "4",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    jp.launch.init_from_env()
    port = 4242 % 2**12 + (65535 - 2**12 + 1)
    assert fake.service == (f"[::]:{port}", 4)
    assert fake.client[:2] == (f"node003:{port}", 0)


def test_slurm_single_task_stays_one_process(fake, monkeypatch):
    for k, v in {"SLURM_JOB_ID": "1", "SLURM_STEP_NODELIST": "n1", "SLURM_NTASKS": "1",
                 "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}.items():  # fmt: skip
        monkeypatch.setenv(k, v)
    assert jp.launch.init_from_env() == (0, 1)
    assert fake.client is None


def test_open_mpi(fake, monkeypatch):
    monkeypatch.setenv("OMPI_MCA_orte_hnp_uri", "1531576320.0;tcp://10.96.0.1,10.148.0.1:34911")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1")
    jp.launch.init_from_env()
    assert fake.service is None  # not process 0
    address, process_id, _ = fake.client
    assert address.startswith("10.96.0.1:") and process_id == 3


def _fake_module(monkeypatch, name, **attrs):
    m = types.ModuleType(name)
    m.__spec__ = importlib.machinery.ModuleSpec(name, None)
    for k, v in attrs.items():
        setattr(m, k, v)
    monkeypatch.setitem(sys.modules, name, m)
    return m


def test_kubernetes_jobset(fake, monkeypatch):
    import socket

    from jax._src.clusters import k8s_cluster

    ns = types.SimpleNamespace
    client = ns(
        CoreV1Api=lambda: None, BatchV1Api=lambda: None, exceptions=ns(ApiException=Exception)
    )
    _fake_module(monkeypatch, "kubernetes", config=ns(load_incluster_config=lambda: None),
                 client=client)  # fmt: skip
    job = ns(
        metadata=ns(name="train-workers-0", labels={"jobset.sigs.k8s.io/jobset-name": "train"}),
        spec=ns(parallelism=8),
    )
    pod = ns(metadata=ns(owner_references=[ns(controller=True, kind="Job")]))
    cls = k8s_cluster.K8sCluster
    monkeypatch.setattr(cls, "_job", classmethod(lambda c: job), raising=False)
    monkeypatch.setattr(cls, "_pod", classmethod(lambda c: pod), raising=False)
    monkeypatch.setattr(cls, "_controller", classmethod(lambda c: pod.metadata.owner_references[0]))
    monkeypatch.setattr(socket, "gethostbyname", lambda host: "10.0.0.7")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "5")
    jp.launch.init_from_env()
    assert fake.client[:2] == ("train-workers-0-0.train:55527", 5)


def test_kubernetes_without_its_package_is_one_process_with_jaxs_warning(fake, monkeypatch):
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # import fails
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    with pytest.warns(UserWarning, match="kubernetes"):
        assert jp.launch.init_from_env() == (0, 1)
    assert fake.client is None


def _tpu_vm(monkeypatch, metadata):
    import socket

    from jax._src.clusters import cloud_tpu_cluster, cluster

    monkeypatch.setattr(cloud_tpu_cluster, "running_in_cloud_tpu_vm", True)
    monkeypatch.setattr(cluster, "running_in_cloud_tpu_vm", True)
    monkeypatch.setattr(cloud_tpu_cluster, "get_metadata", lambda key: metadata.get(key, ("", 404)))
    monkeypatch.setattr(socket, "gethostbyname", lambda host: "10.0.0.9")


def test_gke_tpu(fake, monkeypatch):
    _tpu_vm(monkeypatch, {})
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "tpu-0,tpu-1,tpu-2,tpu-3")
    monkeypatch.setenv("TPU_WORKER_ID", "2")
    monkeypatch.setenv("MEGASCALE_NUM_SLICES", "2")
    monkeypatch.setenv("MEGASCALE_SLICE_ID", "1")
    monkeypatch.setenv("MEGASCALE_COORDINATOR_ADDRESS", "tpu-0")
    jp.launch.init_from_env()
    assert fake.client[:2] == ("tpu-0:8482", 6)  # 2 + slice 1 * 4 workers per slice


def test_gce_tpu(fake, monkeypatch):
    _tpu_vm(
        monkeypatch,
        {
            "agent-worker-number": ("1", 200),
            "worker-network-endpoints": ("w0:x:10.1.0.2,w1:x:10.1.0.3", 200),
            "tpu-env": ("", 200),
        },
    )
    jp.launch.init_from_env()
    assert fake.client[:2] == ("10.1.0.2:8482", 1)


def test_mpi4py_when_asked(fake, monkeypatch):
    ns = types.SimpleNamespace
    world = ns(
        Get_rank=lambda: 1,
        Get_size=lambda: 2,
        bcast=lambda value, root: "host0:1234",
        Split_type=lambda kind: ns(Get_rank=lambda: 0),
    )
    _fake_module(monkeypatch, "mpi4py", MPI=ns(COMM_WORLD=world, COMM_TYPE_SHARED=1))
    jp.launch.init_from_env()  # mpi4py is opt-in in JAX: not used unless asked
    assert fake.client is None
    jp.launch.init_from_env(cluster_detection_method="mpi4py")
    assert fake.client[:2] == ("host0:1234", 1)


def test_jaxpace_launch_variables_are_kept(fake, monkeypatch):
    monkeypatch.setenv("JAXPACE_NUM_PROCESSES", "2")
    monkeypatch.setenv("JAXPACE_COORDINATOR", "127.0.0.1:12345")
    monkeypatch.setenv("JAXPACE_PROCESS_ID", "1")
    # A cluster around the launcher does not take over: the launcher's job is joined.
    monkeypatch.setenv("OMPI_MCA_orte_hnp_uri", "1.0;tcp://10.96.0.1:34911")
    jp.launch.init_from_env()
    address, process_id, kw = fake.client
    assert (address, process_id) == ("127.0.0.1:12345", 1)
    assert kw["heartbeat_timeout"] == 10 and kw["init_timeout"] == 60


def test_explicit_but_incomplete_coordinator_is_an_error(fake, monkeypatch):
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
    with pytest.raises(ValueError, match="Number of processes"):
        jp.launch.init_from_env()
