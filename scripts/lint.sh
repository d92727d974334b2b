#!/usr/bin/env bash
# Style and static checks that CI enforces: clang-format (100 columns, .clang-format) on every C++ and
# CUDA file, clang-tidy (.clang-tidy: bug-finding checks, warnings are errors) on the library, CLI and
# benchmark sources of the build in ./build.
# Usage: scripts/lint.sh [--fix]   (--fix rewrites files with clang-format instead of checking)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mapfile -t files < <(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
clang-format --dry-run --Werror "${files[@]}"
echo "clang-format: ${#files[@]} files clean"
[ -f build/compile_commands.json ] || { echo "lint: run scripts/build.sh first" >&2; exit 1; }
mapfile -t tidy < <(git ls-files 'src/*.cpp' 'tools/*.cpp' 'bench/*.cpp')
printf '%s\n' "${tidy[@]}" | xargs -P "$(nproc)" -n 4 clang-tidy -p build --quiet 2>/dev/null
echo "clang-tidy: ${#tidy[@]} files clean"
