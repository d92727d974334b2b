// Dispatcher and CPU reference of moe_row_weight.h.
#include "ops/moe_permute/moe_row_weight.h"

#include "backend/dispatch.h"

namespace octet {
namespace {

void check_map(Context& ctx, const PermuteMap& m) {
  OCTET_CHECK(m.row_of.defined() && m.row_of.data() != nullptr,
              "permute map: not built (call moe_permute_map first)");
  check_device(m.row_of, "permute map row_of", ctx.device);
  OCTET_CHECK(m.row_of.rows() == m.num_tokens && m.row_of.cols() == m.top_k, "permute map: row_of ",
              shape_str(m.row_of.shape()), " does not match T = ", m.num_tokens, ", k = ", m.top_k);
}

}  // namespace

Tensor moe_permute_weights(Context& ctx, const PermuteMap& map, const Tensor& topk_weight) {
  check_map(ctx, map);
  check_dtype(topk_weight, "moe_permute_weights topk_weight", {DType::kF32});
  check_device(topk_weight, "moe_permute_weights topk_weight", ctx.device);
  OCTET_CHECK((topk_weight.shape() == Shape{map.num_tokens, map.top_k}),
              "moe_permute_weights topk_weight: expected shape (", map.num_tokens, ", ", map.top_k,
              "), got ", shape_str(topk_weight.shape()));
  Tensor w_rows = Tensor::empty(ctx, {map.num_rows}, DType::kF32);
  if (map.num_rows == 0) return w_rows;
  OCTET_DISPATCH(ctx, moe_permute_weights, ctx, map, topk_weight, w_rows);
  return w_rows;
}

Tensor moe_permute_weights_backward(Context& ctx, const PermuteMap& map, const Tensor& d_rows) {
  check_map(ctx, map);
  check_dtype(d_rows, "moe_permute_weights_backward d_rows", {DType::kF32});
  check_device(d_rows, "moe_permute_weights_backward d_rows", ctx.device);
  OCTET_CHECK((d_rows.shape() == Shape{map.num_rows}),
              "moe_permute_weights_backward d_rows: expected shape (", map.num_rows, "), got ",
              shape_str(d_rows.shape()));
  Tensor d = Tensor::empty(ctx, {map.num_tokens, map.top_k}, DType::kF32);
  if (d.numel() == 0) return d;
  OCTET_DISPATCH(ctx, moe_permute_weights_backward, ctx, map, d_rows, d);
  return d;
}

namespace cpu {

void moe_permute_weights(Context&, const PermuteMap& map, const Tensor& topk_weight,
                         Tensor& w_rows) {
  float* w = w_rows.data_as<float>();
  for (int64_t r = 0; r < map.num_rows; ++r) w[r] = 0.0f;
  const int32_t* row_of = map.row_of.data_as<const int32_t>();
  const float* tw = topk_weight.data_as<const float>();
  for (int64_t i = 0; i < map.num_tokens * map.top_k; ++i)
    if (row_of[i] >= 0) w[row_of[i]] = tw[i];
}

void moe_permute_weights_backward(Context&, const PermuteMap& map, const Tensor& d_rows,
                                  Tensor& d_topk_weight) {
  const int32_t* row_of = map.row_of.data_as<const int32_t>();
  const float* dr = d_rows.data_as<const float>();
  float* d = d_topk_weight.data_as<float>();
  for (int64_t i = 0; i < map.num_tokens * map.top_k; ++i)
    d[i] = row_of[i] >= 0 ? dr[row_of[i]] : 0.0f;
}

}  // namespace cpu
}  // namespace octet
