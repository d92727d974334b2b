#!/usr/bin/env bash
# Runs the test suite: every test on this machine (GPU tests skip explicitly when no GPU is visible).
# Usage: scripts/test.sh [ctest args...], e.g. scripts/test.sh -L cpu
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root/build"
ctest --output-on-failure -j "$(nproc 2>/dev/null || echo 2)" "$@"
