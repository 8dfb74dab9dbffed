"""A plain JAX program: `jax.distributed.initialize()` with no arguments, never imports jaxpace.

Run under `jaxpace launch -n 2 --local-devices 2`: every device of every process
contributes `process_index * 10 + local device index + 1` to a psum across all
devices, and each process prints the sum it got (blocking on the result).
"""

import jax

jax.distributed.initialize()

import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

mesh = jax.make_mesh((jax.device_count(),), ("x",))
me, local = jax.process_index(), jax.local_device_count()
values = np.array([[me * 10 + d + 1] for d in range(local)], dtype=np.float32)
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), values)


@jax.jit
@jax.shard_map(mesh=mesh, in_specs=P("x"), out_specs=P())
def total(v):
    return jax.lax.psum(v, "x")


got = total(x)
got.block_until_ready()
print(
    f"process {me} of {jax.process_count()}: {local} local devices, "
    f"{jax.device_count()} in all, psum = {float(np.asarray(got.addressable_data(0)).ravel()[0]):g}",
    flush=True,
)
jax.distributed.shutdown()
