#!/usr/bin/env bash
# The compiled kernels under AddressSanitizer and UndefinedBehaviorSanitizer.
#
# Builds src/jaxpace/native/kernels.cc with -fsanitize=address,undefined into a temporary
# directory, points jaxpace at that build (JAXPACE_KERNELS_LIBRARY), preloads the sanitizer
# runtimes into Python, and runs the tests that drive every kernel: tests/native/test_kernels.py,
# tests/native/test_kernels_edges.py and tests/policy/test_policy_fast_matches_reference.py. Any
# out-of-bounds access or undefined behaviour aborts the run with the sanitizer's report.
#
#   benchmarks/sanitize.sh              # from anywhere; jaxpace (and pytest) importable
#   benchmarks/sanitize.sh -k window    # extra arguments go to pytest
#
# Needs g++ (or CXX=clang++) with its libasan/libubsan. Python's own allocations are not
# leak-checked (detect_leaks=0): CPython keeps memory until exit by design.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
CXX=${CXX:-g++}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
lib="$out/_jaxpace_kernels_sanitized.so"
"$CXX" -std=c++17 -O1 -g -fno-omit-frame-pointer -fPIC -shared \
  -ffp-contract=off -fno-fast-math -fno-trapping-math \
  -fsanitize=address,undefined -fno-sanitize-recover=undefined \
  src/jaxpace/native/kernels.cc -o "$lib"
preload="$("$CXX" -print-file-name=libasan.so):$("$CXX" -print-file-name=libubsan.so)"
export JAXPACE_KERNELS_LIBRARY="$lib" JAXPACE_KERNELS=1
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# The tests must run against this build, not a NumPy fallback or the installed library.
LD_PRELOAD="$preload" "$PY" -c "
from jaxpace.native import kernels
ok, where = kernels.available()
assert ok and 'sanitized' in where, where
print('kernels:', where)
"
LD_PRELOAD="$preload" timeout 1800 "$PY" -m pytest -q -p no:cacheprovider \
  tests/native/test_kernels.py tests/native/test_kernels_edges.py tests/policy/test_policy_fast_matches_reference.py "$@"
echo "sanitize.sh: no sanitizer reports"
