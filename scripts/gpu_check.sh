#!/usr/bin/env bash
# What one call on the lent GPU machine runs: device facts, the GPU test suite, the exhaustive FP8
# conversion test against ml_dtypes on the device, and the benchmarks. Expects a build made elsewhere in
# $BUILD (default build-cuda) and writes logs under $OUT (default ./gpu-out).
# Usage: scripts/gpu_check.sh [tests|bench|all]
set -uo pipefail
what=${1:-all}
build=${BUILD:-build-cuda}
out=${OUT:-gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
status=0
{ nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,temperature.gpu --format=csv; "$build/octet" info; } 2>&1 | tee "$out/info.log"
if [ "$what" != bench ]; then
  "$build/tests/octet_tests_gpu" --gtest_brief=1 2>&1 | tee "$out/gpu_tests.log" | tail -n 25 || status=1
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  if [ -f "$build/tests/liboctet_capi.so" ]; then
    python3 tests/numerics/fp8_exhaustive.py --lib "$build/tests/liboctet_capi.so" --device cuda 2>&1 | tee "$out/exhaustive_cuda.log" | tail -n 8
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  fi
fi
if [ "$what" != tests ]; then
  for suite in ${BENCH_SUITES:-quantize}; do
    "$build/octet" bench "$suite" 2>&1 | tee "$out/bench_$suite.log" || status=1
  done
fi
exit $status
