// CPU reference for swiglu.h: plain loops over the element math of swiglu_math.h; the quantized
// variant applies numerics/scale.h's rule group by group.
#include <algorithm>
#include <vector>

#include "ops/cpu_elements.h"
#include "ops/swiglu/swiglu_backends.h"
#include "ops/swiglu/swiglu_math.h"

namespace octet::cpu {
namespace {

// One row of n values quantized in 1x128 groups by `rule`: the row's FP8 bytes and per-group
// scale_inv, the largest |value| folded into amax_all (as bits).
void quantize_row(const std::vector<float>& vals, int64_t n, const ScaleRule& rule,
                  Fp8Format format, uint8_t* data, float* scale_inv, uint32_t& amax_all) {
  for (int64_t g = 0; g < ceil_div(n, kGroup); ++g) {
    const int64_t c0 = g * kGroup, c1 = std::min(n, c0 + kGroup);
    uint32_t amax = 0;
    for (int64_t j = c0; j < c1; ++j) amax = std::max(amax, abs_bits(vals[j]));
    amax_all = std::max(amax_all, amax);
    const float scale = compute_scale(bits_float(amax), rule);
    scale_inv[g] = scale_inverse(scale);
    for (int64_t j = c0; j < c1; ++j) data[j] = quantize_value(vals[j], scale, format);
  }
}

// gate_up's values as the op reads them: the tensor itself, or its FP8 copy dequantized to `as`
// exactly as dequantize() gives (code * scale_inv, one FP32 product, then stored as `as`).
Tensor gate_up_values(const Tensor& gate_up, const QuantTensor& q, DType as) {
  if (gate_up.defined()) return gate_up;
  const int64_t rows = q.data.rows(), n = q.data.cols(), groups = ceil_div(n, kGroup);
  Tensor out = Tensor::empty({rows, n}, as);
  const uint8_t* codes = q.data.data_as<const uint8_t>();
  const float* s = q.scale_inv.data_as<const float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j)
      store(out, r * n + j,
            rn::mul(fp8_to_float(codes[r * n + j], q.format), s[r * groups + j / kGroup]));
  return out;
}

}  // namespace

void swiglu_forward(Context&, const SwigluForwardArgs& a) {
  const int64_t rows = a.h.rows(), f = a.h.cols();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < f; ++j)
      store(
          a.h, r * f + j,
          swiglu_math::swiglu(load(a.gate_up, r * 2 * f + j), load(a.gate_up, r * 2 * f + f + j)));
}

void swiglu_backward(Context&, const SwigluBackwardArgs& a) {
  const int64_t rows = a.dh.rows(), f = a.dh.cols();
  const Tensor gu = gate_up_values(a.gate_up, a.gate_up_fp8, a.dh.dtype());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < f; ++j) {
      const int64_t gi = r * 2 * f + j, ui = gi + f;
      const auto d = swiglu_math::swiglu_grad(load(gu, gi), load(gu, ui), load(a.dh, r * f + j));
      store(a.d_gate_up, gi, d.dg);
      store(a.d_gate_up, ui, d.du);
    }
  }
}

void swiglu_quantize(Context&, const SwigluQuantizeArgs& a, QuantTensor& out,
                     QuantTensor* gate_up_out) {
  const Tensor gu = gate_up_values(a.gate_up, a.gate_up_fp8, a.gate_up_dtype);
  const int64_t rows = gu.rows(), f = gu.cols() / 2, groups = ceil_div(f, kGroup);
  const ScaleRule rule{
      .format = a.format, .rounding = a.rounding, .epsilon = a.epsilon, .margin = 0};
  uint8_t* data = out.data.data_as<uint8_t>();
  float* scale_inv = out.scale_inv.data_as<float>();
  std::vector<float> h(static_cast<size_t>(f));
  uint32_t amax_all = 0;
  const float* w = a.row_weight.defined() ? a.row_weight.data_as<const float>() : nullptr;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < f; ++j) {
      h[j] = swiglu_math::swiglu(load(gu, r * 2 * f + j), load(gu, r * 2 * f + f + j));
      if (w != nullptr) h[j] = swiglu_math::canonical_nan(rn::mul(h[j], w[r]));
    }
    quantize_row(h, f, rule, a.format, data + r * f, scale_inv + r * groups, amax_all);
  }
  if (out.amax.defined()) out.amax.data_as<float>()[0] = bits_float(amax_all);
  if (gate_up_out == nullptr) return;
  // gate_up's own copy: quantize() of the 2F-wide rows, groups straddling the halves.
  QuantTensor& q = *gate_up_out;
  const ScaleRule gu_rule{.format = q.format, .rounding = q.rounding, .epsilon = 0.0f, .margin = 0};
  const int64_t n = 2 * f, gu_groups = ceil_div(n, kGroup);
  std::vector<float> row(static_cast<size_t>(n));
  uint32_t gu_amax = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) row[j] = load(gu, r * n + j);
    quantize_row(row, n, gu_rule, q.format, q.data.data_as<uint8_t>() + r * n,
                 q.scale_inv.data_as<float>() + r * gu_groups, gu_amax);
  }
  if (q.amax.defined()) q.amax.data_as<float>()[0] = bits_float(gu_amax);
}

void swiglu_backward_quantize(Context& ctx, const SwigluBackwardQuantizeArgs& a,
                              SwigluBackwardQuantizeResult& out) {
  if (a.want_h) swiglu_quantize(ctx, h_quantize_args(a), out.h, nullptr);  // the definition
  const Tensor gu = gate_up_values(a.gate_up, a.gate_up_fp8, a.dh.dtype());
  const int64_t rows = gu.rows(), f = gu.cols() / 2, n = 2 * f;
  const int64_t groups = ceil_div(n, kGroup);
  const ScaleRule rule{
      .format = a.format, .rounding = a.rounding, .epsilon = a.epsilon, .margin = 0};
  const float* w = a.row_weight.defined() ? a.row_weight.data_as<const float>() : nullptr;
  uint8_t* data = out.d_gate_up.data.data_as<uint8_t>();
  float* scale_inv = out.d_gate_up.scale_inv.data_as<float>();
  std::vector<float> d(static_cast<size_t>(n));
  uint32_t amax_all = 0;
  for (int64_t r = 0; r < rows; ++r) {
    float partial[32] = {};
    for (int64_t j = 0; j < f; ++j) {
      const float g = load(gu, r * n + j), u = load(gu, r * n + f + j);
      const float dh = load(a.dh, r * f + j);
      if (w != nullptr) {
        // The warp's order: lane j % 32 adds its columns in increasing j.
        partial[j % 32] = rn::add(partial[j % 32], rn::mul(dh, swiglu_math::swiglu(g, u)));
      }
      const auto gr = swiglu_math::swiglu_grad(g, u, w != nullptr ? rn::mul(dh, w[r]) : dh);
      d[j] = gr.dg;
      d[f + j] = gr.du;
    }
    if (w != nullptr) {
      for (int s = 16; s >= 1; s /= 2)
        for (int l = 0; l < s; ++l) partial[l] = rn::add(partial[l], partial[l + s]);
      out.d_row_weight.data_as<float>()[r] = swiglu_math::canonical_nan(partial[0]);
    }
    quantize_row(d, n, rule, a.format, data + r * n, scale_inv + r * groups, amax_all);
  }
  if (out.d_gate_up.amax.defined()) out.d_gate_up.amax.data_as<float>()[0] = bits_float(amax_all);
}

}  // namespace octet::cpu
