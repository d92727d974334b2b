#!/usr/bin/env bash
# Installs everything octet needs to build and test on a fresh Debian machine (root or sudo).
# The CUDA toolkit is used when nvcc is on PATH or in /usr/local/cuda; it is never installed here.
set -euo pipefail

debs=(build-essential cmake ninja-build libgtest-dev googletest nlohmann-json3-dev libtomlplusplus-dev
      python3 python3-pip python3-venv clang-format clang-tidy)
debs+=(fortunes)  # the default training corpus: ~2.5 MB of English text (src/train/data.h)
debs+=(clang libclang-rt-14-dev)  # scripts/fuzz.sh: clang++ and its libFuzzer and sanitizer runtimes
debs+=(libopenmpi-dev openmpi-bin)  # the NCCL id's exchange under mpirun (src/dist/mpi_exchange.h)
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

# Header-only C++ dependencies of the CUDA backend, pinned by version and wheel hash: the cuDNN frontend
# (fused attention, ops/attention) and CUTLASS (Hopper grouped GEMMs, ops/grouped_gemm). Their PyPI
# wheels also carry Python modules with heavy dependencies that a C++ build does not need, so the wheels
# are downloaded without dependencies and only the headers are unpacked, into .deps/ (CMake looks there).
fetch_headers() {  # name version sha256 subdir-in-wheel dest
  local name=$1 version=$2 sha=$3 subdir=$4 dest="$root/.deps/$5"
  [ -f "$dest/.complete" ] && return 0
  local tmp
  tmp=$(mktemp -d)
  "$venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.11 --implementation cp --abi cp311 --platform manylinux_2_28_x86_64 \
    -d "$tmp" "$name==$version"
  local whl
  whl=$(ls "$tmp"/*.whl)
  echo "$sha  $whl" | sha256sum -c --quiet - || { echo "setup: $name $version: wheel hash mismatch" >&2; exit 1; }
  rm -rf "$dest" && mkdir -p "$dest"
  "$venv/bin/python" - "$whl" "$subdir" "$dest" <<'PY'
import sys, zipfile, os
whl, subdir, dest = sys.argv[1], sys.argv[2].rstrip("/") + "/", sys.argv[3]
with zipfile.ZipFile(whl) as z:
    for info in z.infolist():
        if info.filename.startswith(subdir) and not info.is_dir():
            out = os.path.join(dest, "include", info.filename[len(subdir):])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(info) as src, open(out, "wb") as dst:
                dst.write(src.read())
PY
  touch "$dest/.complete"
  rm -rf "$tmp"
}
fetch_headers nvidia-cudnn-frontend 1.32.0 \
  c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0 include/ cudnn-frontend-1.32.0
fetch_headers nvidia-cutlass 4.2.0.0 \
  f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6 cutlass_library/source/include/ \
  cutlass-4.2.0.0
fetch_headers nvidia-cutlass 4.2.0.0 \
  f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6 cutlass_library/source/tools/util/include/ \
  cutlass-util-4.2.0.0
