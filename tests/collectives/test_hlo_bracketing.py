"""Every collective of a measured call depends on the arrive probe and feeds the done probe.

Checked in the HLO: compiled for CPU (after XLA's combiners and scheduling), and lowered for
CUDA (`lower(lowering_platforms=("cuda",))`, what XLA GPU starts from; no GPU is needed to
lower). Pytrees of many leaves, large and small, mixed dtypes, with and without the
in-band exchange, every drop-in. The compiled CPU program also holds exactly the
collectives of the plain `jax.lax` program (no hidden collective).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hlo_graph import check_bracketed, count_collectives, entry_name, parse
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxpace as jp
from jaxpace.native import probes as _native

pytestmark = pytest.mark.skipif(
    not _native.available()[0], reason=f"native probes unavailable: {_native.available()[1]}"
)

N = 8
PERM = [(i, (i + 1) % N) for i in range(N)]

# name -> f(m, tree): one collective of module `m` (jax.lax or a Pacer) over axis "i".
CALLS = {
    "psum": lambda m, t: m.psum(t, "i"),
    "pmean": lambda m, t: m.pmean(t, "i"),
    "pmax": lambda m, t: m.pmax(t, "i"),
    "pmin": lambda m, t: m.pmin(t, "i"),
    "all_gather": lambda m, t: m.all_gather(t, "i", axis=0, tiled=True),
    "psum_scatter": lambda m, t: m.psum_scatter(t, "i", scatter_dimension=0, tiled=True),
    "ppermute": lambda m, t: m.ppermute(t, "i", PERM),
    "all_to_all": lambda m, t: m.all_to_all(t, "i", 0, 0, tiled=True),
}


def _tree(large: bool):
    """Per-shard leaves (first dimension a multiple of N, for scatter and all-to-all)."""
    big = (N * 32768, 8) if large else (N * 2, 3)  # 8 MiB per shard when large
    return {
        "w": jnp.ones(big, jnp.float32),
        "b": jnp.arange(N * 4, dtype=jnp.float32).reshape(N, 4),
        "h": jnp.ones((N, 5), jnp.bfloat16),
        "k": jnp.arange(N * 2, dtype=jnp.int32),
        "s": [jnp.full((N,), 2.0, jnp.float32), jnp.zeros((N, 2, 2), jnp.float32)],
    }


def _jitted(call, m, mesh, tree):
    spec = jax.tree.map(lambda _: P("i"), tree)
    f = jax.shard_map(
        lambda t: call(m, t), mesh=mesh, in_specs=(spec,), out_specs=spec, check_vma=False
    )
    return jax.jit(f)


def _sharded(mesh, large):
    tree = jax.tree.map(lambda a: jnp.concatenate([a] * N), _tree(large))
    return jax.device_put(tree, NamedSharding(mesh, P("i")))


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((N,), ("i",), devices=jax.devices()[:N])


@pytest.mark.parametrize("large", [False, True], ids=["small", "large"])
@pytest.mark.parametrize("exchange", [False, True], ids=["measure", "exchange"])
@pytest.mark.parametrize("name", list(CALLS))
def test_every_collective_is_bracketed_in_compiled_cpu_hlo(mesh, name, exchange, large):
    policy = jp.adaptive() if exchange else jp.no_pacing()
    pacer = jp.Pacer(policy, granularity="device", mesh=mesh)
    try:
        tree = _sharded(mesh, large)
        with jax.set_mesh(mesh):
            ours = _jitted(CALLS[name], pacer, mesh, tree).lower(tree).compile().as_text()
            plain = _jitted(CALLS[name], lax, mesh, tree).lower(tree).compile().as_text()
        assert "jaxpace_arrive_cpu" in ours, "the call was not measured by the native probes"
        seen, problems = check_bracketed(ours, "jaxpace_arrive_cpu", "jaxpace_done_cpu")
        assert seen > 0, "no collective found in the compiled HLO"
        assert not problems, "\n".join(problems)
        # The same collectives as lax, except that with the exchange psum/pmean carry one
        # more (tiny) operand of an all-reduce: never one collective more.
        assert count_collectives(ours) == count_collectives(plain)
    finally:
        pacer.close()


@pytest.mark.parametrize("exchange", [False, True], ids=["measure", "exchange"])
@pytest.mark.parametrize("name", list(CALLS))
def test_every_collective_is_bracketed_in_hlo_lowered_for_cuda(mesh, name, exchange):
    policy = jp.adaptive() if exchange else jp.no_pacing()
    pacer = jp.Pacer(policy, granularity="device", mesh=mesh)
    try:
        tree = _sharded(mesh, large=True)
        with jax.set_mesh(mesh):
            traced = _jitted(CALLS[name], pacer, mesh, tree).trace(tree)
            text = traced.lower(lowering_platforms=("cuda",)).as_text(dialect="hlo")
        assert "jaxpace_arrive_cuda" in text, "the CUDA lowering holds no native probe"
        seen, problems = check_bracketed(text, "jaxpace_arrive_cuda", "jaxpace_done_cuda")
        assert seen > 0, "no collective found in the HLO lowered for CUDA"
        assert not problems, "\n".join(problems)
        # One collective per array leaf on GPU before any combiner (what stays separate
        # above the combiner's threshold), plus the payload's operand with the exchange.
        n_leaves = len(jax.tree.leaves(tree))
        assert seen >= n_leaves or name in ("psum", "pmean", "pmax", "pmin")
    finally:
        pacer.close()


@pytest.mark.parametrize("name", list(CALLS))
def test_probes_take_the_leaves_themselves_as_operands(mesh, name):
    """No work on the data for the probes: the compiled CPU program passes the operand
    leaves to `arrive` and the collective's results to `done` as they are, so it holds no
    slice or concatenation that the `jax.lax` program does not (a measured call costs its
    two custom calls and one tie per leaf; nothing per leaf on the probes' side)."""
    pacer = jp.Pacer(jp.no_pacing(), granularity="device", mesh=mesh)
    try:
        tree = _sharded(mesh, large=False)
        with jax.set_mesh(mesh):
            text = _jitted(CALLS[name], pacer, mesh, tree).lower(tree).compile().as_text()
            ours = parse(text)
            plain = parse(_jitted(CALLS[name], lax, mesh, tree).lower(tree).compile().as_text())

        def data_ops(comps):
            ops = [i["op"] for c in comps.values() for i in c.values()]
            return {k: ops.count(k) for k in ("concatenate", "slice", "dynamic-slice")}

        entry = ours[entry_name(text)]
        probes = [n for n, i in entry.items() if (i["target"] or "").startswith("jaxpace_")]
        assert len(probes) == 2, probes
        n_leaves = len(jax.tree.leaves(tree))
        for p in probes:
            # arrive: the rank and every leaf; done: payload, step tag, rank and every output.
            assert len(entry[p]["deps"]) >= n_leaves + 1, (p, entry[p]["deps"])
        assert data_ops(ours) == data_ops(plain)
    finally:
        pacer.close()


def test_the_checker_finds_an_unbracketed_collective(mesh):
    """The check can fail: a lax collective beside a measured one is reported."""
    pacer = jp.Pacer(jp.no_pacing(), granularity="device", mesh=mesh)
    try:
        x = jax.device_put(jnp.ones((N * 4,)), NamedSharding(mesh, P("i")))

        def body(v):
            return pacer.psum(v, "i") + lax.psum(v * 2, "i")

        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
        with jax.set_mesh(mesh):
            text = f.lower(x).as_text(dialect="hlo")
        seen, problems = check_bracketed(text, "jaxpace_arrive_cpu", "jaxpace_done_cpu")
        assert seen == 2
        assert len(problems) == 2 and all("all-reduce" in p for p in problems), problems
    finally:
        pacer.close()


def test_values_stay_bitwise_with_every_leaf_tied(mesh):
    """Tying every leaf keeps every output bit (−0.0, NaN payloads, ints, bf16)."""
    pacer = jp.Pacer(jp.adaptive(), granularity="device", mesh=mesh)
    try:
        tree = _tree(large=False)
        tree["w"] = tree["w"].at[0, 0].set(-0.0).at[1, 1].set(np.nan)
        tree = jax.tree.map(lambda a: jnp.concatenate([a] * N), tree)
        tree = jax.device_put(tree, NamedSharding(mesh, P("i")))
        with jax.set_mesh(mesh):
            for name in ("psum", "pmean", "all_gather", "ppermute"):
                ours = _jitted(CALLS[name], pacer, mesh, tree)(tree)
                plain = _jitted(CALLS[name], lax, mesh, tree)(tree)
                for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(plain), strict=True):
                    assert np.asarray(a).view(np.uint8).tobytes() == (
                        np.asarray(b).view(np.uint8).tobytes()
                    ), name
    finally:
        pacer.close()


@pytest.mark.parametrize("exchange", [False, True], ids=["measure", "exchange"])
@pytest.mark.parametrize("name", ["psum", "pmean", "all_gather", "ppermute", "all_to_all"])
def test_io_callback_probes_bracket_every_collective_too(mesh, name, exchange):
    """The fallback probes (host callbacks inside a `cond`, forced by a custom clock)."""
    import time

    policy = jp.adaptive() if exchange else jp.no_pacing()
    pacer = jp.Pacer(policy, granularity="device", mesh=mesh, clock=time.perf_counter_ns.__call__)
    try:
        tree = _sharded(mesh, large=False)
        with jax.set_mesh(mesh):
            text = _jitted(CALLS[name], pacer, mesh, tree).lower(tree).compile().as_text()
        target = "xla_ffi_python_cpu_callback"
        assert target in text
        seen, problems = check_bracketed(text, target, target)
        assert seen > 0 and not problems, problems
    finally:
        pacer.close()


def _fused_root_and_slices(text: str, comp: str) -> tuple[str, int]:
    """`(opcode of the fused computation's ROOT, how many slices it holds)`."""
    body = text.split(f"\n%{comp} ", 1)[1].split("\n}", 1)[0]
    root = re.search(r"ROOT %\S+ = \S+ ([\w\-]+)\(", body)
    return (root.group(1) if root else ""), len(re.findall(r" (?:dynamic-)?slice\(", body))


@pytest.mark.parametrize("exchange", [False, True], ids=["measure", "exchange"])
def test_a_large_leaf_is_tied_in_place_from_the_probes_copy_of_its_first_element(mesh, exchange):
    """A leaf above `IN_PLACE_BYTES` (a matmul's result, as a large gradient is) is tied by
    a one-element `dynamic-update-slice` whose update is the arrive probe's own output (the
    leaf's first element, returned in the same buffer): nothing else in that kernel reads
    the leaf, which is what lets XLA write it in place instead of making a pass over it
    (a slice of the leaf fused beside the update made XLA copy the whole leaf)."""
    policy = jp.adaptive() if exchange else jp.no_pacing()
    pacer = jp.Pacer(policy, granularity="device", mesh=mesh)

    def step(m):
        body = lambda a, b: m.psum(jnp.dot(a, b), "i")  # noqa: E731
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("i"), P()), out_specs=P()))

    try:
        a = jax.device_put(jnp.ones((N * 64, 64)), NamedSharding(mesh, P("i")))
        b = jax.device_put(jnp.ones((64, 2048)), NamedSharding(mesh, P()))  # 512 KiB a shard
        with jax.set_mesh(mesh):
            text = step(pacer).lower(a, b).compile().as_text()
            ours, plain = np.asarray(step(pacer)(a, b)), np.asarray(step(lax)(a, b))
        assert ours.tobytes() == plain.tobytes()
        entry = parse(text)[entry_name(text)]
        arrive = [n for n, i in entry.items() if i["target"] == "jaxpace_arrive_cpu"]
        assert len(arrive) == 1, arrive
        from_probe = {n for n, i in entry.items() if i["op"] == "get-tuple-element"}
        from_probe = {n for n in from_probe if arrive[0] in entry[n]["deps"]}
        leaf = re.compile(r"f32\[64,2048\]")
        writers = []
        for line in text.split("ENTRY", 1)[1].split("\n}", 1)[0].splitlines():
            m = re.match(r"\s*(?:ROOT )?%(\S+) = (\S+) ([\w\-]+)\(", line)
            if not m or not leaf.match(m.group(2)):
                continue
            name, op = m.group(1), m.group(3)
            if op == "dynamic-update-slice":
                writers.append((name, "dynamic-update-slice", 0))
            elif op == "fusion":
                comp = re.search(r"calls=%([\w.\-]+)", line).group(1)
                root, slices = _fused_root_and_slices(text, comp)
                if root == "dynamic-update-slice":
                    writers.append((name, root, slices))
        assert len(writers) == 1, f"expected one tie of the large leaf, found {writers}"
        name, _, slices = writers[0]
        assert entry[name]["deps"] & from_probe, "the tie's update does not come from the probe"
        assert slices == 0, "the tie's kernel also slices the leaf: XLA cannot write it in place"
    finally:
        pacer.close()


@pytest.mark.parametrize(
    "name,call",
    [
        ("all_gather axis 1", lambda m, x: m.all_gather(x, "i", axis=1, tiled=True)),
        ("all_gather axis 1, untiled", lambda m, x: m.all_gather(x, "i", axis=1)),
        (
            "psum_scatter dim 1",
            lambda m, x: m.psum_scatter(x, "i", scatter_dimension=1, tiled=True),
        ),
        (
            "psum_scatter dim 2",
            lambda m, x: m.psum_scatter(x.reshape(4, 4, -1), "i", scatter_dimension=2, tiled=True),
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_done_takes_a_minor_dimension_collectives_result_as_xla_lays_it_out(mesh, name, call):
    """XLA:CPU lays an all-gather's or reduce-scatter's result out with that dimension most
    major; the done probe asks for its operand in that layout, so no kernel copies the
    result to row-major for a probe that never reads it (the FSDP step's reduce-scatter half
    had four such copies)."""
    del name
    pacer = jp.Pacer(jp.no_pacing(), granularity="device", mesh=mesh)

    def step(m):
        body = lambda x: call(m, x * 2.0) * 3.0  # noqa: E731
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))

    try:
        x = jax.device_put(
            jnp.arange(N * 16 * 64.0).reshape(N * 16, 64), NamedSharding(mesh, P("i"))
        )
        with jax.set_mesh(mesh):
            text = step(pacer).lower(x).compile().as_text()
            ours, plain = np.asarray(step(pacer)(x)), np.asarray(step(lax)(x))
        assert ours.tobytes() == plain.tobytes()
        assert check_bracketed(text, "jaxpace_arrive_cpu", "jaxpace_done_cpu")[1] == []
        entry = parse(text)[entry_name(text)]
        done = [i for i in entry.values() if i["target"] == "jaxpace_done_cpu"]
        assert len(done) == 1, done
        fed_by = {entry[d]["op"] for d in done[0]["deps"] if d in entry}
        assert fed_by & {"all-gather", "reduce-scatter"}, fed_by
        assert "fusion" not in fed_by and "copy" not in fed_by, fed_by
    finally:
        pacer.close()
