"""Canaries: each JAX-internal access in `jaxpace._jax_compat` still works on the installed jax.

A failure here means a JAX release moved an internal: fix `_jax_compat.py`,
do not loosen the test.
"""

import os

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from jaxpace import _jax_compat as compat

MESH = jax.make_mesh((8,), ("data",))


def test_bound_axis_sizes_sees_shard_map_axes():
    seen = {}

    def f(x):
        seen.update(compat.bound_axis_sizes() or {})
        return x

    x = jax.device_put(jnp.zeros(8), jax.NamedSharding(MESH, P("data")))
    jax.jit(jax.shard_map(f, mesh=MESH, in_specs=P("data"), out_specs=P("data")))(x)
    assert seen == {"data": 8}


def test_concrete_mesh_sees_set_mesh():
    assert compat.concrete_mesh() is None
    with jax.set_mesh(MESH):
        m = compat.concrete_mesh()
    assert m is not None and tuple(m.axis_names) == ("data",)


def test_is_unknown_tracer_sees_transposed_operands():
    kinds = []

    def f(x):
        kinds.append(compat.is_unknown_tracer(x))
        return x * 2.0

    jax.linear_transpose(f, 1.0)(1.0)  # traced with an unknown (linear) input
    f(1.0)
    assert kinds == [True, False]


def test_distributed_client_is_none_single_process():
    from jax._src import distributed

    assert hasattr(distributed.global_state, "client")
    assert compat.distributed_client() is None


def test_inside_remat_detects_checkpoint():
    seen = []

    def f(x):
        seen.append(compat.inside_remat())
        return jnp.sin(x)

    jax.grad(jax.checkpoint(f))(1.0)
    f(1.0)
    assert seen[0] is True and seen[-1] is False
    import jax._src.ad_checkpoint as ac

    assert ac.__file__.endswith(compat.REMAT_FILE)
    assert os.path.exists(ac.__file__)


def test_distributed_client_offers_what_the_stall_watchdog_calls():
    cls = compat.distributed_client_type()
    assert cls is not None
    for name in compat.KV_METHODS:
        assert callable(getattr(cls, name, None)), name
    # Entries are rewritten in place: `key_value_set(key, value, allow_overwrite)`.
    assert "allow_overwrite" in (cls.key_value_set.__doc__ or "")
    assert "list[tuple[str, str]]" in (cls.key_value_dir_get.__doc__ or "")


def test_hlo_dialect_builds_the_ops_the_probe_lowering_emits():
    hlo = compat.hlo_dialect()
    for name in ("compare", "select", "broadcast_in_dim", "ComparisonDirectionAttr"):
        assert callable(getattr(hlo, name)), name


def test_partial_eval_has_the_rule_tables_the_probes_register_in():
    pe = compat.partial_eval()
    assert isinstance(pe.partial_eval_jaxpr_custom_rules, dict)
    assert isinstance(pe.dce_rules, dict)
    assert callable(pe.dce_jaxpr)


def test_jaxpr_var_type_is_what_a_jaxpr_binds():
    import jax

    Var = compat.jaxpr_var_type()  # noqa: N806
    jaxpr = jax.make_jaxpr(lambda x: x + 1)(1.0).jaxpr
    assert all(isinstance(v, Var) for v in jaxpr.invars)


def test_coordination_service_and_clients_start_in_process_and_share_keys():
    import socket
    import threading

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    addr = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()
    service = compat.coordination_service(addr, 2)
    clients = [None, None]

    def connect(i):
        clients[i] = compat.coordination_client(addr, i, timeout_s=30)

    threads = [threading.Thread(target=connect, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert None not in clients
        assert isinstance(clients[0], compat.distributed_client_type())
        clients[0].key_value_set("canary/p0", "a", True)
        clients[0].key_value_set("canary/p0", "b", True)  # overwritten in place
        assert clients[1].key_value_dir_get("canary/") == [("canary/p0", "b")]
    finally:
        for c in clients:
            if c is not None:
                c.shutdown()
        service.shutdown()


def test_jit_keyed_flag_gives_a_jit_function_one_program_per_value():
    from jaxpace.collectives import measure

    traced = []

    @jax.jit
    def f(x):
        traced.append(measure._PASS_THROUGH.value)
        return x + (1 if measure._PASS_THROUGH.value else 2)

    x = jnp.zeros(())
    with measure.pass_through(True):
        assert int(f(x)) == 1
    assert int(f(x)) == 2
    with measure.pass_through(True):
        assert int(f(x)) == 1  # cached, not retraced
    assert traced == [True, False]


def test_flag_setters_set_and_restore_a_jit_keyed_flag_as_its_context_does():
    """Watch's per-call path: `State.swap_local` / `State.set_local` (what the context
    manager calls); nested uses restore in order, and a jit function keeps one program per
    value as under the context."""
    from jaxpace.collectives import measure

    flag = measure._PASS_THROUGH
    set_, restore = compat.flag_setters(flag)
    # This JAX's own methods (the canary), not the context-manager fallback:
    assert (set_.__name__, restore.__name__) == ("swap_local", "set_local")
    assert set_.__self__ is flag and restore.__self__ is flag

    @jax.jit
    def f(x):
        return x + (1 if flag.value else 2)

    x = jnp.zeros(())
    prev = set_(True)
    assert flag.value is True and int(f(x)) == 1
    inner = set_(False)
    assert flag.value is False and int(f(x)) == 2
    restore(inner)
    assert flag.value is True and int(f(x)) == 1
    restore(prev)
    assert flag.value is False
    with measure.pass_through(True):
        assert int(f(x)) == 1


def test_flag_setters_fall_back_to_the_context_manager_of_another_jax():
    entered = []

    class Cm:
        def __init__(self, v):
            self.v = v

        def __enter__(self):
            entered.append(self.v)

        def __exit__(self, *exc):
            entered.append(("exit", self.v))

    set_, restore = compat.flag_setters(Cm)  # (no swap_local: a context manager factory)
    token = set_(True)
    restore(token)
    assert entered == [True, ("exit", True)]


def test_profiler_stop_collect_ends_the_session_and_exports_on_another_thread(tmp_path_factory):
    """watch's split stop: the step's thread collects, another thread writes the files
    `stop_trace` would have; a new session can start right after the collection."""
    import threading

    from jaxpace.records.sources import xprof

    tmp_path, other = tmp_path_factory.mktemp("window"), tmp_path_factory.mktemp("other")
    x = jax.device_put(jnp.ones(8), jax.NamedSharding(MESH, P("data")))
    g = jax.jit(lambda v: v.sum())  # an all-reduce the partitioner inserts
    jax.block_until_ready(g(x))
    if compat.profile_session(None) is not None:
        pytest.skip(
            "this JAX has the public ProfileSession, which watch uses instead "
            "(test_public_profile_session_collects_then_exports_on_another_thread)"
        )
    jax.profiler.start_trace(str(tmp_path))
    jax.block_until_ready(g(x))
    got = compat.profiler_stop_collect()
    assert got is not None, "jax.profiler's session state moved: fix _jax_compat"
    session, xspace, log_dir = got
    assert isinstance(xspace, bytes) and xspace and log_dir == str(tmp_path)
    jax.profiler.start_trace(str(other))  # the state was reset
    jax.profiler.stop_trace()
    t = threading.Thread(target=session.export, args=(xspace, log_dir))
    t.start()
    t.join(60)
    assert list(tmp_path.glob("plugins/profile/*/*.trace.json.gz"))
    loaded = xprof.load(tmp_path)
    assert loaded.records.columns["site"].size > 0


def test_public_profile_session_collects_then_exports_on_another_thread(tmp_path_factory):
    """watch's split stop on a JAX with the public `jax.profiler.ProfileSession` (0.12): a
    session without `log_dir` collects on the step's thread, the files `stop_trace` would
    have are written on another; while it runs a second session is refused as watch
    expects ("already"). On JAX 0.10 (no such API) `profile_session` is None and watch
    uses `profiler_stop_collect`, whose canary is the test above."""
    import threading

    from jaxpace.records.sources import xprof

    got = compat.profile_session(None)
    if not hasattr(jax.profiler, "ProfileSession"):
        assert got is None  # JAX 0.10: the internal path, checked above
        return
    assert got is not None, "jax.profiler.ProfileSession without export_profile_data: fix"
    session, exporter = got
    tmp_path = tmp_path_factory.mktemp("window")
    x = jax.device_put(jnp.ones(8), jax.NamedSharding(MESH, P("data")))
    g = jax.jit(lambda v: v.sum())
    jax.block_until_ready(g(x))
    session.start()
    with pytest.raises(RuntimeError, match="already"):
        jax.profiler.start_trace(str(tmp_path_factory.mktemp("other")))
    jax.block_until_ready(g(x))
    data = session.stop()
    assert data is not None and not list(tmp_path.iterdir())  # collected, nothing written
    t = threading.Thread(target=exporter.export, args=(data, str(tmp_path)))
    t.start()
    t.join(60)
    loaded = xprof.load(tmp_path)
    assert loaded.records.columns["site"].size > 0
