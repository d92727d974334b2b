// Internal: the per-backend implementations behind cast.h. Arguments are validated and outputs
// allocated by cast.cpp (dtypes, shapes, devices, numel >= 1); these functions only compute.
#pragma once

#include "numerics/fp32_rn.h"
#include "numerics/scale.h"
#include "ops/cast/cast.h"

namespace octet {

#define OCTET_CAST_BACKEND_DECLS                                                           \
  void cast(Context& ctx, const Tensor& x, const Tensor& out);                             \
  void transpose(Context& ctx, const Tensor& x, const Tensor& out);                        \
  void transpose_batched(Context& ctx, const Tensor& x, const Tensor& out);                \
  void add_into(Context& ctx, const Tensor& y, const Tensor& x);                           \
  void round_to_storage(Context& ctx, const Tensor& x, ExMyFormat f, StorageKernel kernel, \
                        const Tensor& out);

namespace cpu {
OCTET_CAST_BACKEND_DECLS
}
namespace cuda {
OCTET_CAST_BACKEND_DECLS
}

#undef OCTET_CAST_BACKEND_DECLS

// add_into's element: one correctly rounded FP32 add. A NaN result is made the canonical
// 0x7FFFFFFF on both backends: x86 and CUDA otherwise produce NaNs of different sign and payload
// (inf - inf is 0xFFC00000 on x86, 0x7FFFFFFF on the GPU), which would break bitwise agreement.
OCTET_HD float add_element(float y, float x) {
  const float s = rn::add(y, x);
  return s != s ? bits_float(0x7FFFFFFFu) : s;
}

// The power-of-2 scale of one tile for round_to_storage (cast.h), from the format's largest finite
// value format_max = decode_exmy(f.max_code(), f).
OCTET_HD float storage_tile_scale_for_max(float amax, float format_max) {
  constexpr uint32_t kMaxScaleBits = (127u + 100u) << 23;  // 2^100
  if (!(amax > 0.0f) || amax != amax || float_bits(amax) >= 0x7F800000u) return 1.0f;
  const float ratio = rn::div(format_max, amax);
  const uint32_t pow2 = float_bits(ratio) & 0x7F800000u;  // floor to a power of 2 (ratio > 0)
  if (pow2 == 0) return bits_float(0x00800000u);          // smallest normal: amax near FLT_MAX
  return bits_float(pow2 > kMaxScaleBits ? kMaxScaleBits : pow2);
}
OCTET_HD float storage_tile_scale(float amax, ExMyFormat f) {
  return storage_tile_scale_for_max(amax, decode_exmy(f.max_code(), f));
}

OCTET_HD float storage_round(float x, float scale, ExMyFormat f) {
  return rn::div(round_to_exmy(rn::mul(x, scale), f), scale);
}

}  // namespace octet
