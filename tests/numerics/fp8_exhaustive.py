#!/usr/bin/env python3
"""Exhaustive check of octet's number conversions against ml_dtypes and numpy (DESIGN.md section 2).

Run by ctest through tests/run_python.sh:
    fp8_exhaustive.py --lib path/to/liboctet_capi.so --device cpu|cuda [--jobs N]

Checks (every input pattern, nothing sampled):
  e4m3 / e5m2 encode   all 2^32 FP32 patterns through octet's quantize (per-tensor scale 1) on the device
  e4m3 / e5m2 decode   all 256 codes through octet's dequantize (scale_inv 1) on the device
  bf16 encode          all 2^32 FP32 patterns, host conversion (numerics/fp8.h)     --device cpu only
  e5m10 round          all 2^32 FP32 patterns, generic ExMy rounding vs float16    --device cpu only
The host-only checks do not depend on the device, so the cuda run leaves them to the cpu run.

Reference semantics. octet saturates (cvt.rn.satfinite): finite values beyond the largest finite value
and infinities become +-max. ml_dtypes and numpy do not saturate (they give inf, or NaN for e4m3fn), so
the reference for a non-NaN x is the library's round-to-nearest-even of clip(x, -max, max); clipping
cannot change the rounding of in-range values and maps +-inf to +-max. BF16 has FP32's range and is
not clipped: it overflows to inf, as CUDA's __float2bfloat16_rn does.
NaN: a NaN input must give a NaN output (any NaN code); only NaN-ness is compared. The sign and payload
of that NaN are unspecified by the contract: fp8.h gives the positive all-ones code as the hardware
conversion does, ml_dtypes keeps the input's sign, and a GPU's x * 1 already returns a canonical NaN.

Exit status: 0 when every check passes, 1 otherwise, 77 (skipped) for --device cuda without a GPU.
The last line reads "N passed, M failed" over the checks listed above.
"""

import argparse
import ctypes
import multiprocessing
import os
import sys
import time

import numpy as np

try:
    import ml_dtypes
except ImportError:  # a missing reference is a broken environment, not a skip
    sys.exit("fp8_exhaustive.py: needs ml_dtypes (pip install ml_dtypes; scripts/setup.sh does it)")

CHUNK_BITS = 24  # 2^24 patterns per task: 64 MiB of float32, 256 tasks for the whole space
N_CHUNKS = 1 << (32 - CHUNK_BITS)
SKIP = 77
MAX_EXAMPLES = 5

# name -> (capi format, largest finite value, ml_dtypes type)
FP8 = {
    "e4m3": (0, 448.0, ml_dtypes.float8_e4m3fn),
    "e5m2": (1, 57344.0, ml_dtypes.float8_e5m2),
}
F16_MAX = 65504.0  # largest finite E5M10 (IEEE half)
F16_TINY = np.float32(2.0**-25)  # half the smallest float16 subnormal

_lib = None  # the library, loaded once per worker process
_buf = {}  # per-process scratch arrays, reused across chunks (allocation costs as much as a pass)


def load(path):
    lib = ctypes.CDLL(path)
    p, i, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
    lib.octet_capi_has_gpu.argtypes = []
    lib.octet_capi_cast_to_fp8.argtypes = [i, i, p, p, i64]
    lib.octet_capi_fp8_to_float.argtypes = [i, i, p, p, i64]
    lib.octet_capi_float_to_bf16.argtypes = [p, p, i64]
    lib.octet_capi_round_exmy.argtypes = [p, p, i64, i, i, i]
    return lib


def scratch(name, dtype, n):
    b = _buf.get(name)
    if b is None or b.dtype != dtype or b.size != n:
        b = _buf[name] = np.empty(n, dtype)
    return b


def call(fn, *args):
    rc = fn(*args)
    if rc != 0:
        raise RuntimeError(f"{fn.__name__} returned {rc}")


def nan_codes(dtype, bits):
    """Boolean table over all codes of a small format: which codes are NaN (from the reference)."""
    codes = np.arange(1 << bits, dtype=np.uint16 if bits == 16 else np.uint8)
    return np.isnan(codes.view(dtype).astype(np.float32))


def mismatches(x, got, ref, got_is_nan):
    """Indices where got != ref, except NaN inputs that gave a NaN (sign and payload unspecified)."""
    ne = scratch("ne", np.bool_, got.size)
    np.not_equal(got, ref, out=ne)
    if not ne.any():  # the common case, and a cheap one: no index array to build
        return np.empty(0, np.int64)
    bad = np.flatnonzero(ne)
    return bad[~(np.isnan(x[bad]) & got_is_nan(got[bad]))]


def describe(x, got, ref, idx):
    w = got.dtype.itemsize * 2
    return [
        f"x=0x{int(x.view(np.uint32)[i]):08x} ({float(x[i])!r}): octet 0x{int(got[i]):0{w}x}, "
        f"reference 0x{int(ref[i]):0{w}x}"
        for i in idx[:MAX_EXAMPLES]
    ]


def check_chunk(task):
    """Checks one chunk of 2^CHUNK_BITS FP32 patterns; returns {check: (mismatch count, examples)}."""
    global _lib
    lib_path, device, chunk, host_checks = task
    if _lib is None:
        _lib = load(lib_path)
        np.seterr(invalid="ignore")  # casting NaN to the small formats is expected here
    n = 1 << CHUNK_BITS
    u = scratch("u", np.uint32, n)
    u[:] = np.arange(n, dtype=np.uint32)
    u += np.uint32(chunk << CHUNK_BITS)
    x = u.view(np.float32)
    xp = x.ctypes.data
    out = {}

    clipped = scratch("clipped", np.float32, n)
    got8 = scratch("got8", np.uint8, n)
    for name, (fmt, fmax, dtype) in FP8.items():
        call(_lib.octet_capi_cast_to_fp8, device, fmt, xp, got8.ctypes.data, n)
        np.clip(x, -fmax, fmax, out=clipped)
        ref = clipped.astype(dtype).view(np.uint8)
        table = nan_codes(dtype, 8)
        bad = mismatches(x, got8, ref, lambda g, t=table: t[g])
        out[f"{name} encode"] = (int(bad.size), describe(x, got8, ref, bad))

    if host_checks:
        got16 = scratch("got16", np.uint16, n)
        call(_lib.octet_capi_float_to_bf16, xp, got16.ctypes.data, n)
        ref = x.astype(ml_dtypes.bfloat16).view(np.uint16)
        bad = mismatches(x, got16, ref, lambda g: (g & 0x7FFF) > 0x7F80)
        out["bf16 encode"] = (int(bad.size), describe(x, got16, ref, bad))

        got32 = scratch("got32", np.float32, n)
        np.clip(x, -F16_MAX, F16_MAX, out=clipped)
        # numpy raises its underflow flag element by element through a subnormal operation (~100 ns
        # each on x86). Inputs below half the smallest float16 subnormal (2^-25) round to the signed
        # zero, so they are handed to numpy as that zero, which converts fast; the tie 2^-25 itself and
        # everything above still go through numpy's own rounding.
        tiny = scratch("tiny", np.bool_, n)
        np.less(np.abs(clipped, out=got32), F16_TINY, out=tiny)
        np.copysign(np.float32(0), clipped, out=clipped, where=tiny)
        ref = clipped.astype(np.float16).astype(np.float32).view(np.uint32)
        call(_lib.octet_capi_round_exmy, xp, got32.ctypes.data, n, 5, 10, 0)
        g = got32.view(np.uint32)
        bad = mismatches(x, g, ref, lambda v: (v & 0x7FFFFFFF) > 0x7F800000)
        out["e5m10 round"] = (int(bad.size), describe(x, g, ref, bad))
    return out


def check_decode(lib, device):
    """All 256 codes of each FP8 format: bits must match (signed zeros, infinities), NaN codes NaN."""
    out = {}
    codes = np.arange(256, dtype=np.uint8)
    for name, (fmt, _, dtype) in FP8.items():
        got = np.empty(256, np.float32)
        call(lib.octet_capi_fp8_to_float, device, fmt, codes.ctypes.data, got.ctypes.data, 256)
        ref = codes.view(dtype).astype(np.float32)
        g, r = got.view(np.uint32), ref.view(np.uint32)
        bad = np.flatnonzero((g != r) & ~(np.isnan(got) & np.isnan(ref)))
        examples = [
            f"code 0x{i:02x}: octet 0x{int(g[i]):08x}, reference 0x{int(r[i]):08x}" for i in bad[:MAX_EXAMPLES]
        ]
        out[f"{name} decode"] = (int(bad.size), examples)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", required=True, help="path of liboctet_capi")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    default_jobs = min(len(os.sched_getaffinity(0)), 8)
    ap.add_argument("--jobs", type=int, default=default_jobs, help="worker processes (default %(default)s)")
    ap.add_argument("--chunks", type=int, default=N_CHUNKS,
                    help="check only the first N chunks of 2^24 patterns (for quick runs; default all)")
    args = ap.parse_args()
    device = 1 if args.device == "cuda" else 0
    host_checks = device == 0
    start = time.monotonic()

    # Probe in a child so that this process never initialises CUDA: the workers must make their own
    # contexts, and spawned workers are used for the same reason.
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as probe:
        has_gpu = probe.apply(_probe_gpu, (args.lib,))
    if device == 1 and not has_gpu:
        print("skipped: --device cuda but no CUDA GPU is visible (or octet was built without CUDA)")
        return SKIP

    totals = {}
    with ctx.Pool(max(1, args.jobs)) as pool:
        decode = pool.apply_async(_decode_task, (args.lib, device))
        tasks = [(args.lib, device, c, host_checks) for c in range(min(args.chunks, N_CHUNKS))]
        for done, res in enumerate(pool.imap_unordered(check_chunk, tasks), 1):
            for name, (count, examples) in res.items():
                t = totals.setdefault(name, [0, [], 0])
                t[0] += count
                t[1].extend(examples[: MAX_EXAMPLES - len(t[1])])
                t[2] += 1 << CHUNK_BITS
            if done % 32 == 0:
                print(f"  {done}/{len(tasks)} chunks, {time.monotonic() - start:.0f} s", flush=True)
        for name, (count, examples) in decode.get().items():
            totals[name] = [count, examples, 256]

    passed = failed = 0
    for name, (count, examples, inputs) in totals.items():
        status = "ok" if count == 0 else "FAILED"
        print(f"{name:12s} {args.device}: {inputs} inputs, {count} mismatches  {status}")
        for e in examples:
            print(f"    {e}")
        passed += count == 0
        failed += count != 0
    print(f"time {time.monotonic() - start:.1f} s with {args.jobs} workers")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


def _probe_gpu(lib_path):
    return bool(load(lib_path).octet_capi_has_gpu())


def _decode_task(lib_path, device):
    return check_decode(load(lib_path), device)


if __name__ == "__main__":
    sys.exit(main())
