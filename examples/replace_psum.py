"""The whole change jaxpace asks of a shard_map train step: one import, one call.

python examples/replace_psum.py                                      # one process, 8 CPU devices
jaxpace launch -n 2 --local-devices 2 -- python examples/replace_psum.py   # two processes
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxpace as jp

jax.config.update("jax_num_cpu_devices", 8)  # alone on CPU: 8 devices to shard over
# Under `jaxpace launch` (or SLURM, Kubernetes) this joins the job; without it every
# process would run on its own, unsynchronized. Alone, it does nothing.
jp.launch.init_from_env()

mesh = jax.make_mesh((jax.device_count(),), ("data",))


def local_grads(w, x):
    w = jax.lax.pcast(w, "data", to="varying")  # local (per-shard) gradients
    g = jax.grad(lambda w: jnp.mean((x @ w) ** 2))(w)
    return jp.pmean(g, "data")  # was: jax.lax.pmean(g, "data")


step = jax.jit(jax.shard_map(local_grads, mesh=mesh, in_specs=(P(), P("data")), out_specs=P()))
# Each process provides only its own rows of the global batch.
x_local = np.ones((jax.local_device_count() * 4, 3), np.float32)
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), x_local)
for _ in range(5):
    g = step(jnp.ones(3), x)
print(f"process {jax.process_index()} of {jax.process_count()}: grad {np.asarray(g)}")
for site, s in jp.default_pacer().stats().items():
    print(f"{site}: {s.steps} steps measured, mean wait {s.wait_mean_s * 1e6:.0f} us")
