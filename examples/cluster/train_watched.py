"""Your own JAX program on a cluster, watched by jaxpace: the one line to add is `jaxpace.watch`.

A data-parallel `jax.jit` step whose gradient all-reduce XLA inserts (no jaxpace collective).
`jaxpace.watch` profiles a short window every `--every` calls on every process, and process 0
names the process the others wait for, live: one log line per window, and under `--out` the
verdict (`verdict.json`) and the windows, which `jaxpace report OUT/windows` reads afterwards.

Joining the job:
- SLURM (`srun`, see slurm.sbatch) and `jaxpace launch`: a bare `jax.distributed.initialize()`;
  JAX's own cluster detection supplies the coordinator, the process count and the index.
- Kubernetes JobSet (see jobset.yaml): the manifest passes `JAX_COORDINATOR_ADDRESS`,
  `JAX_NUM_PROCESSES` and `JAX_PROCESS_ID`, and they are given to `initialize` explicitly
  (JAX's Kubernetes detection needs the `kubernetes` package and an API server).

`--late-process P --late-ms MS` makes process P sleep before each step, to see a straggler named.
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


def join_the_job() -> None:
    addr = os.environ.get("JAX_COORDINATOR_ADDRESS")
    n, i = os.environ.get("JAX_NUM_PROCESSES"), os.environ.get("JAX_PROCESS_ID")
    if addr and n is not None and i is not None:  # Kubernetes JobSet: passed explicitly
        jax.distributed.initialize(
            coordinator_address=addr, num_processes=int(n), process_id=int(i)
        )
    else:  # SLURM, jaxpace launch: JAX's cluster detection
        jax.distributed.initialize()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=100, help="calls between watch windows")
    ap.add_argument("--window", type=int, default=5, help="calls in a watch window")
    ap.add_argument("--out", default=None, help="shared folder for the verdict and windows")
    ap.add_argument("--late-process", type=int, default=-1)
    ap.add_argument("--late-ms", type=float, default=0.0)
    args = ap.parse_args(argv)

    join_the_job()
    import jaxpace  # after initialize: watch uses the job's coordination service

    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    data, repl = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    rng = np.random.default_rng(0)
    params = jax.device_put(
        {"w1": rng.normal(size=(64, 256)).astype(np.float32) * 0.1,
         "w2": rng.normal(size=(256, 1)).astype(np.float32) * 0.1},
        repl,
    )  # fmt: skip
    local = jax.local_device_count()
    x = jax.make_array_from_process_local_data(
        data, rng.normal(size=(16 * local, 64)).astype(np.float32)
    )
    y = jax.make_array_from_process_local_data(
        data, rng.normal(size=(16 * local, 1)).astype(np.float32)
    )

    def loss(p, x, y):
        return jnp.mean((jnp.tanh(x @ p["w1"]) @ p["w2"] - y) ** 2)

    @jax.jit
    def step(p, x, y):  # XLA inserts the gradient all-reduce over "data"
        v, g = jax.value_and_grad(loss)(p, x, y)
        return jax.tree.map(lambda a, b: a - 0.01 * b, p, g), v

    step = jaxpace.watch(step, every=args.every, window=args.window, out=args.out)
    me = jax.process_index()
    for _ in range(args.steps):
        if me == args.late_process and args.late_ms > 0:
            time.sleep(args.late_ms / 1e3)  # a slow input pipeline, a throttled GPU ...
        params, v = step(params, x, y)
        jax.block_until_ready(v)
    step.close()
    if me == 0:
        for w in step.history():
            who = "nobody" if w.culprit_process is None else f"process {w.culprit_process}"
            print(f"window steps {w.first_step}-{w.last_step}: {who} (likely: {w.likely})")


if __name__ == "__main__":
    main()
