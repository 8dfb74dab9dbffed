#!/usr/bin/env bash
# On a GPU machine (under 8 minutes): install with CUDA, run the core tests on the
# GPU, then the single-process overhead benchmark, and print a compact table.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e ".[dev,cuda12]"
python3 -c "import jax; print(jax.devices())"
# Core behaviour on the accelerator: bitwise identity, HLO, grads.
set +e
JAX_PLATFORMS=cuda timeout 300 python3 -m pytest -q -x -p no:cacheprovider \
  tests/test_collectives.py -k "bitwise or hlo or grad"
echo "core GPU tests exit code: $?"
set -e
timeout 240 python3 -m benchmarks --gpu --quick --out /tmp/jaxpace-bench --markdown /tmp/jaxpace-bench/benchmarks-gpu.md
cat /tmp/jaxpace-bench/benchmarks-gpu.md
