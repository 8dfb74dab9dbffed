"""Under `jaxpace launch`: a measured psum with one late process, exported by jaxpace.sinks.

python -m jaxpace launch -n 4 --local-devices 2 -- python tests/scripts/sinks_job.py OUT
"""

import sys
import threading
import time

import jaxpace as jp

pid, nproc = jp.launch.init_from_env(platform="cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxpace.sinks  # noqa: E402

out = sys.argv[1]
LATE_PROCESS, LAG_S, STEPS = 1, 0.05, 30  # 50 ms: well beyond this machine's noise
prom = jaxpace.sinks.prometheus_textfile(f"{out}/jaxpace.prom", write_every_s=0.0)
tb = jaxpace.sinks.tensorboard(f"{out}/tb")
threads = set()


def spy(summary):
    threads.add(threading.current_thread().name)


mesh = jax.make_mesh((jax.device_count(),), ("data",))
# adaptive exchanges waits in-band, so every process sees every rank's earliness.
pacer = jp.Pacer(policy=jp.adaptive(max_delay_s=0.005), sinks=[spy, prom, tb], mesh=mesh)


def local(x):
    return pacer.psum(x, "data", site="grads")


step = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P("data"), out_specs=P()))
x = jax.make_array_from_process_local_data(
    NamedSharding(mesh, P("data")), np.ones((jax.local_device_count(), 4), np.float32)
)
for _ in range(STEPS):
    if pid == LATE_PROCESS:
        time.sleep(LAG_S)
    y = step(x)
    jax.block_until_ready(y)
assert float(jnp.sum(y)) == 4 * jax.device_count()
pacer.flush()
pacer.close(timeout_s=10.0)
assert threads == {"jaxpace-sinks"}, threads
print(f"p{pid} wrote {prom.path} {tb.logdir}", flush=True)
