#!/usr/bin/env bash
# One device call: GPU tests, the step breakdown, a per-kernel profile, the trainer's throughput, the
# DeepSeek-V3 slice and the peer. The commands docs/benchmarks.md quotes.
# Here: copy build/octet, build/tests/octet_tests_gpu, ../shared/bench/peer_step.py and a prepared
# fortunes corpus (data/fortunes-*) into gpu-carry/ (git-ignored), and the libraries of `ldd build/octet`
# that live in /lib/x86_64-linux-gnu and are not glibc's or libstdc++'s into gpu-carry/lib/ (libmpi,
# libopen-rte, libopen-pal, libhwloc, libevent_core, libevent_pthreads, libudev); then on the GPU machine, carrying
# gpu-carry:  bash scripts/gpu_call.sh [attn] [tests] [bench] [ncu] [trace] [train] [peer] [slice]
# (trace: the step's kernel timelines, `octet bench train-step --trace`, into $OUT/trace.tgz; it
# needs libcupti on LD_LIBRARY_PATH: copy CUDA's libcupti.so.13 into gpu-carry/lib)
# (env: TEST_TIMEOUT, TEST_SHARDS, GTEST_FILTER, RECIPES, NCU_RECIPES, TRAIN_SET, SLICE_RUNS, SLICE_SET, PEER_SLICE_MODES)
set -uo pipefail
export NCCL_NVLS_ENABLE=0
ncclib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}${ncclib:+:$ncclib}
G=${CARRY:-gpu-carry}; OUT=${OUT:-gpu-out}; mkdir -p $OUT
# Libraries the build links that the GPU machine may lack (the CUDA build links OpenMPI's libmpi and
# its dependencies when setup installed it): copied into $G/lib here, looked up after the machine's own.
[ -d $G/lib ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$PWD/$G/lib
DATA=$(ls -d $G/data/fortunes-*)
# The GPU suite, TEST_SHARDS processes at once on the one GPU (gtest's own sharding; default 1), each
# line-buffered, so a run stopped by TEST_TIMEOUT still shows which tests passed, failed or were cut off.
run_gpu_tests() {
  local shards=${TEST_SHARDS:-1} i pids=() rcs=() logs=() buf="" total failed cut
  command -v stdbuf >/dev/null && buf="stdbuf -oL -eL"
  total=$($G/octet_tests_gpu --gtest_list_tests ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} | grep -c '^  ')
  for ((i = 0; i < shards; ++i)); do
    logs+=(/tmp/gpu_tests.$i.log)
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout ${TEST_TIMEOUT:-300} $buf $G/octet_tests_gpu \
      ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} > ${logs[$i]} 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait $pid; rcs+=($?); done
  cat "${logs[@]}" > $OUT/gpu_tests.log
  failed=$(grep -E '^\[  FAILED  \] .*\(' $OUT/gpu_tests.log | sort -u)
  # per shard: the test that had started and not ended when the shard stopped
  cut=$(for l in "${logs[@]}"; do awk '/^\[ RUN      \]/{t=$4} /^\[       OK \]|^\[  FAILED  \]|^\[  SKIPPED \]/{t=""} END{if(t!="")print t}' $l; done)
  echo "gpu tests: $total selected, $(grep -c '^\[       OK \]' $OUT/gpu_tests.log) passed," \
    "$(grep -c . <<< "$failed") failed, $(grep -E '^\[  SKIPPED \] .*\(' $OUT/gpu_tests.log | sort -u | wc -l) skipped," \
    "rc per shard: ${rcs[*]}"
  [ -n "$cut" ] && echo "cut off by TEST_TIMEOUT while running: $cut (the tests after it did not run)"
  [ -n "$failed" ] && head -20 <<< "$failed"
  return 0
}
for what in "$@"; do case $what in
  tests) run_gpu_tests;;
  bench) for r in ${RECIPES:-bf16 deepseek}; do $G/octet bench train-step configs/baseline-h100.toml --runs 5 --recipe $r 2>&1 | grep -E "^\| [a-z]" | tee -a $OUT/train_step.log; done;;
  ncu) for nr in ${NCU_RECIPES:-deepseek}; do timeout ${NCU_TIMEOUT:-240} ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw --print-units base --launch-count 9000 $G/octet bench train-step configs/baseline-h100.toml --recipe $nr --runs 1 > /tmp/ncu-$nr.csv 2>/dev/null; python3 scripts/ncu_phases.py /tmp/ncu-$nr.csv --top 60 > $OUT/phases-$nr.txt; gzip -c /tmp/ncu-$nr.csv > $OUT/ncu-$nr.csv.gz; head -4 $OUT/phases-$nr.txt; done;;
  train) for r in ${RECIPES:-bf16 deepseek}; do $G/octet train configs/baseline-h100.toml --set recipe=$r --set run_dir=/tmp/runs/b-$r --set data.shards=$DATA --set steps=30 --set checkpoint_every=-1 ${TRAIN_SET:-} > $OUT/train-$r.log 2>&1; echo "== train $r rc=$?"; grep -E "tokens/s|peak|step time" $OUT/train-$r.log | tail -4; done;;
  attn) $G/octet bench attention --runs 10 2>&1 | tee $OUT/attention.log;;
  trace) mkdir -p $OUT/trace; for r in ${RECIPES:-deepseek fp8-flow}; do $G/octet bench train-step configs/baseline-h100.toml --runs 3 --recipe $r --trace $OUT/trace > $OUT/trace/bench-$r.log 2>&1; grep "trace of" $OUT/trace/bench-$r.log; done; tar -czf $OUT/trace.tgz -C $OUT trace && rm -rf $OUT/trace;;
  peer) python3 $G/peer_step.py --preset baseline --mode compile 2>&1 | tail -2 | tee $OUT/peer.log;;
  slice) for v in ${SLICE_RUNS:-bf16:1 deepseek:1 deepseek:0}; do set -- ${v/:/ }; $G/octet train configs/dsv3-slice.toml --set recipe=$1 --set model.num_nextn_predict_layers=$2 --set run_dir=/tmp/runs/s-$1-$2 --set data.shards=$DATA --set steps=${SLICE_STEPS:-12} --set log_every=1 --set checkpoint_every=-1 ${SLICE_SET:-} > $OUT/slice-$1-$2.log 2>&1; echo "== slice $1 mtp=$2 rc=$?"; grep -E "tokens/s|peak" $OUT/slice-$1-$2.log | tail -2; done
    for m in ${PEER_SLICE_MODES:-eager compile}; do python3 $G/peer_step.py --preset dsv3-slice --mode $m 2>&1 | tail -2 | tee -a $OUT/peer-slice.log; done;;
esac; done
# fused: the trainer with optim.fused_prepare on and off (the same losses expected, bit for bit)
if [ "${FUSED_CHECK:-0}" = 1 ]; then
  for f in true false; do $G/octet train configs/baseline-h100.toml --set recipe=deepseek --set run_dir=/tmp/runs/f-$f --set data.shards=$DATA --set steps=${FSTEPS:-20} --set log_every=1 --set optim.fused_prepare=$f > $OUT/fused-$f.log 2>&1; echo "fused=$f rc=$?"; grep -E "tokens/s|peak" $OUT/fused-$f.log | tail -2; done
  python3 - <<'PY'
import json
a=[json.loads(l) for l in open('/tmp/runs/f-true/metrics.jsonl')]; b=[json.loads(l) for l in open('/tmp/runs/f-false/metrics.jsonl')]
same=all(x.get('loss')==y.get('loss') and x.get('grad_norm')==y.get('grad_norm') for x,y in zip(a,b))
print('fused vs unfused: %d steps, losses and grad norms identical: %s; last loss %s' % (len(a), same, a[-1].get('loss')))
PY
fi
