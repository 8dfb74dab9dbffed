"""Multi-process check run under `jaxpace launch`: every process builds the same mesh.

Each process builds `jaxpace.make_mesh` from the same topology file, runs a
psum over it, and writes `mesh-p{i}.json` into `--out` with the mesh as
`[process_index, id]` pairs and the psum result.
"""

import argparse
import json
import os


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--topology", required=True)
    ap.add_argument("--mesh", default="4,2")
    ap.add_argument("--axes", default="data,model")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import jaxpace.launch as jl

    pid, nproc = jl.init_from_env(platform="cpu")

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jaxpace.topology as jt

    shape = tuple(int(x) for x in args.mesh.split(","))
    names = tuple(args.axes.split(","))
    plan = jt.plan_mesh(shape, names, devices=jax.devices(), topology=args.topology)
    mesh = jt.make_mesh(shape, names, topology=args.topology)
    assert (
        np.vectorize(lambda d: d.id)(mesh.devices) == np.vectorize(lambda d: d.id)(plan.devices)
    ).all()

    n = mesh.devices.size
    # Global array whose shard on each device is that device's position in the mesh.
    sharding = NamedSharding(mesh, P(*names))
    x = jax.make_array_from_callback(
        shape, sharding, lambda idx: np.asarray(np.arange(n).reshape(shape)[idx], np.float32)
    )

    def body(v):
        return jax.lax.psum(v, names[-1])

    y = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(*names), out_specs=P(*names)))(x)
    local = {str(s.device.id): float(np.asarray(s.data).ravel()[0]) for s in y.addressable_shards}
    with open(os.path.join(args.out, f"mesh-p{pid}.json"), "w") as f:
        json.dump(
            {
                "process": pid,
                "num_processes": nproc,
                "mesh": [[d.process_index, d.id] for d in mesh.devices.flat],
                "used_topology": plan.used_topology,
                "psum": local,
                "jnp_ok": float(jnp.sum(jnp.ones(2))),
            },
            f,
        )


if __name__ == "__main__":
    main()
