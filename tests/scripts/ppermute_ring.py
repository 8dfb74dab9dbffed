"""Multi-process pipeline-style job under `jaxpace launch`: a `jaxpace.ppermute` ring.

Every process runs `--steps` steps of one `jaxpace.ppermute` (stage i sends to stage i+1)
over all devices; `--lag-process` sleeps `--lag-s` before each step. Each process exports
its records to `--out`.
"""

import argparse
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--lag-process", type=int, default=1)
    ap.add_argument("--lag-s", type=float, default=0.1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import jaxpace.launch as jl

    pid, _ = jl.init_from_env(platform="cpu")

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jaxpace as jp

    n = jax.device_count()
    mesh = jax.make_mesh((n,), ("stage",))
    jp.configure(mesh=mesh)
    perm = [(i, (i + 1) % n) for i in range(n)]
    sh = NamedSharding(mesh, P("stage"))
    x = jax.make_array_from_callback((n, 256), sh, lambda i: np.ones((n, 256), np.float32)[i])
    f = jax.jit(
        jax.shard_map(
            lambda v: jp.ppermute(jnp.sin(v) + 1.0, "stage", perm, site="ring"),
            mesh=mesh,
            in_specs=P("stage"),
            out_specs=P("stage"),
        )
    )
    for _ in range(args.steps):
        if pid == args.lag_process:
            time.sleep(args.lag_s)
        x = jax.block_until_ready(f(x))
    os.makedirs(args.out, exist_ok=True)
    jp.default_pacer().export(os.path.join(args.out, f"records-p{pid}.jsonl"))


if __name__ == "__main__":
    main()
