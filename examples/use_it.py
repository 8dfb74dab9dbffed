"""A complete data-parallel training program with jaxpace (the README's drop-ins section includes this file).

python examples/use_it.py                # one process: all of its devices (set XLA_FLAGS for more)
jaxpace launch -n 2 --local-devices 2 -- python examples/use_it.py   # two processes
jaxpace report run/                      # then: name the straggler, the HTML report, the trace
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxpace as jp

# Joins the job under `jaxpace launch` (or SLURM/Kubernetes); alone, it does nothing.
# Without it every process under a launcher would train on its own, unsynchronized.
jp.launch.init_from_env()

mesh = jax.make_mesh((jax.device_count(),), ("data",))
jp.configure(policy=jp.adaptive(max_delay_s=0.005), mesh=mesh)  # optional: pace, not only measure


def loss_fn(params, x, y):
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def local_step(params, x, y):
    # Differentiate a per-device ("varying") copy of the parameters: otherwise jax.grad
    # inserts its own all-reduce and jp.pmean sees gradients that are already in sync.
    # Keep `params` itself replicated: it is what the update and out_specs=P() need.
    local = jax.tree.map(lambda p: jax.lax.pcast(p, "data", to="varying"), params)
    loss, grads = jax.value_and_grad(loss_fn)(local, x, y)
    grads = jp.pmean(grads, "data")  # was: jax.lax.pmean(grads, "data")
    params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
    return params, jax.lax.pmean(loss, "data")


step = jax.jit(
    jax.shard_map(
        local_step,
        mesh=mesh,
        in_specs=(P(), P("data"), P("data")),
        out_specs=(P(), P()),
    )
)

# Input sharding: each process makes (or loads) only its own rows of the global batch.
rng = np.random.default_rng(jax.process_index())
x_local = rng.normal(size=(8 * jax.local_device_count(), 4)).astype(np.float32)
y_local = x_local @ np.array([[1.0], [-2.0], [3.0], [0.5]], np.float32)
batch = NamedSharding(mesh, P("data"))
x = jax.make_array_from_process_local_data(batch, x_local)
y = jax.make_array_from_process_local_data(batch, y_local)

params = {"w": jnp.zeros((4, 1)), "b": jnp.zeros((1,))}
for _ in range(20):
    params, loss = step(params, x, y)

pacer = jp.default_pacer()
stats = pacer.stats()  # waits (bounded) for steps still in flight
for site, s in stats.items():
    print(f"process {jax.process_index()}: {site}: {s.steps} steps, loss {float(loss):.4f}")
print("wrote", pacer.export(sys.argv[1] if len(sys.argv) > 1 else "run/"))
