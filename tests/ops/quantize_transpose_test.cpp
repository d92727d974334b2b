// The quantize family's amax, scaling-aware transpose and delayed-scaling ops on the CPU against
// the independent reference of quantize_test_util.h (see quantize_test.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "numerics/fp8.h"
#include "ops/quantize/quantize.h"
#include "quantize_test_util.h"
#include "test_util.h"

namespace octet {
namespace {

using test::Dist;
using namespace test::quantize_ref;  // NOLINT(google-build-using-namespace): the tests' reference

// ---------------------------------------------------------------------------------------------------
// amax

TEST(Amax, MaxAbsWithNaNWinning) {
  Context ctx = make_context(Device::kCpu);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Tensor x = test::random_tensor({37, 129}, dt, 21, Dist::kOutliers);
    const std::vector<float> v = host_floats(x);
    double want = 0;
    for (float f : v) want = std::max(want, std::fabs(double{f}));
    EXPECT_EQ(amax(ctx, x).data_as<float>()[0], static_cast<float>(want));
    auto set = [&](int64_t e, float f) {
      if (dt == DType::kF32)
        x.data_as<float>()[e] = f;
      else
        x.data_as<uint16_t>()[e] = float_to_bf16(f);
    };
    set(100, -kInf);
    EXPECT_EQ(amax(ctx, x).data_as<float>()[0], kInf);
    set(4000, -kNaN);  // NaN wins over inf wherever it is, whatever its sign
    EXPECT_TRUE(std::isnan(amax(ctx, x).data_as<float>()[0]));
    set(100, 1.0f);
    EXPECT_TRUE(std::isnan(amax(ctx, x).data_as<float>()[0]));
  }
  EXPECT_EQ(amax(ctx, Tensor::empty({0, 3}, DType::kF32)).data_as<float>()[0], 0.0f);
  EXPECT_THROW(amax(ctx, Tensor::empty({2}, DType::kI32)), Error);
}

// ---------------------------------------------------------------------------------------------------
// Scaling-aware transpose

// Each element moves to its tile's scale S = max s_i: the exact value q * s_i / S (double: powers
// of two times a 4-bit significand), rounded to nearest even in the format. Where it stays normal
// that is the value itself; below, a correct rounding, never a flush or a kept mantissa.
TEST(ScalingAwareTranspose, EqualsCorrectlyRoundedRescaling) {
  Context ctx = make_context(Device::kCpu);
  const Shape shapes[] = {{1, 1}, {127, 129}, {129, 257}, {300, 200}, {3, 129, 130}};
  int64_t exact = 0, rounded = 0;
  uint64_t seed = 200;
  for (const Shape& shape : shapes)
    for (Dist dist : {Dist::kOutliers, Dist::kWide})
      for (Fp8Format fmt : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
        SCOPED_TRACE(shape_str(shape) + " " + format_name(fmt) +
                     (dist == Dist::kWide ? " wide" : " outliers"));
        const Fp8Ref f(fmt);
        const Tensor x = test::random_tensor(shape, DType::kF32, ++seed, dist);
        QuantTensor q = quantize(
            ctx, make_args(x, RefParams{Granularity::k1x128, fmt, true}, QuantizeOutput::kRowwise));
        scaling_aware_transpose(ctx, q);
        const int64_t rows = q.rows(), cols = q.cols(), rb = (rows + 127) / 128,
                      cb = (cols + 127) / 128;
        ASSERT_EQ(q.columnwise_granularity, Granularity::k128x128);
        ASSERT_EQ(q.columnwise_data.shape(), (Shape{cols, rows}));
        ASSERT_EQ(q.columnwise_scale_inv.shape(), (Shape{cb, rb}));
        const uint8_t* d = q.data.data_as<uint8_t>();
        const uint8_t* dt = q.columnwise_data.data_as<uint8_t>();
        const float* s = q.scale_inv.data_as<float>();
        const float* st = q.columnwise_scale_inv.data_as<float>();
        for (int64_t tr = 0; tr < rb; ++tr)
          for (int64_t tc = 0; tc < cb; ++tc) {
            double big = 0;  // over the rows with a non-zero code in the tile
            for (int64_t i = tr * 128; i < std::min(rows, tr * 128 + 128); ++i)
              for (int64_t j = tc * 128; j < std::min(cols, tc * 128 + 128); ++j)
                if ((d[i * cols + j] & 0x7F) != 0) big = std::max(big, double{s[i * cb + tc]});
            if (big == 0) big = 1;
            ASSERT_EQ(double{st[tc * rb + tr]}, big) << "tile scale (" << tc << ", " << tr << ")";
            for (int64_t i = tr * 128; i < std::min(rows, tr * 128 + 128); ++i)
              for (int64_t j = tc * 128; j < std::min(cols, tc * 128 + 128); ++j) {
                const double v = f.decode(d[i * cols + j]) * std::min(s[i * cb + tc] / big, 1.0);
                const uint8_t got = dt[j * rows + i];
                ASSERT_EQ(hex(got), hex(f.encode(v)))
                    << "(row " << i << ", col " << j << ") value " << v;
                if (std::fabs(v) >= f.min_normal()) {
                  ASSERT_EQ(f.decode(got), v);  // exact where the value stays normal
                  ++exact;
                } else if (f.decode(got) != v) {
                  ++rounded;
                }
              }
          }
        EXPECT_TRUE(valid_scale_invs(q.columnwise_scale_inv, true));
      }
  EXPECT_GT(exact, 0);
  EXPECT_GT(rounded,
            0);  // the data did exercise the rounding of values that leave the normal range
}

// Hand-made ties at the bottom of E4M3, and a ratio of 2^-253 that underflows FP32 itself.
TEST(ScalingAwareTranspose, TiesAndUnderflow) {
  Context ctx = make_context(Device::kCpu);
  auto make = [](std::vector<uint8_t> codes, std::vector<float> sinv, int64_t cols) {
    QuantTensor q;
    q.format = Fp8Format::kE4M3;
    q.granularity = Granularity::k1x128;
    q.rounding = ScaleRounding::kPow2;
    const int64_t rows = static_cast<int64_t>(sinv.size());
    q.data = Tensor::empty({rows, cols}, DType::kE4M3);
    std::copy(codes.begin(), codes.end(), q.data.data_as<uint8_t>());
    q.scale_inv = Tensor::empty({rows, 1}, DType::kF32);
    std::copy(sinv.begin(), sinv.end(), q.scale_inv.data_as<float>());
    return q;
  };
  // Row 0 moves by 2^-1 (scale_inv 1 against the tile's 2), row 1 stays.
  const std::vector<uint8_t> row0 = {0x01, 0x03, 0x09, 0x0B, 0x08, 0x0F, 0x81, 0x7E};
  const std::vector<uint8_t> want0 = {0x00, 0x02, 0x04, 0x06, 0x04, 0x08, 0x80, 0x76};
  std::vector<uint8_t> codes = row0;
  codes.insert(codes.end(), row0.begin(), row0.end());
  QuantTensor q = make(codes, {1.0f, 2.0f}, 8);
  scaling_aware_transpose(ctx, q);
  EXPECT_EQ(q.columnwise_scale_inv.data_as<float>()[0], 2.0f);
  for (int j = 0; j < 8; ++j) {
    EXPECT_EQ(hex(q.columnwise_data.data_as<uint8_t>()[j * 2 + 0]), hex(want0[j])) << "col " << j;
    EXPECT_EQ(hex(q.columnwise_data.data_as<uint8_t>()[j * 2 + 1]), hex(row0[j])) << "col " << j;
  }
  QuantTensor u = make({0x7E, 0xFE, 0x7E, 0x01}, {0x1p-127f, 0x1p126f}, 2);
  scaling_aware_transpose(ctx, u);
  EXPECT_EQ(u.columnwise_scale_inv.data_as<float>()[0], 0x1p126f);
  EXPECT_EQ(u.columnwise_data.data_as<uint8_t>()[0], 0x00);  // 448 * 2^-253
  EXPECT_EQ(u.columnwise_data.data_as<uint8_t>()[2], 0x80);  // -448 * 2^-253 keeps its sign
  EXPECT_EQ(u.columnwise_data.data_as<uint8_t>()[1], 0x7E);
  EXPECT_EQ(u.columnwise_data.data_as<uint8_t>()[3], 0x01);
}

// Rows whose group is all zero (quantize gives them scale_inv 1.0; a padded permute's padding rows
// look the same) do not set the tile's scale: small gradients in the same tile keep their codes
// exactly. Counting them made S = 1 and flushed gradients of ~1e-5 to zero (fp8-flow's Wgrad).
TEST(ScalingAwareTranspose, AllZeroRowsDoNotSetTheScale) {
  Context ctx = make_context(Device::kCpu);
  for (const Shape& shape : {Shape{130, 200}, Shape{256, 128}, Shape{7, 300}}) {
    Tensor x = test::random_tensor(shape, DType::kF32, 5);
    const int64_t rows = shape[0], cols = shape[1];
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        float& v = x.data_as<float>()[i * cols + j];
        v = i % 3 == 1 ? (i % 2 ? -0.0f : 0.0f) : v * 1e-5f;  // zero rows (both signs), small rest
      }
    QuantTensor q =
        quantize(ctx, make_args(x, RefParams{Granularity::k1x128, Fp8Format::kE4M3, true},
                                QuantizeOutput::kRowwise));
    scaling_aware_transpose(ctx, q);
    const int64_t cb = (cols + 127) / 128, rb = (rows + 127) / 128;
    const float* s = q.scale_inv.data_as<float>();
    const float* st = q.columnwise_scale_inv.data_as<float>();
    for (int64_t tr = 0; tr < rb; ++tr)
      for (int64_t tc = 0; tc < cb; ++tc) {
        float big = 0;
        for (int64_t i = tr * 128; i < std::min(rows, tr * 128 + 128); ++i)
          if (i % 3 != 1) big = std::max(big, s[i * cb + tc]);
        ASSERT_LT(big, 1e-3f);
        EXPECT_EQ(st[tc * rb + tr], big) << "tile (" << tc << ", " << tr << ")";
      }
    // Dequantized, the column-wise copy is the row-wise one's transpose within one rounding at the
    // tile's scale (E4M3: 2^-4 relative while normal, half a subnormal step 2^-10 below).
    const Tensor a = dequantize(ctx, q, DType::kF32);
    const Tensor b = dequantize(ctx, q, DType::kF32, Copy::kColumnwise);
    int64_t kept = 0;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const float want = a.data_as<float>()[i * cols + j], got = b.data_as<float>()[j * rows + i];
        const float tile_s = st[(j / 128) * rb + i / 128];
        EXPECT_NEAR(got, want, std::fabs(want) * 0x1p-4f + tile_s * 0x1p-10f)
            << "(" << i << ", " << j << ")";
        kept += want != 0 && got != 0;
      }
    EXPECT_GT(kept, rows * cols / 2);
  }
  // An all-zero tile: scale 1, codes zero.
  Tensor zeros = Tensor::empty({3, 4}, DType::kF32);
  std::fill_n(zeros.data_as<float>(), 12, 0.0f);
  QuantTensor z =
      quantize(ctx, make_args(zeros, RefParams{Granularity::k1x128, Fp8Format::kE4M3, true},
                              QuantizeOutput::kRowwise));
  scaling_aware_transpose(ctx, z);
  EXPECT_EQ(z.columnwise_scale_inv.data_as<float>()[0], 1.0f);
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(z.columnwise_data.data_as<uint8_t>()[i], 0);
}

// The 1x128 form (the grouped Wgrad's A operand) holds the same codes, and each tile's scale at
// every one of its output rows.
TEST(ScalingAwareTranspose, PerRowFormRepeatsEachTilesScale) {
  Context ctx = make_context(Device::kCpu);
  const Tensor x = test::random_tensor({300, 261}, DType::kF32, 7);
  const QuantizeArgs args = make_args(x, RefParams{Granularity::k1x128, Fp8Format::kE4M3, true},
                                      QuantizeOutput::kRowwise);
  QuantTensor tiles = quantize(ctx, args);
  QuantTensor rows = tiles;
  scaling_aware_transpose(ctx, tiles);
  scaling_aware_transpose(ctx, rows, Granularity::k1x128);
  ASSERT_EQ(rows.columnwise_granularity, Granularity::k1x128);
  ASSERT_EQ(rows.columnwise_scale_inv.shape(), (Shape{261, 3}));
  EXPECT_TRUE(test::bitwise_equal(tiles.columnwise_data, rows.columnwise_data));
  const float* t = tiles.columnwise_scale_inv.data_as<float>();  // (3, 3)
  const float* r = rows.columnwise_scale_inv.data_as<float>();   // (261, 3)
  for (int64_t c = 0; c < 261; ++c)
    for (int64_t b = 0; b < 3; ++b) ASSERT_EQ(r[c * 3 + b], t[(c / 128) * 3 + b]) << c << "," << b;
  QuantTensor other = tiles;
  EXPECT_THROW(scaling_aware_transpose(ctx, other, Granularity::kTensor), Error);
}

TEST(ScalingAwareTranspose, Preconditions) {
  Context ctx = make_context(Device::kCpu);
  const Tensor x = test::random_tensor({4, 130}, DType::kF32, 1);
  QuantTensor exact =
      quantize(ctx, make_args(x, RefParams{Granularity::k1x128}, QuantizeOutput::kRowwise));
  EXPECT_THROW(scaling_aware_transpose(ctx, exact), Error);  // scales not powers of 2
  QuantTensor blocks =
      quantize(ctx, make_args(x, RefParams{Granularity::k128x128, Fp8Format::kE4M3, true},
                              QuantizeOutput::kRowwise));
  EXPECT_THROW(scaling_aware_transpose(ctx, blocks), Error);
  QuantTensor empty =
      quantize(ctx, make_args(Tensor::empty({0, 5}, DType::kF32),
                              RefParams{Granularity::k1x128, Fp8Format::kE4M3, true},
                              QuantizeOutput::kRowwise));
  scaling_aware_transpose(ctx, empty);
  EXPECT_EQ(empty.columnwise_data.shape(), (Shape{5, 0}));
}

// ---------------------------------------------------------------------------------------------------
// Delayed scaling

Tensor scalar(float v) {
  Tensor t = Tensor::empty({1}, DType::kF32);
  t.data_as<float>()[0] = v;
  return t;
}

float hist(const DelayedScaling& s, int64_t i) {
  return s.amax_history.data_as<float>()[i];
}
float scale_of(const DelayedScaling& s) {
  return s.scale.data_as<float>()[0];
}

TEST(DelayedScaling, HistoryReductionAndMargin) {
  Context ctx = make_context(Device::kCpu);
  const ScaleRule e4{
      .format = Fp8Format::kE4M3, .rounding = ScaleRounding::kExact, .epsilon = 0.0f, .margin = 0};
  DelayedScaling s = make_delayed_scaling(ctx, 4);
  ASSERT_EQ(s.amax_history.shape(), (Shape{4}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(hist(s, i), 0.0f);
  EXPECT_EQ(scale_of(s), 1.0f);
  EXPECT_EQ(s.scale_inv.data_as<float>()[0], 1.0f);

  delayed_scaling_update(ctx, s, scalar(10.0f), 0, AmaxReduction::kMax, e4);
  EXPECT_EQ(hist(s, 0), 10.0f);
  EXPECT_EQ(scale_of(s), 448.0f / 10.0f);
  EXPECT_EQ(s.scale_inv.data_as<float>()[0], 1.0f / (448.0f / 10.0f));
  delayed_scaling_update(ctx, s, scalar(5.0f), 1, AmaxReduction::kMax, e4);
  EXPECT_EQ(scale_of(s), 448.0f / 10.0f);  // the max of the history is still 10
  delayed_scaling_update(ctx, s, scalar(4.0f), 2, AmaxReduction::kMostRecent, e4);
  EXPECT_EQ(scale_of(s), 448.0f / 4.0f);
  delayed_scaling_update(ctx, s, scalar(2.0f), 3, AmaxReduction::kMax, e4);
  EXPECT_EQ(scale_of(s), 448.0f / 10.0f);
  // Step 4 overwrites slot 0 (the 10): the ring buffer forgets it.
  delayed_scaling_update(ctx, s, scalar(1.0f), 4, AmaxReduction::kMax, e4);
  EXPECT_EQ(hist(s, 0), 1.0f);
  EXPECT_EQ(hist(s, 1), 5.0f);
  EXPECT_EQ(scale_of(s), 448.0f / 5.0f);
  delayed_scaling_update(ctx, s, scalar(1.0f), 5, AmaxReduction::kMax, e4);
  EXPECT_EQ(scale_of(s), 448.0f / 4.0f);

  const ScaleRule margin{
      .format = Fp8Format::kE5M2, .rounding = ScaleRounding::kExact, .epsilon = 0.0f, .margin = 3};
  delayed_scaling_update(ctx, s, scalar(7.0f), 6, AmaxReduction::kMostRecent, margin);
  EXPECT_EQ(scale_of(s), (57344.0f / 7.0f) / 8.0f);
  const ScaleRule pow2{
      .format = Fp8Format::kE4M3, .rounding = ScaleRounding::kPow2, .epsilon = 0.0f, .margin = 1};
  delayed_scaling_update(ctx, s, scalar(3.0f), 7, AmaxReduction::kMostRecent, pow2);
  EXPECT_EQ(scale_of(s), 64.0f);  // 448 / 3 / 2 = 74.7, rounded down
  EXPECT_EQ(s.scale_inv.data_as<float>()[0], 1.0f / 64.0f);
  // quantize.h: delayed scaling has no amax floor, whatever the rule's epsilon.
  const ScaleRule eps{
      .format = Fp8Format::kE4M3, .rounding = ScaleRounding::kExact, .epsilon = 1.0f, .margin = 0};
  delayed_scaling_update(ctx, s, scalar(0.5f), 8, AmaxReduction::kMostRecent, eps);
  EXPECT_EQ(scale_of(s), 896.0f);
}

TEST(DelayedScaling, ZeroAndNonFiniteAmaxKeepThePreviousScale) {
  Context ctx = make_context(Device::kCpu);
  const ScaleRule e4{
      .format = Fp8Format::kE4M3, .rounding = ScaleRounding::kExact, .epsilon = 0.0f, .margin = 0};
  DelayedScaling s = make_delayed_scaling(ctx, 2);
  delayed_scaling_update(ctx, s, scalar(2.0f), 0, AmaxReduction::kMostRecent, e4);
  ASSERT_EQ(scale_of(s), 224.0f);
  for (float bad : {0.0f, kNaN, kInf}) {
    delayed_scaling_update(ctx, s, scalar(bad), 1, AmaxReduction::kMostRecent, e4);
    EXPECT_EQ(scale_of(s), 224.0f) << bad;
    EXPECT_EQ(s.scale_inv.data_as<float>()[0], 1.0f / 224.0f) << bad;
  }
  // Under kMax a NaN in the history holds the scale until it leaves the ring buffer.
  delayed_scaling_update(ctx, s, scalar(kNaN), 2, AmaxReduction::kMax, e4);
  delayed_scaling_update(ctx, s, scalar(8.0f), 3, AmaxReduction::kMax, e4);
  EXPECT_EQ(scale_of(s), 224.0f);
  delayed_scaling_update(ctx, s, scalar(4.0f), 4, AmaxReduction::kMax, e4);
  EXPECT_EQ(scale_of(s), 56.0f);  // history {4, 8}
  EXPECT_THROW(delayed_scaling_update(ctx, s, scalar(1.0f), -1, AmaxReduction::kMax, e4), Error);
  EXPECT_THROW(
      delayed_scaling_update(ctx, s, scalar(1.0f), 0, AmaxReduction::kMax, ScaleRule{.margin = 65}),
      Error);
  EXPECT_THROW(make_delayed_scaling(ctx, 0), Error);
}

// A training step: quantize with the state's scale, record the amax, update for the next step.
TEST(DelayedScaling, QuantizeUsesTheGivenScale) {
  Context ctx = make_context(Device::kCpu);
  const ScaleRule e4{
      .format = Fp8Format::kE4M3, .rounding = ScaleRounding::kExact, .epsilon = 0.0f, .margin = 0};
  DelayedScaling s = make_delayed_scaling(ctx, 16);
  for (int64_t step = 0; step < 3; ++step) {
    const Tensor x = test::random_tensor({17, 300}, DType::kBF16, 40 + static_cast<uint64_t>(step),
                                         Dist::kOutliers);
    RefParams p{Granularity::kTensor};
    p.fixed_scale = scale_of(s);
    QuantizeArgs a = make_args(x, p, QuantizeOutput::kBoth);
    a.scale = s.scale;
    const QuantTensor q = quantize(ctx, a);
    EXPECT_EQ(float_bits(q.scale_inv.data_as<float>()[0]),
              float_bits(s.scale_inv.data_as<float>()[0]));
    EXPECT_TRUE(
        same_codes(ref_quantize(host_floats(x), x.rows(), x.cols(), p).data, q.data, Fp8Ref(p.f)));
    delayed_scaling_update(ctx, s, q.amax, step, AmaxReduction::kMax, e4);
    EXPECT_EQ(hist(s, step), q.amax.data_as<float>()[0]);
  }
  EXPECT_NE(scale_of(s), 1.0f);
}

}  // namespace
}  // namespace octet
