// Elementwise dtype casts, the matrix transpose and y += x for F32 and BF16 tensors: the glue a
// Linear layer needs around its GEMMs (the BF16 recipe's transposed operands, BF16 copies of FP32
// master weights, accumulation of partial results).
//
//   cast       out[i] = round(x[i])          F32 -> BF16 rounds to nearest even (numerics/fp8.h
//                                           float_to_bf16: NaN stays NaN, overflow goes to inf);
//                                           BF16 -> F32 is exact; a same-dtype cast copies bytes
//   transpose  out[j, i] = x[i, j]           of the (rows, cols) matrix view; out is (cols, rows)
//   add_into   y[i] = round(y[i] + x[i])     the sum in FP32 (one correctly rounded add), then one
//                                           rounding to y's dtype when y is BF16  (+=); a NaN
//                                           sum is the canonical NaN 0x7FFFFFFF (0x7FFF in BF16)
//
// cast and transpose return freshly allocated tensors (=); add_into accumulates into y (+=). All
// tensors live on the context's device. The CPU and CUDA backends agree bit for bit: every output
// element is the result of the same one or two correctly rounded operations.
#pragma once

#include "core/context.h"
#include "numerics/fp8.h"

namespace octet {

// x (any shape) f32 or bf16 -> a tensor of x's shape in `to` (f32 or bf16), written (=).
Tensor cast(Context& ctx, const Tensor& x, DType to);

// x (rows, cols) f32 or bf16, leading dimensions flattened into rows -> (cols, rows), x's dtype.
Tensor transpose(Context& ctx, const Tensor& x);

// x (batch, rows, cols) -> (batch, cols, rows): each matrix transposed, one launch. Moves element
// bytes (never rounds): f32, bf16 and the 1-byte types (e4m3, e5m2, u8), so FP8 data and its
// scales relayout without a copy per matrix.
Tensor transpose_batched(Context& ctx, const Tensor& x);

// y (any shape) f32 or bf16 += x (y's shape) f32 or bf16, elementwise; y and x must not overlap.
void add_into(Context& ctx, Tensor& y, const Tensor& x);

// Emulated low-precision storage (DeepSeek-V3 keeps the input of the attention output projection in
// "E5M6" for its Wgrad, reference/fp8-facts.md section 4): per 1x128 tile of each row, a power-of-2
// scale s = 2^floor(log2(format_max / amax)) (1 for a zero or non-finite amax, at most 2^100), then
//   out[i] = decode(encode_rn(x[i] * s)) / s        (numerics/fp8.h ExMy, saturating)
// Both multiplications by powers of 2 are exact, so out holds exactly the values the format with
// that scale can represent; for formats with at most 7 mantissa bits (E5M6) they are BF16 values.
// x (rows, cols) f32 | bf16 -> x's shape and dtype (=). CPU and CUDA agree bit for bit.
// `kernel` picks the CUDA kernel for BF16 data (the same bits either way): kAuto the integer
// encode of ops/cast/storage_round_bf16.h where the format allows, kGenericEncode the previous
// kernel through numerics/fp8.h's ExMy encode and decode (kept for `octet bench attention`).
enum class StorageKernel : uint8_t { kAuto, kGenericEncode };
Tensor round_to_storage(Context& ctx, const Tensor& x, ExMyFormat format,
                        StorageKernel kernel = StorageKernel::kAuto);

}  // namespace octet
