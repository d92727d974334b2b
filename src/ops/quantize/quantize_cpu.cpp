// CPU reference for quantize.h: plain loops over groups, every step the scalar rule of
// numerics/scale.h. Obviously correct first; it is also the CPU backend for real runs.
#include <algorithm>
#include <vector>

#include "ops/quantize/quantize_backends.h"

namespace octet::cpu {
namespace {

std::vector<float> to_float(const Tensor& x) {
  std::vector<float> v(static_cast<size_t>(x.numel()));
  if (x.dtype() == DType::kF32) {
    std::copy_n(x.data_as<const float>(), v.size(), v.begin());
  } else {
    const uint16_t* p = x.data_as<const uint16_t>();
    for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_to_float(p[i]);
  }
  return v;
}

// Group edge (rows, cols) of a granularity on a (rows, cols) matrix.
struct GroupDims {
  int64_t h, w;
};
GroupDims group_dims(Granularity g, int64_t rows, int64_t cols) {
  switch (g) {
    case Granularity::kTensor:
      return {std::max<int64_t>(rows, 1), std::max<int64_t>(cols, 1)};
    case Granularity::kRow:
      return {1, std::max<int64_t>(cols, 1)};
    case Granularity::k1x128:
      return {1, kGroup};
    case Granularity::k128x1:
      return {kGroup, 1};
    case Granularity::k128x128:
      return {kGroup, kGroup};
  }
  OCTET_THROW("unknown granularity");
}

// Quantizes the (rows, cols) matrix read through `at(i, j)`; `fixed_scale` > 0 overrides the
// groups. 1x128 scales go where `layout` says (core/scale_layout.h), padding included.
template <typename At>
void quantize_matrix(At at, int64_t rows, int64_t cols, Granularity g, ScaleLayout layout,
                     const ScaleRule& rule, float fixed_scale, uint8_t* data, float* scale_inv) {
  const auto [gh, gw] = group_dims(g, rows, cols);
  const int64_t gcols = ceil_div(cols, gw);
  for (int64_t r0 = 0; r0 < rows; r0 += gh) {
    for (int64_t c0 = 0; c0 < cols; c0 += gw) {
      const int64_t r1 = std::min(rows, r0 + gh), c1 = std::min(cols, c0 + gw);
      uint32_t amax = 0;
      for (int64_t i = r0; i < r1; ++i)
        for (int64_t j = c0; j < c1; ++j) amax = std::max(amax, abs_bits(at(i, j)));
      const float scale = fixed_scale > 0 ? fixed_scale : compute_scale(bits_float(amax), rule);
      if (g == Granularity::k1x128)
        store_1x128_scale(scale_inv, layout, r0, c0 / gw, rows, gcols, scale_inverse(scale));
      else
        scale_inv[(r0 / gh) * gcols + c0 / gw] = scale_inverse(scale);
      for (int64_t i = r0; i < r1; ++i)
        for (int64_t j = c0; j < c1; ++j)
          data[i * cols + j] = quantize_value(at(i, j), scale, rule.format);
    }
  }
}

}  // namespace

void quantize(Context&, const QuantizeArgs& args, QuantTensor& out) {
  const std::vector<float> x = to_float(args.input);
  const int64_t rows = args.input.rows(), cols = args.input.cols();
  const ScaleRule rule{
      .format = args.format, .rounding = args.rounding, .epsilon = args.epsilon, .margin = 0};
  const float fixed = args.scale.defined() ? args.scale.data_as<const float>()[0] : 0.0f;

  uint32_t amax_all = 0;
  for (float v : x) amax_all = std::max(amax_all, abs_bits(v));
  if (out.amax.defined()) out.amax.data_as<float>()[0] = bits_float(amax_all);

  if (args.output != QuantizeOutput::kColumnwise) {
    auto at = [&](int64_t i, int64_t j) { return x[static_cast<size_t>(i * cols + j)]; };
    quantize_matrix(at, rows, cols, args.granularity, args.scale_layout, rule, fixed,
                    out.data.data_as<uint8_t>(), out.scale_inv.data_as<float>());
  }
  if (args.output != QuantizeOutput::kRowwise) {
    auto at_t = [&](int64_t i, int64_t j) { return x[static_cast<size_t>(j * cols + i)]; };
    quantize_matrix(at_t, cols, rows, args.granularity, args.scale_layout, rule, fixed,
                    out.columnwise_data.data_as<uint8_t>(),
                    out.columnwise_scale_inv.data_as<float>());
  }
}

void dequantize(Context&, const Tensor& data, const Tensor& scale_inv, Granularity g, Fp8Format f,
                Tensor& out) {
  const int64_t rows = data.rows(), cols = data.cols();
  const auto [gh, gw] = group_dims(g, rows, cols);
  const int64_t gcols = ceil_div(cols, gw);
  const ScaleLayout layout = scale_layout(g, scale_inv);
  const uint8_t* q = data.data_as<const uint8_t>();
  const float* s = scale_inv.data_as<const float>();
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t si = g == Granularity::k1x128
                             ? scale_1x128_offset(layout, i, j / gw, rows, gcols)
                             : (i / gh) * gcols + j / gw;
      const float v = rn::mul(fp8_to_float(q[i * cols + j], f), s[si]);
      if (out.dtype() == DType::kF32)
        out.data_as<float>()[i * cols + j] = v;
      else
        out.data_as<uint16_t>()[i * cols + j] = float_to_bf16(v);
    }
  }
}

void amax(Context&, const Tensor& x, Tensor& out) {
  uint32_t m = 0;
  for (float v : to_float(x)) m = std::max(m, abs_bits(v));
  out.data_as<float>()[0] = bits_float(m);
}

void scaling_aware_transpose(Context&, const QuantTensor& in, Tensor& cdata, Tensor& cscale,
                             Granularity cgran) {
  const int64_t rows = in.rows(), cols = in.cols();
  const int64_t rblocks = ceil_div(rows, kGroup), cblocks = ceil_div(cols, kGroup);
  const uint8_t* q = in.data.data_as<const uint8_t>();
  const float* s = in.scale_inv.data_as<const float>();  // (rows, cblocks), powers of two
  uint8_t* qt = cdata.data_as<uint8_t>();                // (cols, rows)
  float* st = cscale.data_as<float>();  // (cblocks, rblocks), or (cols, rblocks) in the 1x128 form
  for (int64_t rb = 0; rb < rblocks; ++rb) {
    for (int64_t cb = 0; cb < cblocks; ++cb) {
      const int64_t r0 = rb * kGroup, r1 = std::min(rows, r0 + kGroup);
      const int64_t c0 = cb * kGroup, c1 = std::min(cols, c0 + kGroup);
      // S: the largest scale_inv of the rows holding a non-zero code here (an all-zero group's
      // scale_inv, 1.0, says nothing about its data and would push the others towards 0).
      float smax = 0.0f;
      for (int64_t i = r0; i < r1; ++i) {
        bool nonzero = false;
        for (int64_t j = c0; j < c1; ++j) nonzero |= (q[i * cols + j] & 0x7F) != 0;
        if (nonzero) smax = std::max(smax, s[i * cblocks + cb]);
      }
      if (smax == 0.0f) smax = 1.0f;  // an all-zero tile: quantize's scale for zeros
      if (cgran == Granularity::k128x128)
        st[cb * rblocks + rb] = smax;
      else
        for (int64_t j = c0; j < c1; ++j) st[j * rblocks + rb] = smax;
      for (int64_t i = r0; i < r1; ++i) {
        // s_i / S = 2^-d exactly: the quotient of two powers of two; capped at 1 for the all-zero
        // rows (whose scale_inv may exceed S), whose codes stay zero.
        const float ratio = std::min(s[i * cblocks + cb] / smax, 1.0f);
        for (int64_t j = c0; j < c1; ++j)
          qt[j * rows + i] =
              float_to_fp8(fp8_to_float(q[i * cols + j], in.format) * ratio, in.format);
      }
    }
  }
}

void delayed_scaling_update(Context&, DelayedScaling& state, const Tensor& amax, int64_t step,
                            AmaxReduction reduce, const ScaleRule& rule) {
  float* hist = state.amax_history.data_as<float>();
  const int64_t len = state.amax_history.numel();
  const float a = amax.data_as<const float>()[0];
  hist[step % len] = a;
  uint32_t reduced = abs_bits(a);
  if (reduce == AmaxReduction::kMax)
    for (int64_t i = 0; i < len; ++i) reduced = std::max(reduced, abs_bits(hist[i]));
  if (reduced != 0 && reduced < 0x7F800000u) {
    const float scale = compute_scale(bits_float(reduced), rule);
    state.scale.data_as<float>()[0] = scale;
    state.scale_inv.data_as<float>()[0] = scale_inverse(scale);
  }
}

}  // namespace octet::cpu
