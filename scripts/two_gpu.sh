#!/usr/bin/env bash
# Issue 18 in one device call: expert- and data-parallel training on two GPUs against one, on the
# baseline configuration (configs/baseline-h100.toml, deepseek recipe, fixed seed), and the
# collectives' bandwidth. docs/scaling.md section 5 says what each part checks.
#
# Here: build octet (scripts/build.sh), then copy it and a prepared fortunes corpus into the carry
# directory (git-ignored), as for scripts/gpu_call.sh:
#     mkdir -p gpu-carry/data && cp build/octet gpu-carry/ && cp -r .cache/octet/fortunes-* gpu-carry/data/
# On the device machine, from the repository root, carrying gpu-carry:
#     NPROC=2 bash scripts/two_gpu.sh    # nvidia-h200-x2: every part below
#     NPROC=1 bash scripts/two_gpu.sh    # one GPU: (a), (a') and (h) at world size 1 (about 2 min)
# Parts (G = the global batch, 2 x batch_size sequences of seq_len; the reference's per-GPU work
# per step equals the weak-scaling runs'):
#   (a)  one GPU, G as grad_accum 2, 50 steps; (a') the same without CUDA graphs (several ranks
#        run eagerly, so this is the like-for-like reference of the step time)
#   (b)  EP = 2, G, `octet train --nproc 2`; checkpoints at step STEPS - RESUME_STEPS and the end
#   (c)  DP = 2 (ZeRO-1), G, two background ranks started with torchrun's variables (RANK,
#        WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
#   (d)  DP x EP: not possible on two GPUs (parallel.ep must divide the world: EP 2 leaves DP 1;
#        DP 2 x EP 2 needs four ranks): printed, not run
#   (e)  (b) and (c) against (a) step by step: max abs / rel loss difference within the in-process
#        tests' tolerance (1e-3 relative, tests/train/expert_parallel_test.cpp), skipped steps
#   (f)  (b)'s checkpoint at step STEPS - RESUME_STEPS resumed on one GPU to STEPS, against (a)
#   (g)  weak scaling: EP = 2 and DP = 2 on 2G (each GPU's work per step is (a)'s), tokens/s per
#        GPU against (a) and (a'); target >= 1.85x one GPU's tokens/s in total
#   (h)  octet bench comm --nproc NPROC on the baseline shapes
# NCCL_NVLS_ENABLE=0 is exported for everything (the device tool requires NVLink multicast off).
# Env: CARRY (gpu-carry), OUT (gpu-out), RUNS (/tmp/runs/two18), NPROC (2), STEPS (50),
# RESUME_STEPS (5), SCALE_STEPS (30), BATCH (8: sequences per micro-batch), RUN_TIMEOUT (300 s a
# run), OCTET_DIST_TIMEOUT_S (120), BENCH_RUNS (20), PARTS ("a b c e f g h": a subset splits the
# call in two; (e) and (f) read (a), (b) and (c) from RUNS, so keep RUNS between the calls and
# set KEEP_RUNS=1 not to clear it), TRAIN_SET and BENCH_SET (extra arguments to every training
# run and to the bench, e.g. TRAIN_SET="--set model.num_hidden_layers=4").
set -uo pipefail
export NCCL_NVLS_ENABLE=0
export OCTET_DIST_TIMEOUT_S=${OCTET_DIST_TIMEOUT_S:-120}
G=${CARRY:-gpu-carry}; OUT=${OUT:-gpu-out}; R=${RUNS:-/tmp/runs/two18}
NPROC=${NPROC:-2}; STEPS=${STEPS:-50}; RESUME_STEPS=${RESUME_STEPS:-5}; SCALE_STEPS=${SCALE_STEPS:-30}
BATCH=${BATCH:-8}; RUN_TIMEOUT=${RUN_TIMEOUT:-300}
CFG=configs/baseline-h100.toml
die() { echo "two_gpu.sh: error: $*" >&2; exit 2; }

case $NPROC in 1|2) ;; *) die "NPROC=$NPROC: expected 1 (one GPU: the reference parts) or 2";; esac
[ -f "$CFG" ] && [ -f scripts/two_gpu_compare.py ] || die "run from the repository root ($CFG not found)"
[ -d "$G" ] || die "no carry directory $G/: build octet, copy it and a prepared corpus into $G/ (see this script's header), and carry $G"
[ -x "$G/octet" ] || die "$G/octet is missing or not executable: cp build/octet $G/ (a CUDA build with NCCL)"
DATA=$(ls -d "$G"/data/fortunes-* 2>/dev/null | head -n 1)
[ -n "$DATA" ] || die "no prepared corpus $G/data/fortunes-*: cp -r .cache/octet/fortunes-<hash> $G/data/"
command -v python3 >/dev/null || die "python3 is needed for the comparisons"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$gpus" -ge "$NPROC" ] || die "NPROC=$NPROC but nvidia-smi lists $gpus GPU(s)"
[ "$RESUME_STEPS" -ge 1 ] && [ "$RESUME_STEPS" -lt "$STEPS" ] || die "RESUME_STEPS=$RESUME_STEPS: expected 1 to STEPS - 1"

ncclib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}${ncclib:+:$ncclib}
O=$G/octet
PARTS=" ${PARTS:-a b c e f g h} "
want() { [[ $PARTS == *" $1 "* ]]; }
mkdir -p "$OUT"; [ "${KEEP_RUNS:-0}" = 1 ] || rm -rf "$R"; mkdir -p "$R"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader > "$OUT/gpus.txt" 2>&1
[ "$NPROC" -ge 2 ] && nvidia-smi topo -m > "$OUT/topology.txt" 2>&1
cat "$OUT/gpus.txt"
BASE=(--set recipe=deepseek --set "data.shards=$DATA" --set seed=1234 --set batch_size=$BATCH
      --set steps=$STEPS --set log_every=1 --set eval.every=0 --set checkpoint_every=-1 ${TRAIN_SET:-})
fails=0
# run NAME CMD...: one training run with its log in $OUT/NAME.log; prints its status and summary.
run() {
  local name=$1; shift
  local t0=$SECONDS
  timeout "$RUN_TIMEOUT" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc ($((SECONDS - t0)) s)"
  grep -E "^trained|tokens/s  |skipped steps|peak memory" "$OUT/$name.log" | sed 's/^/   /'
  [ $rc -eq 0 ] || { fails=$((fails + 1)); tail -n 5 "$OUT/$name.log" | sed 's/^/   | /'; }
  return $rc
}

# (a), (a'): one GPU, G as two micro-batches.
if want a; then
  run ref "$O" train $CFG "${BASE[@]}" --set grad_accum=2 --set run_dir=$R/ref
  run ref-eager "$O" train $CFG "${BASE[@]}" --set grad_accum=2 --set cuda_graphs=false --set run_dir=$R/ref-eager
fi

if [ "$NPROC" -ge 2 ]; then
  # (b) EP = 2 through the spawner, checkpoints at STEPS - RESUME_STEPS and at the end.
  want b && run ep2 "$O" train $CFG "${BASE[@]}" --set parallel.ep=2 --set checkpoint_every=$((STEPS - RESUME_STEPS)) \
      --set keep_checkpoints=0 --set run_dir=$R/ep2 --nproc 2
  want b && [ -f $R/ep2/metrics.jsonl ] && cp $R/ep2/metrics.jsonl "$R/ep2-metrics.jsonl"

  # (c) DP = 2 (ZeRO-1): two ranks as torchrun starts them.
  if want c; then
    port=$((29500 + RANDOM % 2000)); pids=(); t0=$SECONDS
    for r in 0 1; do
      RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        timeout "$RUN_TIMEOUT" "$O" train $CFG "${BASE[@]}" --set run_dir=$R/dp2 > "$OUT/dp2-rank$r.log" 2>&1 &
      pids+=($!)
    done
    rc=0; for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    echo "== dp2 (torchrun variables, 2 background ranks) rc=$rc ($((SECONDS - t0)) s)"
    grep -E "^trained|tokens/s  |skipped steps|peak memory|data parallel" "$OUT/dp2-rank0.log" | sed 's/^/   /'
    [ $rc -eq 0 ] || { fails=$((fails + 1)); tail -n 5 "$OUT"/dp2-rank*.log | sed 's/^/   | /'; }
  fi

  # (d)
  echo "== dp x ep: not run: on 2 GPUs parallel.ep = 2 leaves DP = 1 (that is (b)); DP 2 x EP 2 needs 4 ranks"

  # (e) losses against (a).
  if want e; then
    echo "== (e) losses, EP 2 and DP 2 against one GPU"
    python3 scripts/two_gpu_compare.py losses --ref $R/ref/metrics.jsonl \
        --run ep2=$R/ep2-metrics.jsonl --run dp2=$R/dp2/metrics.jsonl | tee "$OUT/losses.txt" \
        || fails=$((fails + 1))
  fi

  # (f) (b)'s earlier checkpoint resumed on one GPU (G as two micro-batches), steps to STEPS.
  if want f; then
    ck=$(ls -d $R/ep2/checkpoints/step_* 2>/dev/null | grep -v partial | sort | head -n 1)
    if [ -n "$ck" ]; then
      run resume-ep2-on-1 "$O" train --resume "$ck" --set parallel.ep=1 --set grad_accum=2 --allow-config-change
      python3 scripts/two_gpu_compare.py losses --ref $R/ref/metrics.jsonl \
          --run ep2-resumed-on-1=$R/ep2/metrics.jsonl --from-step $((STEPS - RESUME_STEPS + 1)) \
          | tee "$OUT/resume.txt" || fails=$((fails + 1))
    else
      echo "== resume: no checkpoint in $R/ep2/checkpoints"; fails=$((fails + 1))
    fi
  fi

  # (g) weak scaling: 2G, each GPU two micro-batches per step as in (a).
  if want g; then
    run ep2-weak "$O" train $CFG "${BASE[@]}" --set steps=$SCALE_STEPS --set grad_accum=2 --set parallel.ep=2 \
        --set run_dir=$R/ep2-weak --nproc 2
    run dp2-weak "$O" train $CFG "${BASE[@]}" --set steps=$SCALE_STEPS --set grad_accum=2 \
        --set run_dir=$R/dp2-weak --nproc 2
    echo "== (g) weak scaling"
    for ref in ref ref-eager; do
      python3 scripts/two_gpu_compare.py speed --ref $ref=$R/$ref/metrics.jsonl:1 \
          --run ep2-weak=$R/ep2-weak/metrics.jsonl:2 --run dp2-weak=$R/dp2-weak/metrics.jsonl:2 \
          --run ep2-G=$R/ep2-metrics.jsonl:2 --run dp2-G=$R/dp2/metrics.jsonl:2
    done | tee "$OUT/scaling.txt"
  fi
elif want g; then
  echo "== (g) reference (one GPU; the two-GPU runs need NPROC=2)"
  python3 scripts/two_gpu_compare.py speed --ref ref=$R/ref/metrics.jsonl:1 \
      --run ref-eager=$R/ref-eager/metrics.jsonl:1 | tee "$OUT/scaling.txt"
fi

# (h) the collectives at NPROC ranks, through the spawner.
if want h; then
  t0=$SECONDS
  timeout "$RUN_TIMEOUT" "$O" bench comm $CFG --set batch_size=$BATCH --nproc "$NPROC" --runs ${BENCH_RUNS:-20} ${BENCH_SET:-} \
      > "$OUT/bench-comm.log" 2>&1
  rc=$?; echo "== bench comm --nproc $NPROC rc=$rc ($((SECONDS - t0)) s)"; cat "$OUT/bench-comm.log"
  [ $rc -eq 0 ] || fails=$((fails + 1))
fi
for f in $R/*/metrics.jsonl; do cp "$f" "$OUT/metrics-$(basename "$(dirname "$f")").jsonl"; done
[ -f $R/ep2-metrics.jsonl ] && cp $R/ep2-metrics.jsonl "$OUT/metrics-ep2-before-resume.jsonl"
echo "two_gpu.sh: NPROC=$NPROC done, $fails part(s) failed"
[ $fails -eq 0 ]
