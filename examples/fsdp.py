r"""A transformer block trained with FSDP + tensor parallelism, every collective a jaxpace drop-in.

A 2 x 4 mesh (`data`, `model`) in `jax.shard_map`: each weight is split over `model`
(tensor parallelism: attention heads and MLP columns) and over `data` (FSDP). Per layer
the weights are all-gathered over `data` (`jaxpace.all_gather`), the attention and MLP
outputs are summed over `model` (`jaxpace.psum`), the gradients of the gathered weights
are reduce-scattered back to their shards (`jaxpace.psum_scatter`), and the loss is
averaged over `data` (`jaxpace.pmean`). Plain JAX, synthetic data, a few steps. The
step is two jitted calls (forward/backward, then reduce-scatter/update), so that
`--lag-process` can make one process late at both:

    python examples/fsdp.py --steps 8                        # 1 process, 8 CPU devices
    jaxpace launch -n 4 --local-devices 2 -- python examples/fsdp.py \
        --lag-process 1 --lag-s 0.2 --steps 24
    jaxpace report run/fsdp                                   # who was late, where

`--collective lax` runs the same step with `jax.lax` (the overhead benchmark compares).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

D, HEADS, FF, SEQ, LAYERS = 64, 4, 128, 16, 2
# weight -> the axis it is split along over `data` (FSDP); the other one is split over
# `model` (tensor parallelism): q/k/v/w1 by columns, o/w2 by rows.
FSDP_AXIS = {"q": 0, "k": 0, "v": 0, "o": 1, "w1": 0, "w2": 1}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch-per-replica", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--collective", choices=["jaxpace", "lax"], default="jaxpace")
    p.add_argument("--lag-process", type=int, default=-1, help="this process starts late")
    p.add_argument("--lag-s", type=float, default=0.05, help="how late, per step")
    p.add_argument("--local-devices", type=int, default=8, help="CPU devices, 1 process")
    p.add_argument("--out", default="run/fsdp", help="directory for records and results")
    return p.parse_args(argv)


def init_params(key):
    """Global weights, per layer: q, k, v, o (D x D), w1 (D x FF), w2 (FF x D)."""
    import jax

    shapes = {"q": (D, D), "k": (D, D), "v": (D, D), "o": (D, D), "w1": (D, FF), "w2": (FF, D)}
    layers = []
    for layer in range(LAYERS):
        keys = jax.random.split(jax.random.fold_in(key, layer), len(shapes))
        layers.append(
            {
                n: jax.random.normal(k, s) * (1.0 / s[0] ** 0.5)
                for k, (n, s) in zip(keys, shapes.items(), strict=True)
            }
        )
    return layers


def param_specs():
    """FSDP over `data` on `FSDP_AXIS`, tensor parallelism over `model` on the other axis."""
    from jax.sharding import PartitionSpec as P

    spec = {n: P("data", "model") if a == 0 else P("model", "data") for n, a in FSDP_AXIS.items()}
    return [dict(spec) for _ in range(LAYERS)]


def _rms(x):
    import jax.numpy as jnp

    return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)


def _enter_model(c, site: str):
    """Megatron's `f` operator for `c`: the identity forward (typed as varying over `model`);
    backward, the activations' gradient summed over `model` by `c.psum`. Autodiff would
    insert a plain all-reduce there (the transpose of the implicit `pvary`), out of reach
    of any drop-in."""
    import jax

    @jax.custom_vjp
    def enter(h):
        return jax.lax.pcast(h, "model", to="varying")

    def fwd(h):
        return enter(h), None

    def bwd(_, ct):
        return (c.psum(ct, "model", **_site(c, site)),)

    enter.defvjp(fwd, bwd)
    return enter


def block(w, x, c, layer):
    """One pre-norm transformer layer on this shard's heads and MLP columns."""
    import jax
    import jax.numpy as jnp

    h = _enter_model(c, f"tp-attn{layer}-grad")(_rms(x))
    b, s, _ = x.shape
    q, k, v = (jnp.dot(h, w[n]).reshape(b, s, -1, D // HEADS) for n in ("q", "k", "v"))
    att = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / (D // HEADS) ** 0.5, axis=-1)
    ctx = jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, s, -1)
    x = x + c.psum(jnp.dot(ctx, w["o"]), "model", **_site(c, f"tp-attn{layer}"))
    h = _enter_model(c, f"tp-mlp{layer}-grad")(_rms(x))
    return x + c.psum(
        jnp.dot(jax.nn.gelu(jnp.dot(h, w["w1"])), w["w2"]), "model", **_site(c, f"tp-mlp{layer}")
    )


def _site(c, name):
    """`site=` for jaxpace, nothing for `jax.lax`."""
    return {} if getattr(c, "__name__", "") == "jax.lax" else {"site": name}


def grad_step(c, shards, x, y):
    """All-gather each layer's weights, then the loss and its gradients on this shard's data.

    `c` is `jaxpace` or `jax.lax`. Returns the local gradients of the gathered weights
    (not yet reduced) and the loss averaged over `data`.
    """
    import jax
    import jax.numpy as jnp

    full = []
    for layer, ws in enumerate(shards):
        col = {n: ws[n] for n in ws if FSDP_AXIS[n] == 0}
        row = {n: ws[n] for n in ws if FSDP_AXIS[n] == 1}
        col = c.all_gather(col, "data", axis=0, tiled=True, **_site(c, f"ag-in{layer}"))
        row = c.all_gather(row, "data", axis=1, tiled=True, **_site(c, f"ag-out{layer}"))
        full.append({**col, **row})
    # all_gather's result stays typed as varying over `data` (lax's default `to="varying"`),
    # so autodiff adds no all-reduce of its own: the gradients stay local until the
    # reduce-scatter.

    def loss_fn(ws):
        h = x
        for layer, w in enumerate(ws):
            h = block(w, h, c, layer)
        return jnp.mean((h - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(full)
    return grads, c.pmean(loss, "data", **_site(c, "loss"))


def update_step(c, shards, grads, lr):
    """Reduce-scatter each layer's gradients back to the weight shards; one SGD step."""
    import jax

    n_data = jax.lax.axis_size("data")
    new = []
    for layer, (ws, gs) in enumerate(zip(shards, grads, strict=True)):
        col = {n: gs[n] for n in gs if FSDP_AXIS[n] == 0}
        row = {n: gs[n] for n in gs if FSDP_AXIS[n] == 1}
        col = c.psum_scatter(
            col, "data", scatter_dimension=0, tiled=True, **_site(c, f"rs-in{layer}")
        )
        row = c.psum_scatter(
            row, "data", scatter_dimension=1, tiled=True, **_site(c, f"rs-out{layer}")
        )
        g = {**col, **row}
        new.append({n: ws[n] - lr * g[n] / n_data for n in ws})
    return new


def make_step(mesh, collective, lr: float, donate: bool = True):
    """`step(params, x, y, lag_s=0.0) -> (params, loss)` with `collective` "jaxpace", "lax" or
    a `jaxpace.Pacer`: the forward/backward half and the
    reduce-scatter/update half, two jitted calls; `lag_s` is slept before each (a late
    process reaches both the all-gathers and the reduce-scatters late)."""
    import jax
    from jax.sharding import PartitionSpec as P

    if collective == "jaxpace":
        import jaxpace as c
    elif collective == "lax":
        c = jax.lax
    else:
        c = collective  # a `jaxpace.Pacer`
    specs = param_specs()
    # A gradient has the gathered weight's shape on each device: the same specs lay the
    # `data` replicas' gradients side by side along the FSDP axis.
    grads_fn = jax.jit(
        jax.shard_map(
            lambda s, x, y: grad_step(c, s, x, y),
            mesh=mesh,
            in_specs=(specs, P("data"), P("data")),
            out_specs=(specs, P()),
        )
    )
    update_fn = jax.jit(
        jax.shard_map(
            lambda s, g: update_step(c, s, g, lr),
            mesh=mesh,
            in_specs=(specs, specs),
            out_specs=specs,
        ),
        donate_argnums=0 if donate else (),
    )

    def step(params, x, y, lag_s=0.0):
        # Each half runs to completion before the next starts, so a host delay before a
        # half is a late arrival at its first collective (not hidden behind queued work).
        if lag_s > 0:
            time.sleep(lag_s)
        grads, loss = jax.block_until_ready(grads_fn(params, x, y))
        if lag_s > 0:
            time.sleep(lag_s)
        return jax.block_until_ready(update_fn(params, grads)), loss

    step.halves = (grads_fn, update_fn)  # for inspection (tests, benchmarks)
    return step


def make_data(mesh, batch_per_replica: int, steps: int):
    """Synthetic regression: targets from a fixed random map of the inputs (same at any
    process count: each process builds only its shards from the same global arrays)."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    n = batch_per_replica * mesh.shape["data"]
    teacher = np.random.default_rng(1).standard_normal((D, D)).astype(np.float32) / D**0.5
    sh = NamedSharding(mesh, P("data"))
    out = []
    for k in range(steps):
        x = np.random.default_rng((2, k)).standard_normal((n, SEQ, D)).astype(np.float32)
        y = np.tanh(x @ teacher).astype(np.float32)
        out.append(
            tuple(jax.make_array_from_callback(a.shape, sh, lambda i, a=a: a[i]) for a in (x, y))
        )
    return out


def _place(tree, shardings):
    """Each process builds only its shards of the (same) global weights."""
    import jax
    import numpy as np

    def place(a, sharding):
        host = np.asarray(a)
        return jax.make_array_from_callback(host.shape, sharding, lambda i: host[i])

    return jax.tree.map(place, tree, shardings)


def main(argv=None) -> int:
    args = parse_args(argv)
    import jax

    from jaxpace import launch

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if "JAXPACE_LOCAL_DEVICES" not in os.environ:
        jax.config.update("jax_num_cpu_devices", args.local_devices)
    pid, _ = launch.init_from_env(platform="cpu")
    import numpy as np
    from jax.sharding import NamedSharding

    import jaxpace

    mesh = jax.make_mesh((2, 4), ("data", "model"))
    jax.set_mesh(mesh)
    if args.collective == "jaxpace":
        jaxpace.configure(mesh=mesh)
    shardings = [{n: NamedSharding(mesh, s) for n, s in d.items()} for d in param_specs()]
    with jax.default_device(jax.local_devices(backend="cpu")[0]):
        params = _place(init_params(jax.random.key(0)), shardings)
    step = make_step(mesh, args.collective, args.lr)
    data = make_data(mesh, args.batch_per_replica, args.steps)
    losses, times = [], []
    for x, y in data:
        t0 = time.perf_counter()
        params, loss = step(params, x, y, args.lag_s if pid == args.lag_process else 0.0)
        losses.append(float(loss))
        times.append(time.perf_counter() - t0)
    # This process's weight shards, byte for byte (the test compares jaxpace with lax).
    digest = hashlib.sha256(
        b"".join(
            np.asarray(s.data).tobytes()
            for a in jax.tree.leaves(params)
            for s in sorted(a.addressable_shards, key=lambda s: s.device.id)
        )
    ).hexdigest()
    os.makedirs(args.out, exist_ok=True)
    if args.collective == "jaxpace":
        jaxpace.default_pacer().export(os.path.join(args.out, f"records-p{pid}.jsonl"))
    with open(os.path.join(args.out, f"result-p{pid}.json"), "w") as f:
        json.dump({"losses": losses, "step_times_s": times, "params_sha256": digest}, f)
    if pid == 0:
        print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}, params sha256 {digest[:16]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
