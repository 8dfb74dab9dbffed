#!/usr/bin/env bash
# ThreadSanitizer run of the native probes' CUDA path, on CPU: builds the probe library and the
# fake cudart (tests/native/fake_cudart.cc) with -fsanitize=thread into a temporary directory,
# then runs tests/native/test_cuda_probe_fake.py against them (the handlers on the calling thread,
# stream workers and host functions on the fake's threads, the drain from another thread).
# Exits non-zero when the build fails, a test fails, or TSan reports a race in jaxpace's code.
#
# Usage: benchmarks/sanitize_probe.sh            (needs g++ with libtsan, and jax for its headers)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
CXX=${CXX:-g++}
OUT=$(mktemp -d /tmp/jaxpace-tsan.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
INC=$($PY -c "import jax.ffi; print(jax.ffi.include_dir())")
TSAN_LIB=$($CXX -print-file-name=libtsan.so)
[ -e "$TSAN_LIB" ] || { echo "sanitize_probe: $CXX has no libtsan.so" >&2; exit 2; }
FLAGS=(-std=c++17 -O1 -g -fno-omit-frame-pointer -fsanitize=thread -shared -fPIC)
timeout 600 $CXX "${FLAGS[@]}" -isystem "$INC" src/jaxpace/native/probe.cc -ldl \
  -o "$OUT/probe_tsan.so"
timeout 600 $CXX "${FLAGS[@]}" tests/native/fake_cudart.cc -lpthread -o "$OUT/libfakecudart_tsan.so"
# Python and jaxlib are not instrumented: TSan checks the two libraries above. Reports go to
# $OUT/tsan.<pid>; exitcode=0 lets pytest finish and this script judge the reports.
export TSAN_OPTIONS="halt_on_error=0 exitcode=0 report_signal_unsafe=0 log_path=$OUT/tsan"
export JAXPACE_NATIVE_LIB="$OUT/probe_tsan.so" JAXPACE_FAKE_CUDART_LIB="$OUT/libfakecudart_tsan.so"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" JAX_PLATFORMS=cpu
# The tests must load the sanitized library, not the one built next to the sources.
LD_PRELOAD="$TSAN_LIB" timeout 300 $PY -c "
from jaxpace.native import probes as n
ok, why = n.available()
assert ok and 'probe_tsan' in why, why" || { echo "sanitize_probe: FAIL: not the TSan build"; exit 1; }
status=0
LD_PRELOAD="$TSAN_LIB" timeout 900 $PY -m pytest -q -p no:cacheprovider \
  tests/native/test_cuda_probe_fake.py || status=$?
reports=$(cat "$OUT"/tsan.* 2>/dev/null | grep -c "WARNING: ThreadSanitizer" || true)
# Ours: any frame or location in the two instrumented libraries or their sources.
ours=$(cat "$OUT"/tsan.* 2>/dev/null |
  grep -E "probe(_cuda)?\.cc|fake_cudart\.cc|probe_tsan\.so|libfakecudart_tsan\.so" || true)
echo "sanitize_probe: pytest exit $status; TSan reports: $reports"
if [ -n "$ours" ]; then
  echo "sanitize_probe: FAIL: reports involving jaxpace's code:"
  cat "$OUT"/tsan.*
  exit 1
fi
[ "$status" -eq 0 ] || { echo "sanitize_probe: FAIL: tests failed"; exit 1; }
echo "sanitize_probe: PASS (no ThreadSanitizer report involving the probe library or the fake)"
