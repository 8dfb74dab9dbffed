"""Multi-process exchange job under `jaxpace launch`: one `jaxpace.ppermute` per step, or
one `jaxpace.all_to_all` (`--op all_to_all`: the token routing of a mixture-of-experts layer,
every device sending a slice to every other).

`--perm ring`: stage i sends to stage i+1 over all devices. `--perm swap`: device i and
device i ^ 2 exchange (4 processes x 2 devices: processes 0 and 1 swap, 2 and 3 swap).
`--lag-process` sleeps `--lag-s` before each of `--steps` steps. Each process exports its
records to `--out`. (On CPU, XLA's multi-process collective-permute over a ring makes a
process wait for its source's own source too, so a late process shows at two pairs of a
ring; `swap` keeps each pair apart.)
"""

import argparse
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--lag-process", type=int, default=1)
    ap.add_argument("--lag-s", type=float, default=0.1)
    ap.add_argument("--perm", choices=["ring", "swap"], default="swap")
    ap.add_argument("--op", choices=["ppermute", "all_to_all"], default="ppermute")
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
    if args.perm == "ring":
        perm = [(i, (i + 1) % n) for i in range(n)]
    else:
        perm = [(i, i ^ 2) for i in range(n)]
    sh = NamedSharding(mesh, P("stage"))
    if args.op == "ppermute":
        shape = (n, 256)

        def exchange(v):
            return jp.ppermute(jnp.sin(v) + 1.0, "stage", perm, site="p2p")
    else:
        shape = (n * n, 32)  # each shard holds n slices of 32 values: one for each device

        def exchange(v):
            return jp.all_to_all(jnp.sin(v) + 1.0, "stage", 0, 0, tiled=True, site="a2a")

    x = jax.make_array_from_callback(shape, sh, lambda i: np.ones(shape, np.float32)[i])
    f = jax.jit(jax.shard_map(exchange, mesh=mesh, in_specs=P("stage"), out_specs=P("stage")))
    for _ in range(args.steps):
        if pid == args.lag_process:
            time.sleep(args.lag_s)
        x = jax.block_until_ready(f(x))
    os.makedirs(args.out, exist_ok=True)
    jp.default_pacer().export(os.path.join(args.out, f"records-p{pid}.jsonl"))


if __name__ == "__main__":
    main()
