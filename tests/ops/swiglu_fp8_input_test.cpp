// The swiglu ops with gate_up kept in FP8 (swiglu.h; Recipe::moe_swiglu_input fp8) on the CPU: the
// caching forward writes quantize()'s copy of gate_up and swiglu_quantize's h, and every reader of
// the copy gives the bits of the plain op on dequantize(copy), on the baseline's expert width
// (F = 704: groups straddle the gate/up halves), whole groups (2048), F % 128 != 0 and F % 8 != 0
// widths, odd row counts and zero rows.
#include <gtest/gtest.h>

#include <string>

#include "swiglu_fp8_input_check.h"

namespace octet {
namespace {

using test::Dist;
using test::random_tensor;

TEST(SwigluFp8Input, FusedEqualsQuantizeThenDequantize) {
  Context cpu = make_context(Device::kCpu);
  for (const auto& [rows, f] : {std::pair<int64_t, int64_t>{3, 704},
                                {5, 2048},
                                {7, 100},
                                {2, 7},
                                {9, 1000},
                                {1, 64},
                                {0, 704},
                                {0, 7}})
    for (DType dt : {DType::kBF16, DType::kF32})
      for (Dist dist : {Dist::kGaussian, Dist::kOutliers}) {
        const uint64_t seed = 31 + rows * 7 + f + static_cast<int>(dist);
        const Tensor gu = random_tensor({rows, 2 * f}, dt, seed, dist);
        const Tensor dh = random_tensor({rows, f}, dt, seed + 1, Dist::kGaussian);
        const Tensor w = test::fp8_input_row_weights(rows, seed + 2);
        const std::string where = "rows " + std::to_string(rows) + " F " + std::to_string(f) + " " +
                                  std::string(dtype_name(dt));
        ASSERT_TRUE(test::same_outputs(test::run_fp8_input_ops(cpu, gu, dh, w, false),
                                       test::run_fp8_input_ops(cpu, gu, dh, w, true)))
            << where;
      }
}

// Other copy formats and roundings than the MoE layer's (E4M3, power-of-2), special values, and an
// all-zero row (scale 1).
TEST(SwigluFp8Input, OtherFormatsAndSpecialValues) {
  Context cpu = make_context(Device::kCpu);
  Tensor gu = random_tensor({6, 2 * 200}, DType::kF32, 41, Dist::kWide);
  float* p = gu.data_as<float>();
  const float special[] = {0.0f, -0.0f, 1e30f, -1e30f, 1e-40f, -88.0f, 88.0f, 448.0f, 1e-8f};
  for (int i = 0; i < 9; ++i) p[1 * 400 + 190 + i] = special[i], p[2 * 400 + 250 + i] = special[i];
  for (int64_t j = 0; j < 400; ++j) p[4 * 400 + j] = 0.0f;
  const Tensor dh = random_tensor({6, 200}, DType::kF32, 42, Dist::kGaussian);
  const Tensor w = test::fp8_input_row_weights(6, 43);
  for (Fp8Format fmt : {Fp8Format::kE4M3, Fp8Format::kE5M2})
    for (ScaleRounding rnd : {ScaleRounding::kPow2, ScaleRounding::kExact}) {
      const SwigluInputCache cache{.format = fmt, .rounding = rnd};
      ASSERT_TRUE(test::same_outputs(test::run_fp8_input_ops(cpu, gu, dh, w, false, cache),
                                     test::run_fp8_input_ops(cpu, gu, dh, w, true, cache)))
          << format_name(fmt) << (rnd == ScaleRounding::kPow2 ? " pow2" : " exact");
    }
}

TEST(SwigluFp8Input, RejectsBadArguments) {
  Context cpu = make_context(Device::kCpu);
  const Tensor gu = random_tensor({4, 256}, DType::kBF16, 44);
  const Tensor dh = random_tensor({4, 128}, DType::kBF16, 45);
  const QuantTensor q = swiglu_quantize_caching_input(cpu, {.gate_up = gu}).gate_up;
  EXPECT_EQ(q.data.shape(), (Shape{4, 256}));
  EXPECT_EQ(q.scale_inv.shape(), (Shape{4, 2}));
  EXPECT_EQ(q.rounding, ScaleRounding::kPow2);
  Tensor d = Tensor::empty({4, 256}, DType::kBF16);
  // Both or neither of gate_up and its copy.
  EXPECT_THROW(swiglu_backward(cpu, {.dh = dh, .gate_up = gu, .d_gate_up = d, .gate_up_fp8 = q}),
               Error);
  EXPECT_THROW(swiglu_backward(cpu, {.dh = dh, .d_gate_up = d}), Error);
  // A copy that is not 1x128, or not K-major.
  QuantTensor bad = q;
  bad.granularity = Granularity::k128x128;
  EXPECT_THROW(swiglu_quantize(cpu, {.gate_up_fp8 = bad}), Error);
  bad = q;
  bad.scale_inv = Tensor::empty({2, 1, 4}, DType::kF32);
  EXPECT_THROW(swiglu_quantize(cpu, {.gate_up_fp8 = bad}), Error);
  EXPECT_THROW(swiglu_quantize(cpu, {.gate_up_fp8 = q, .gate_up_dtype = DType::kE4M3}), Error);
  // The caching forward needs the BF16/FP32 tensor.
  EXPECT_THROW(swiglu_quantize_caching_input(cpu, {.gate_up_fp8 = q}), Error);
}

}  // namespace
}  // namespace octet
