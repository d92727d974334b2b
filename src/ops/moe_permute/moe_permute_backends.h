// Internal: the per-backend implementations behind moe_permute.h. Arguments are validated and
// outputs allocated by moe_permute.cpp; these functions only compute.
#pragma once

#include "ops/moe_permute/moe_permute.h"

namespace octet {

#define OCTET_MOE_PERMUTE_BACKEND_DECLS                                                           \
  void moe_permute_map(Context& ctx, const PermuteMapArgs& args, PermuteMap& map);                \
  /* out[r] = src[token_of[r]], rows of row_bytes bytes; padding rows get fill_word. */           \
  void moe_gather_rows(Context& ctx, const PermuteMap& map, const Tensor& src, int64_t row_bytes, \
                       uint32_t fill_word, Tensor& out);                                          \
  /* out[t] = sum_j w[t, j] src[row_of[t, j]] (w = 1 without weight), FP32, slot order; with */   \
  /* d_rows defined also d_topk[t, j] = d_rows[row_of[t, j]] (moe_permute_weights_backward); */   \
  /* then add0 and add1 (each if defined, out's dtype and shape) as add_into adds them */         \
  void moe_weighted_gather(Context& ctx, const PermuteMap& map, const Tensor& src,                \
                           const Tensor& weight, Tensor& out, const Tensor& d_rows,               \
                           Tensor& d_topk, const Tensor& add0, const Tensor& add1);               \
  void moe_combine_backward(Context& ctx, const PermuteMap& map, const CombineBackwardArgs& args, \
                            CombineGrads& grads);                                                 \
  /* moe_permute_quantize: out's data, scale_inv and amax allocated, written here; rows_out */    \
  /* (null unless asked for) gets x's (T, D) quantized rows, its amax shared with out's; with */  \
  /* topk_weight defined, w_rows (R) gets moe_permute_weights(map, topk_weight) */                \
  void moe_permute_quantize(Context& ctx, const PermuteMap& map, const QuantizeArgs& args,        \
                            QuantTensor& out, QuantTensor* rows_out, const Tensor& topk_weight,   \
                            Tensor& w_rows);                                                      \
  /* moe_permute_transposed: cdata (D, R) and cscale allocated, written here */                   \
  void moe_permute_transposed(Context& ctx, const PermuteMap& map, const QuantTensor& x,          \
                              Tensor& cdata, Tensor& cscale, Granularity columnwise);             \
  /* moe_permute_quantize_transposed: out's row-wise and column-wise copies and amax allocated */ \
  void moe_permute_quantize_transposed(Context& ctx, const PermuteMap& map,                       \
                                       const QuantizeArgs& args, QuantTensor& out,                \
                                       Granularity columnwise);

namespace cpu {
OCTET_MOE_PERMUTE_BACKEND_DECLS
}
namespace cuda {
OCTET_MOE_PERMUTE_BACKEND_DECLS
}

#undef OCTET_MOE_PERMUTE_BACKEND_DECLS

}  // namespace octet
