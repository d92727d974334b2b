// CUDA quantize family against the CPU reference, bit for bit, on odd and prime shapes.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>

#include "backend/backend.h"
#include "ops/cast/cast.h"
#include "ops/quantize/quantize.h"
#include "test_util.h"

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

// Fills the device pool with a poison pattern and frees it, so that outputs the kernels fail to
// write hold garbage rather than zeros left by an earlier test.
void poison_pool(Context& gpu, int64_t bytes) {
  Tensor t = Tensor::empty(gpu, {bytes}, DType::kU8);
  gpu.be().memset(t.data(), 0xA5, bytes);
}

::testing::AssertionResult same_quant(Context& gpu, const QuantTensor& want,
                                      const QuantTensor& got) {
  auto cmp = [&](const Tensor& a, const Tensor& b, const char* what) -> ::testing::AssertionResult {
    if (!a.defined() && !b.defined()) return ::testing::AssertionSuccess();
    if (a.data() == nullptr && a.numel() > 0)
      return ::testing::AssertionSuccess();  // not requested
    auto r = bitwise_equal(a, b.to_host(gpu));
    if (!r) r << " [" << what << "]";
    return r;
  };
  for (auto r : {cmp(want.data, got.data, "data"), cmp(want.scale_inv, got.scale_inv, "scale_inv"),
                 cmp(want.amax, got.amax, "amax"),
                 cmp(want.columnwise_data, got.columnwise_data, "columnwise_data"),
                 cmp(want.columnwise_scale_inv, got.columnwise_scale_inv, "columnwise_scale_inv")})
    if (!r) return r;
  return ::testing::AssertionSuccess();
}

using Case = std::tuple<Shape, Granularity, Fp8Format, ScaleRounding, QuantizeOutput, DType>;

class QuantizeGpu : public ::testing::TestWithParam<Case> {};

TEST_P(QuantizeGpu, MatchesCpuBitwise) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const auto& [shape, g, fmt, rnd, out, dt] = GetParam();
  for (Dist dist : {Dist::kGaussian, Dist::kOutliers, Dist::kWide}) {
    Tensor x = random_tensor(shape, dt, 1234 + static_cast<int>(dist), dist);
    QuantizeArgs a{.input = x,
                   .format = fmt,
                   .granularity = g,
                   .rounding = rnd,
                   .epsilon = 0.0f,
                   .output = out};
    const QuantTensor want = quantize(cpu, a);
    poison_pool(gpu, 4 * x.nbytes() + (1 << 20));
    a.input = x.to(gpu, Device::kCuda);
    const QuantTensor got = quantize(gpu, a);
    ASSERT_TRUE(same_quant(gpu, want, got)) << "dist " << static_cast<int>(dist);
    if (out != QuantizeOutput::kColumnwise) {
      const Tensor dq_cpu = dequantize(cpu, want, DType::kBF16);
      ASSERT_TRUE(bitwise_equal(dq_cpu, dequantize(gpu, got, DType::kBF16).to_host(gpu)))
          << "dequantize bf16";
      ASSERT_TRUE(bitwise_equal(dequantize(cpu, want, DType::kF32),
                                dequantize(gpu, got, DType::kF32).to_host(gpu)))
          << "dequantize f32";
    }
  }
}

const Shape kShapes[] = {{1, 1},    {1, 127},      {127, 129}, {129, 257},
                         {1481, 7}, {3, 129, 136}, {256, 384}, {130, 1024}};

INSTANTIATE_TEST_SUITE_P(
    AllRecipes, QuantizeGpu,
    ::testing::Combine(::testing::ValuesIn(kShapes),
                       ::testing::Values(Granularity::kTensor, Granularity::kRow,
                                         Granularity::k1x128, Granularity::k128x1,
                                         Granularity::k128x128),
                       ::testing::Values(Fp8Format::kE4M3, Fp8Format::kE5M2),
                       ::testing::Values(ScaleRounding::kExact, ScaleRounding::kPow2),
                       ::testing::Values(QuantizeOutput::kRowwise, QuantizeOutput::kColumnwise,
                                         QuantizeOutput::kBoth),
                       ::testing::Values(DType::kBF16, DType::kF32)));

// The BF16 1x128 tile kernel with the column-wise copy (quantize_bf16_tile_kernels.cuh): taken when
// cols % 8 == 0, rows % 16 == 0 and the buffers are aligned. Full and partial 128x128 tiles in
// both directions, the model's widths (288, 704, 1408, 2816), both formats and roundings.
using FastCase = std::tuple<Shape, Fp8Format, ScaleRounding, QuantizeOutput>;

class QuantizeGpuBf16Tile : public ::testing::TestWithParam<FastCase> {};

TEST_P(QuantizeGpuBf16Tile, MatchesCpuBitwise) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const auto& [shape, fmt, rnd, out] = GetParam();
  for (Dist dist : {Dist::kGaussian, Dist::kOutliers, Dist::kWide}) {
    Tensor x = random_tensor(shape, DType::kBF16, 4321 + static_cast<int>(dist), dist);
    QuantizeArgs a{.input = x,
                   .format = fmt,
                   .granularity = Granularity::k1x128,
                   .rounding = rnd,
                   .epsilon = 0.0f,
                   .output = out};
    const QuantTensor want = quantize(cpu, a);
    poison_pool(gpu, 4 * x.nbytes() + (1 << 20));
    a.input = x.to(gpu, Device::kCuda);
    const QuantTensor got = quantize(gpu, a);
    ASSERT_TRUE(same_quant(gpu, want, got)) << "dist " << static_cast<int>(dist);
  }
}

INSTANTIATE_TEST_SUITE_P(
    FastPath, QuantizeGpuBf16Tile,
    ::testing::Combine(::testing::Values(Shape{16, 8}, Shape{128, 128}, Shape{144, 136},
                                         Shape{272, 288}, Shape{2, 64, 520}, Shape{400, 704},
                                         Shape{256, 1408}, Shape{48, 2816}, Shape{2064, 256}),
                       ::testing::Values(Fp8Format::kE4M3, Fp8Format::kE5M2),
                       ::testing::Values(ScaleRounding::kExact, ScaleRounding::kPow2),
                       ::testing::Values(QuantizeOutput::kColumnwise, QuantizeOutput::kBoth)));

// QuantizeArgs::amax false on every CUDA path (the row-wise 1x128 kernel, the BF16 tile kernel with
// the column-wise copy, the general tile kernel): the CPU's copies bit for bit and no amax, over a
// pool of 0xA5 bytes (no word is zeroed for it any more).
TEST(QuantizeGpuSpecial, WithoutAmaxMatchesCpu) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  for (const auto& [shape, g, out] :
       {std::tuple{Shape{256, 1408}, Granularity::k1x128, QuantizeOutput::kRowwise},
        std::tuple{Shape{256, 1408}, Granularity::k1x128, QuantizeOutput::kBoth},
        std::tuple{Shape{130, 300}, Granularity::k128x128, QuantizeOutput::kBoth},
        std::tuple{Shape{130, 300}, Granularity::kRow, QuantizeOutput::kBoth}}) {
    SCOPED_TRACE(shape_str(shape) + " " + granularity_name(g));
    Tensor x = random_tensor(shape, DType::kBF16, 77, Dist::kOutliers);
    QuantizeArgs a{.input = x,
                   .granularity = g,
                   .rounding = ScaleRounding::kPow2,
                   .output = out,
                   .amax = false};
    const QuantTensor want = quantize(cpu, a);
    poison_pool(gpu, 4 * x.nbytes() + (1 << 20));
    a.input = x.to(gpu, Device::kCuda);
    const QuantTensor got = quantize(gpu, a);
    EXPECT_FALSE(got.amax.defined());
    ASSERT_TRUE(same_quant(gpu, want, got));
  }
}

// NaN, infinities, an all-zero row, an all-zero tile column, -0 and BF16 subnormals in the fast
// path, with and without an epsilon.
TEST(QuantizeGpuSpecial, Bf16TileNonFiniteZeroAndEpsilon) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const int64_t rows = 272, cols = 264;
  Tensor x = random_tensor({rows, cols}, DType::kBF16, 17, Dist::kWide);
  auto* p = x.data_as<uint16_t>();
  for (int64_t c = 0; c < cols; ++c) p[5 * cols + c] = 0;         // an all-zero row
  for (int64_t r = 0; r < rows; ++r) p[r * cols + 131] = 0x8000;  // an all -0 column
  p[17 * cols + 3] = 0x7F80;                                      // +inf
  p[40 * cols + 200] = 0xFF80;                                    // -inf
  p[130 * cols + 129] = 0x7FC0;                                   // NaN
  p[131 * cols + 130] = 0xFFC1;                                   // NaN with sign and payload
  p[250 * cols + 7] = 0x0001;                                     // BF16 subnormal
  p[251 * cols + 7] = 0x7F7F;                                     // BF16 max
  for (float eps : {0.0f, 1e-4f})
    for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2})
      for (QuantizeOutput o : {QuantizeOutput::kColumnwise, QuantizeOutput::kBoth}) {
        QuantizeArgs a{.input = x,
                       .format = f,
                       .granularity = Granularity::k1x128,
                       .rounding = ScaleRounding::kPow2,
                       .epsilon = eps,
                       .output = o};
        const QuantTensor want = quantize(cpu, a);
        poison_pool(gpu, 4 * x.nbytes() + (1 << 20));
        a.input = x.to(gpu, Device::kCuda);
        ASSERT_TRUE(same_quant(gpu, want, quantize(gpu, a)))
            << format_name(f) << " eps " << eps << " output " << static_cast<int>(o);
      }
}

// A misaligned input and a row count that is not a multiple of 16 take the general tile kernel.
TEST(QuantizeGpuSpecial, Bf16TileFallbacks) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  Tensor big = random_tensor({1, 144 * 256 + 8}, DType::kBF16, 19, Dist::kOutliers);
  Tensor dev_big = big.to(gpu, Device::kCuda);
  for (int64_t shift : {1, 4}) {  // 2 and 8 bytes off a 16-byte boundary
    Tensor xs = Tensor::wrap(static_cast<uint16_t*>(big.data()) + shift, {144, 256}, DType::kBF16,
                             Device::kCpu);
    QuantizeArgs a{.input = xs,
                   .format = Fp8Format::kE4M3,
                   .granularity = Granularity::k1x128,
                   .rounding = ScaleRounding::kExact,
                   .epsilon = 0.0f,
                   .output = QuantizeOutput::kBoth};
    const QuantTensor want = quantize(cpu, a);
    a.input = Tensor::wrap(static_cast<uint16_t*>(dev_big.data()) + shift, {144, 256}, DType::kBF16,
                           Device::kCuda);
    ASSERT_TRUE(same_quant(gpu, want, quantize(gpu, a))) << "shift " << shift;
  }
  Tensor odd = random_tensor({136, 256}, DType::kBF16, 23, Dist::kGaussian);  // rows % 16 == 8
  QuantizeArgs a{.input = odd,
                 .format = Fp8Format::kE4M3,
                 .granularity = Granularity::k1x128,
                 .rounding = ScaleRounding::kPow2,
                 .epsilon = 0.0f,
                 .output = QuantizeOutput::kBoth};
  const QuantTensor want = quantize(cpu, a);
  a.input = odd.to(gpu, Device::kCuda);
  ASSERT_TRUE(same_quant(gpu, want, quantize(gpu, a)));
}

TEST(QuantizeGpuSpecial, NonFiniteAndZeroGroups) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  Tensor x = random_tensor({300, 260}, DType::kF32, 7, Dist::kWide);
  float* p = x.data_as<float>();
  for (int64_t c = 0; c < 260; ++c) p[5 * 260 + c] = 0.0f;  // an all-zero row
  p[17 * 260 + 3] = std::numeric_limits<float>::infinity();
  p[40 * 260 + 200] = -std::numeric_limits<float>::infinity();
  p[130 * 260 + 129] = std::numeric_limits<float>::quiet_NaN();
  p[250 * 260 + 7] = -0.0f;
  p[251 * 260 + 7] = 1e-40f;  // FP32 subnormal
  for (Granularity g : {Granularity::kTensor, Granularity::kRow, Granularity::k1x128,
                        Granularity::k128x1, Granularity::k128x128})
    for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
      QuantizeArgs a{.input = x,
                     .format = f,
                     .granularity = g,
                     .rounding = ScaleRounding::kPow2,
                     .epsilon = 0.0f,
                     .output = QuantizeOutput::kBoth};
      const QuantTensor want = quantize(cpu, a);
      a.input = x.to(gpu, Device::kCuda);
      ASSERT_TRUE(same_quant(gpu, want, quantize(gpu, a)))
          << granularity_name(g) << " " << format_name(f);
    }
}

TEST(QuantizeGpuSpecial, MisalignedInputTakesTheScalarPath) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  Tensor big = random_tensor({1, 129 * 256 + 1}, DType::kBF16, 9);
  Tensor x =
      Tensor::wrap(static_cast<uint16_t*>(big.data()) + 1, {129, 256}, DType::kBF16, Device::kCpu);
  Tensor dev_big = big.to(gpu, Device::kCuda);
  Tensor dev_x = Tensor::wrap(static_cast<uint16_t*>(dev_big.data()) + 1, {129, 256}, DType::kBF16,
                              Device::kCuda);
  QuantizeArgs a{.input = x,
                 .format = Fp8Format::kE4M3,
                 .granularity = Granularity::k1x128,
                 .rounding = ScaleRounding::kExact,
                 .epsilon = 0.0f,
                 .output = QuantizeOutput::kRowwise};
  const QuantTensor want = quantize(cpu, a);
  a.input = dev_x;
  ASSERT_TRUE(same_quant(gpu, want, quantize(gpu, a)));
}

TEST(QuantizeGpuSpecial, LargeTensorAndEpsilon) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  Tensor x = random_tensor({2053, 7168}, DType::kBF16, 11, Dist::kOutliers);
  for (QuantizeOutput o : {QuantizeOutput::kRowwise, QuantizeOutput::kBoth}) {
    QuantizeArgs a{.input = x,
                   .format = Fp8Format::kE4M3,
                   .granularity = Granularity::k1x128,
                   .rounding = ScaleRounding::kPow2,
                   .epsilon = 1e-4f,
                   .output = o};
    const QuantTensor want = quantize(cpu, a);
    a.input = x.to(gpu, Device::kCuda);
    ASSERT_TRUE(same_quant(gpu, want, quantize(gpu, a)));
  }
}

TEST(QuantizeGpuSpecial, GivenDelayedScale) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  Tensor x = random_tensor({257, 129}, DType::kF32, 13, Dist::kOutliers);
  Tensor scale = Tensor::empty({1}, DType::kF32);
  scale.data_as<float>()[0] = 3.75f;
  QuantizeArgs a{.input = x,
                 .format = Fp8Format::kE5M2,
                 .granularity = Granularity::kTensor,
                 .rounding = ScaleRounding::kExact,
                 .epsilon = 0.0f,
                 .output = QuantizeOutput::kBoth,
                 .scale = scale};
  const QuantTensor want = quantize(cpu, a);
  a.input = x.to(gpu, Device::kCuda);
  a.scale = scale.to(gpu, Device::kCuda);
  ASSERT_TRUE(same_quant(gpu, want, quantize(gpu, a)));
}

class TransposeGpu : public ::testing::TestWithParam<std::tuple<Shape, Fp8Format>> {};

TEST_P(TransposeGpu, MatchesCpuBitwise) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const auto& [shape, fmt] = GetParam();
  for (int variant = 0; variant < 4; ++variant) {
    // Three distributions, then small gradient-like values with all-zero rows (of both signs) in
    // between, as the padded permute's padding rows and the masked MTP positions give fp8-flow.
    const Dist dist = variant < 3
                          ? std::array{Dist::kOutliers, Dist::kWide, Dist::kGaussian}[variant]
                          : Dist::kGaussian;
    Tensor x = random_tensor(shape, DType::kF32, 77 + variant, dist);
    if (variant == 3) {
      const int64_t cols = shape.back(), rows = x.numel() / std::max<int64_t>(cols, 1);
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          float& v = x.data_as<float>()[i * cols + j];
          v = i % 3 == 1 ? (i % 2 ? -0.0f : 0.0f) : v * 1e-5f;
        }
    }
    x = cast(cpu, x, DType::kBF16);
    QuantizeArgs a{.input = x,
                   .format = fmt,
                   .granularity = Granularity::k1x128,
                   .rounding = ScaleRounding::kPow2,
                   .epsilon = 0.0f,
                   .output = QuantizeOutput::kRowwise};
    QuantTensor want = quantize(cpu, a);
    scaling_aware_transpose(cpu, want);
    a.input = x.to(gpu, Device::kCuda);
    QuantTensor got = quantize(gpu, a);
    poison_pool(gpu, 4 * x.nbytes() + (1 << 20));
    scaling_aware_transpose(gpu, got);
    ASSERT_TRUE(bitwise_equal(want.columnwise_data, got.columnwise_data.to_host(gpu)))
        << "variant " << variant;
    ASSERT_TRUE(bitwise_equal(want.columnwise_scale_inv, got.columnwise_scale_inv.to_host(gpu)));
  }
}

INSTANTIATE_TEST_SUITE_P(
    OddShapes, TransposeGpu,
    ::testing::Combine(::testing::Values(Shape{1, 1}, Shape{1, 129}, Shape{127, 1}, Shape{129, 257},
                                         Shape{1481, 133}, Shape{256, 512}, Shape{300, 1030}),
                       ::testing::Values(Fp8Format::kE4M3, Fp8Format::kE5M2)));

TEST(AmaxGpu, MatchesCpuIncludingNaN) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Tensor x = random_tensor({1031, 517}, dt, 5, Dist::kWide);
    ASSERT_TRUE(bitwise_equal(amax(cpu, x), amax(gpu, x.to(gpu, Device::kCuda)).to_host(gpu)));
  }
  Tensor x = random_tensor({64, 64}, DType::kF32, 6);
  x.data_as<float>()[100] = std::numeric_limits<float>::quiet_NaN();
  const float a = amax(gpu, x.to(gpu, Device::kCuda)).to_host(gpu).data_as<float>()[0];
  EXPECT_TRUE(std::isnan(a));
}

TEST(DelayedScalingGpu, MatchesCpuOverASequence) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  for (AmaxReduction reduce : {AmaxReduction::kMax, AmaxReduction::kMostRecent}) {
    DelayedScaling sc = make_delayed_scaling(cpu, 5), sg = make_delayed_scaling(gpu, 5);
    const ScaleRule rule{.format = Fp8Format::kE4M3,
                         .rounding = ScaleRounding::kExact,
                         .epsilon = 0.0f,
                         .margin = 1};
    const float amaxes[] = {3.0f,  0.0f,   7.5f, std::numeric_limits<float>::quiet_NaN(),
                            0.25f, 1e-30f, 2.0f, 0.5f};
    for (int step = 0; step < 8; ++step) {
      Tensor am = Tensor::empty({1}, DType::kF32);
      am.data_as<float>()[0] = amaxes[step];
      delayed_scaling_update(cpu, sc, am, step, reduce, rule);
      delayed_scaling_update(gpu, sg, am.to(gpu, Device::kCuda), step, reduce, rule);
      ASSERT_TRUE(bitwise_equal(sc.scale, sg.scale.to_host(gpu))) << "step " << step;
      ASSERT_TRUE(bitwise_equal(sc.scale_inv, sg.scale_inv.to_host(gpu))) << "step " << step;
      ASSERT_TRUE(bitwise_equal(sc.amax_history, sg.amax_history.to_host(gpu))) << "step " << step;
    }
  }
}

}  // namespace
}  // namespace octet
