// Shared by swiglu_fp8_input_test.cpp (CPU) and swiglu_fp8_input_gpu_test.cpp (CUDA): every swiglu
// op that writes or reads gate_up's 1x128 FP8 copy (swiglu.h, Recipe::moe_swiglu_input fp8) run on
// one device by the fused path and by the separate path it replaces (quantize(gate_up), and
// dequantize(copy) fed to the BF16/FP32 op), the outputs brought to the host. fused_equals_separate
// compares the two on one device bit for bit; the GPU test also compares the fused outputs of both
// devices.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "norm_act_test_util.h"
#include "ops/quantize/quantize.h"
#include "ops/swiglu/swiglu.h"

namespace octet::test {

// The outputs of one path, on the host, in a fixed order: h's and gate_up's copies (caching
// forward), swiglu_quantize from the copy (unweighted, weighted), swiglu_backward from the copy,
// swiglu_backward_quantize from the copy (data, scales, amax, weight gradient).
struct Fp8InputOutputs {
  std::vector<std::pair<std::string, Tensor>> named;
};

inline Tensor on(Context& ctx, const Tensor& host) {
  return ctx.device == Device::kCpu ? host : host.to(ctx, Device::kCuda);
}
inline Tensor back(Context& ctx, const Tensor& t) {
  return t.device() == Device::kCpu ? t : t.to_host(ctx);
}
inline void add_quant(Fp8InputOutputs& o, Context& ctx, const std::string& what,
                      const QuantTensor& q) {
  o.named.emplace_back(what + " data", back(ctx, q.data));
  o.named.emplace_back(what + " scale_inv", back(ctx, q.scale_inv));
  o.named.emplace_back(what + " amax", back(ctx, q.amax));
}

// gu_h (rows, 2F) bf16 or f32 and dh_h (rows, F) of the same dtype, w_h (rows) f32, on the host;
// fused: the ops' FP8 paths, else quantize / dequantize around the plain ops. The copy is E4M3 with
// power-of-2 scales (what the MoE layer keeps) unless cache says otherwise.
inline Fp8InputOutputs run_fp8_input_ops(Context& ctx, const Tensor& gu_h, const Tensor& dh_h,
                                         const Tensor& w_h, bool fused,
                                         SwigluInputCache cache = {}) {
  const Tensor gu = on(ctx, gu_h), dh = on(ctx, dh_h), w = on(ctx, w_h);
  const DType dt = gu.dtype();
  Fp8InputOutputs o;
  const SwigluQuantizeArgs plain{.gate_up = gu};
  QuantTensor copy;
  if (fused) {
    SwigluQuantizeCachedResult r = swiglu_quantize_caching_input(ctx, plain, cache);
    add_quant(o, ctx, "h", r.h);
    copy = r.gate_up;
  } else {
    add_quant(o, ctx, "h", swiglu_quantize(ctx, plain));
    copy = quantize(ctx, {.input = gu,
                          .format = cache.format,
                          .granularity = Granularity::k1x128,
                          .rounding = cache.rounding,
                          .epsilon = 0.0f,
                          .output = QuantizeOutput::kRowwise});
  }
  add_quant(o, ctx, "gate_up copy", copy);
  // The weighted variant of the caching forward (fp8-flow): h's copy and gate_up's copy again.
  if (fused) {
    SwigluQuantizeCachedResult r = swiglu_quantize_caching_input(
        ctx, {.gate_up = gu, .format = Fp8Format::kE4M3, .row_weight = w}, cache);
    add_quant(o, ctx, "weighted h", r.h);
    add_quant(o, ctx, "weighted gate_up copy", r.gate_up);
  } else {
    add_quant(o, ctx, "weighted h",
              swiglu_quantize(ctx, {.gate_up = gu, .format = Fp8Format::kE4M3, .row_weight = w}));
    add_quant(o, ctx, "weighted gate_up copy", copy);
  }
  // Readers of the copy: fused, or from dequantize(copy, dt).
  const Tensor deq = fused ? Tensor() : dequantize(ctx, copy, dt);
  const QuantTensor in_fp8 = fused ? copy : QuantTensor{};
  for (const bool weighted : {false, true})
    add_quant(o, ctx, weighted ? "recompute weighted" : "recompute",
              swiglu_quantize(ctx, {.gate_up = deq,
                                    .row_weight = weighted ? w : Tensor(),
                                    .gate_up_fp8 = in_fp8,
                                    .gate_up_dtype = dt}));
  Tensor dgu = Tensor::empty(ctx, gu.shape(), dt);
  if (dgu.nbytes()) ctx.be().memset(dgu.data(), 0xFF, dgu.nbytes());
  swiglu_backward(ctx, {.dh = dh, .gate_up = deq, .d_gate_up = dgu, .gate_up_fp8 = in_fp8});
  o.named.emplace_back("backward", back(ctx, dgu));
  // fused: h from dSwiGLU's pass as well (want_h); else the weighted recompute, its definition.
  const SwigluBackwardQuantizeResult bq = swiglu_backward_quantize(
      ctx, {.dh = dh, .gate_up = deq, .row_weight = w, .gate_up_fp8 = in_fp8, .want_h = fused});
  add_quant(o, ctx, "backward_quantize", bq.d_gate_up);
  o.named.emplace_back("backward_quantize d_row_weight", back(ctx, bq.d_row_weight));
  add_quant(
      o, ctx, "backward_quantize h",
      fused ? bq.h : swiglu_quantize(ctx, {.gate_up = deq, .row_weight = w, .gate_up_dtype = dt}));
  return o;
}

inline ::testing::AssertionResult same_outputs(const Fp8InputOutputs& want,
                                               const Fp8InputOutputs& got) {
  if (want.named.size() != got.named.size())
    return ::testing::AssertionFailure() << "different output counts";
  for (size_t i = 0; i < want.named.size(); ++i) {
    auto r = bitwise_equal(want.named[i].second, got.named[i].second);
    if (!r) return r << " [" << want.named[i].first << "]";
  }
  return ::testing::AssertionSuccess();
}

// Routing-like weights: positive, some rows 0.
inline Tensor fp8_input_row_weights(int64_t rows, uint64_t seed) {
  Tensor w = random_tensor({rows}, DType::kF32, seed, Dist::kGaussian);
  for (int64_t r = 0; r < rows; ++r) {
    float& v = w.data_as<float>()[r];
    v = r % 7 == 3 ? 0.0f : std::fabs(v) * 0.7f + 0.05f;
  }
  return w;
}

}  // namespace octet::test
