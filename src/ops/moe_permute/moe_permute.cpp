// Dispatcher for moe_permute.h: validates once, allocates outputs, routes to cpu:: or cuda::.
#include "ops/moe_permute/moe_permute.h"

#include <optional>
#include <string>

#include "backend/dispatch.h"
#include "core/cast_counter.h"
#include "numerics/scale.h"
#include "ops/moe_permute/moe_permute_backends.h"

namespace octet {
namespace {

constexpr uint32_t kScaleOne = 0x3F800000u;  // 1.0f: scale_inv of an all-zero group

void check_map(Context& ctx, const PermuteMap& m) {
  OCTET_CHECK(m.row_of.defined() && m.token_of.defined() && m.offsets.defined(),
              "permute map: not built (call moe_permute_map first)");
  check_device(m.row_of, "permute map row_of", ctx.device);
  OCTET_CHECK(m.row_of.rows() == m.num_tokens && m.row_of.cols() == m.top_k &&
                  m.token_of.numel() == m.num_rows,
              "permute map: row_of ", shape_str(m.row_of.shape()), " / token_of ",
              shape_str(m.token_of.shape()), " do not match T = ", m.num_tokens, ", k = ", m.top_k,
              ", R = ", m.num_rows);
}

void check_rows(const Tensor& t, const char* name, int64_t rows, Device device) {
  check_device(t, name, device);
  OCTET_CHECK(t.rank() >= 2 && t.rows() == rows, name, ": expected shape [", rows, ", D], got ",
              shape_str(t.shape()));
}

void check_out_dtype(DType d, const char* name) {
  OCTET_CHECK(d == DType::kBF16 || d == DType::kF32, name,
              ": output dtype must be BF16 or F32, got ", dtype_name(d));
}

// The row-wise FP8 codes and their 1x128 scales of a permute's input: one row per token.
void check_fp8_rows(const Context& ctx, const PermuteMap& map, const QuantTensor& x,
                    const std::string& what) {
  OCTET_CHECK(x.data.data() != nullptr || x.data.numel() == 0, what,
              ": the row-wise copy was not written");
  const std::string data = what + " data", scales = what + " scale_inv";
  check_dtype(x.data, data.c_str(), {fp8_dtype(x.format)});
  check_rows(x.data, data.c_str(), map.num_tokens, ctx.device);
  const int64_t groups = ceil_div(x.cols(), kGroup);
  check_k_major_scales(x.granularity, x.scale_inv, scales.c_str());
  check_dtype(x.scale_inv, scales.c_str(), {DType::kF32});
  check_device(x.scale_inv, scales.c_str(), ctx.device);
  OCTET_CHECK(x.scale_inv.numel() == map.num_tokens * groups, what, " scale_inv: expected shape [",
              map.num_tokens, ", ", groups, "], got ", shape_str(x.scale_inv.shape()));
}

}  // namespace

PermuteMap moe_permute_map(Context& ctx, const PermuteMapArgs& args) {
  const Tensor& idx = args.topk_idx;
  check_dtype(idx, "permute topk_idx", {DType::kI32});
  check_device(idx, "permute topk_idx", ctx.device);
  OCTET_CHECK(idx.rank() == 2 && idx.cols() >= 1, "permute topk_idx: expected shape [T, k], got ",
              shape_str(idx.shape()));
  OCTET_CHECK(args.num_experts >= 1 && args.num_experts <= (1 << 20),
              "permute: num_experts must be in [1, 2^20], got ", args.num_experts);
  PermuteMap m;
  m.num_tokens = idx.rows();
  m.top_k = idx.cols();
  m.num_experts = args.num_experts;
  m.padding = args.padding;
  const int64_t assignments = m.num_tokens * m.top_k;
  m.num_rows = args.padding == PermutePadding::kNone
                   ? assignments
                   : (assignments + (kGroup - 1) * args.num_experts) / kGroup * kGroup;
  OCTET_CHECK(m.num_rows < (int64_t{1} << 31), "permute: ", m.num_rows,
              " permuted rows exceed int32 indexing");
  m.row_of = Tensor::empty(ctx, {m.num_tokens, m.top_k}, DType::kI32);
  m.token_of = Tensor::empty(ctx, {m.num_rows}, DType::kI32);
  m.counts = Tensor::empty(ctx, {m.num_experts}, DType::kI32);
  m.group_sizes = Tensor::empty(ctx, {m.num_experts}, DType::kI32);
  m.offsets = Tensor::empty(ctx, {m.num_experts + 1}, DType::kI32);
  OCTET_DISPATCH(ctx, moe_permute_map, ctx, args, m);
  return m;
}

Tensor moe_permute(Context& ctx, const PermuteMap& map, const Tensor& x) {
  check_map(ctx, map);
  check_dtype(x, "permute input", {DType::kBF16, DType::kF32});
  check_rows(x, "permute input", map.num_tokens, ctx.device);
  Tensor out = Tensor::empty(ctx, {map.num_rows, x.cols()}, x.dtype());
  OCTET_DISPATCH(ctx, moe_gather_rows, ctx, map, x, x.cols() * dtype_size(x.dtype()), 0u, out);
  return out;
}

QuantTensor moe_permute(Context& ctx, const PermuteMap& map, const QuantTensor& x) {
  check_map(ctx, map);
  OCTET_CHECK(x.granularity == Granularity::k1x128,
              "permute fp8 input: expected 1x128 scales, got ", granularity_name(x.granularity));
  check_fp8_rows(ctx, map, x, "permute fp8 input");
  const int64_t cols = x.cols(), groups = ceil_div(cols, kGroup);
  QuantTensor q;
  q.format = x.format;
  q.granularity = Granularity::k1x128;
  q.rounding = x.rounding;
  q.amax = x.amax;  // padding adds only zeros: the same amax
  q.data = Tensor::empty(ctx, {map.num_rows, cols}, x.data.dtype());
  q.scale_inv = Tensor::empty(ctx, {map.num_rows, groups}, DType::kF32);
  OCTET_DISPATCH(ctx, moe_gather_rows, ctx, map, x.data, cols, 0u, q.data);
  OCTET_DISPATCH(ctx, moe_gather_rows, ctx, map, x.scale_inv, groups * 4, kScaleOne, q.scale_inv);
  return q;
}

QuantTensor moe_permute_transposed(Context& ctx, const PermuteMap& map, const QuantTensor& x,
                                   Granularity columnwise) {
  OCTET_CHECK(columnwise == Granularity::k128x128 || columnwise == Granularity::k1x128,
              "permute transposed: the column-wise scales are 128x128 tiles or their 1x128 form, "
              "not ",
              granularity_name(columnwise));
  check_map(ctx, map);
  OCTET_CHECK(x.granularity == Granularity::k1x128 && x.rounding == ScaleRounding::kPow2,
              "permute transposed: expected 1x128 power-of-2 scales (the scaling-aware transpose), "
              "got ",
              granularity_name(x.granularity),
              x.rounding == ScaleRounding::kPow2 ? "" : " with scales that are not powers of 2");
  check_fp8_rows(ctx, map, x, "permute transposed input");
  const int64_t cols = x.cols();
  QuantTensor q;
  q.format = x.format;
  q.granularity = Granularity::k1x128;
  q.rounding = x.rounding;
  q.amax = x.amax;
  q.data = Tensor::wrap(nullptr, {map.num_rows, cols}, x.data.dtype(), ctx.device);
  q.columnwise_granularity = columnwise;
  q.columnwise_data = Tensor::empty(ctx, {cols, map.num_rows}, x.data.dtype());
  q.columnwise_scale_inv =
      Tensor::empty(ctx, scale_shape(columnwise, cols, map.num_rows), DType::kF32);
  count_casts(ctx, CastKind::kTranspose, 1);
  if (map.num_rows > 0 && cols > 0)
    OCTET_DISPATCH(ctx, moe_permute_transposed, ctx, map, x, q.columnwise_data,
                   q.columnwise_scale_inv, columnwise);
  return q;
}

namespace {

// The fused FP8 dispatch; keep_rows: also the token rows; topk_weight: also the weights per row;
// transposed (set): also the scaling-aware column-wise copy of the permuted rows in that
// granularity (moe_permute_quantize_transposed; not with keep_rows or topk_weight).
PermuteQuantizeResult permute_quantize(Context& ctx, const PermuteMap& map,
                                       const QuantizeArgs& args, bool keep_rows,
                                       const Tensor& topk_weight,
                                       std::optional<Granularity> transposed = std::nullopt) {
  check_map(ctx, map);
  const Tensor& x = args.input;
  check_dtype(x, "permute quantize input", {DType::kBF16, DType::kF32});
  check_rows(x, "permute quantize input", map.num_tokens, ctx.device);
  OCTET_CHECK(args.granularity == Granularity::k1x128 && args.output == QuantizeOutput::kRowwise &&
                  !args.scale.defined(),
              "permute quantize: the FP8 dispatch quantizes in 1x128 groups, row-wise, with "
              "current scales; got ",
              granularity_name(args.granularity), args.scale.defined() ? " with a given scale" : "",
              args.output != QuantizeOutput::kRowwise ? " and a column-wise copy" : "");
  OCTET_CHECK(args.epsilon >= 0.0f && args.epsilon < 3.4e38f,
              "permute quantize: epsilon must be finite and >= 0, got ", args.epsilon);
  OCTET_CHECK(args.scale_layout == ScaleLayout::kKMajor,
              "permute quantize: the FP8 dispatch writes K-major scales (the grouped GEMMs read "
              "them); got a request for MN-major ones");
  const int64_t cols = x.cols(), groups = ceil_div(cols, kGroup);
  QuantTensor q;
  q.format = args.format;
  q.granularity = Granularity::k1x128;
  q.rounding = args.rounding;
  q.data = Tensor::empty(ctx, {map.num_rows, cols}, fp8_dtype(args.format));
  q.scale_inv = Tensor::empty(ctx, {map.num_rows, groups}, DType::kF32);
  if (args.amax) q.amax = Tensor::empty(ctx, {1}, DType::kF32);
  PermuteQuantizeResult out;
  if (keep_rows) {
    out.rows = q;
    out.rows.data = Tensor::empty(ctx, {map.num_tokens, cols}, fp8_dtype(args.format));
    out.rows.scale_inv = Tensor::empty(ctx, {map.num_tokens, groups}, DType::kF32);
  }
  if (topk_weight.defined()) {
    check_dtype(topk_weight, "permute quantize topk_weight", {DType::kF32});
    check_device(topk_weight, "permute quantize topk_weight", ctx.device);
    OCTET_CHECK((topk_weight.shape() == Shape{map.num_tokens, map.top_k}),
                "permute quantize topk_weight: expected shape (", map.num_tokens, ", ", map.top_k,
                "), got ", shape_str(topk_weight.shape()));
    out.w_rows = Tensor::empty(ctx, {map.num_rows}, DType::kF32);
  }
  QuantizeArgs a = args;
  a.input = x.reshape({map.num_tokens, cols});
  count_casts(ctx, CastKind::kQuantize, 1);  // the BF16 -> FP8 cast before the dispatch
  if (transposed) {
    OCTET_CHECK(*transposed == Granularity::k128x128 || *transposed == Granularity::k1x128,
                "permute quantize transposed: the column-wise scales are 128x128 tiles or their "
                "1x128 form, not ",
                granularity_name(*transposed));
    OCTET_CHECK(args.rounding == ScaleRounding::kPow2,
                "permute quantize transposed: the scaling-aware transpose needs power-of-2 "
                "scales");
    q.columnwise_granularity = *transposed;
    q.columnwise_data = Tensor::empty(ctx, {cols, map.num_rows}, fp8_dtype(args.format));
    q.columnwise_scale_inv =
        Tensor::empty(ctx, scale_shape(*transposed, cols, map.num_rows), DType::kF32);
    count_casts(ctx, CastKind::kTranspose, 1);
    OCTET_DISPATCH(ctx, moe_permute_quantize_transposed, ctx, map, a, q, *transposed);
  } else {
    OCTET_DISPATCH(ctx, moe_permute_quantize, ctx, map, a, q, keep_rows ? &out.rows : nullptr,
                   topk_weight, out.w_rows);
  }
  out.permuted = std::move(q);
  return out;
}

}  // namespace

QuantTensor moe_permute_quantize(Context& ctx, const PermuteMap& map, const QuantizeArgs& args) {
  return permute_quantize(ctx, map, args, false, Tensor()).permuted;
}

PermuteQuantizeResult moe_permute_quantize_keeping_rows(Context& ctx, const PermuteMap& map,
                                                        const QuantizeArgs& args,
                                                        const Tensor& topk_weight) {
  return permute_quantize(ctx, map, args, true, topk_weight);
}

QuantTensor moe_permute_quantize_transposed(Context& ctx, const PermuteMap& map,
                                            const QuantizeArgs& args, Granularity columnwise) {
  return permute_quantize(ctx, map, args, false, Tensor(), columnwise).permuted;
}

namespace {

// The then_add tensors of a gather (moe_permute.h): at most two, each (T, cols) in out_dtype on
// the context's device.
struct Addends {
  Tensor first, second;
};
Addends gather_addends(Context& ctx, const PermuteMap& map, int64_t cols, DType out_dtype,
                       const std::vector<Tensor>& then_add, const char* what) {
  OCTET_CHECK(then_add.size() <= 2, what, ": at most two tensors to add, got ", then_add.size());
  for (const Tensor& a : then_add) {
    OCTET_CHECK(a.defined(), what, ": a tensor to add is undefined");
    OCTET_CHECK(a.dtype() == out_dtype, what, ": a tensor to add must have the output's dtype ",
                dtype_name(out_dtype), ", got ", dtype_name(a.dtype()));
    check_device(a, what, ctx.device);
    OCTET_CHECK((a.shape() == Shape{map.num_tokens, cols}), what,
                ": a tensor to add must have the output's shape (", map.num_tokens, ", ", cols,
                "), got ", shape_str(a.shape()));
  }
  Addends r;
  if (!then_add.empty()) r.first = then_add[0];
  if (then_add.size() > 1) r.second = then_add[1];
  return r;
}

// moe_permute_backward, and with d_rows defined also moe_permute_weights_backward in its pass.
PermuteBackwardResult permute_backward(Context& ctx, const PermuteMap& map,
                                       const Tensor& d_permuted, DType out_dtype,
                                       const Tensor& d_rows,
                                       const std::vector<Tensor>& then_add = {}) {
  check_map(ctx, map);
  check_dtype(d_permuted, "permute backward d_permuted", {DType::kBF16, DType::kF32});
  check_rows(d_permuted, "permute backward d_permuted", map.num_rows, ctx.device);
  check_out_dtype(out_dtype, "permute backward");
  PermuteBackwardResult r;
  r.d_x = Tensor::empty(ctx, {map.num_tokens, d_permuted.cols()}, out_dtype);
  if (d_rows.defined()) {
    check_dtype(d_rows, "permute backward d_rows", {DType::kF32});
    check_device(d_rows, "permute backward d_rows", ctx.device);
    OCTET_CHECK((d_rows.shape() == Shape{map.num_rows}),
                "permute backward d_rows: expected shape (", map.num_rows, "), got ",
                shape_str(d_rows.shape()));
    r.d_topk_weight = Tensor::empty(ctx, {map.num_tokens, map.top_k}, DType::kF32);
  }
  const Addends add =
      gather_addends(ctx, map, d_permuted.cols(), out_dtype, then_add, "permute backward");
  OCTET_DISPATCH(ctx, moe_weighted_gather, ctx, map, d_permuted, Tensor(), r.d_x, d_rows,
                 r.d_topk_weight, add.first, add.second);
  return r;
}

}  // namespace

Tensor moe_permute_backward(Context& ctx, const PermuteMap& map, const Tensor& d_permuted,
                            DType out_dtype, const std::vector<Tensor>& then_add) {
  return permute_backward(ctx, map, d_permuted, out_dtype, Tensor(), then_add).d_x;
}

PermuteBackwardResult moe_permute_backward_with_weights(Context& ctx, const PermuteMap& map,
                                                        const Tensor& d_permuted, DType out_dtype,
                                                        const Tensor& d_rows) {
  OCTET_CHECK(d_rows.defined(), "permute backward: d_rows is required");
  return permute_backward(ctx, map, d_permuted, out_dtype, d_rows);
}

Tensor moe_combine(Context& ctx, const PermuteMap& map, const CombineArgs& args) {
  check_map(ctx, map);
  check_dtype(args.expert_out, "combine expert_out", {DType::kBF16, DType::kF32});
  check_rows(args.expert_out, "combine expert_out", map.num_rows, ctx.device);
  check_dtype(args.topk_weight, "combine topk_weight", {DType::kF32});
  check_device(args.topk_weight, "combine topk_weight", ctx.device);
  OCTET_CHECK(args.topk_weight.rows() == map.num_tokens && args.topk_weight.cols() == map.top_k,
              "combine topk_weight: expected shape [", map.num_tokens, ", ", map.top_k, "], got ",
              shape_str(args.topk_weight.shape()));
  check_out_dtype(args.out_dtype, "combine");
  Tensor out = Tensor::empty(ctx, {map.num_tokens, args.expert_out.cols()}, args.out_dtype);
  const Addends add =
      gather_addends(ctx, map, args.expert_out.cols(), args.out_dtype, args.then_add, "combine");
  Tensor none;
  OCTET_DISPATCH(ctx, moe_weighted_gather, ctx, map, args.expert_out, args.topk_weight, out,
                 Tensor(), none, add.first, add.second);
  return out;
}

CombineGrads moe_combine_backward(Context& ctx, const PermuteMap& map,
                                  const CombineBackwardArgs& args) {
  check_map(ctx, map);
  check_dtype(args.expert_out, "combine backward expert_out", {DType::kBF16, DType::kF32});
  check_rows(args.expert_out, "combine backward expert_out", map.num_rows, ctx.device);
  const int64_t cols = args.expert_out.cols();
  check_dtype(args.d_out, "combine backward d_out", {DType::kBF16, DType::kF32});
  check_rows(args.d_out, "combine backward d_out", map.num_tokens, ctx.device);
  OCTET_CHECK(args.d_out.cols() == cols, "combine backward d_out: expected shape [", map.num_tokens,
              ", ", cols, "] (D of expert_out), got ", shape_str(args.d_out.shape()));
  check_dtype(args.topk_weight, "combine backward topk_weight", {DType::kF32});
  check_device(args.topk_weight, "combine backward topk_weight", ctx.device);
  OCTET_CHECK(args.topk_weight.rows() == map.num_tokens && args.topk_weight.cols() == map.top_k,
              "combine backward topk_weight: expected shape [", map.num_tokens, ", ", map.top_k,
              "], got ", shape_str(args.topk_weight.shape()));
  check_out_dtype(args.d_expert_out_dtype, "combine backward d_expert_out");
  CombineGrads g;
  g.d_expert_out = Tensor::empty(ctx, {map.num_rows, cols}, args.d_expert_out_dtype);
  g.d_topk_weight = Tensor::empty(ctx, {map.num_tokens, map.top_k}, DType::kF32);
  OCTET_DISPATCH(ctx, moe_combine_backward, ctx, map, args, g);
  return g;
}

}  // namespace octet
