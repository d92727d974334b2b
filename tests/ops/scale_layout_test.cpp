// 1x128 scale layouts (core/scale_layout.h) on the CPU reference: MN-major scales are the transpose
// of K-major ones with 1.0 padding, the codes do not depend on the layout, and every consumer
// (dequantize, the GEMM) gives bitwise the same result from either; consumers that read only
// K-major scales reject MN-major ones with one clear error.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <tuple>

#include "backend/backend.h"
#include "core/cast_counter.h"
#include "core/scale_layout.h"
#include "ops/gemm/gemm.h"
#include "ops/grouped_gemm/grouped_gemm.h"
#include "ops/quantize/quantize.h"
#include "test_util.h"

namespace octet {
namespace {

using test::bitwise_equal;
using test::Dist;
using test::random_tensor;

Context& cpu() {
  static Context c = make_context(Device::kCpu);
  return c;
}

QuantTensor quant(const Tensor& x, Granularity g, QuantizeOutput out, ScaleLayout layout,
                  Fp8Format f = Fp8Format::kE4M3, ScaleRounding r = ScaleRounding::kExact) {
  return quantize(cpu(), {.input = x,
                          .format = f,
                          .granularity = g,
                          .rounding = r,
                          .output = out,
                          .scale_layout = layout});
}

void expect_error(const std::function<void()>& fn, const std::string& fragment) {
  try {
    fn();
    ADD_FAILURE() << "expected an error mentioning '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

// `mn` holds the scales of `k` ((rows, L) K-major) transposed, rows padded to 4 with 1.0.
void expect_transposed(const Tensor& k, const Tensor& mn, int64_t rows, int64_t cols,
                       const char* what) {
  const int64_t groups = ceil_div(cols, kGroup), ld = mn_major_ld(rows);
  ASSERT_EQ(k.shape(), (Shape{rows, groups})) << what;
  ASSERT_EQ(mn.shape(), (Shape{groups, ld / 4, 4})) << what;
  ASSERT_EQ(scale_layout(Granularity::k1x128, mn), ScaleLayout::kMNMajor) << what;
  ASSERT_EQ(scale_layout(Granularity::k1x128, k), ScaleLayout::kKMajor) << what;
  const float* ks = k.data_as<const float>();
  const float* ms = mn.data_as<const float>();
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t r = 0; r < rows; ++r)
      ASSERT_EQ(float_bits(ms[g * ld + r]), float_bits(ks[r * groups + g]))
          << what << " row " << r << " group " << g;
    for (int64_t r = rows; r < ld; ++r)
      ASSERT_EQ(ms[g * ld + r], 1.0f) << what << " padding row " << r << " group " << g;
  }
}

// Row counts not multiples of 4 (padding), K not a multiple of 128 (a partial last group).
const Shape kShapes[] = {{1, 1}, {5, 300}, {7, 129}, {37, 200}, {130, 257}, {3, 6, 130}, {64, 256}};

TEST(ScaleLayout, MnMajorIsTheTransposeOfKMajor) {
  for (const Shape& shape : kShapes)
    for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2})
      for (ScaleRounding rnd : {ScaleRounding::kExact, ScaleRounding::kPow2}) {
        const Tensor x = random_tensor(shape, DType::kBF16, 11, Dist::kOutliers);
        const QuantTensor k =
            quant(x, Granularity::k1x128, QuantizeOutput::kBoth, ScaleLayout::kKMajor, f, rnd);
        const QuantTensor m =
            quant(x, Granularity::k1x128, QuantizeOutput::kBoth, ScaleLayout::kMNMajor, f, rnd);
        const std::string what = shape_str(shape);
        ASSERT_TRUE(bitwise_equal(k.data, m.data)) << what << ": the codes do not move";
        ASSERT_TRUE(bitwise_equal(k.columnwise_data, m.columnwise_data)) << what;
        ASSERT_TRUE(bitwise_equal(k.amax, m.amax)) << what;
        const int64_t rows = x.rows(), cols = x.cols();
        expect_transposed(k.scale_inv, m.scale_inv, rows, cols, "row-wise");
        expect_transposed(k.columnwise_scale_inv, m.columnwise_scale_inv, cols, rows,
                          "column-wise");
        // Only one copy requested: the same scales.
        const QuantTensor mr =
            quant(x, Granularity::k1x128, QuantizeOutput::kRowwise, ScaleLayout::kMNMajor, f, rnd);
        const QuantTensor mc = quant(x, Granularity::k1x128, QuantizeOutput::kColumnwise,
                                     ScaleLayout::kMNMajor, f, rnd);
        ASSERT_TRUE(bitwise_equal(m.scale_inv, mr.scale_inv)) << what;
        ASSERT_TRUE(bitwise_equal(m.columnwise_scale_inv, mc.columnwise_scale_inv)) << what;
      }
}

TEST(ScaleLayout, DequantizeReadsEitherLayout) {
  for (const Shape& shape : kShapes) {
    const Tensor x = random_tensor(shape, DType::kF32, 12, Dist::kWide);
    const QuantTensor k =
        quant(x, Granularity::k1x128, QuantizeOutput::kBoth, ScaleLayout::kKMajor);
    const QuantTensor m =
        quant(x, Granularity::k1x128, QuantizeOutput::kBoth, ScaleLayout::kMNMajor);
    for (DType dt : {DType::kF32, DType::kBF16})
      for (Copy c : {Copy::kRowwise, Copy::kColumnwise})
        ASSERT_TRUE(bitwise_equal(dequantize(cpu(), k, dt, c), dequantize(cpu(), m, dt, c)))
            << shape_str(shape);
  }
}

// The three training GEMMs of the blockwise recipe with x and dy quantized in each layout: the
// same bits out, for M odd (not a multiple of 4) and K not a multiple of 128.
TEST(ScaleLayout, GemmOnMnMajorOperandsIsBitwiseKMajor) {
  using Shape3 = std::tuple<int64_t, int64_t, int64_t>;  // T, In, Out
  const Shape3 cases[] = {{37, 200, 72}, {5, 136, 24}, {130, 264, 136}, {1, 128, 8}};
  for (const auto& [t, in, out] : cases) {
    const Tensor x = random_tensor({t, in}, DType::kBF16, 21);
    const Tensor w = random_tensor({out, in}, DType::kF32, 22);
    const Tensor dy = random_tensor({t, out}, DType::kBF16, 23, Dist::kOutliers);
    const QuantTensor qw =
        quant(w, Granularity::k128x128, QuantizeOutput::kBoth, ScaleLayout::kKMajor);
    QuantTensor qx[2], qdy[2];
    for (int l = 0; l < 2; ++l) {
      const auto layout = l == 0 ? ScaleLayout::kKMajor : ScaleLayout::kMNMajor;
      qx[l] = quant(x, Granularity::k1x128, QuantizeOutput::kBoth, layout);
      qdy[l] = quant(dy, Granularity::k1x128, QuantizeOutput::kBoth, layout, Fp8Format::kE4M3,
                     ScaleRounding::kPow2);
    }
    for (AccumulatorEmulation emu :
         {AccumulatorEmulation::fp32(), AccumulatorEmulation::hopper()}) {
      Tensor y[2], dx[2], dw[2];
      for (int l = 0; l < 2; ++l) {
        y[l] = Tensor::empty({t, out}, DType::kBF16);
        dx[l] = Tensor::empty({t, in}, DType::kBF16);
        dw[l] = random_tensor({out, in}, DType::kF32, 24);  // += onto the same start
        gemm_fp8(
            cpu(),
            {.a = rowwise_operand(qx[l]), .b = rowwise_operand(qw), .d = y[l], .emulation = emu});
        gemm_fp8(cpu(), {.a = rowwise_operand(qdy[l]),
                         .b = columnwise_operand(qw),
                         .d = dx[l],
                         .emulation = emu});
        gemm_fp8(cpu(), {.a = columnwise_operand(qdy[l]),
                         .b = columnwise_operand(qx[l]),
                         .d = dw[l],
                         .accumulate = Accumulate::kAdd,
                         .emulation = emu});
      }
      const std::string what =
          std::to_string(t) + " x " + std::to_string(out) + " x " + std::to_string(in);
      ASSERT_TRUE(bitwise_equal(y[0], y[1])) << "fprop " << what;
      ASSERT_TRUE(bitwise_equal(dx[0], dx[1])) << "dgrad " << what;
      ASSERT_TRUE(bitwise_equal(dw[0], dw[1])) << "wgrad " << what;
    }
  }
}

TEST(ScaleLayout, RelayoutsAreCountedForKMajorOperandsOnly) {
  const Tensor x = random_tensor({12, 256}, DType::kBF16, 31);
  const Tensor w = random_tensor({16, 256}, DType::kF32, 32);
  const QuantTensor qw =
      quant(w, Granularity::k128x128, QuantizeOutput::kRowwise, ScaleLayout::kKMajor);
  Context ctx = make_context(Device::kCpu);
  ctx.casts = std::make_shared<CastCounter>();
  Tensor y = Tensor::empty({12, 16}, DType::kBF16);
  for (ScaleLayout l : {ScaleLayout::kKMajor, ScaleLayout::kMNMajor}) {
    const QuantTensor qx = quant(x, Granularity::k1x128, QuantizeOutput::kBoth, l);
    gemm_fp8(ctx, {.a = rowwise_operand(qx), .b = rowwise_operand(qw), .d = y});
    Tensor dw = Tensor::empty({256, 256}, DType::kF32);
    gemm_fp8(ctx, {.a = columnwise_operand(qx), .b = columnwise_operand(qx), .d = dw});
  }
  EXPECT_EQ(ctx.casts->at("other")[CastKind::kScaleRelayout], 3)
      << "K-major: Fprop's A and both Wgrad operands; MN-major: none";
}

TEST(ScaleLayout, KMajorOnlyConsumersRejectMnMajor) {
  const Tensor x = random_tensor({8, 256}, DType::kBF16, 41);
  QuantTensor m = quant(x, Granularity::k1x128, QuantizeOutput::kRowwise, ScaleLayout::kMNMajor,
                        Fp8Format::kE4M3, ScaleRounding::kPow2);
  expect_error([&] { scaling_aware_transpose(cpu(), m); }, "needs K-major 1x128 scales");
  const Tensor w = random_tensor({2 * 128, 256}, DType::kF32, 42);
  const QuantTensor qw =
      quant(w, Granularity::k128x128, QuantizeOutput::kRowwise, ScaleLayout::kKMajor);
  Tensor sizes = Tensor::empty({2}, DType::kI32);
  sizes.data_as<int32_t>()[0] = 3, sizes.data_as<int32_t>()[1] = 5;
  Tensor d = Tensor::empty({8, 128}, DType::kBF16);
  expect_error(
      [&] {
        grouped_gemm_fp8(
            cpu(),
            {.a = rowwise_operand(m), .b = rowwise_operand(qw), .group_sizes = sizes, .d = d});
      },
      "grouped gemm A: needs K-major");
  expect_error(
      [&] { quant(w, Granularity::k128x128, QuantizeOutput::kBoth, ScaleLayout::kMNMajor); },
      "MN-major scale layout exists for 1x128 groups only");
  // A rank-3 1x128 scale tensor of the wrong extent is named, not misread.
  Fp8Operand bad = rowwise_operand(m);
  bad.scale_inv = Tensor::empty({2, 1, 4}, DType::kF32);
  Tensor y = Tensor::empty({8, 256}, DType::kBF16);
  const QuantTensor qw2 = quant(random_tensor({256, 256}, DType::kF32, 43), Granularity::k128x128,
                                QuantizeOutput::kRowwise, ScaleLayout::kKMajor);
  expect_error([&] { gemm_fp8(cpu(), {.a = bad, .b = rowwise_operand(qw2), .d = y}); },
               "(MN-major) of a 8 x 256 operand must have shape [2, 2, 4]");
}

}  // namespace
}  // namespace octet
