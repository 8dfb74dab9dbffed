"""Worker for `python -m benchmarks fsdp --processes N`: the example's step on each process.

Run under `jaxpace launch -n N --local-devices 8/N` (as `examples/fsdp.py` runs in its test):
every process builds the 2 x 4 mesh over all the job's devices, its shards of the example's
weights and one batch, and times the `jax.lax` step against the jaxpace one (measure only)
in interleaved rounds, in the same shuffled order on every process (`_interleaved`'s fixed
seed), each call blocked on. Process 0 writes what it timed to `--out`.
"""

import argparse
import json
import sys
from pathlib import Path

import jaxpace.launch as jl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--reps", type=int, default=600)
ap.add_argument("--repeats", type=int, default=3)
ap.add_argument("--batch-per-replica", type=int, default=8)
args = ap.parse_args()
pid, _ = jl.init_from_env(platform="cpu")

import jax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402

import jaxpace  # noqa: E402
from benchmarks.fsdp import _example, _pair  # noqa: E402

ex = _example()
mesh = jax.make_mesh((2, 4), ("data", "model"))
jax.set_mesh(mesh)
jaxpace.configure(mesh=mesh)
shardings = [{n: NamedSharding(mesh, s) for n, s in d.items()} for d in ex.param_specs()]
with jax.default_device(jax.local_devices(backend="cpu")[0]):
    params = ex._place(ex.init_params(jax.random.key(0)), shardings)
x, y = ex.make_data(mesh, args.batch_per_replica, 1)[0]
lax_step = ex.make_step(mesh, "lax", 0.05, donate=False)
jp_step = ex.make_step(mesh, "jaxpace", 0.05, donate=False)
runs = [_pair(lax_step, jp_step, (params, x, y), args.reps) for _ in range(args.repeats)]
st = jaxpace.default_pacer().stats()
if pid == 0:
    Path(args.out).write_text(
        json.dumps(
            {
                "runs": runs,
                "sites_measured": sum(1 for s in st.values() if s.measured and s.steps > 0),
                "processes": jax.process_count(),
                "local_devices": jax.local_device_count(),
            }
        )
    )
