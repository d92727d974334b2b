#!/usr/bin/env bash
# The GPU test suite under compute-sanitizer: first `--tool memcheck` (out-of-bounds and misaligned
# device memory accesses, CUDA API errors), then `--tool racecheck` (shared-memory data races), each
# with --error-exitcode 1. For the GPU machine, with a CUDA build made elsewhere in $BUILD (default
# build): runs $BUILD/tests/octet_tests_gpu --gtest_brief=1, writes each tool's whole output (the
# tests' and the sanitizer's) to ${OUT:-gpu-out}/sanitize_memcheck.log and sanitize_racecheck.log,
# and prints a summary: per tool, the tests that passed / failed / were skipped and the sanitizer's
# error count, with the first error lines.
#
# The sanitizer slows kernels 10-100x (racecheck more on shared-memory-heavy kernels), so by default
# the largest cases are left out (DEFAULT_FILTER below: the T = 8192 attention and model step, the
# grouped GEMMs at DeepSeek-V3 widths, model-sized embedding / cross-entropy / quantize / norm /
# SwiGLU / transpose cases, the 2^20-parameter AdamW case, attention at T = 1000, and three of the
# eight model recipe x routing cases); every op family keeps its other tests, odd shapes included.
# The whole script is meant to end within 9 minutes on an H100; as a safety net each tool is
# stopped after SANITIZE_TIMEOUT seconds (default 255), which counts as a failure.
#
# Usage: scripts/sanitize_gpu.sh [GTEST_FILTER]
#   GTEST_FILTER     a --gtest_filter pattern instead of the default ('*' runs every test)
# Environment: BUILD, OUT, SANITIZE_TIMEOUT (seconds per tool), SANITIZE_FLAGS (more
# compute-sanitizer flags for both tools, e.g. "--leak-check full" or "--report-api-errors no").
# Exit status: 0 when both tools ran to the end with no sanitizer error and no failed test, 1
# otherwise, 2 when the binary or compute-sanitizer is missing.
set -uo pipefail

DEFAULT_FILTER='*'
DEFAULT_FILTER+='-ModelCuda.LongSequenceDeepseekStep'
DEFAULT_FILTER+=':AttentionGpuSpecial.LongSequenceMemoryAndAccuracy'
DEFAULT_FILTER+=':OddShapes/AttentionGpu.MatchesCpuForwardAndBackward/2?'  # T = 1000 (and 129)
DEFAULT_FILTER+=':GroupedGemmGpu.*ModelShapes*'
DEFAULT_FILTER+=':CrossEntropyGpuSpecial.LargestVocabulary'
DEFAULT_FILTER+=':CrossEntropyGpuSpecial.ManyRowsAndLargeLogits'
DEFAULT_FILTER+=':EmbeddingGpuSpecial.ModelSizedBackward'
DEFAULT_FILTER+=':QuantizeGpuSpecial.LargeTensorAndEpsilon'
DEFAULT_FILTER+=':RmsNormGpuWide.ManyRows'
DEFAULT_FILTER+=':SwigluGpuSpecial.ZeroRowsAndExpertSizedInput'
DEFAULT_FILTER+=':CastGpu.TransposeOfATallMatrixBeyondOneGridColumn'
DEFAULT_FILTER+=':Sizes/AdamWGpu.StepsMatchCpuBitwise/4'  # 2^20 + 3 parameters
# Recipe x routing: bf16, deepseek, fp8-tensor-delayed, fp8-tensor-current with natural routing,
# and deepseek with forced routing (empty and crowded experts) stay.
DEFAULT_FILTER+=':Recipes/ModelCudaVsCpu.ForwardAndBackward/1'
DEFAULT_FILTER+=':Recipes/ModelCudaVsCpu.ForwardAndBackward/5'
DEFAULT_FILTER+=':Recipes/ModelCudaVsCpu.ForwardAndBackward/7'

case "${1:-}" in
  -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
esac
[ $# -le 1 ] || { echo "sanitize_gpu.sh: at most one argument, a gtest filter (see --help)" >&2; exit 2; }
filter=${1:-$DEFAULT_FILTER}
build=${BUILD:-build}
out=${OUT:-gpu-out}
limit=${SANITIZE_TIMEOUT:-255}
bin="$build/tests/octet_tests_gpu"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}

[ -x "$bin" ] || { echo "sanitize_gpu.sh: $bin not found (a CUDA build in \$BUILD)" >&2; exit 2; }
sanitizer=$(command -v compute-sanitizer || true)
[ -n "$sanitizer" ] || [ ! -x /usr/local/cuda/bin/compute-sanitizer ] ||
  sanitizer=/usr/local/cuda/bin/compute-sanitizer
[ -n "$sanitizer" ] || { echo "sanitize_gpu.sh: compute-sanitizer not found" >&2; exit 2; }
mkdir -p "$out" || exit 2

# The last number that `sed_expr` extracts from `file`, or "?" when there is none.
last_number() {
  local n
  n=$(sed -n "$2" "$1" | tail -n 1)
  echo "${n:-?}"
}

status=0
summary=()
for tool in memcheck racecheck; do
  log="$out/sanitize_$tool.log"
  echo "== compute-sanitizer --tool $tool ($bin, filter: $filter)"
  start=$(date +%s)
  # shellcheck disable=SC2086  # SANITIZE_FLAGS is a list of flags
  timeout -k 15 "$limit" "$sanitizer" --tool "$tool" --error-exitcode 1 ${SANITIZE_FLAGS:-} \
    "$bin" --gtest_brief=1 --gtest_filter="$filter" >"$log" 2>&1
  rc=$?
  secs=$(($(date +%s) - start))
  ran=$(last_number "$log" 's/^\[==========\] \([0-9]*\) tests\{0,1\} from .* ran\..*/\1/p')
  passed=$(last_number "$log" 's/^\[  PASSED  \] \([0-9]*\) tests\{0,1\}\..*/\1/p')
  failed=$(last_number "$log" 's/^\[  FAILED  \] \([0-9]*\) tests\{0,1\}, listed below.*/\1/p')
  skipped=$(last_number "$log" 's/^\[  SKIPPED \] \([0-9]*\) tests\{0,1\}, listed below.*/\1/p')
  if [ "$ran" != "?" ]; then  # gtest prints the FAILED and SKIPPED lines only when there are some
    [ "$failed" != "?" ] || failed=0
    [ "$skipped" != "?" ] || skipped=0
  fi
  errors=$(last_number "$log" 's/^=* *ERROR SUMMARY: \([0-9]*\) error.*/\1/p')
  verdict=clean
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    verdict="TIMED OUT after ${limit} s (SANITIZE_TIMEOUT; give a narrower filter)"
  elif [ "$ran" = "?" ] || [ "$errors" = "?" ]; then
    verdict="DID NOT FINISH (exit $rc; see $log)"
  elif [ "$errors" != 0 ] || [ "$failed" != 0 ] || [ "$rc" -ne 0 ]; then
    verdict="FAILED (exit $rc)"
  fi
  [ "$verdict" = clean ] || status=1
  line=$(printf '%-9s %5s s  tests: %s ran, %s passed, %s failed, %s skipped  sanitizer errors: %s  %s' \
    "$tool" "$secs" "$ran" "$passed" "$failed" "$skipped" "$errors" "$verdict")
  summary+=("$line")
  echo "$line"
  if [ "$verdict" != clean ]; then
    # The first sanitizer reports and failed tests, for a first look (the log has everything).
    grep -m 8 -E '^=+ +(Invalid|Misaligned|Out-of-range|Program hit|Error:|Warning:|Race reported|Barrier error|Malloc/Free error|Leaked)' "$log" || true
    grep -E '^\[  FAILED  \] [A-Za-z]' "$log" | head -n 10 || true
  fi
done

echo
echo "compute-sanitizer summary (logs in $out/sanitize_{memcheck,racecheck}.log):"
printf '  %s\n' "${summary[@]}"
if [ "$status" -eq 0 ]; then echo "result: clean"; else echo "result: FAILED"; fi
exit "$status"
