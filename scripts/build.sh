#!/usr/bin/env bash
# Configures and builds octet in ./build (CUDA backend when nvcc is present, CPU-only otherwise).
# Usage: scripts/build.sh [extra cmake args...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "$jobs"
