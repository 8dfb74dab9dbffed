"""SIGTERM during a paced sleep: the sleep must end promptly.

Prints `SLEEPING` when the second step's pre-collective callback is about to
sleep its `fixed(5.0)` delay; the test then sends SIGTERM. With `--handler`
a user handler (installed before jaxpace) records the signal and the script
goes on, printing how long the interrupted step took.
"""

import os
import signal
import sys
import time

os.environ["JAX_PLATFORMS"] = "cpu"
import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 2)

import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxpace as jp  # noqa: E402
from jaxpace.runtime.testing import set_fault_hook  # noqa: E402

got = []
if "--handler" in sys.argv:
    signal.signal(signal.SIGTERM, lambda s, f: got.append(time.monotonic()))

pacer = jp.Pacer(policy=jp.fixed(5.0))


def hook(where, site, rank, step):
    if where == "pre" and step == 1:
        print("SLEEPING", flush=True)


set_fault_hook(pacer, hook)
mesh = jax.make_mesh((2,), ("data",))
f = jax.jit(
    jax.shard_map(
        lambda v: pacer.psum(v, "data", site="s"), mesh=mesh, in_specs=P("data"), out_specs=P()
    )
)
x = jax.device_put(jnp.ones((2, 4)), NamedSharding(mesh, P("data")))
f(x).block_until_ready()  # step 0: no pending delay yet; sets 5 s for step 1
t0 = time.monotonic()
out = f(x).block_until_ready()
took = time.monotonic() - t0
print(f"STEP_S {took:.3f} SIGNALS {len(got)} SUM {float(out.ravel()[0])}", flush=True)
