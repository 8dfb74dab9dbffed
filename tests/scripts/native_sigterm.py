"""SIGTERM while a native probe sleeps a `fixed(5.0)` delay: the sleep must end promptly.

A user SIGTERM handler (installed before jaxpace) records the signal, so the script goes on
and prints how long the interrupted step took and which probes timed it.
"""

import signal
import sys
import time

import jax

jax.config.update("jax_num_cpu_devices", 2)

import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxpace as jp  # noqa: E402

got = []
signal.signal(signal.SIGTERM, lambda s, f: got.append(time.monotonic()))

pacer = jp.Pacer(policy=jp.fixed(5.0))
mesh = jax.make_mesh((2,), ("data",))
f = jax.jit(
    jax.shard_map(
        lambda v: pacer.psum(v, "data", site="s"), mesh=mesh, in_specs=P("data"), out_specs=P()
    )
)
x = jax.device_put(jnp.ones((2, 4)), NamedSharding(mesh, P("data")))
f(x).block_until_ready()  # step 0: no pending delay yet; its record sets 5 s for step 1
probe = pacer.stats()["s"].probe  # drains step 0 now: the delay is set
print("SLEEPING", flush=True)
t0 = time.monotonic()
out = f(x).block_until_ready()
took = time.monotonic() - t0
print(f"STEP_S {took:.3f} SIGNALS {len(got)} SUM {float(out.ravel()[0])}", flush=True)
print(f"PROBE {probe}", flush=True)
sys.exit(0)
