"""Under `jaxpace launch`: process 1 configures a different policy; all must fail clearly."""

import jaxpace.launch as jl

pid, nproc = jl.init_from_env(platform="cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxpace as jp  # noqa: E402

max_delay = 0.01 if pid == 1 else 0.005
pacer = jp.Pacer(policy=jp.adaptive(max_delay_s=max_delay), consensus_timeout_s=30)
mesh = jax.make_mesh((jax.device_count(),), ("data",))
f = jax.jit(
    jax.shard_map(lambda v: pacer.psum(v, "data"), mesh=mesh, in_specs=P("data"), out_specs=P())
)
try:
    x = jax.make_array_from_process_local_data(
        NamedSharding(mesh, P("data")), jnp.ones((jax.local_device_count(),))
    )
    f(x)
    print("NO ERROR", flush=True)
except jp.errors.ConfigMismatchError as e:
    print("MISMATCH:", str(e).splitlines()[0], flush=True)
