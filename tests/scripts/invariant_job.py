"""Under `jaxpace launch -n 2`: data parallel without `pcast` of the parameters (issue 26, item 2).

`jax.grad` with respect to replicated parameters all-reduces the gradients itself,
so the operand of `jp.pmean` is already invariant over "data": every rank leaves
that earlier reduction together. Process 1 sleeps 20 ms a step; the records must
say the operand was invariant, and the report must not name a culprit.

python -m jaxpace launch -n 2 --local-devices 1 -- python tests/scripts/invariant_job.py OUT
"""

import sys
import time

import jaxpace as jp

pid, nproc = jp.launch.init_from_env(platform="cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

out = sys.argv[1]
SLOW_PROCESS, LAG_S, STEPS = 1, 0.02, 30
mesh = jax.make_mesh((jax.device_count(),), ("data",))
pacer = jp.Pacer(mesh=mesh)


def loss_fn(w, x):
    return jnp.mean((x @ w) ** 2)


def local(w, x):
    g = jax.grad(loss_fn)(w, x)  # no pcast: JAX all-reduces g before jaxpace sees it
    return w - 0.1 * pacer.pmean(g, "data", site="grads")


step = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data")), out_specs=P()))
x = jax.make_array_from_process_local_data(
    NamedSharding(mesh, P("data")), np.ones((jax.local_device_count() * 2, 3), np.float32)
)
w = jnp.ones(3)
for _ in range(STEPS):
    if pid == SLOW_PROCESS:
        time.sleep(LAG_S)
    w = step(w, x)
    jax.block_until_ready(w)
pacer.export(out + "/")  # a directory: records-p{i}.parquet inside
pacer.close(timeout_s=10.0)
print(f"p{pid} exported", flush=True)
