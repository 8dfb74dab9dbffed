"""A measured step for tests: `pacer.psum` over a 1-D (`data`) mesh of CPU devices, jitted."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


def psum_step(pacer, site: str, *, ranks: int = 8, width: int = 4):
    """`(f, x)`: `f(x)` runs `pacer.psum(x, "data", site=site)` on `ranks` devices; `x` is
    float32 ones of shape `(ranks, width)`, sharded over `data`."""
    mesh = jax.make_mesh((ranks,), ("data",), devices=jax.devices()[:ranks])
    f = jax.jit(
        jax.shard_map(
            lambda v: pacer.psum(v, "data", site=site), mesh=mesh, in_specs=P("data"), out_specs=P()
        )
    )
    x = jax.device_put(np.ones((ranks, width), np.float32), NamedSharding(mesh, P("data")))
    return f, x


def run_psum(pacer, site: str, steps: int, **kw) -> None:
    """`steps` steps of `psum_step(pacer, site, **kw)`, each waited for (XLA:CPU can stall
    with many 8-device collectives queued on few cores)."""
    f, x = psum_step(pacer, site, **kw)
    for _ in range(steps):
        jax.block_until_ready(f(x))
