// MN-major 1x128 scales on CUDA (core/scale_layout.h): every quantize kernel writes them (padding
// included) bitwise as the CPU reference does, and cuBLASLt GEMMs that read them in place give
// bitwise the output of the same GEMMs on K-major operands (whose scales gemm_cuda.cu re-lays out).
#include <gtest/gtest.h>

#include <tuple>

#include "backend/backend.h"
#include "core/scale_layout.h"
#include "ops/gemm/gemm.h"
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

// Poisons the device pool, so that scale entries (the padding) a kernel fails to write differ.
void poison_pool(Context& gpu, int64_t bytes) {
  Tensor t = Tensor::empty(gpu, {bytes}, DType::kU8);
  gpu.be().memset(t.data(), 0xA5, bytes);
}

QuantizeArgs args_for(const Tensor& x, QuantizeOutput out, ScaleLayout layout,
                      ScaleRounding rnd = ScaleRounding::kExact) {
  return {.input = x,
          .format = Fp8Format::kE4M3,
          .granularity = Granularity::k1x128,
          .rounding = rnd,
          .output = out,
          .scale_layout = layout};
}

// Shapes for each kernel: the 1x128 row-wise streaming kernel (vector and scalar), the BF16 tile
// kernel (rows % 16 == 0, cols % 8 == 0) and the general tile kernel (F32, odd shapes); row counts
// not multiples of 4 and K not a multiple of 128.
using Case = std::tuple<Shape, DType, QuantizeOutput>;
class ScaleLayoutQuantizeGpu : public ::testing::TestWithParam<Case> {};

TEST_P(ScaleLayoutQuantizeGpu, MnMajorMatchesCpuBitwise) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const auto& [shape, dt, out] = GetParam();
  for (Dist dist : {Dist::kGaussian, Dist::kWide}) {
    const Tensor x = random_tensor(shape, dt, 77 + static_cast<int>(dist), dist);
    const QuantTensor want = quantize(cpu, args_for(x, out, ScaleLayout::kMNMajor));
    poison_pool(gpu, 4 * x.nbytes() + (1 << 20));
    const QuantTensor got =
        quantize(gpu, args_for(x.to(gpu, Device::kCuda), out, ScaleLayout::kMNMajor));
    if (out != QuantizeOutput::kColumnwise) {
      ASSERT_EQ(got.scale_inv.shape(), want.scale_inv.shape());
      ASSERT_TRUE(bitwise_equal(want.data, got.data.to_host(gpu))) << "data";
      ASSERT_TRUE(bitwise_equal(want.scale_inv, got.scale_inv.to_host(gpu))) << "scale_inv";
    }
    if (out != QuantizeOutput::kRowwise) {
      ASSERT_TRUE(bitwise_equal(want.columnwise_data, got.columnwise_data.to_host(gpu)));
      ASSERT_TRUE(bitwise_equal(want.columnwise_scale_inv, got.columnwise_scale_inv.to_host(gpu)))
          << "columnwise_scale_inv";
      ASSERT_TRUE(bitwise_equal(dequantize(cpu, want, DType::kF32, Copy::kColumnwise),
                                dequantize(gpu, got, DType::kF32, Copy::kColumnwise).to_host(gpu)))
          << "dequantize (column-wise)";
    }
    if (out != QuantizeOutput::kColumnwise)
      ASSERT_TRUE(bitwise_equal(dequantize(cpu, want, DType::kBF16),
                                dequantize(gpu, got, DType::kBF16).to_host(gpu)))
          << "dequantize";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, ScaleLayoutQuantizeGpu,
    ::testing::Combine(::testing::Values(Shape{1, 1}, Shape{5, 300}, Shape{37, 200},
                                         Shape{130, 257}, Shape{48, 704}, Shape{144, 1032},
                                         Shape{2, 48, 136}, Shape{256, 1024}),
                       ::testing::Values(DType::kBF16, DType::kF32),
                       ::testing::Values(QuantizeOutput::kRowwise, QuantizeOutput::kColumnwise,
                                         QuantizeOutput::kBoth)));

// D = A B^T on cuBLASLt with A (and B, for 1x128 x 1x128) quantized K-major and MN-major: the same
// codes and scales, so bitwise the same D. M not a multiple of 4 runs the zero-padded A copy.
using GemmCase = std::tuple<int64_t, int64_t, int64_t>;  // M, N, K
class ScaleLayoutGemmGpu : public ::testing::TestWithParam<GemmCase> {};

TEST_P(ScaleLayoutGemmGpu, MnMajorIsBitwiseKMajor) {
  OCTET_REQUIRE_GPU();
  auto& gpu = devices().gpu;
  const auto& [m, n, k] = GetParam();
  const Tensor a = random_tensor({m, k}, DType::kBF16, 91).to(gpu, Device::kCuda);
  const Tensor b = random_tensor({n, k}, DType::kBF16, 92, Dist::kOutliers).to(gpu, Device::kCuda);
  QuantizeArgs wq = args_for(b, QuantizeOutput::kRowwise, ScaleLayout::kKMajor);
  wq.granularity = Granularity::k128x128;
  const QuantTensor qw = quantize(gpu, wq);
  Tensor y[2], d[2], acc[2];
  for (int l = 0; l < 2; ++l) {
    const auto layout = l == 0 ? ScaleLayout::kKMajor : ScaleLayout::kMNMajor;
    const QuantTensor qa = quantize(gpu, args_for(a, QuantizeOutput::kRowwise, layout));
    const QuantTensor qb =
        quantize(gpu, args_for(b, QuantizeOutput::kRowwise, layout, ScaleRounding::kPow2));
    y[l] = Tensor::empty(gpu, {m, n}, DType::kBF16);
    d[l] = Tensor::empty(gpu, {m, n}, DType::kBF16);
    acc[l] = random_tensor({m, n}, DType::kF32, 93).to(gpu, Device::kCuda);
    gemm_fp8(gpu,
             {.a = rowwise_operand(qa), .b = rowwise_operand(qw), .d = y[l]});  // 1x128 x 128x128
    gemm_fp8(gpu,
             {.a = rowwise_operand(qa), .b = rowwise_operand(qb), .d = d[l]});  // 1x128 x 1x128
    gemm_fp8(gpu, {.a = rowwise_operand(qa),
                   .b = rowwise_operand(qb),
                   .d = acc[l],
                   .accumulate = Accumulate::kAdd});
  }
  ASSERT_TRUE(bitwise_equal(y[0].to_host(gpu), y[1].to_host(gpu))) << "1x128 x 128x128";
  ASSERT_TRUE(bitwise_equal(d[0].to_host(gpu), d[1].to_host(gpu))) << "1x128 x 1x128";
  ASSERT_TRUE(bitwise_equal(acc[0].to_host(gpu), acc[1].to_host(gpu))) << "1x128 x 1x128, +=";
}

INSTANTIATE_TEST_SUITE_P(Shapes, ScaleLayoutGemmGpu,
                         ::testing::Values(GemmCase{37, 72, 208}, GemmCase{5, 8, 16},
                                           GemmCase{130, 264, 384}, GemmCase{2048, 1408, 1024},
                                           GemmCase{4, 128, 2816}));

}  // namespace
}  // namespace octet
