#!/usr/bin/env bash
# The convergence runs of docs/convergence.md (issue 17), in device calls of at most 600 s.
#
# Here, once: scripts/corpus.sh, then `scripts/convergence.sh carry` fills conv-carry/ (ignored by
# git) with the CUDA build of octet and the packed tokens: what a device call carries.
# On the GPU machine, one call at a time, each with carry ["conv-carry"]:
#
#   bash scripts/convergence.sh run NAME     NAME: bf16 deepseek fp8-flow fp8-tensor-delayed
#                                                  bf16-seed2
#   bash scripts/convergence.sh run NAME...  several runs at once, one per GPU (GPU i runs the
#                                            i-th), on a machine with that many GPUs
#
# trains run NAME (configs/convergence.toml; seed 1234, or 2 for bf16-seed2) under $WORK
# (default /tmp/octet-conv, on the device's own disk) for at most $BUDGET seconds (default 500),
# then stops it with SIGTERM (the trainer finishes its step and writes a checkpoint), and leaves
# $OUT/conv-NAME.tar.gz: NAME/metrics.jsonl, NAME/config.toml and NAME.log (the trainer's output
# of every call so far), one file per run (a call returns at most 8). The next call
# with the same NAME on the same machine resumes it (octet train --resume, bit-identical). The
# checkpoints (~5 GiB each) cannot leave the machine (a call returns 64 MiB at most), so a run must
# finish on the machine it started on: the calls of one run follow each other while the machine
# is warm. A fresh machine starts the run again from step 0.
#
#   bash scripts/convergence.sh status       the runs under $WORK and how far each is
#
# Environment: OCTET (default conv-carry/octet), PACK (default conv-carry/tokens-32768.tar.xz),
# WORK, BUDGET, and for a new run only (a resumed run keeps its saved config): STEPS (a shorter
# run, for a smoke test) and SET ("key=value ..." more --set options).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
carry=conv-carry
octet=${OCTET:-$carry/octet}
pack=${PACK:-$carry/tokens-32768.tar.xz}
work=${WORK:-/tmp/octet-conv}
budget=${BUDGET:-500}
out=${OUT:-conv-out}
# The CUDA build links libnccl.so.2: on a machine without the system package, PyTorch's wheel has it.
ncclib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}${ncclib:+:$ncclib}

die() { echo "convergence.sh: $*" >&2; exit 1; }

recipe_of() {
  case $1 in
    bf16 | bf16-seed2) echo bf16 ;;
    deepseek | fp8-flow | fp8-tensor-delayed | fp8-tensor-current) echo "$1" ;;
    *) die "unknown run '$1' (bf16, deepseek, fp8-flow, fp8-tensor-delayed, bf16-seed2)" ;;
  esac
}
seed_of() { [ "$1" = bf16-seed2 ] && echo 2 || echo 1234; }

# The last step recorded in a run's metrics.jsonl (0 when none).
last_step() {
  local s=""
  [ -f "$1/metrics.jsonl" ] && s=$(tail -n 2 "$1/metrics.jsonl" | grep -o '"step":[0-9]*' | tail -n 1 | cut -d: -f2)
  echo "${s:-0}"
}
planned_steps() { sed -nE 's/^steps *= *([0-9]+).*/\1/p' "$1/config.toml" | head -n 1; }

# The token shards under $work/data, unpacked once per machine from the carried pack.
unpack_data() {
  local data=$work/data/tokens-32768
  if [ -f "$data/manifest.json" ]; then echo "$data"; return; fi
  [ -f "$pack" ] || die "$pack not found: carry conv-carry (scripts/convergence.sh carry makes it)"
  if [ -f "$pack.sha256" ]; then
    (cd "$(dirname "$pack")" && sha256sum -c --quiet "$(basename "$pack").sha256") >&2 ||
      die "$pack: sha256 mismatch"
  fi
  mkdir -p "$work/data"
  tar -C "$work/data" -xJf "$pack" >&2 || die "cannot unpack $pack"
  [ -f "$data/manifest.json" ] || die "$pack holds no tokens-32768/manifest.json"
  echo "$data"
}

cmd_carry() {  # here, not on the device
  local build=${BUILD:-build} corpus=${CORPUS_DIR:-.cache/octet/corpus}
  [ -x "$build/octet" ] || die "$build/octet not found (scripts/build.sh with CUDA)"
  [ -f "$corpus/tokens-32768.tar.xz" ] || die "$corpus/tokens-32768.tar.xz not found (scripts/corpus.sh)"
  mkdir -p "$carry"
  cp "$build/octet" "$carry/octet"
  cp "$corpus/tokens-32768.tar.xz" "$corpus/tokens-32768.tar.xz.sha256" "$carry/"
  local tree
  # What travels besides: tracked files (untracked ones that git does not ignore travel too).
  tree=$(git ls-files -z | du -cb --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
  local total=$(( $(du -cb "$carry" | tail -n 1 | cut -f1) + tree ))
  echo "conv-carry: $(du -sh "$carry" | cut -f1); with the tracked tree: $((total / 1048576)) MiB of 64"
  [ "$total" -le $((64 * 1048576)) ] || die "over the 64 MiB a device call carries"
}

cmd_status() {
  for r in "$work"/runs/*/; do
    [ -d "$r" ] || continue
    echo "$(basename "$r"): step $(last_step "$r") of $(planned_steps "$r" || echo '?')"
  done
}

cmd_run() {
  local name=$1 recipe seed data run log rc
  recipe=$(recipe_of "$name") || return 1
  seed=$(seed_of "$name")
  [ -x "$octet" ] || die "$octet not found: carry conv-carry"
  data=$work/data/tokens-32768
  run=$work/runs/$name
  log=$work/runs/$name.log
  mkdir -p "$out" "$work/runs"
  echo "== call at $(date -u +%FT%TZ) on ${CUDA_VISIBLE_DEVICES:-all GPUs}" >> "$log"
  local sets=()
  for kv in ${SET:-}; do sets+=(--set "$kv"); done
  local done_steps
  done_steps=$(last_step "$run")
  if [ -f "$run/config.toml" ] && [ "$done_steps" -ge "$(planned_steps "$run")" ]; then
    echo "$name: finished earlier (step $done_steps)" | tee -a "$log"
    rc=0
  elif compgen -G "$run/checkpoints/step_*" >/dev/null; then
    echo "$name: resuming from step $done_steps" | tee -a "$log"
    timeout -s TERM -k 45 "$budget" "$octet" train --resume "$run" >> "$log" 2>&1
    rc=$?
  else
    echo "$name: new run ($recipe, seed $seed)" | tee -a "$log"
    [ -n "${STEPS:-}" ] && sets+=(--set "steps=$STEPS")
    timeout -s TERM -k 45 "$budget" "$octet" train configs/convergence.toml --overwrite \
      --set "recipe=$recipe" --set "seed=$seed" --set "run_dir=$run" --set "data.shards=$data" \
      "${sets[@]}" >> "$log" 2>&1
    rc=$?
  fi
  # 124 / 143: stopped by the time budget (the trainer saw SIGTERM and wrote a checkpoint).
  local step planned
  step=$(last_step "$run")
  planned=$(planned_steps "$run" 2>/dev/null || echo '?')
  case $rc in
    0) echo "$name: step $step of $planned: finished" ;;
    124 | 143) echo "$name: step $step of $planned: stopped for the call's time limit; run again to resume" ;;
    *) echo "$name: step $step of $planned: octet train exited with $rc; the log's end:"; tail -n 15 "$log" ;;
  esac
  grep -E "^summary|tokens/s|val" "$log" | tail -n 3 | sed "s/^/$name: /"
  tar -C "$work/runs" -czf "$out/conv-$name.tar.gz" "$name.log" \
    $(cd "$work/runs" && ls "$name/metrics.jsonl" "$name/config.toml" 2>/dev/null)
  case $rc in 0 | 124 | 143) return 0 ;; *) return "$rc" ;; esac
}

# One run, or several at once with GPU i running the i-th (each process sees only its GPU).
cmd_runs() {
  unpack_data > /dev/null || exit 1
  if [ $# -eq 1 ]; then cmd_run "$1"; return; fi
  local i=0 pids=() rc=0
  for name in "$@"; do
    recipe_of "$name" > /dev/null || exit 1
    CUDA_VISIBLE_DEVICES=$i cmd_run "$name" & pids+=($!)
    i=$((i + 1))
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}

case ${1:-} in
  run) [ $# -ge 2 ] || die "usage: scripts/convergence.sh run NAME..."; shift; cmd_runs "$@" ;;
  status) cmd_status ;;
  carry) cmd_carry ;;
  *) die "usage: scripts/convergence.sh carry | run NAME... | status" ;;
esac
