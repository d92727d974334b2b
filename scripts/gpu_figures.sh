#!/usr/bin/env bash
# The trainer's GPU figures (docs/benchmarks.md): throughput and peak memory per recipe on the
# baseline configuration (configs/baseline-h100.toml), and the convergence comparison of bf16,
# deepseek, fp8-tensor-delayed and fp8-flow on the default model. Expects a build in $BUILD, token
# shards in $DATA (the prepared fortunes corpus: .cache/octet/fortunes-*/), writes runs under $OUT.
# $RECIPES picks the recipes (default: all four FP8 comparisons), $SEEDS the convergence seeds
# (default 1234; another seed s writes conv-<recipe>-seed<s>), $CONV_JOBS how many convergence runs
# train at once on the GPU (default 1; the small model is launch-bound, so a few at once finish
# sooner, each run's numbers unchanged: its own process, seed and data order).
# Usage: scripts/gpu_figures.sh [throughput|convergence|all]
# e.g. fp8-flow's three seeds in one device call:
#   RECIPES=fp8-flow SEEDS="1234 2 3" CONV_JOBS=3 DATA=... BUILD=build scripts/gpu_figures.sh convergence
set -u
what=${1:-all}
build=${BUILD:-build}
data=${DATA:?set DATA to a directory of llm.c token shards}
out=${OUT:-gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
status=0
if [ "$what" != convergence ]; then
  for r in ${RECIPES:-bf16 fp8-tensor-delayed deepseek fp8-flow}; do
    "$build/octet" train configs/baseline-h100.toml --set recipe=$r --set "run_dir=$out/baseline-$r" \
      --set "data.shards=$data" --set "steps=${THROUGHPUT_STEPS:-30}" > "$out/baseline-$r.log" 2>&1 || status=1
    echo "== $r"; sed -n '/^summary/,$p' "$out/baseline-$r.log"
  done
fi
if [ "$what" != throughput ]; then
  jobs_max=${CONV_JOBS:-1}
  case $jobs_max in '' | *[!0-9]* | 0) echo "gpu_figures.sh: CONV_JOBS must be a positive integer, got '$jobs_max'" >&2; exit 2 ;; esac
  names=() pids=()
  for seed in ${SEEDS:-1234}; do
    case $seed in '' | *[!0-9]*) echo "gpu_figures.sh: a seed must be a non-negative integer, got '$seed'" >&2; exit 2 ;; esac
    for r in ${RECIPES:-bf16 deepseek fp8-tensor-delayed fp8-flow}; do
      name=conv-$r
      [ "$seed" = 1234 ] || name=conv-$r-seed$seed
      while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
      "$build/octet" train --set recipe=$r --set device=cuda --set "run_dir=$out/$name" \
        --set seed=$seed --set "data.shards=$data" --set "steps=${CONV_STEPS:-2000}" \
        --set optim.warmup_steps=100 --set eval.every=100 --set eval.batches=16 \
        --set checkpoint_every=0 --set log_every=200 > "$out/$name.log" 2>&1 &
      names+=("$name") pids+=($!)
    done
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || status=1
    echo "== ${names[$i]}"; sed -n '/^summary/,$p' "$out/${names[$i]}.log"
  done
fi
exit $status
