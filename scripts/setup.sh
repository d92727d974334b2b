#!/usr/bin/env bash
# Installs everything octet needs to build and test on a fresh Debian machine (root or sudo).
# The CUDA toolkit is used when nvcc is on PATH or in /usr/local/cuda; it is never installed here.
set -euo pipefail

debs=(build-essential cmake ninja-build libgtest-dev googletest nlohmann-json3-dev libtomlplusplus-dev
      python3 python3-pip python3-venv clang-format clang-tidy)
debs+=(fortunes)  # the default training corpus: ~2.5 MB of English text (src/train/data.h)
missing=()
for p in "${debs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Python side: the independent FP8 reference (ml_dtypes) and the plotting/array tools, in a project venv so
# the system interpreter is left alone.
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$root/scripts/requirements.txt"
