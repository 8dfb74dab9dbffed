#!/usr/bin/env bash
# GPU check of the native CUDA probes (issue 14): build, bitwise identity vs lax, lag detection
# (2+ GPUs in this process), overhead ratio vs lax at 1K/1M elements per shard; prints a table.
# UNVERIFIED: this script has not yet run on a GPU host; until it has, the docs say so.
# Needs an installed jax with CUDA (jax[cuda12]); no network and no CUDA toolkit needed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
$PY -m pip install -q --no-build-isolation --no-deps -e . >/tmp/jaxpace-gpu-build.log 2>&1 || true
if ! ls src/jaxpace/_native/_jaxpace_probe*.so >/dev/null 2>&1; then  # plain compiler, same flags
  INC=$($PY -c "import jax.ffi; print(jax.ffi.include_dir())")
  g++ -O2 -shared -fPIC -std=c++17 -isystem "$INC" src/jaxpace/_native/probe.cc -ldl \
    -o src/jaxpace/_native/_jaxpace_probe.so || echo "build failed: see /tmp/jaxpace-gpu-build.log"
fi
JAX_PLATFORMS=cuda timeout 400 $PY - <<'EOF'
import time
import jax, jax.numpy as jnp, numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P
import jaxpace as jp
from jaxpace import _native
from jaxpace._native import primitive

devs = jax.devices()
n = len(devs)
rows = [("devices", f"{n} x {devs[0].device_kind}"), ("native library", str(_native.available()))]
rows.append(("CUDA handlers", str(primitive.cuda_registered())))
mesh = jax.make_mesh((n,), ("d",))
put = lambda a: jax.device_put(a, NamedSharding(mesh, P("d")))
smap = lambda f: jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("d"), out_specs=P()))

# 1. bitwise identity and the path stats() names
pacer = jp.Pacer(mesh=mesh, granularity="device")
x = put(jnp.sin(jnp.arange(n * 4099, dtype=jnp.float32)).reshape(n, 4099))
f = smap(lambda v: pacer.psum(v * 1.5, "d", site="bw"))
g = smap(lambda v: lax.psum(v * 1.5, "d"))
same = all(np.asarray(f(x)).tobytes() == np.asarray(g(x)).tobytes() for _ in range(5))
s = pacer.stats()["bw"]
rows += [("bitwise == lax.psum", str(same)), ("probe path", str(s.probe)),
         ("records (5 steps)", f"{s.steps} (expect {5 * n})"), ("mean wait", f"{s.wait_mean_s:.2e} s")]

# 2. lag: device n-1 runs ~extra matmuls before the collective; it should wait least
if n >= 2:
    lp = jp.Pacer(mesh=mesh, granularity="device")
    w = put(jnp.ones((n, 512, 512), jnp.float32) / 512)

    def body(v):
        late = lax.axis_index("d") == n - 1
        v = lax.cond(late, lambda u: lax.fori_loop(0, 200, lambda i, a: a @ u[0] + 0 * a, u[0])[None], lambda u: u, v)
        return lp.psum(v, "d", site="lag")

    h = smap(body)
    for _ in range(25):
        h(w).block_until_ready()
    by = {}
    for r in lp.records()[1:]:
        by.setdefault(r["step"], {})[r["rank"]] = r["wait_ns"]
    mins = [min(d, key=d.get) for st, d in by.items() if st >= 5 and len(d) == n]
    rows.append(("lag: late device waits least", f"{mins.count(n - 1)}/{len(mins)} steps"))
else:
    rows.append(("lag check", "skipped: needs 2+ GPUs in this process"))

# 3. overhead vs lax, interleaved medians, operand computed in the program
for size in (1024, 1 << 20):
    bp = jp.Pacer(mesh=mesh)
    xs = put(jnp.full((n, size), 0.5, jnp.float32))
    fm = smap(lambda v: bp.pmean(v * 1.0001, "d", site=f"o{size}"))
    fl = smap(lambda v: lax.pmean(v * 1.0001, "d"))
    ts = {"m": [], "l": []}
    for fn in (fm, fl):
        for _ in range(5):
            fn(xs).block_until_ready()
    for _ in range(200):
        for k, fn in (("m", fm), ("l", fl)):
            t0 = time.perf_counter(); fn(xs).block_until_ready(); ts[k].append(time.perf_counter() - t0)
    ratio = np.median(ts["m"]) / np.median(ts["l"])
    rows.append((f"measure-only / lax at {size} el/shard", f"{ratio:.3f}x (lax {np.median(ts['l']) * 1e6:.0f} us)"))

width = max(len(k) for k, _ in rows)
print("\njaxpace native CUDA probes on", jax.__version__)
for k, v in rows:
    print(f"  {k:<{width}}  {v}")
EOF
echo "gpu.sh exit: $?"
