// SwiGLU on the CPU: the portable exp against FP64 exp, the forward against the formula and the
// gate/up convention, the backward against FP64 central differences, and swiglu_quantize bit for
// bit against quantize() of the FP32 output.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "numerics/fp32_rn.h"

#include <cmath>
#include <limits>

#include "norm_act_test_util.h"
#include "ops/quantize/quantize.h"
#include "ops/swiglu/swiglu.h"
#include "ops/swiglu/swiglu_math.h"

namespace octet {
namespace {

using test::Dist;
using test::random_tensor;

Tensor run_forward(Context& ctx, const Tensor& gu, DType out) {
  Tensor h = Tensor::empty({gu.rows(), gu.cols() / 2}, out);
  test::poison(h, 0xFF);
  swiglu_forward(ctx, {.gate_up = gu, .h = h});
  return h;
}

// Distance in units in the last place of the FP32 nearest to `want`.
double ulps(float got, double want) {
  const float w = static_cast<float>(want);
  const double ulp =
      std::nextafter(std::fabs(w), std::numeric_limits<float>::infinity()) - std::fabs(w);
  return std::fabs(got - want) / ulp;
}

TEST(SwigluMath, ExpWithinTwoUlp) {
  double worst = 0.0;
  float worst_x = 0.0f;
  for (int i = 0; i <= 400000; ++i) {
    const float x = -103.0f + 191.7f * static_cast<float>(i) / 400000.0f;
    const float got = rn::exp_rn(x);
    const double want = std::exp(static_cast<double>(x));
    if (want < 1.17549435e-38) {  // subnormal results: absolute error within one subnormal ulp
      ASSERT_LE(std::fabs(got - want), 1.5e-45) << "x = " << x;
      continue;
    }
    const double u = ulps(got, want);
    if (u > worst) worst = u, worst_x = x;
  }
  EXPECT_LE(worst, 2.0) << "worst at x = " << worst_x;
  EXPECT_EQ(rn::exp_rn(0.0f), 1.0f);
  EXPECT_EQ(rn::exp_rn(-200.0f), 0.0f);
  EXPECT_TRUE(std::isinf(rn::exp_rn(89.0f)));
  EXPECT_TRUE(std::isnan(rn::exp_rn(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(rn::exp_rn(-std::numeric_limits<float>::infinity()), 0.0f);
  // NaN results are canonical: silu(-inf) = -inf * 0 is an invalid operation (x86 makes
  // 0xFFC00000).
  const float ninf = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(float_bits(swiglu_math::swiglu(ninf, 1.0f)), 0x7FC00000u);
  EXPECT_EQ(float_bits(swiglu_math::swiglu_grad(ninf, 1.0f, 1.0f).dg), 0x7FC00000u);
}

TEST(Swiglu, GateIsTheFirstHalf) {
  Context cpu = make_context(Device::kCpu);
  // One row, F = 2: [g0, g1 | u0, u1].
  const float v[] = {1.5f, -2.0f, 3.0f, 0.25f};
  const Tensor gu = test::host_tensor({1, 4}, DType::kF32, [&](int64_t i) { return v[i]; });
  const Tensor h = run_forward(cpu, gu, DType::kF32);
  auto silu = [](double g) { return g / (1.0 + std::exp(-g)); };
  EXPECT_NEAR(h.data_as<float>()[0], silu(1.5) * 3.0, 1e-6);
  EXPECT_NEAR(h.data_as<float>()[1], silu(-2.0) * 0.25, 1e-7);
}

TEST(Swiglu, ForwardMatchesFormula) {
  Context cpu = make_context(Device::kCpu);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const Tensor gu = random_tensor({13, 2 * 37}, dt, 21, Dist::kOutliers);
    const Tensor h = run_forward(cpu, gu, DType::kF32);
    double worst = 0.0;
    for (int64_t r = 0; r < 13; ++r)
      for (int64_t j = 0; j < 37; ++j) {
        const double g = test::value_at(gu, r * 74 + j), u = test::value_at(gu, r * 74 + 37 + j);
        const double want = g / (1.0 + std::exp(-g)) * u;
        if (want != 0.0) worst = std::max(worst, ulps(h.data_as<float>()[r * 37 + j], want));
      }
    EXPECT_LE(worst, 6.0) << dtype_name(dt);  // exp (2 ulp) + four rounded operations
    // BF16 output: the FP32 value rounded once.
    const Tensor hb = run_forward(cpu, gu, DType::kBF16);
    for (int64_t i = 0; i < h.numel(); ++i)
      ASSERT_EQ(float_to_bf16(h.data_as<float>()[i]), hb.data_as<uint16_t>()[i]) << "element " << i;
  }
}

// L = sum(h * R); d(gate_up) from the backward with dh = R, against central differences.
TEST(Swiglu, BackwardMatchesFiniteDifferences) {
  Context cpu = make_context(Device::kCpu);
  const int64_t rows = 4, f = 5;
  Tensor gu = random_tensor({rows, 2 * f}, DType::kF32, 22);
  gu.data_as<float>()[3] = 6.0f;  // the saturating side of sigmoid
  gu.data_as<float>()[12] = -7.0f;
  const Tensor r = random_tensor({rows, f}, DType::kF32, 23);
  auto loss = [&] { return test::weighted_sum(run_forward(cpu, gu, DType::kF32), r); };
  Tensor dgu = Tensor::empty({rows, 2 * f}, DType::kF32);
  test::poison(dgu, 0xFF);
  swiglu_backward(cpu, {.dh = r, .gate_up = gu, .d_gate_up = dgu});
  for (int64_t i = 0; i < gu.numel(); ++i) {
    const double fd = test::central_difference(gu.data_as<float>() + i, 1e-2, loss);
    EXPECT_NEAR(dgu.data_as<float>()[i], fd, 1e-3 * std::max(1.0, std::fabs(fd)))
        << (i % (2 * f) < f ? "gate" : "up") << " element " << i;
  }
}

TEST(Swiglu, BackwardBf16IsTheF32GradientRounded) {
  Context cpu = make_context(Device::kCpu);
  const Tensor gu = random_tensor({7, 2 * 9}, DType::kBF16, 24);
  const Tensor dh32 = random_tensor({7, 9}, DType::kF32, 25);
  Tensor dh16 = Tensor::empty({7, 9}, DType::kBF16);
  for (int64_t i = 0; i < dh16.numel(); ++i) {
    dh16.data_as<uint16_t>()[i] = float_to_bf16(dh32.data_as<float>()[i]);
    dh32.data_as<float>()[i] = bf16_to_float(dh16.data_as<uint16_t>()[i]);
  }
  Tensor d32 = Tensor::empty({7, 18}, DType::kF32), d16 = Tensor::empty({7, 18}, DType::kBF16);
  swiglu_backward(cpu, {.dh = dh32, .gate_up = gu, .d_gate_up = d32});
  swiglu_backward(cpu, {.dh = dh16, .gate_up = gu, .d_gate_up = d16});
  for (int64_t i = 0; i < d32.numel(); ++i)
    ASSERT_EQ(float_to_bf16(d32.data_as<float>()[i]), d16.data_as<uint16_t>()[i])
        << "element " << i;
}

TEST(Swiglu, QuantizeEqualsQuantizeOfF32Output) {
  Context cpu = make_context(Device::kCpu);
  for (const Shape& shape : {Shape{1, 14}, Shape{5, 258}, Shape{3, 512}, Shape{17, 2 * 300}})
    for (DType dt : {DType::kBF16, DType::kF32})
      for (Fp8Format fmt : {Fp8Format::kE4M3, Fp8Format::kE5M2})
        for (ScaleRounding rnd : {ScaleRounding::kPow2, ScaleRounding::kExact})
          for (Dist dist : {Dist::kGaussian, Dist::kOutliers, Dist::kWide}) {
            const Tensor gu = random_tensor(shape, dt, 26 + static_cast<int>(dist), dist);
            const float eps = rnd == ScaleRounding::kPow2 ? 0.0f : 1e-4f;
            const QuantTensor got = swiglu_quantize(
                cpu, {.gate_up = gu, .format = fmt, .rounding = rnd, .epsilon = eps});
            QuantizeArgs qa{.input = run_forward(cpu, gu, DType::kF32),
                            .format = fmt,
                            .granularity = Granularity::k1x128,
                            .rounding = rnd,
                            .epsilon = eps,
                            .output = QuantizeOutput::kRowwise};
            const QuantTensor want = quantize(cpu, qa);
            const std::string where =
                shape_str(shape) + " " + std::string(dtype_name(dt)) + " " + format_name(fmt);
            ASSERT_TRUE(test::bitwise_equal(want.data, got.data)) << where << " data";
            ASSERT_TRUE(test::bitwise_equal(want.scale_inv, got.scale_inv))
                << where << " scale_inv";
            ASSERT_TRUE(test::bitwise_equal(want.amax, got.amax)) << where << " amax";
            ASSERT_EQ(got.granularity, Granularity::k1x128);
            ASSERT_EQ(got.rounding, rnd);
            ASSERT_FALSE(got.has_columnwise() && got.columnwise_data.numel() > 0);
          }
}

TEST(Swiglu, ZeroRows) {
  Context cpu = make_context(Device::kCpu);
  const Tensor gu = Tensor::empty({0, 256}, DType::kBF16);
  Tensor h = Tensor::empty({0, 128}, DType::kBF16);
  swiglu_forward(cpu, {.gate_up = gu, .h = h});
  const QuantTensor q = swiglu_quantize(cpu, {.gate_up = gu});
  EXPECT_EQ(q.data.shape(), (Shape{0, 128}));
  EXPECT_EQ(q.scale_inv.shape(), (Shape{0, 1}));
  EXPECT_EQ(q.amax.data_as<float>()[0], 0.0f);
}

TEST(Swiglu, RejectsBadArguments) {
  Context cpu = make_context(Device::kCpu);
  const Tensor gu = random_tensor({4, 10}, DType::kBF16, 27);
  test::expect_error(
      [&] {
        swiglu_forward(cpu, {.gate_up = random_tensor({4, 9}, DType::kBF16, 1),
                             .h = Tensor::empty({4, 4}, DType::kBF16)});
      },
      {"swiglu gate_up", "2F", "[4, 9]"});
  test::expect_error(
      [&] {
        swiglu_forward(cpu, {.gate_up = gu, .h = Tensor::empty({4, 10}, DType::kBF16)});
      },
      {"swiglu h", "expected shape [4, 5]", "got [4, 10]"});
  test::expect_error(
      [&] {
        swiglu_forward(cpu, {.gate_up = gu, .h = Tensor::empty({4, 5}, DType::kE4M3)});
      },
      {"swiglu h", "BF16|F32", "F8_E4M3"});
  const Tensor dh = random_tensor({4, 5}, DType::kF32, 28);
  test::expect_error(
      [&] {
        swiglu_backward(
            cpu, {.dh = dh, .gate_up = gu, .d_gate_up = Tensor::empty({4, 10}, DType::kBF16)});
      },
      {"swiglu d_gate_up", "F32", "BF16"});
  test::expect_error(
      [&] {
        swiglu_quantize(cpu, {.gate_up = gu,
                              .format = Fp8Format::kE4M3,
                              .rounding = ScaleRounding::kPow2,
                              .epsilon = -1.0f});
      },
      {"epsilon"});
}

}  // namespace
}  // namespace octet
