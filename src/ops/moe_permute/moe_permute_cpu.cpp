// CPU reference for moe_permute.h: a counting sort over the assignments in token order, row copies,
// and FP32 sums in the orders the header states (numerics/fp32_rn.h, one rounding per operation).
#include <cstring>
#include <vector>

#include "core/cast_counter.h"
#include "numerics/fp32_rn.h"
#include "ops/cast/cast_backends.h"  // add_element: add_into's element
#include "ops/cpu_elements.h"
#include "ops/moe_permute/moe_permute_backends.h"
#include "ops/moe_permute/moe_row_weight.h"

namespace octet::cpu {
void moe_permute_map(Context&, const PermuteMapArgs& args, PermuteMap& m) {
  const int64_t T = m.num_tokens, k = m.top_k, E = m.num_experts;
  const int32_t* idx = args.topk_idx.data_as<const int32_t>();
  int32_t* counts = m.counts.data_as<int32_t>();
  int32_t* sizes = m.group_sizes.data_as<int32_t>();
  int32_t* offsets = m.offsets.data_as<int32_t>();
  std::fill_n(counts, E, 0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = idx[t * k + j];
      OCTET_CHECK(e >= 0 && e < E, "permute topk_idx: expert id ", e, " at (token ", t, ", slot ",
                  j, ") is outside [0, ", E, ")");
      for (int64_t i = 0; i < j; ++i)
        OCTET_CHECK(idx[t * k + i] != e, "permute topk_idx: token ", t, " chooses expert ", e,
                    " twice (slots ", i, " and ", j, ")");
      ++counts[e];
    }
  }
  offsets[0] = 0;
  for (int64_t e = 0; e < E; ++e) {
    sizes[e] = m.padding == PermutePadding::kTo128
                   ? static_cast<int32_t>(ceil_div(counts[e], kGroup) * kGroup)
                   : counts[e];
    offsets[e + 1] = offsets[e] + sizes[e];
  }
  int32_t* token_of = m.token_of.data_as<int32_t>();
  int32_t* row_of = m.row_of.data_as<int32_t>();
  std::fill_n(token_of, m.num_rows, -1);
  std::vector<int32_t> next(offsets, offsets + E);  // next free row of each expert
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t row = next[idx[t * k + j]]++;
      row_of[t * k + j] = row;
      token_of[row] = static_cast<int32_t>(t);
    }
  }
}

void moe_gather_rows(Context&, const PermuteMap& m, const Tensor& src, int64_t row_bytes,
                     uint32_t fill_word, Tensor& out) {
  const int32_t* token_of = m.token_of.data_as<const int32_t>();
  const auto* s = static_cast<const uint8_t*>(src.data());
  auto* o = static_cast<uint8_t*>(out.data());
  for (int64_t r = 0; r < m.num_rows; ++r) {
    uint8_t* dst = o + r * row_bytes;
    if (token_of[r] >= 0) {
      std::memcpy(dst, s + token_of[r] * row_bytes, static_cast<size_t>(row_bytes));
    } else {
      uint8_t fill[4];
      std::memcpy(fill, &fill_word, 4);
      for (int64_t b = 0; b < row_bytes; ++b) dst[b] = fill[b % 4];
    }
  }
}

void moe_weighted_gather(Context& ctx, const PermuteMap& m, const Tensor& src, const Tensor& weight,
                         Tensor& out, const Tensor& d_rows, Tensor& d_topk, const Tensor& add0,
                         const Tensor& add1) {
  if (d_rows.defined()) moe_permute_weights_backward(ctx, m, d_rows, d_topk);
  const int64_t T = m.num_tokens, k = m.top_k, D = src.cols();
  const int32_t* row_of = m.row_of.data_as<const int32_t>();
  const float* w = weight.data() ? weight.data_as<const float>() : nullptr;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t d = 0; d < D; ++d) {
      float acc = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        const float x = load(src, row_of[t * k + j] * D + d);
        acc = rn::add(acc, w ? rn::mul(w[t * k + j], x) : x);
      }
      store(out, t * D + d, acc);
      // then add_into's element for each addend, on the stored (rounded) value
      for (const Tensor* a : {&add0, &add1})
        if (a->data() != nullptr)
          store(out, t * D + d, add_element(load(out, t * D + d), load(*a, t * D + d)));
    }
  }
}

void moe_combine_backward(Context&, const PermuteMap& m, const CombineBackwardArgs& a,
                          CombineGrads& g) {
  const int64_t T = m.num_tokens, k = m.top_k, D = a.expert_out.cols();
  const int32_t* row_of = m.row_of.data_as<const int32_t>();
  const float* w = a.topk_weight.data_as<const float>();
  float* dw = g.d_topk_weight.data_as<float>();
  std::memset(g.d_expert_out.data(), 0, static_cast<size_t>(g.d_expert_out.nbytes()));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t row = row_of[t * k + j];
      float partial[32] = {};
      for (int64_t d = 0; d < D; ++d) {
        const float dy = load(a.d_out, t * D + d);
        store(g.d_expert_out, row * D + d, rn::mul(w[t * k + j], dy));
        partial[d % 32] = rn::add(partial[d % 32], rn::mul(dy, load(a.expert_out, row * D + d)));
      }
      for (int h = 16; h > 0; h /= 2)
        for (int l = 0; l < h; ++l) partial[l] = rn::add(partial[l], partial[l + h]);
      dw[t * k + j] = partial[0];
    }
  }
}

// The reference of the fused dispatch: quantize, then permute the payload and its scales.
void moe_permute_quantize(Context& ctx, const PermuteMap& map, const QuantizeArgs& args,
                          QuantTensor& out, QuantTensor* rows_out, const Tensor& topk_weight,
                          Tensor& w_rows) {
  if (topk_weight.defined()) moe_permute_weights(ctx, map, topk_weight, w_rows);
  const QuantTensor qx = [&] {
    const CastCountPause pause(ctx);  // the dispatcher counted this dispatch's one quantization
    return quantize(ctx, args);
  }();
  const int64_t cols = args.input.cols(), groups = ceil_div(cols, kGroup);
  moe_gather_rows(ctx, map, qx.data, cols, 0u, out.data);
  moe_gather_rows(ctx, map, qx.scale_inv, groups * 4, 0x3F800000u, out.scale_inv);  // pad: 1.0
  if (out.amax.defined()) out.amax.data_as<float>()[0] = qx.amax.data_as<const float>()[0];
  if (rows_out != nullptr) {  // the quantized rows themselves
    if (qx.data.nbytes()) std::memcpy(rows_out->data.data(), qx.data.data(), qx.data.nbytes());
    if (qx.scale_inv.nbytes())
      std::memcpy(rows_out->scale_inv.data(), qx.scale_inv.data(), qx.scale_inv.nbytes());
  }
}

// The reference of the transposed dispatch: the permutation, then the scaling-aware transpose.
void moe_permute_transposed(Context& ctx, const PermuteMap& map, const QuantTensor& x,
                            Tensor& cdata, Tensor& cscale, Granularity columnwise) {
  QuantTensor q = octet::moe_permute(ctx, map, x);
  {
    const CastCountPause pause(ctx);  // the dispatcher counted this transpose
    scaling_aware_transpose(ctx, q, columnwise);
  }
  std::memcpy(cdata.data(), q.columnwise_data.data(), static_cast<size_t>(cdata.nbytes()));
  std::memcpy(cscale.data(), q.columnwise_scale_inv.data(), static_cast<size_t>(cscale.nbytes()));
}

// The reference of the transposed dispatch: the dispatch keeping the token rows, then their
// gathered scaling-aware transpose.
void moe_permute_quantize_transposed(Context& ctx, const PermuteMap& map, const QuantizeArgs& args,
                                     QuantTensor& out, Granularity columnwise) {
  QuantTensor rows = out;
  const int64_t cols = args.input.cols();
  rows.data = Tensor::empty(ctx, {map.num_tokens, cols}, out.data.dtype());
  rows.scale_inv = Tensor::empty(ctx, {map.num_tokens, ceil_div(cols, kGroup)}, DType::kF32);
  Tensor no_weights;
  moe_permute_quantize(ctx, map, args, out, &rows, Tensor(), no_weights);
  moe_permute_transposed(ctx, map, rows, out.columnwise_data, out.columnwise_scale_inv, columnwise);
}

}  // namespace octet::cpu
