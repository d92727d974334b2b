#!/usr/bin/env bash
# Per-kernel device time of one `octet bench train-step` run under Nsight Compute (clocks left as
# they are), summed per kernel by scripts/ncu_summary.py. For the GPU machine (ncu on PATH).
# Usage: scripts/profile_step.sh OCTET_BINARY RECIPE [CONFIG.toml]   (writes ncu-RECIPE.csv here)
set -euo pipefail
octet=$1 recipe=$2 config=${3:-configs/baseline-h100.toml}
ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw --print-units base \
  --launch-count 12000 "$octet" bench train-step "$config" --recipe "$recipe" --runs 1 \
  > "ncu-$recipe.csv"
python3 "$(dirname "$0")/ncu_summary.py" "ncu-$recipe.csv"
