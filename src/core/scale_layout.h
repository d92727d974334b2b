// Scale layouts of 1x128-quantized tensors: where scale_inv puts the scale of (row r, K-group g) of
// a (rows, cols) matrix, L = ceil(cols / 128) groups per row.
//
//   layout    scale_inv shape        (r, g) at     read by
//   kKMajor   [rows, L]              r * L + g     quant_types.h's layout (the default): CUTLASS's
//                                                  grouped GEMMs, the scaling-aware transpose, the
//                                                  MoE permute and dispatch, checkpoints
//   kMNMajor  [L, ld / 4, 4]         g * ld + r    cuBLASLt's VEC128_32F layout (rows contiguous:
//                                                  "M-major" for its A, "N-major" for its B), read
//                                                  in place; ld = rows rounded up to 4 (16-byte
//                                                  columns), the padding rows hold 1.0
//
// The layout is a property of the scale tensor itself: MN-major scales are the only rank-3 1x128
// scales, so every holder (a QuantTensor's row-wise or column-wise copy, an Fp8Operand, a saved
// activation) carries it without a field of its own, and every consumer tells the two apart with
// scale_layout(). The dense Linear layers quantize x and dy MN-major (both copies), so the cuBLASLt
// GEMMs read their scales as they are; the MoE paths keep K-major. Consumers that read only one
// layout check it and fail with a message naming it. Every other granularity has one layout.
#pragma once

#include <cstdint>

#include "core/hd.h"
#include "core/quant_tensor.h"

namespace octet {

enum class ScaleLayout : uint8_t { kKMajor, kMNMajor };

inline constexpr int64_t kScaleRowAlign = 4;  // floats: the 16-byte columns cuBLASLt reads

const char* scale_layout_name(ScaleLayout l);  // "K-major", "MN-major"

// The row stride of an MN-major 1x128 scale tensor: rows rounded up to kScaleRowAlign.
OCTET_HD int64_t mn_major_ld(int64_t rows) {
  return ceil_div(rows, kScaleRowAlign) * kScaleRowAlign;
}

// Offset of the scale of (row r, group g) in a 1x128 scale tensor of a (rows, groups * 128) matrix.
OCTET_HD int64_t scale_1x128_offset(ScaleLayout l, int64_t r, int64_t g, int64_t rows,
                                    int64_t groups) {
  return l == ScaleLayout::kKMajor ? r * groups + g : g * mn_major_ld(rows) + r;
}

// Stores the scale_inv of (r, g); in the MN-major layout the writer of the last row also fills the
// padding rows of its group with 1.0, so a quantizer writes every element of the tensor.
OCTET_HD void store_1x128_scale(float* s, ScaleLayout l, int64_t r, int64_t g, int64_t rows,
                                int64_t groups, float v) {
  s[scale_1x128_offset(l, r, g, rows, groups)] = v;
  if (l == ScaleLayout::kMNMajor && r == rows - 1)
    for (int64_t p = rows; p < mn_major_ld(rows); ++p) s[g * mn_major_ld(rows) + p] = 1.0f;
}

// scale_shape() in a layout: kKMajor is scale_shape(g, rows, cols); kMNMajor (1x128 only, else an
// error) is [ceil(cols / 128), mn_major_ld(rows) / 4, 4].
Shape scale_shape(Granularity g, int64_t rows, int64_t cols, ScaleLayout layout);

// The layout of a scale tensor of granularity g: kMNMajor for a rank-3 1x128 tensor, else kKMajor.
ScaleLayout scale_layout(Granularity g, const Tensor& scale_inv);

// One clear error when a consumer that reads only K-major scales gets MN-major ones: `what` names
// the consumer and the operand.
void check_k_major_scales(Granularity g, const Tensor& scale_inv, const char* what);

}  // namespace octet
