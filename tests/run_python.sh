#!/bin/sh
# Runs a Python test with the configured interpreter, or python3 when that one is absent (the GPU machine
# runs a build made elsewhere and has its own Python with numpy and ml_dtypes).
py="$1"; shift
[ -x "$py" ] || py=python3
exec "$py" "$@"
