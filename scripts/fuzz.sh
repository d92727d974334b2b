#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/, clang with AddressSanitizer and UndefinedBehaviorSanitizer,
# CPU only) in ./build-fuzz and runs each in turn, one process at a time, starting from its committed
# seed corpus fuzz/corpus/<target>/ (new inputs go to build-fuzz/corpus/<target>/, crashes to
# build-fuzz/artifacts/). Prints each harness's executions and time, and exits non-zero when any
# harness crashed.
#
# Usage: scripts/fuzz.sh [--smoke | --runs N | --time S] [TARGET...]
#   --smoke    each harness for a few seconds (what CI runs); the default
#   --runs N   each harness for N executions
#   --time S   each harness for S seconds
#   TARGET     safetensors, token_shard, train_config, checkpoint_index, trainer_state (default: all)
# Extra libFuzzer flags can be given in OCTET_FUZZ_FLAGS (e.g. OCTET_FUZZ_FLAGS=-max_len=8192).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

limit=(-max_total_time=8)
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) limit=(-max_total_time=8) ;;
    --runs) limit=(-runs="${2:?--runs needs a count}"); shift ;;
    --time) limit=(-max_total_time="${2:?--time needs seconds}"); shift ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
    *) targets+=("$1") ;;
  esac
  shift
done
all=(safetensors token_shard train_config checkpoint_index trainer_state)
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")
for t in "${targets[@]}"; do
  [ -d "fuzz/corpus/$t" ] || { echo "fuzz.sh: unknown target '$t' (${all[*]})" >&2; exit 2; }
done

command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ not found (run scripts/setup.sh)" >&2; exit 1; }
build="$root/build-fuzz"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ \
  -DOCTET_CUDA=OFF -DOCTET_TESTS=OFF -DOCTET_FUZZ=ON >/dev/null
cmake --build "$build" --target octet_fuzzers -j "$(nproc 2>/dev/null || echo 2)"

mkdir -p "$build/artifacts" "$build/logs"
status=0
total=0
printf '%-18s %14s %8s  %s\n' harness executions seconds result
for t in "${targets[@]}"; do
  mkdir -p "$build/corpus/$t"
  log="$build/logs/$t.log"
  start=$(date +%s)
  rc=0
  # -rss_limit_mb and -timeout turn a runaway allocation or a hang into a reported crash. Paths are
  # absolute: a harness may work in a directory of its own.
  # shellcheck disable=SC2086
  "$build/fuzz/fuzz_$t" "${limit[@]}" -print_final_stats=1 -rss_limit_mb=2048 -timeout=10 \
    -artifact_prefix="$build/artifacts/$t-" ${OCTET_FUZZ_FLAGS:-} \
    "$build/corpus/$t" "$root/fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  secs=$(( $(date +%s) - start ))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  execs=${execs:-0}
  total=$((total + execs))
  if [ "$rc" -eq 0 ]; then
    result=clean
  else
    result="FAILED (exit $rc; see $log)"
    status=1
    grep -m1 -E 'ERROR: (AddressSanitizer|libFuzzer)|runtime error|invariant violated' "$log" >&2 || true
  fi
  printf '%-18s %14s %8s  %s\n' "$t" "$execs" "$secs" "$result"
done
printf '%-18s %14s\n' total "$total"
exit "$status"
