// CUDA swiglu against the CPU reference, bit for bit (both run swiglu_math.h's correctly rounded
// operations), on odd and prime shapes, three value distributions and special values; the fused
// quantizer also bit for bit against quantize() of the FP32 output, on the CPU and on the GPU.
// Outputs are poisoned with NaN first.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <tuple>

#include "backend/backend.h"
#include "norm_act_test_util.h"
#include "ops/quantize/quantize.h"
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

Tensor forward(Context& ctx, const Tensor& gu, DType out) {
  Tensor h = ctx.device == Device::kCuda ? test::poisoned(ctx, {gu.rows(), gu.cols() / 2}, out)
                                         : Tensor::empty({gu.rows(), gu.cols() / 2}, out);
  swiglu_forward(ctx, {.gate_up = gu, .h = h});
  return h.to_host(ctx);
}

Tensor backward(Context& ctx, const Tensor& dh, const Tensor& gu) {
  Tensor d = ctx.device == Device::kCuda ? test::poisoned(ctx, gu.shape(), dh.dtype())
                                         : Tensor::empty(gu.shape(), dh.dtype());
  swiglu_backward(ctx, {.dh = dh, .gate_up = gu, .d_gate_up = d});
  return d.to_host(ctx);
}

::testing::AssertionResult same_quant(const QuantTensor& want, const QuantTensor& got,
                                      Context& gpu) {
  for (auto [a, b, what] : {std::tuple{&want.data, &got.data, "data"},
                            std::tuple{&want.scale_inv, &got.scale_inv, "scale_inv"},
                            std::tuple{&want.amax, &got.amax, "amax"}}) {
    auto r = bitwise_equal(*a, b->device() == Device::kCuda ? b->to_host(gpu) : *b);
    if (!r) return r << " [" << what << "]";
  }
  return ::testing::AssertionSuccess();
}

QuantTensor host_copy(const QuantTensor& q, Context& gpu) {
  QuantTensor h = q;
  h.data = q.data.to_host(gpu);
  h.scale_inv = q.scale_inv.to_host(gpu);
  h.amax = q.amax.to_host(gpu);
  return h;
}

// Checks every op of the family on one input (host tensor gu).
void check_all(const Tensor& gu, DType out_dt, const std::string& where) {
  auto& [cpu, gpu] = devices();
  const Tensor gu_d = gu.to(gpu, Device::kCuda);
  ASSERT_TRUE(bitwise_equal(forward(cpu, gu, out_dt), forward(gpu, gu_d, out_dt)))
      << where << " forward";
  const Tensor dh = random_tensor({gu.rows(), gu.cols() / 2}, out_dt, 77 + gu.rows());
  ASSERT_TRUE(bitwise_equal(backward(cpu, dh, gu), backward(gpu, dh.to(gpu, Device::kCuda), gu_d)))
      << where << " backward";
  const Tensor h32 = forward(cpu, gu, DType::kF32);
  for (Fp8Format fmt : {Fp8Format::kE4M3, Fp8Format::kE5M2})
    for (ScaleRounding rnd : {ScaleRounding::kPow2, ScaleRounding::kExact}) {
      const std::string w =
          where + " " + format_name(fmt) + (rnd == ScaleRounding::kPow2 ? " pow2" : " exact");
      const QuantTensor want =
          swiglu_quantize(cpu, {.gate_up = gu, .format = fmt, .rounding = rnd, .epsilon = 0.0f});
      const QuantTensor got =
          swiglu_quantize(gpu, {.gate_up = gu_d, .format = fmt, .rounding = rnd, .epsilon = 0.0f});
      ASSERT_TRUE(same_quant(want, got, gpu)) << w << " swiglu_quantize cuda vs cpu";
      const QuantizeArgs qa{.input = h32,
                            .format = fmt,
                            .granularity = Granularity::k1x128,
                            .rounding = rnd,
                            .epsilon = 0.0f,
                            .output = QuantizeOutput::kRowwise};
      ASSERT_TRUE(same_quant(quantize(cpu, qa), got, gpu))
          << w << " swiglu_quantize vs quantize(cpu swiglu f32)";
      QuantizeArgs qg = qa;
      qg.input = h32.to(gpu, Device::kCuda);
      ASSERT_TRUE(same_quant(host_copy(quantize(gpu, qg), gpu), got, gpu))
          << w << " vs quantize(cuda swiglu f32)";
      const QuantTensor again =
          swiglu_quantize(gpu, {.gate_up = gu_d, .format = fmt, .rounding = rnd, .epsilon = 0.0f});
      ASSERT_TRUE(same_quant(host_copy(got, gpu), again, gpu)) << w << " not deterministic";
    }
}

using Case =
    std::tuple<int64_t, int64_t, DType, DType>;  // rows, F, gate_up dtype, h (and dh) dtype

class SwigluGpu : public ::testing::TestWithParam<Case> {};

TEST_P(SwigluGpu, MatchesCpuBitwise) {
  OCTET_REQUIRE_GPU();
  const auto& [rows, f, in_dt, out_dt] = GetParam();
  for (Dist dist : {Dist::kGaussian, Dist::kOutliers, Dist::kWide}) {
    const Tensor gu =
        random_tensor({rows, 2 * f}, in_dt, 1000 + rows * 7 + f + static_cast<int>(dist), dist);
    check_all(gu, out_dt,
              "rows " + std::to_string(rows) + " F " + std::to_string(f) + " " +
                  std::string(dtype_name(in_dt)) + "->" + std::string(dtype_name(out_dt)) +
                  " dist " + std::to_string(static_cast<int>(dist)));
  }
}

INSTANTIATE_TEST_SUITE_P(OddShapes, SwigluGpu,
                         ::testing::Combine(::testing::Values(1, 127, 129, 1481),
                                            ::testing::Values(7, 129, 1000, 2048),
                                            ::testing::Values(DType::kBF16, DType::kF32),
                                            ::testing::Values(DType::kBF16, DType::kF32)));

// Widths that take the vectorised kernels (F % 8 == 0): one partial group (8, 64), the baseline's
// expert width (704: the last group of a row is 64 wide), whole groups (1024).
INSTANTIATE_TEST_SUITE_P(VecShapes, SwigluGpu,
                         ::testing::Combine(::testing::Values(3, 1481),
                                            ::testing::Values(8, 64, 704, 1024),
                                            ::testing::Values(DType::kBF16, DType::kF32),
                                            ::testing::Values(DType::kBF16, DType::kF32)));

// Padding rows (all zero, as the permute's 128-row tiles leave them) between data rows, and a
// gate_up that starts 2 bytes past an aligned address (the scalar kernels' path): both as the CPU.
TEST(SwigluGpuSpecial, PaddingRowsAndUnalignedViews) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  for (int64_t f : {64, 704, 2048}) {
    Tensor gu = random_tensor({517, 2 * f}, DType::kBF16, 1300 + f, Dist::kOutliers);
    for (int64_t r = 0; r < 517; ++r)
      if (r % 5 == 2 || r >= 500)
        for (int64_t j = 0; j < 2 * f; ++j) gu.data_as<uint16_t>()[r * 2 * f + j] = 0;
    check_all(gu, DType::kBF16, "padding rows F " + std::to_string(f));
    // The same rows read through a view one element in.
    const Tensor big = random_tensor({517 * 2 * f + 1}, DType::kBF16, 1400 + f);
    Tensor big_d = big.to(gpu, Device::kCuda);
    const Tensor view =
        Tensor::wrap(big_d.data_as<uint16_t>() + 1, {517, 2 * f}, DType::kBF16, Device::kCuda);
    Tensor host = Tensor::empty({517, 2 * f}, DType::kBF16);
    std::copy_n(big.data_as<uint16_t>() + 1, 517 * 2 * f, host.data_as<uint16_t>());
    for (Fp8Format fmt : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
      ASSERT_TRUE(same_quant(swiglu_quantize(cpu, {.gate_up = host, .format = fmt}),
                             swiglu_quantize(gpu, {.gate_up = view, .format = fmt}), gpu))
          << "unaligned view F " << f;
    }
    ASSERT_TRUE(bitwise_equal(forward(cpu, host, DType::kBF16), forward(gpu, view, DType::kBF16)))
        << "unaligned view forward F " << f;
  }
}

// Every BF16 bit pattern as a gate value (the vectorised kernels' sigmoid and its reciprocal
// against swiglu_math's, NaNs, infinities and subnormals included), and F32 gates swept densely
// over [-100, 100] (1 + exp(-g) from 1 to past 2^125): every op as the CPU, bit for bit.
TEST(SwigluGpuSpecial, EveryBf16GateAndADenseF32Sweep) {
  OCTET_REQUIRE_GPU();
  constexpr int64_t kF = 1024, kRows = 65536 / kF;
  Tensor gu = random_tensor({kRows, 2 * kF}, DType::kBF16, 1500, Dist::kGaussian);
  for (int64_t i = 0; i < 65536; ++i)
    gu.data_as<uint16_t>()[(i / kF) * 2 * kF + i % kF] = static_cast<uint16_t>(i);
  check_all(gu, DType::kBF16, "every bf16 gate");
  Tensor g32 = random_tensor({kRows, 2 * kF}, DType::kF32, 1501, Dist::kGaussian);
  for (int64_t i = 0; i < 65536; ++i)
    g32.data_as<float>()[(i / kF) * 2 * kF + i % kF] =
        -100.0f + 200.0f * static_cast<float>(i) / 65536.0f + 1e-4f * static_cast<float>(i % 7);
  check_all(g32, DType::kF32, "f32 gate sweep");
}

TEST(SwigluGpuSpecial, NonFiniteZerosAndExtremes) {
  OCTET_REQUIRE_GPU();
  Tensor gu = random_tensor({9, 2 * 300}, DType::kF32, 1100, Dist::kWide);
  float* p = gu.data_as<float>();
  const float inf = std::numeric_limits<float>::infinity(),
              nan = std::numeric_limits<float>::quiet_NaN();
  const float special[] = {0.0f,   -0.0f,  inf,    -inf,  nan,    1e30f,
                           -1e30f, 1e-40f, -88.0f, 88.0f, 103.5f, -103.5f};
  for (int i = 0; i < 12; ++i) {
    p[3 * 600 + i] = special[i];        // gate of row 3
    p[4 * 600 + 300 + i] = special[i];  // up of row 4
    p[5 * 600 + 129 + i] = special[i];  // gate, second group
    p[5 * 600 + 300 + 129 + i] = 2.5f;
  }
  for (int64_t j = 0; j < 600; ++j) p[6 * 600 + j] = 0.0f;  // an all-zero row: scale 1
  check_all(gu, DType::kF32, "special f32");
  check_all(gu, DType::kBF16, "special bf16");
}

TEST(SwigluGpuSpecial, ZeroRowsAndExpertSizedInput) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const QuantTensor q =
      swiglu_quantize(gpu, {.gate_up = Tensor::empty(gpu, {0, 512}, DType::kBF16)});
  EXPECT_EQ(q.amax.to_host(gpu).data_as<float>()[0], 0.0f);
  // DeepSeek-V3's moe_intermediate_size (2048) over a few thousand routed tokens.
  check_all(random_tensor({3001, 2 * 2048}, DType::kBF16, 1200, Dist::kOutliers), DType::kBF16,
            "expert sized");
}

}  // namespace
}  // namespace octet
