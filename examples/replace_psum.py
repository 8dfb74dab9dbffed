"""The whole change jaxpace asks of a shard_map train step: one import, one call.

python examples/replace_psum.py
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxpace as jp  # noqa: E402

mesh = jax.make_mesh((jax.device_count(),), ("data",))


def local_grads(w, x):
    w = jax.lax.pcast(w, "data", to="varying")  # local (per-shard) gradients
    g = jax.grad(lambda w: jnp.mean((x @ w) ** 2))(w)
    return jp.pmean(g, "data")  # was: jax.lax.pmean(g, "data")


step = jax.jit(jax.shard_map(local_grads, mesh=mesh, in_specs=(P(), P("data")), out_specs=P()))
x = jax.device_put(jnp.ones((jax.device_count() * 4, 3)), NamedSharding(mesh, P("data")))
for _ in range(5):
    g = step(jnp.ones(3), x)
print("grad:", g)
for site, s in jp.default_pacer().stats().items():
    print(f"{site}: {s.steps} steps measured, mean wait {s.wait_mean_s * 1e6:.0f} us")
