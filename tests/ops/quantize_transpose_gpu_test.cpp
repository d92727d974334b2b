// The CUDA scaling-aware transpose against the CPU reference and against the kernel it replaced,
// bit for bit, on the model's MoE shapes and the edge cases the op takes. The codes are drawn
// directly (every one of the 256 codes, NaN and infinities included) with power-of-2 scale_invs
// spread over 2^-40 .. 2^40, so the rescaling reaches every case: exact shifts, subnormal results
// rounded to nearest even, underflow to +-0, rows of zero codes whose scale_inv exceeds the tile's.
// quantize_gpu_test.cpp's TransposeGpu covers codes that come from quantize.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "ops/quantize/quantize.h"
#include "ops/quantize/quantize_backends.h"
#include "test_util.h"

namespace octet {
namespace {

using test::bitwise_equal;

struct Devices {
  Context cpu = make_context(Device::kCpu);
  Context gpu = make_context(Device::kCuda);
};

Devices& devices() {
  static Devices d;
  return d;
}

struct Lcg {
  uint64_t s;
  uint32_t next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(s >> 33);
  }
};

// A host (rows, cols) row-wise 1x128 pow2 QuantTensor with K-major scales: random codes, every
// 7th row all zero codes (+0 and -0), every 5th 1x128 group all zero, the rest random bytes where
// `dense` (else mostly zeros: sparse groups whose few codes decide S alone).
// spread: scale_inv exponents in [-spread, spread]; no_nan: NaN codes drawn become +0.
QuantTensor random_codes(int64_t rows, int64_t cols, Fp8Format fmt, uint64_t seed, int spread = 40,
                         bool no_nan = false) {
  Lcg g{seed};
  const int64_t cblocks = (cols + 127) / 128;
  QuantTensor q;
  q.format = fmt;
  q.granularity = Granularity::k1x128;
  q.rounding = ScaleRounding::kPow2;
  q.data = Tensor::empty({rows, cols}, fp8_dtype(fmt));
  q.scale_inv = Tensor::empty(scale_shape(Granularity::k1x128, rows, cols), DType::kF32);
  q.amax = Tensor::empty({1}, DType::kF32);
  q.amax.data_as<float>()[0] = 1.0f;
  auto* d = q.data.data_as<uint8_t>();
  auto* s = q.scale_inv.data_as<float>();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t b = 0; b < cblocks; ++b) {
      // 2^e, e in [-spread, spread]; a tenth of the groups share 2^0 so that ties of S occur.
      const int e =
          g.next() % 10 == 0
              ? 0
              : static_cast<int>(g.next() % static_cast<uint32_t>(2 * spread + 1)) - spread;
      s[i * cblocks + b] = bits_float(static_cast<uint32_t>(127 + e) << 23);
      const bool zero = i % 7 == 3 || (i + b) % 5 == 2;
      const bool sparse = (i + 3 * b) % 4 == 1;
      for (int64_t j = b * 128; j < std::min(cols, (b + 1) * 128); ++j) {
        const uint32_t r = g.next();
        uint8_t c = static_cast<uint8_t>(r >> 8);
        if (zero) c &= 0x80;  // +0 or -0
        if (sparse && r % 64 != 0) c = 0;
        const bool nan = fmt == Fp8Format::kE4M3 ? (c & 0x7F) == 0x7F : (c & 0x7F) > 0x7C;
        if (no_nan && nan) c = 0;
        d[i * cols + j] = c;
      }
    }
  return q;
}

QuantTensor to_gpu(Context& gpu, const QuantTensor& h) {
  QuantTensor q = h;
  q.data = h.data.to(gpu, Device::kCuda);
  q.scale_inv = h.scale_inv.to(gpu, Device::kCuda);
  q.amax = h.amax.to(gpu, Device::kCuda);
  return q;
}

void poison_pool(Context& gpu, int64_t bytes) {
  Tensor t = Tensor::empty(gpu, {bytes}, DType::kU8);
  gpu.be().memset(t.data(), 0xA5, bytes);
}

using Case = std::tuple<Shape, Fp8Format>;
class TransposeGpuCodes : public ::testing::TestWithParam<Case> {};

// The op (the 16-byte tile kernel) against the CPU reference, and the legacy kernel against both.
TEST_P(TransposeGpuCodes, MatchesCpuAndLegacyBitwise) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const auto& [shape, fmt] = GetParam();
  const int64_t rows = shape[0], cols = shape[1];
  QuantTensor want = random_codes(rows, cols, fmt, 1000 + rows * 31 + cols);
  QuantTensor got = to_gpu(gpu, want);
  scaling_aware_transpose(cpu, want);
  poison_pool(gpu, 2 * rows * cols + (1 << 20));
  scaling_aware_transpose(gpu, got);
  ASSERT_EQ(got.columnwise_granularity, Granularity::k128x128);
  ASSERT_EQ(got.columnwise_data.shape(), (Shape{cols, rows}));
  ASSERT_TRUE(bitwise_equal(want.columnwise_data, got.columnwise_data.to_host(gpu)));
  ASSERT_TRUE(bitwise_equal(want.columnwise_scale_inv, got.columnwise_scale_inv.to_host(gpu)));

  // The 1x128 form of the scales (fp8-flow's dY and d_gate_up for the grouped Wgrad).
  QuantTensor want_rows = random_codes(rows, cols, fmt, 1000 + rows * 31 + cols);
  QuantTensor got_rows = to_gpu(gpu, want_rows);
  scaling_aware_transpose(cpu, want_rows, Granularity::k1x128);
  poison_pool(gpu, 2 * rows * cols + (1 << 20));
  scaling_aware_transpose(gpu, got_rows, Granularity::k1x128);
  ASSERT_EQ(got_rows.columnwise_scale_inv.shape(), scale_shape(Granularity::k1x128, cols, rows));
  EXPECT_TRUE(bitwise_equal(want.columnwise_data, got_rows.columnwise_data.to_host(gpu)));
  EXPECT_TRUE(
      bitwise_equal(want_rows.columnwise_scale_inv, got_rows.columnwise_scale_inv.to_host(gpu)));

#if OCTET_WITH_CUDA  // the kernels' own entry points exist in a CUDA build only
  Tensor ldata = Tensor::empty(gpu, {cols, rows}, fp8_dtype(fmt));
  Tensor lscale = Tensor::empty(gpu, scale_shape(Granularity::k128x128, cols, rows), DType::kF32);
  gpu.be().memset(ldata.data(), 0xA5, ldata.nbytes());
  cuda::scaling_aware_transpose_legacy(gpu, got, ldata, lscale);
  EXPECT_TRUE(bitwise_equal(want.columnwise_data, ldata.to_host(gpu))) << "legacy kernel";
  EXPECT_TRUE(bitwise_equal(want.columnwise_scale_inv, lscale.to_host(gpu))) << "legacy kernel";
#endif
}

// Without NaN codes the threads whose rows move by 2^-24 or less take the half-precision rescale
// (rescale_fp8x4_f16), the others the FP32 one: with scales within 2^-3 .. 2^3 or 2^-12 .. 2^12
// every thread takes it (half-precision subnormal products included), within 2^-40 .. 2^40 both
// paths run. Either must give the CPU's bits, subnormal results and underflow included.
TEST_P(TransposeGpuCodes, HalfPrecisionRescaleMatchesCpu) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const auto& [shape, fmt] = GetParam();
  const int64_t rows = shape[0], cols = shape[1];
  for (int spread : {3, 12, 40}) {
    QuantTensor want = random_codes(rows, cols, fmt, 7 + rows * 13 + cols + spread, spread, true);
    QuantTensor got = to_gpu(gpu, want);
    scaling_aware_transpose(cpu, want);
    poison_pool(gpu, 2 * rows * cols + (1 << 20));
    scaling_aware_transpose(gpu, got);
    ASSERT_TRUE(bitwise_equal(want.columnwise_data, got.columnwise_data.to_host(gpu))) << spread;
    ASSERT_TRUE(bitwise_equal(want.columnwise_scale_inv, got.columnwise_scale_inv.to_host(gpu)))
        << spread;
  }
}

// The model's MoE shapes (configs/baseline-h100.toml: 16384 tokens, top-4, expert widths 1024 and
// 704, 704 = 5.5 tiles), slices of the bench's 7168 and 5120 widths, and the edge cases: rows not a
// multiple of 128 or of 16 (bytewise output stores), columns not a multiple of 128 or of 16
// (bytewise loads), a single element, zero rows.
INSTANTIATE_TEST_SUITE_P(
    Shapes, TransposeGpuCodes,
    ::testing::Combine(::testing::Values(Shape{65536, 1024}, Shape{65536, 704}, Shape{16384, 1024},
                                         Shape{16384, 704}, Shape{640, 7168}, Shape{384, 5120},
                                         Shape{4096, 1408}, Shape{1000, 704}, Shape{136, 1024},
                                         Shape{200, 130}, Shape{129, 8}, Shape{1, 1},
                                         Shape{0, 1024}),
                       ::testing::Values(Fp8Format::kE4M3, Fp8Format::kE5M2)));

#if OCTET_WITH_CUDA
// The row-gather form (moe_permute_transposed's device code): row r of the transposed tensor is
// row row_src[r] of q, -1 a row of zero codes with scale_inv 1.0. Against the CPU reference of the
// gathered tensor.
TEST(TransposeGpuGathered, MatchesCpuOfTheGather) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  for (Fp8Format fmt : {Fp8Format::kE4M3, Fp8Format::kE5M2})
    for (const auto& [src_rows, out_rows, cols] :
         {std::tuple<int64_t, int64_t, int64_t>{4096, 16384, 704},
          {300, 1000, 1024},
          {100, 264, 130}}) {
      SCOPED_TRACE(std::to_string(out_rows) + " x " + std::to_string(cols));
      const QuantTensor q = random_codes(src_rows, cols, fmt, 77 + out_rows);
      const int64_t cblocks = (cols + 127) / 128;
      Lcg g{5};
      std::vector<int32_t> src(out_rows);
      for (int64_t r = 0; r < out_rows; ++r)
        src[r] = g.next() % 9 == 0 ? -1 : static_cast<int32_t>(g.next() % src_rows);
      // The gather on the host: padding rows are zero codes with scale_inv 1.0.
      QuantTensor want = random_codes(out_rows, cols, fmt, 1);
      for (int64_t r = 0; r < out_rows; ++r)
        for (int64_t j = 0; j < cols; ++j)
          want.data.data_as<uint8_t>()[r * cols + j] =
              src[r] < 0 ? 0 : q.data.data_as<uint8_t>()[src[r] * cols + j];
      for (int64_t r = 0; r < out_rows; ++r)
        for (int64_t b = 0; b < cblocks; ++b)
          want.scale_inv.data_as<float>()[r * cblocks + b] =
              src[r] < 0 ? 1.0f : q.scale_inv.data_as<float>()[src[r] * cblocks + b];
      Tensor row_src = Tensor::empty({out_rows}, DType::kI32);
      std::copy(src.begin(), src.end(), row_src.data_as<int32_t>());
      // Both forms of the scales: 128x128 tiles, and each tile's scale for each of its rows.
      for (Granularity gran : {Granularity::k128x128, Granularity::k1x128}) {
        scaling_aware_transpose(cpu, want, gran);
        Tensor cdata = Tensor::empty(gpu, {cols, out_rows}, fp8_dtype(fmt));
        Tensor cscale = Tensor::empty(gpu, scale_shape(gran, cols, out_rows), DType::kF32);
        gpu.be().memset(cdata.data(), 0xA5, cdata.nbytes());
        gpu.be().memset(cscale.data(), 0xA5, cscale.nbytes());
        cuda::scaling_aware_transpose_gathered(gpu, to_gpu(gpu, q), row_src.to(gpu, Device::kCuda),
                                               cdata, cscale, gran);
        EXPECT_TRUE(bitwise_equal(want.columnwise_data, cdata.to_host(gpu)))
            << granularity_name(gran);
        EXPECT_TRUE(bitwise_equal(want.columnwise_scale_inv, cscale.to_host(gpu)))
            << granularity_name(gran);
      }
    }
}
#endif

// MN-major scales are refused on the GPU as on the CPU, before any kernel runs.
TEST(TransposeGpuLayout, RefusesMnMajorScales) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  Tensor x = Tensor::empty({256, 256}, DType::kF32);
  for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = static_cast<float>(i % 97) - 48;
  QuantTensor q = quantize(gpu, {.input = x.to(gpu, Device::kCuda),
                                 .format = Fp8Format::kE4M3,
                                 .granularity = Granularity::k1x128,
                                 .rounding = ScaleRounding::kPow2,
                                 .scale_layout = ScaleLayout::kMNMajor});
  EXPECT_THROW(scaling_aware_transpose(gpu, q), Error);
}

}  // namespace
}  // namespace octet
