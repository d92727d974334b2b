// The quantize op family on the CPU (ops/quantize/quantize.h) against an independent
// re-implementation written here: the FP8 formats from their definition (a table of values,
// nearest-even search), scales looked up element by element through the granularity, arithmetic in
// double where it must be exact. It shares no loop structure with quantize_cpu.cpp, so a wrong
// group boundary, a partial last group or a swapped layout shows up as a mismatch at a named
// coordinate.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <sstream>
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

// Every check of one quantize call that the reference can make.
void check_quantize(Context& ctx, const Tensor& x, const RefParams& p) {
  const int64_t rows = x.rows(), cols = x.cols();
  const std::vector<float> xf = host_floats(x);
  const Tensor xt = transpose(x);
  const std::vector<float> xtf = host_floats(xt);
  const RefQuant row = ref_quantize(xf, rows, cols, p), col = ref_quantize(xtf, cols, rows, p);
  const Fp8Ref f(p.f);
  uint32_t amax_bits = 0;
  for (float v : xf) amax_bits = std::max(amax_bits, abs_bits(v));

  const QuantTensor both = quantize(ctx, make_args(x, p, QuantizeOutput::kBoth));
  ASSERT_EQ(both.data.shape(), x.shape());
  ASSERT_EQ(both.scale_inv.shape(), row.sshape);
  ASSERT_EQ(both.columnwise_data.shape(), (Shape{cols, rows}));
  ASSERT_EQ(both.columnwise_scale_inv.shape(), col.sshape);
  EXPECT_EQ(both.columnwise_granularity, p.g);
  EXPECT_EQ(float_bits(both.amax.data_as<float>()[0]), amax_bits);
  EXPECT_TRUE(valid_scale_invs(both.scale_inv, p.pow2));
  EXPECT_TRUE(valid_scale_invs(both.columnwise_scale_inv, p.pow2));
  EXPECT_TRUE(same_floats(row.scale_inv, both.scale_inv)) << "row-wise scale_inv";
  EXPECT_TRUE(same_codes(row.data, both.data, f)) << "row-wise data";
  EXPECT_TRUE(same_floats(col.scale_inv, both.columnwise_scale_inv)) << "column-wise scale_inv";
  EXPECT_TRUE(same_codes(col.data, both.columnwise_data, f)) << "column-wise data";

  // With exact scales the largest |x| of each finite group lands on the format's max (no headroom
  // lost).
  if (!p.pow2 && p.eps == 0 && p.g == Granularity::kTensor && amax_bits &&
      amax_bits < 0x7F800000u) {
    const auto it =
        std::find_if(xf.begin(), xf.end(), [&](float v) { return abs_bits(v) == amax_bits; });
    EXPECT_EQ(both.data.data_as<uint8_t>()[it - xf.begin()] & 0x7F, f.v.size() - 1);
  }

  // The other output modes write the same bytes, and only their copy.
  const QuantTensor r = quantize(ctx, make_args(x, p, QuantizeOutput::kRowwise));
  EXPECT_FALSE(r.has_columnwise());
  EXPECT_TRUE(test::bitwise_equal(both.data, r.data));
  EXPECT_TRUE(test::bitwise_equal(both.scale_inv, r.scale_inv));
  const QuantTensor c = quantize(ctx, make_args(x, p, QuantizeOutput::kColumnwise));
  EXPECT_TRUE(c.data.data() == nullptr || c.data.numel() == 0);
  EXPECT_EQ(c.rows(), rows);
  EXPECT_EQ(c.cols(), cols);
  EXPECT_TRUE(test::bitwise_equal(both.columnwise_data, c.columnwise_data));
  EXPECT_TRUE(test::bitwise_equal(both.columnwise_scale_inv, c.columnwise_scale_inv));

  // The column-wise copy is the row-wise quantization of the explicit transpose.
  const QuantTensor t = quantize(ctx, make_args(xt, p, QuantizeOutput::kRowwise));
  EXPECT_TRUE(test::bitwise_equal(t.data, both.columnwise_data))
      << "quantize(X^T) vs column-wise data";
  EXPECT_TRUE(test::bitwise_equal(t.scale_inv, both.columnwise_scale_inv))
      << "quantize(X^T) scale_inv";

  check_dequantize(ctx, both, Copy::kRowwise, xf, rows, cols, p, row);
  check_dequantize(ctx, both, Copy::kColumnwise, xtf, cols, rows, p, col);
}

std::string describe(const Shape& s, DType dt, const RefParams& p) {
  std::ostringstream os;
  os << shape_str(s) << " " << dtype_name(dt) << " " << granularity_name(p.g) << " "
     << format_name(p.f) << (p.pow2 ? " pow2" : " exact") << (p.eps > 0 ? " eps" : "");
  return os.str();
}

TEST(Quantize, EveryGranularityFormatAndOutputMatchesTheReference) {
  Context ctx = make_context(Device::kCpu);
  const Shape shapes[] = {{1, 1},    {1, 127},      {127, 129}, {129, 257},
                          {1481, 7}, {3, 129, 130}, {0, 5}};
  uint64_t seed = 100;
  for (const Shape& shape : shapes) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      // Outliers: groups of very different ranges; wide: 2^-40..2^40 inside a group, so subnormal
      // results, underflow to zero and every exponent of the format occur.
      ++seed;
      const Tensor x =
          test::random_tensor(shape, dt, seed, seed % 2 ? Dist::kOutliers : Dist::kWide);
      for (Granularity g : kAllGranularities)
        for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2})
          for (bool pow2 : {false, true}) {
            const RefParams p{g, f, pow2};
            SCOPED_TRACE(describe(shape, dt, p));
            check_quantize(ctx, x, p);
            if (HasFatalFailure()) return;
          }
    }
  }
}

TEST(Quantize, EpsilonFloorsTheAmax) {
  Context ctx = make_context(Device::kCpu);
  Tensor x = test::random_tensor({5, 300}, DType::kF32, 7);
  for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] *= (i / 300) % 2 ? 1.0f : 1e-7f;
  for (Granularity g : {Granularity::kRow, Granularity::k1x128})
    for (bool pow2 : {false, true}) {
      const RefParams p{g, Fp8Format::kE4M3, pow2, 1e-4f};
      SCOPED_TRACE(describe(x.shape(), DType::kF32, p));
      check_quantize(ctx, x, p);
      const QuantTensor q = quantize(ctx, make_args(x, p, QuantizeOutput::kRowwise));
      const float floor_sinv = 1.0f / ref_scale(1e-4, false, p);
      EXPECT_EQ(q.scale_inv.data_as<float>()[q.scale_inv.numel() - 1],
                floor_sinv);  // row 4: tiny values
    }
}

// QuantizeArgs::amax false: the same copies, bit for bit, and no amax; per-tensor current scaling,
// whose scale is the amax's, refuses it.
TEST(Quantize, WithoutAmaxWritesTheSameCopies) {
  Context ctx = make_context(Device::kCpu);
  const Tensor x = test::random_tensor({129, 257}, DType::kBF16, 11, Dist::kOutliers);
  for (Granularity g : kAllGranularities) {
    SCOPED_TRACE(granularity_name(g));
    QuantizeArgs a = make_args(x, RefParams{g, Fp8Format::kE4M3, true}, QuantizeOutput::kBoth);
    const QuantTensor with = quantize(ctx, a);
    a.amax = false;
    if (g == Granularity::kTensor) {
      EXPECT_THROW(quantize(ctx, a), Error);
      continue;
    }
    const QuantTensor without = quantize(ctx, a);
    EXPECT_TRUE(with.amax.defined());
    EXPECT_FALSE(without.amax.defined());
    EXPECT_TRUE(test::bitwise_equal(with.data, without.data));
    EXPECT_TRUE(test::bitwise_equal(with.scale_inv, without.scale_inv));
    EXPECT_TRUE(test::bitwise_equal(with.columnwise_data, without.columnwise_data));
    EXPECT_TRUE(test::bitwise_equal(with.columnwise_scale_inv, without.columnwise_scale_inv));
  }
}

// All-zero groups get scale_inv 1 and zero codes (sign kept); a group with an inf or NaN gets scale
// 1, its finite values saturate, +-inf become +-max and NaN stays NaN; the other groups are
// unaffected.
TEST(Quantize, ZeroInfAndNaNGroups) {
  Context ctx = make_context(Device::kCpu);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (Granularity g : kAllGranularities) {
      for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
        const Fp8Ref ref(f);
        const int64_t rows = 130, cols = 260;
        Tensor x32 = test::random_tensor({rows, cols}, DType::kF32, 11);
        float* v = x32.data_as<float>();
        for (int64_t e = 0; e < rows * cols; ++e) v[e] *= 1000.0f;  // E4M3 saturates under scale 1
        // The tensor granularity has one group: zero it all in a separate case below.
        if (g != Granularity::kTensor)
          for (int64_t e = 0; e < rows * cols; ++e)
            if (scale_index(g, e / cols, e % cols, cols) == 0) v[e] = e % 3 ? 0.0f : -0.0f;
        const int64_t inf_at = 129 * cols + 259, ninf_at = 5 * cols + 200, nan_at = 128 * cols + 3;
        v[inf_at] = kInf;
        v[ninf_at] = -kInf;
        v[nan_at] = kNaN;
        Tensor x = x32;
        if (dt == DType::kBF16) {
          x = Tensor::empty({rows, cols}, DType::kBF16);
          for (int64_t e = 0; e < rows * cols; ++e) x.data_as<uint16_t>()[e] = float_to_bf16(v[e]);
        }
        const RefParams p{g, f, false};
        SCOPED_TRACE(describe(x.shape(), dt, p));
        check_quantize(ctx, x, p);
        const QuantTensor q = quantize(ctx, make_args(x, p, QuantizeOutput::kRowwise));
        const uint8_t* d = q.data.data_as<uint8_t>();
        const float* s = q.scale_inv.data_as<float>();
        EXPECT_TRUE(std::isnan(q.amax.data_as<float>()[0]));
        EXPECT_EQ(d[inf_at], ref.v.size() - 1);
        EXPECT_EQ(d[ninf_at], 0x80 | (ref.v.size() - 1));
        EXPECT_TRUE(ref.is_nan(d[nan_at]));
        for (int64_t at : {inf_at, ninf_at, nan_at})
          EXPECT_EQ(s[scale_index(g, at / cols, at % cols, cols)], 1.0f);
        if (g != Granularity::kTensor) {
          EXPECT_EQ(s[0], 1.0f);
          for (int64_t e = 0; e < rows * cols; ++e) {
            if (scale_index(g, e / cols, e % cols, cols) == 0) {
              ASSERT_EQ(d[e], e % 3 ? 0x00 : 0x80) << e;  // -0 keeps its sign
            }
          }
        }
      }
    }
  }
  const Tensor zeros = Tensor::empty({3, 200}, DType::kF32);
  std::fill_n(zeros.data_as<float>(), zeros.numel(), 0.0f);
  for (Granularity g : kAllGranularities) {
    QuantizeArgs a = make_args(zeros, RefParams{g}, QuantizeOutput::kBoth);
    a.epsilon = 1e-4f;  // an epsilon does not change the rule for all-zero groups
    const QuantTensor q = quantize(ctx, a);
    for (const Tensor* t : {&q.scale_inv, &q.columnwise_scale_inv})
      for (int64_t k = 0; k < t->numel(); ++k)
        ASSERT_EQ(t->data_as<float>()[k], 1.0f) << granularity_name(g);
    for (int64_t e = 0; e < zeros.numel(); ++e) ASSERT_EQ(q.data.data_as<uint8_t>()[e], 0);
    EXPECT_EQ(q.amax.data_as<float>()[0], 0.0f);
  }
}

TEST(Quantize, GivenScaleSaturatesAndIsUsedAsIs) {
  Context ctx = make_context(Device::kCpu);
  Tensor x = test::random_tensor({33, 140}, DType::kF32, 5, Dist::kWide);
  x.data_as<float>()[7] = 1e6f;
  x.data_as<float>()[8] = -kInf;
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    for (float scale : {1.0f, 3.0f, 1024.0f}) {
      RefParams p{Granularity::kTensor, f};
      p.fixed_scale = scale;
      QuantizeArgs a = make_args(x, p, QuantizeOutput::kBoth);
      a.scale = Tensor::empty({1}, DType::kF32);
      a.scale.data_as<float>()[0] = scale;
      const QuantTensor q = quantize(ctx, a);
      const RefQuant r = ref_quantize(host_floats(x), x.rows(), x.cols(), p);
      const Fp8Ref ref(f);
      EXPECT_TRUE(same_codes(r.data, q.data, ref));
      EXPECT_EQ(q.scale_inv.data_as<float>()[0], 1.0f / scale);
      EXPECT_EQ(q.columnwise_scale_inv.data_as<float>()[0], 1.0f / scale);
      EXPECT_EQ(q.data.data_as<uint8_t>()[7], ref.v.size() - 1);           // saturated
      EXPECT_EQ(q.data.data_as<uint8_t>()[8], 0x80 | (ref.v.size() - 1));  // -inf -> -max
    }
  }
  QuantizeArgs bad = make_args(x, RefParams{Granularity::k1x128}, QuantizeOutput::kRowwise);
  bad.scale = Tensor::empty({1}, DType::kF32);
  EXPECT_THROW(quantize(ctx, bad), Error);  // a given scale is per-tensor only
  QuantizeArgs neg = make_args(x, RefParams{}, QuantizeOutput::kRowwise);
  neg.epsilon = -1.0f;
  EXPECT_THROW(quantize(ctx, neg), Error);
  EXPECT_THROW(quantize(ctx, make_args(Tensor::empty({2, 2}, DType::kI32), RefParams{},
                                       QuantizeOutput::kRowwise)),
               Error);
}

TEST(Dequantize, Bf16OutputAndUnwrittenCopies) {
  Context ctx = make_context(Device::kCpu);
  const Tensor x = test::random_tensor({20, 300}, DType::kF32, 3, Dist::kOutliers);
  const QuantTensor q =
      quantize(ctx, make_args(x, RefParams{Granularity::k1x128}, QuantizeOutput::kRowwise));
  const Tensor d32 = dequantize(ctx, q, DType::kF32), d16 = dequantize(ctx, q, DType::kBF16);
  ASSERT_EQ(d16.shape(), x.shape());
  for (int64_t e = 0; e < x.numel(); ++e)
    ASSERT_EQ(d16.data_as<uint16_t>()[e], float_to_bf16(d32.data_as<float>()[e])) << e;
  EXPECT_THROW(dequantize(ctx, q, DType::kF32, Copy::kColumnwise), Error);
  EXPECT_THROW(dequantize(ctx, q, DType::kE4M3), Error);
  const QuantTensor c =
      quantize(ctx, make_args(x, RefParams{Granularity::k1x128}, QuantizeOutput::kColumnwise));
  EXPECT_THROW(dequantize(ctx, c, DType::kF32, Copy::kRowwise), Error);
  EXPECT_EQ(dequantize(ctx, c, DType::kF32, Copy::kColumnwise).shape(), (Shape{300, 20}));
}

}  // namespace
}  // namespace octet
