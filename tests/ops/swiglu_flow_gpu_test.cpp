// The fp8-flow fused operators on CUDA against the CPU reference, bit for bit: swiglu_quantize
// with routing weights, swiglu_backward_quantize (FP8 data, scales, amax and the weight gradient,
// whose summation order is fixed), and the routing weights' scatter / gather of
// ops/moe_permute/moe_row_weight.h, on odd and prime shapes. Outputs are poisoned first.
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "backend/backend.h"
#include "norm_act_test_util.h"
#include "ops/moe_permute/moe_row_weight.h"
#include "ops/swiglu/swiglu.h"

namespace octet {
namespace {

using test::bitwise_equal;
using test::Dist;
using test::random_tensor;

struct Devices {
  Context cpu = make_context(Device::kCpu);
  Context gpu = make_context(Device::kCuda);
};

Devices& devices() {
  static Devices d;
  return d;
}

Tensor row_weights(int64_t rows, uint64_t seed) {
  Tensor w = random_tensor({rows}, DType::kF32, seed, Dist::kGaussian);
  for (int64_t r = 0; r < rows; ++r) {
    float& v = w.data_as<float>()[r];
    v = r % 7 == 3 ? 0.0f : std::fabs(v) * 0.7f + 0.05f;
  }
  return w;
}

::testing::AssertionResult same_quant(const QuantTensor& want, const QuantTensor& got,
                                      Context& gpu) {
  for (auto [a, b, what] : {std::tuple{&want.data, &got.data, "data"},
                            std::tuple{&want.scale_inv, &got.scale_inv, "scale_inv"},
                            std::tuple{&want.amax, &got.amax, "amax"}}) {
    auto r = bitwise_equal(*a, b->to_host(gpu));
    if (!r) return r << " [" << what << "]";
  }
  return ::testing::AssertionSuccess();
}

using Case = std::tuple<int64_t, int64_t, DType>;  // rows, F, dtype of gate_up and dh

class SwigluFlowGpu : public ::testing::TestWithParam<Case> {};

TEST_P(SwigluFlowGpu, MatchesCpuBitwise) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const auto& [rows, f, dt] = GetParam();
  for (Dist dist : {Dist::kGaussian, Dist::kOutliers, Dist::kWide}) {
    const std::string where = "rows " + std::to_string(rows) + " F " + std::to_string(f) + " " +
                              std::string(dtype_name(dt)) + " dist " +
                              std::to_string(static_cast<int>(dist));
    const uint64_t seed = 3000 + rows * 7 + f + static_cast<uint64_t>(dist);
    const Tensor gu = random_tensor({rows, 2 * f}, dt, seed, dist);
    const Tensor dh = random_tensor({rows, f}, dt, seed + 1, dist);
    const Tensor w = row_weights(rows, seed + 2);
    const Tensor gu_d = gu.to(gpu, Device::kCuda), dh_d = dh.to(gpu, Device::kCuda),
                 w_d = w.to(gpu, Device::kCuda);
    const QuantTensor hq = swiglu_quantize(cpu, {.gate_up = gu, .row_weight = w});
    ASSERT_TRUE(same_quant(hq, swiglu_quantize(gpu, {.gate_up = gu_d, .row_weight = w_d}), gpu))
        << where << " weighted swiglu_quantize";
    for (bool weighted : {false, true}) {
      // want_h: h again from the same pass, swiglu_quantize's bits (the CPU computes it by that op).
      const SwigluBackwardQuantizeResult want = swiglu_backward_quantize(
          cpu, {.dh = dh, .gate_up = gu, .row_weight = weighted ? w : Tensor(), .want_h = true});
      const SwigluBackwardQuantizeResult got = swiglu_backward_quantize(
          gpu,
          {.dh = dh_d, .gate_up = gu_d, .row_weight = weighted ? w_d : Tensor(), .want_h = true});
      ASSERT_TRUE(same_quant(want.d_gate_up, got.d_gate_up, gpu))
          << where << (weighted ? " weighted" : "") << " swiglu_backward_quantize";
      ASSERT_TRUE(same_quant(want.h, got.h, gpu))
          << where << (weighted ? " weighted" : "") << " swiglu_backward_quantize h";
      if (weighted)
        ASSERT_TRUE(bitwise_equal(want.d_row_weight, got.d_row_weight.to_host(gpu)))
            << where << " d_row_weight";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(OddShapes, SwigluFlowGpu,
                         ::testing::Combine(::testing::Values(1, 127, 129, 1481),
                                            ::testing::Values(7, 129, 1000, 2048),
                                            ::testing::Values(DType::kBF16, DType::kF32)));

// amax false (the MoE layers' calls): the CPU's codes and scales bit for bit and no amax, for the
// caching forward, dSwiGLU from the FP8 copy with and without h (the row and the staged kernel)
// and the recompute from the FP8 copy.
TEST(SwigluFlowGpuSpecial, WithoutAmaxMatchesCpu) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const int64_t rows = 1481, f = 704;
  const Tensor gu = random_tensor({rows, 2 * f}, DType::kBF16, 901, Dist::kOutliers);
  const Tensor dh = random_tensor({rows, f}, DType::kBF16, 902, Dist::kOutliers);
  const Tensor w = row_weights(rows, 903);
  const Tensor gu_d = gu.to(gpu, Device::kCuda), dh_d = dh.to(gpu, Device::kCuda),
               w_d = w.to(gpu, Device::kCuda);
  auto expect_same = [&](const QuantTensor& want, const QuantTensor& got, const char* what) {
    SCOPED_TRACE(what);
    EXPECT_FALSE(want.amax.defined());
    EXPECT_FALSE(got.amax.defined());
    EXPECT_TRUE(bitwise_equal(want.data, got.data.to_host(gpu)));
    EXPECT_TRUE(bitwise_equal(want.scale_inv, got.scale_inv.to_host(gpu)));
  };
  const SwigluQuantizeCachedResult want =
      swiglu_quantize_caching_input(cpu, {.gate_up = gu, .row_weight = w, .amax = false});
  const SwigluQuantizeCachedResult got =
      swiglu_quantize_caching_input(gpu, {.gate_up = gu_d, .row_weight = w_d, .amax = false});
  expect_same(want.h, got.h, "caching forward, h");
  expect_same(want.gate_up, got.gate_up, "caching forward, gate_up's copy");
  for (bool want_h : {false, true}) {
    const SwigluBackwardQuantizeResult bw = swiglu_backward_quantize(
        cpu,
        {.dh = dh, .row_weight = w, .gate_up_fp8 = want.gate_up, .want_h = want_h, .amax = false});
    const SwigluBackwardQuantizeResult bg =
        swiglu_backward_quantize(gpu, {.dh = dh_d,
                                       .row_weight = w_d,
                                       .gate_up_fp8 = got.gate_up,
                                       .want_h = want_h,
                                       .amax = false});
    expect_same(bw.d_gate_up, bg.d_gate_up, want_h ? "dSwiGLU with h" : "dSwiGLU");
    if (want_h) expect_same(bw.h, bg.h, "dSwiGLU's h");
  }
  const QuantTensor rw = swiglu_quantize(cpu, {.gate_up_fp8 = want.gate_up, .amax = false});
  const QuantTensor rg = swiglu_quantize(gpu, {.gate_up_fp8 = got.gate_up, .amax = false});
  expect_same(rw, rg, "recompute from the FP8 copy");
}

// Widths that take the vectorised kernel (8, 64: one partial group; 704: the baseline's expert
// width, groups straddling the gate/up boundary; 2048: whole groups; 120 ... 1000: du's groups
// shifted by every kind of t = F / 8 % 16, the row in one to four windows, and 248, 504 and 760,
// whose last window's shifted-out lanes hold columns), padding rows (all zero, weight 0), both FP8
// formats, both scale roundings and an amax floor.
TEST(SwigluFlowGpuVec, FormatsRoundingsAndPaddingRows) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  for (int64_t f : {8, 64, 704, 2048, 120, 136, 248, 264, 504, 760, 1000}) {
    const int64_t rows = 301;
    Tensor gu = random_tensor({rows, 2 * f}, DType::kBF16, 3500 + f, Dist::kOutliers);
    for (int64_t i = 0; i < rows * f; ++i)  // gates: a sweep of BF16 patterns, NaN and inf included
      gu.data_as<uint16_t>()[(i / f) * 2 * f + i % f] = static_cast<uint16_t>(i * 211 + f);
    Tensor dh = random_tensor({rows, f}, DType::kBF16, 3600 + f, Dist::kOutliers);
    Tensor w = row_weights(rows, 3700 + f);
    for (int64_t r = 0; r < rows; ++r) {
      if (r % 9 != 4 && r < 290) continue;
      for (int64_t j = 0; j < 2 * f; ++j) gu.data_as<uint16_t>()[r * 2 * f + j] = 0;
      for (int64_t j = 0; j < f; ++j) dh.data_as<uint16_t>()[r * f + j] = 0;
      w.data_as<float>()[r] = 0.0f;
    }
    const Tensor gu_d = gu.to(gpu, Device::kCuda), dh_d = dh.to(gpu, Device::kCuda),
                 w_d = w.to(gpu, Device::kCuda);
    for (Fp8Format fmt : {Fp8Format::kE4M3, Fp8Format::kE5M2})
      for (ScaleRounding rnd : {ScaleRounding::kPow2, ScaleRounding::kExact})
        for (float eps : {0.0f, 1e-4f}) {
          const std::string where = "F " + std::to_string(f) + " " + format_name(fmt) +
                                    (rnd == ScaleRounding::kPow2 ? " pow2" : " exact") + " eps " +
                                    std::to_string(eps);
          ASSERT_TRUE(same_quant(
              swiglu_quantize(
                  cpu,
                  {.gate_up = gu, .format = fmt, .rounding = rnd, .epsilon = eps, .row_weight = w}),
              swiglu_quantize(gpu, {.gate_up = gu_d,
                                    .format = fmt,
                                    .rounding = rnd,
                                    .epsilon = eps,
                                    .row_weight = w_d}),
              gpu))
              << where << " weighted swiglu_quantize";
          for (bool weighted : {false, true}) {
            // h in the format and rounding the gradient does not use, so that the two rules
            // are not mixed up.
            auto args = [&](const Tensor& d, const Tensor& g, const Tensor& rw) {
              return SwigluBackwardQuantizeArgs{
                  .dh = d,
                  .gate_up = g,
                  .row_weight = weighted ? rw : Tensor(),
                  .format = fmt,
                  .rounding = rnd,
                  .epsilon = eps,
                  .want_h = true,
                  .h_format = fmt == Fp8Format::kE4M3 ? Fp8Format::kE5M2 : Fp8Format::kE4M3,
                  .h_rounding =
                      rnd == ScaleRounding::kPow2 ? ScaleRounding::kExact : ScaleRounding::kPow2};
            };
            const SwigluBackwardQuantizeResult want =
                swiglu_backward_quantize(cpu, args(dh, gu, w));
            const SwigluBackwardQuantizeResult got =
                swiglu_backward_quantize(gpu, args(dh_d, gu_d, w_d));
            ASSERT_TRUE(same_quant(want.d_gate_up, got.d_gate_up, gpu))
                << where << (weighted ? " weighted" : "") << " swiglu_backward_quantize";
            ASSERT_TRUE(same_quant(want.h, got.h, gpu))
                << where << (weighted ? " weighted" : "") << " swiglu_backward_quantize h";
            if (weighted)
              ASSERT_TRUE(bitwise_equal(want.d_row_weight, got.d_row_weight.to_host(gpu)))
                  << where << " d_row_weight";
          }
        }
  }
}

TEST(MoeRowWeightGpu, MatchesCpuBitwise) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  for (const auto& [T, k, E] :
       {std::tuple{1, 1, 4}, std::tuple{127, 2, 8}, std::tuple{1481, 8, 64}}) {
    // Distinct experts per token: a rotation of a random start.
    Tensor idx = Tensor::empty({T, k}, DType::kI32);
    const Tensor start = test::random_ints({T}, 0, E - 1, 91 + T);
    for (int t = 0; t < T; ++t)
      for (int j = 0; j < k; ++j)
        idx.data_as<int32_t>()[t * k + j] = (start.data_as<int32_t>()[t] + j * 3) % E;
    const Tensor w = random_tensor({T, k}, DType::kF32, 92 + T);
    for (PermutePadding pad : {PermutePadding::kNone, PermutePadding::kTo128}) {
      const PermuteMap mc = moe_permute_map(cpu, {idx, E, pad});
      const PermuteMap mg = moe_permute_map(gpu, {idx.to(gpu, Device::kCuda), E, pad});
      const Tensor rc = moe_permute_weights(cpu, mc, w);
      const Tensor rg = moe_permute_weights(gpu, mg, w.to(gpu, Device::kCuda));
      ASSERT_TRUE(bitwise_equal(rc, rg.to_host(gpu))) << "T " << T << " scatter";
      const Tensor d = random_tensor({mc.num_rows}, DType::kF32, 93 + T);
      ASSERT_TRUE(bitwise_equal(
          moe_permute_weights_backward(cpu, mc, d),
          moe_permute_weights_backward(gpu, mg, d.to(gpu, Device::kCuda)).to_host(gpu)))
          << "T " << T << " gather";
    }
  }
}

}  // namespace
}  // namespace octet
