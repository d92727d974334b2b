#!/usr/bin/env bash
# The SASS of the kernels in an object file or binary of the build: what ptxas made of a kernel
# (which loads wait for which, its registers and stack). The CUDA toolkit here has nvcc and ptxas
# but no disassembler, so cuobjdump and nvdisasm come from their PyPI wheels, pinned by version and
# hash, unpacked into .deps/cuda-disasm-<version>/ on first use. A developer tool: neither the
# build nor the tests need it.
# Usage: scripts/sass.sh FILE [NAME_REGEX]   SASS of FILE's kernels whose mangled names match the
#                                            extended regex (all of them without one)
#        scripts/sass.sh --res-usage FILE    registers, stack and shared memory of each kernel
# e.g.   scripts/sass.sh build/CMakeFiles/octet_ops.dir/src/ops/embedding/embedding_cuda.cu.o \
#          runs_kernel
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=13.5.37
dest="$root/.deps/cuda-disasm-$version"
py="$root/.venv/bin/python"  # scripts/setup.sh's; the system one otherwise
[ -x "$py" ] || py=python3

fetch() {  # wheel-name sha256
  local tmp whl
  tmp=$(mktemp -d)
  "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform manylinux2014_x86_64 -d "$tmp" "$1==$version"
  whl=$(ls "$tmp"/*.whl)
  if ! echo "$2  $whl" | sha256sum -c --quiet -; then
    echo "sass: $1 $version: wheel hash mismatch" >&2
    exit 1
  fi
  "$py" - "$whl" "$dest/bin" <<'PY'
import os, sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
with zipfile.ZipFile(whl) as z:
    for info in z.infolist():
        if "/bin/" in info.filename and not info.is_dir():
            path = os.path.join(out, os.path.basename(info.filename))
            with z.open(info) as src, open(path, "wb") as dst:
                dst.write(src.read())
            os.chmod(path, 0o755)
PY
  rm -rf "$tmp"
}
if [ ! -f "$dest/.complete" ]; then
  rm -rf "$dest"
  fetch nvidia-cuda-cuobjdump 38780fee50863252a0b8926357faa91615ca1c8346490563f33a06100cd73f58
  fetch nvidia-cuda-nvdisasm d3fdbdd49fa53e2e4aacd3db8259d052bd2b049ececdcb69e92e083c6728e7ca
  touch "$dest/.complete"
fi
export PATH="$dest/bin:$PATH"

if [ "${1:-}" = "--res-usage" ]; then
  [ $# -eq 2 ] || { echo "usage: scripts/sass.sh --res-usage FILE" >&2; exit 2; }
  exec cuobjdump -res-usage "$2"
fi
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: scripts/sass.sh FILE [NAME_REGEX]" >&2
  exit 2
fi
[ -f "$1" ] || { echo "sass: no file $1" >&2; exit 1; }
if [ $# -eq 1 ]; then
  exec cuobjdump -sass "$1"
fi
mapfile -t names < <(cuobjdump -sass "$1" | sed -n 's/^[[:space:]]*Function : //p' |
  grep -E -- "$2" || true)
[ ${#names[@]} -gt 0 ] || { echo "sass: no kernel of $1 matches $2" >&2; exit 1; }
for n in "${names[@]}"; do cuobjdump -sass -fun "$n" "$1"; done
