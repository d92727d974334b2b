// Internal: the per-backend implementations behind cast.h. Arguments are validated and outputs
// allocated by cast.cpp (dtypes, shapes, devices, numel >= 1); these functions only compute.
#pragma once

#include "numerics/fp32_rn.h"
#include "ops/cast/cast.h"

namespace octet {

#define OCTET_CAST_BACKEND_DECLS                                    \
  void cast(Context& ctx, const Tensor& x, const Tensor& out);      \
  void transpose(Context& ctx, const Tensor& x, const Tensor& out); \
  void add_into(Context& ctx, const Tensor& y, const Tensor& x);

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

}  // namespace octet
