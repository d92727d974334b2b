// Per-group per-tensor quantization of the contiguous grouped layout that ops/moe_permute builds
// and ops/grouped_gemm reads (rows [o_g, o_g + M_g) belong to group g, o_g = M_0 + ... + M_{g-1}):
// the per-tensor FP8 recipes' routed experts quantize each expert's rows with their own scale, as
// one Linear per expert would, but in one pass over the whole tensor with the counts read on the
// device (no host synchronisation).
//
//   scale_g      = args.scale[g] when given (delayed scaling), else compute_scale(amax_g, rule)
//                  with amax_g = max |x| over the group's rows (0 for an empty group: scale 1)
//   q[r, c]      = cvt_rn_satfinite(x[r, c] * scale_g(r))       r in group g(r)
//   scale_inv_g  = 1 / scale_g
//
// exactly as quantize(..., Granularity::kTensor) applied to each group on its own (bit for bit). The
// scales are written in the layouts the blockwise grouped GEMMs read, so per-tensor scaling runs
// through them as constant blocks (no re-layout kernel):
//   row-wise     data (R, C), scale_inv (R, ceil(C/128)): 1x128, every entry of row r is
//                scale_inv_g(r)
//   column-wise  columnwise_data (C, R), the transpose; columnwise_scale_inv 1x128 along rows
//                (C, ceil(R/128)) or 128x128 (ceil(C/128), ceil(R/128)) (columnwise_granularity),
//                block b's entry the scale_inv of the group that owns row 128 b. Every non-empty
//                group must start at a multiple of 128 rows (PermutePadding::kTo128), so that no
//                block of 128 rows straddles two groups; checked on the CPU, the caller's promise
//                on CUDA (where the counts stay on the device).
// Rows past the groups' sum (the tail of a padded permute) belong to no group: scale 1.
//
// CPU (reference) and CUDA agree bit for bit: every value is numerics/scale.h's scalar rule, and
// the amaxes are maxima of |x| bit patterns (order-free, NaN wins).
#pragma once

#include "core/context.h"
#include "core/quant_tensor.h"
#include "numerics/scale.h"
#include "ops/quantize/quantize.h"

namespace octet {

struct GroupedQuantizeArgs {
  Tensor input = {};        // (R, C) bf16 | f32, leading dimensions flattened into rows
  Tensor group_sizes = {};  // (G) int32 on the context's device: M_g >= 0, sum M_g <= R
  Fp8Format format = Fp8Format::kE4M3;
  ScaleRounding rounding = ScaleRounding::kExact;
  float epsilon = 0.0f;  // amax floor, >= 0
  QuantizeOutput output = QuantizeOutput::kRowwise;
  // The layout of the column-wise scales: k1x128 (a GEMM's A along tokens) or k128x128 (its B).
  Granularity columnwise_granularity = Granularity::k1x128;
  Tensor scale = {};  // optional (G) f32: delayed scaling, each group's scale; undefined: current
};

struct GroupedQuantTensor {
  // granularity k1x128 with the constant per-group scales above; amax undefined (per group below).
  QuantTensor q;
  Tensor amax;       // (G) f32: max |x| over each group's rows
  Tensor scale_inv;  // (G) f32: 1 / scale_g
};

GroupedQuantTensor quantize_grouped_tensorwise(Context& ctx, const GroupedQuantizeArgs& args);

}  // namespace octet
