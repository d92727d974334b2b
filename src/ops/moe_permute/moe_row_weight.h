// The routing weights in the permuted layout (FP8-Flow-MoE's dataflow, DESIGN.md section 3): the
// fp8-flow recipe applies each token's routing weight inside its expert (fused into SwiGLU +
// quantize, ops/swiglu) instead of in the combine, so that the combine's backward is a pure copy
// of the incoming gradient and the backward dispatch can move FP8 rows unchanged. These two ops move
// the (T, k) weights to one weight per permuted row and the gradient back.
//
//   moe_permute_weights           w_rows[row_of[t, j]] = topk_weight[t, j]; padding rows 0.0
//   moe_permute_weights_backward  d_topk_weight[t, j]  = d_rows[row_of[t, j]]
//
// Both are copies (no arithmetic), so CPU and CUDA agree bit for bit. A choice the CUDA map
// dropped (row_of -1, see moe_permute.h) has weight gradient 0. Outputs are freshly allocated (=).
#pragma once

#include "ops/moe_permute/moe_permute.h"

namespace octet {

// topk_weight (T, k) f32 -> (R) f32.
Tensor moe_permute_weights(Context& ctx, const PermuteMap& map, const Tensor& topk_weight);

// d_rows (R) f32 -> (T, k) f32.
Tensor moe_permute_weights_backward(Context& ctx, const PermuteMap& map, const Tensor& d_rows);

namespace cpu {
void moe_permute_weights(Context& ctx, const PermuteMap& map, const Tensor& topk_weight,
                         Tensor& w_rows);
void moe_permute_weights_backward(Context& ctx, const PermuteMap& map, const Tensor& d_rows,
                                  Tensor& d_topk_weight);
}  // namespace cpu
namespace cuda {
void moe_permute_weights(Context& ctx, const PermuteMap& map, const Tensor& topk_weight,
                         Tensor& w_rows);
void moe_permute_weights_backward(Context& ctx, const PermuteMap& map, const Tensor& d_rows,
                                  Tensor& d_topk_weight);
}  // namespace cuda

}  // namespace octet
