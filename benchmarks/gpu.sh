#!/usr/bin/env bash
# GPU checks of jaxpace's native CUDA probes, each with a verdict; exits non-zero on any failure.
# The checks and what each proves: docs/multihost.md ("Checking the GPU path").
# Not yet run on a GPU: until this script has passed on one, the docs call the GPU path
# unverified. Needs jax with CUDA (jax[cuda12] or jax[cuda13]); no network, no CUDA toolkit.
# Fits in about 11 minutes on one node: each step has its own time limit, 655 s in all.
#
# Usage: benchmarks/gpu.sh            STEPS=40 benchmarks/gpu.sh (more steps per run)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
STEPS=${STEPS:-20}
fail=0
note() { echo "gpu.sh: $*"; }
part() {  # part NAME TIMEOUT_S CMD...: runs one part; a non-zero exit or a timeout is a failure
  local name=$1 limit=$2
  shift 2
  note "--- $name"
  timeout "$limit" "$@"
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    [ "$rc" -eq 124 ] && note "FAIL: $name ran past ${limit}s" || note "FAIL: $name (exit $rc)"
    fail=1
  fi
}

# 1. Build: the probe library (probe.cc + probe_cuda.cc) against this jaxlib's FFI headers.
#    JAXPACE_GPU_SH_BUILD=0 uses whatever is installed or built already (the CPU test does).
if [ "${JAXPACE_GPU_SH_BUILD:-1}" != "0" ]; then
  timeout 90 $PY -m pip install -q --no-build-isolation --no-deps -e . >/tmp/jaxpace-gpu-build.log 2>&1 ||
    note "pip install -e . failed (see /tmp/jaxpace-gpu-build.log); trying g++ directly"
  if ! ls src/jaxpace/native/_jaxpace_probe*.so >/dev/null 2>&1; then
    INC=$($PY -c "import jax.ffi; print(jax.ffi.include_dir())")
    SUFFIX=$($PY -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
    timeout 60 g++ -O2 -shared -fPIC -std=c++17 -isystem "$INC" src/jaxpace/native/probe.cc \
      -ldl -o "src/jaxpace/native/_jaxpace_probe$SUFFIX" || { note "FAIL: build"; exit 1; }
  fi
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

# 2. The native library and its CUDA handlers load; how many GPUs JAX sees.
NGPU=$(JAX_PLATFORMS=cuda timeout 45 $PY - <<'EOF'
import sys
import jax
from jaxpace.native import probes as _native
from jaxpace.native import primitive
ok, why = _native.available()
cuda_ok, cuda_why = primitive.cuda_registered()
print(f"native library: {ok} ({why}); CUDA handlers: {cuda_ok} ({cuda_why})", file=sys.stderr)
print(len(jax.devices("gpu")) if ok and cuda_ok else 0)
EOF
)
if [ -z "$NGPU" ] || [ "$NGPU" -lt 1 ]; then
  note "FAIL: no GPU with the native CUDA handlers (see the line above)"
  exit 1
fi
note "$NGPU GPU(s)"

# 3. Measure-only with a profiler trace (waits vs NCCL kernels), fixed delay, adaptive, one run
#    without blocking per step, bitwise equality for each, overhead (information).
part "main (async collectives, XLA's default)" 200 env JAX_PLATFORMS=cuda \
  $PY benchmarks/gpu_check.py main --steps "$STEPS"

if [ "$NGPU" -ge 2 ]; then
  # 4. The same measure-only steps with synchronous all-reduces: waits within the stated
  #    tolerance of the NCCL kernel times.
  part "sync collectives" 100 env JAX_PLATFORMS=cuda \
    XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_disable_async_collectives=allreduce" \
    $PY benchmarks/gpu_check.py sync --steps "$STEPS"
  # 5. One process per GPU (jax.distributed on localhost): bitwise, the late process waits least.
  part "one process per GPU" 110 env JAX_PLATFORMS=cuda \
    $PY benchmarks/gpu_check.py multiproc --processes "$NGPU" --steps "$STEPS" \
    --child-timeout-s 90
else
  note "NOTE: 1 GPU: no NCCL runs, so the waits vs NCCL kernels (async and sync), the late" \
    "device and one process per GPU are not checked here; run on 2+ GPUs"
fi

# 6. The report's reading of a profiler trace, when that check exists in this checkout.
if [ -f benchmarks/gpu_trace_check.py ]; then
  part "jaxpace report on a profiler trace" 50 env JAX_PLATFORMS=cuda \
    $PY benchmarks/gpu_trace_check.py
fi

# 7. A watched jit step (jaxpace.watch, its pmean measured only inside windows): what watch's
#    trace reader takes as each device's time inside the NCCL kernels vs the native probes'
#    waits on the same executions. Unverified until run here (docs/diagnostics.md).
if [ "$NGPU" -ge 2 ]; then
  part "watched step: trace reader vs native probes" 60 env JAX_PLATFORMS=cuda \
    $PY benchmarks/gpu_watch_check.py --platform cuda
else
  note "NOTE: 1 GPU: no NCCL kernel, so the watched step's trace reader vs probes is not checked"
fi

if [ "$fail" -ne 0 ]; then
  note "FAIL (see the FAIL lines above)"
  exit 1
fi
note "PASS"
