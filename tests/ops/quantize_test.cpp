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
#include "test_util.h"

namespace octet {
namespace {

using test::Dist;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr Granularity kAllGranularities[] = {Granularity::kTensor, Granularity::kRow,
                                             Granularity::k1x128, Granularity::k128x1,
                                             Granularity::k128x128};

// ---------------------------------------------------------------------------------------------------
// Independent reference

// An FP8 format from its definition: the non-negative finite values by code.
struct Fp8Ref {
  int man_bits, bias;
  bool ieee;
  std::vector<double> v;

  explicit Fp8Ref(Fp8Format f)
      : man_bits(f == Fp8Format::kE4M3 ? 3 : 2),
        bias(f == Fp8Format::kE4M3 ? 7 : 15),
        ieee(f == Fp8Format::kE5M2) {
    const int codes = ieee ? 31 << man_bits : 127;  // below inf (E5M2) or the NaN code (E4M3)
    for (int c = 0; c < codes; ++c) {
      const int e = c >> man_bits, m = c & ((1 << man_bits) - 1);
      v.push_back(e == 0 ? std::ldexp(m, 1 - bias - man_bits)
                         : std::ldexp((1 << man_bits) + m, e - bias - man_bits));
    }
  }
  double max() const { return v.back(); }
  double min_normal() const { return std::ldexp(1.0, 1 - bias); }
  bool is_nan(uint8_t c) const { return ieee ? (c & 0x7F) > 0x7C : (c & 0x7F) == 0x7F; }
  double decode(uint8_t c) const {
    if (is_nan(c)) return std::nan("");
    const double mag =
        (c & 0x7F) < static_cast<int>(v.size()) ? v[c & 0x7F] : HUGE_VAL;  // E5M2 inf
    return c & 0x80 ? -mag : mag;
  }
  // Nearest value, ties to the even code, saturating; NaN -> the all-ones code.
  uint8_t encode(double x) const {
    if (std::isnan(x)) return 0x7F;
    const int sign = std::signbit(x) ? 0x80 : 0;
    const double a = std::fabs(x);
    if (a >= max()) return static_cast<uint8_t>(sign | (v.size() - 1));
    const size_t hi = static_cast<size_t>(std::upper_bound(v.begin(), v.end(), a) - v.begin()),
                 lo = hi - 1;
    const double dlo = a - v[lo], dhi = v[hi] - a;
    const size_t c = dlo < dhi ? lo : (dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi));
    return static_cast<uint8_t>(sign | c);
  }
  // Half the spacing of the format's values at magnitude a <= max.
  double half_ulp(double a) const {
    const int e = a < min_normal() ? 1 - bias : std::ilogb(a);
    return std::ldexp(1.0, e - man_bits - 1);
  }
};

// Scale grid of a (rows, cols) matrix and the entry that element (i, j) uses, written per
// granularity.
Shape ref_scale_shape(Granularity g, int64_t rows, int64_t cols) {
  const int64_t rb = (rows + 127) / 128, cb = (cols + 127) / 128;
  switch (g) {
    case Granularity::kTensor:
      return {1};
    case Granularity::kRow:
      return {rows, 1};
    case Granularity::k1x128:
      return {rows, cb};
    case Granularity::k128x1:
      return {rb, cols};
    case Granularity::k128x128:
      return {rb, cb};
  }
  return {};
}
int64_t scale_index(Granularity g, int64_t i, int64_t j, int64_t cols) {
  const int64_t cb = (cols + 127) / 128;
  switch (g) {
    case Granularity::kTensor:
      return 0;
    case Granularity::kRow:
      return i;
    case Granularity::k1x128:
      return i * cb + j / 128;
    case Granularity::k128x1:
      return (i / 128) * cols + j;
    case Granularity::k128x128:
      return (i / 128) * cb + j / 128;
  }
  return -1;
}

struct RefParams {
  Granularity g = Granularity::k1x128;
  Fp8Format f = Fp8Format::kE4M3;
  bool pow2 = false;
  float eps = 0.0f;
  float fixed_scale = 0.0f;  // > 0: a given per-tensor scale
};

struct RefQuant {
  Shape sshape;
  std::vector<float> scale, scale_inv;
  std::vector<char> nonfinite;  // the group holds an inf or NaN
  std::vector<uint8_t> data;
};

// The spec's rule, stated directly: scale 1 for all-zero or non-finite groups, FLT_MAX on overflow.
float ref_scale(double amax, bool nonfinite, const RefParams& p) {
  if (nonfinite || amax == 0) return 1.0f;
  const float fmax = p.f == Fp8Format::kE4M3 ? 448.0f : 57344.0f;
  float s = fmax / std::max(static_cast<float>(amax), p.eps);  // IEEE division: correctly rounded
  if (std::isinf(s)) s = FLT_MAX;
  if (p.pow2) {
    int e;
    std::frexp(s, &e);  // s = m * 2^e, m in [0.5, 1)
    s = std::ldexp(1.0f, e - 1);
  }
  return s;
}

RefQuant ref_quantize(const std::vector<float>& x, int64_t rows, int64_t cols, const RefParams& p) {
  const Fp8Ref fmt(p.f);
  RefQuant r;
  r.sshape = ref_scale_shape(p.g, rows, cols);
  const size_t n = static_cast<size_t>(shape_numel(r.sshape));
  std::vector<double> amax(n, 0.0);
  r.nonfinite.assign(n, 0);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const size_t k = static_cast<size_t>(scale_index(p.g, i, j, cols));
      const float v = x[static_cast<size_t>(i * cols + j)];
      if (!std::isfinite(v))
        r.nonfinite[k] = 1;
      else
        amax[k] = std::max(amax[k], std::fabs(double{v}));
    }
  for (size_t k = 0; k < n; ++k) {
    r.scale.push_back(p.fixed_scale > 0 ? p.fixed_scale : ref_scale(amax[k], r.nonfinite[k], p));
    r.scale_inv.push_back(1.0f / r.scale.back());
  }
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const float s = r.scale[static_cast<size_t>(scale_index(p.g, i, j, cols))];
      r.data.push_back(fmt.encode(x[static_cast<size_t>(i * cols + j)] * s));  // FP32 product first
    }
  return r;
}

std::vector<float> host_floats(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = t.dtype() == DType::kF32
               ? t.data_as<float>()[i]
               : bits_float(static_cast<uint32_t>(t.data_as<uint16_t>()[i]) << 16);
  return v;
}

// (rows, cols) -> (cols, rows), on the raw elements of any 2- or 4-byte dtype.
Tensor transpose(const Tensor& t) {
  const int64_t rows = t.rows(), cols = t.cols(), es = dtype_size(t.dtype());
  Tensor out = Tensor::empty({cols, rows}, t.dtype());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      std::copy_n(static_cast<const char*>(t.data()) + (i * cols + j) * es, es,
                  static_cast<char*>(out.data()) + (j * rows + i) * es);
  return out;
}

std::string hex(int v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

std::string where(int64_t e, int64_t cols) {
  std::ostringstream os;
  os << "(row " << e / std::max<int64_t>(cols, 1) << ", col " << e % std::max<int64_t>(cols, 1)
     << ")";
  return os.str();
}

// Codes equal bit for bit, except that any NaN code matches any NaN code (the NaN sign is
// unspecified).
::testing::AssertionResult same_codes(const std::vector<uint8_t>& want, const Tensor& got,
                                      const Fp8Ref& f) {
  if (static_cast<int64_t>(want.size()) != got.numel())
    return ::testing::AssertionFailure() << "size " << want.size() << " vs " << got.numel();
  const uint8_t* g = got.data_as<const uint8_t>();
  for (size_t e = 0; e < want.size(); ++e)
    if (want[e] != g[e] && !(f.is_nan(want[e]) && f.is_nan(g[e])))
      return ::testing::AssertionFailure()
             << "code at " << where(static_cast<int64_t>(e), got.cols()) << ": want "
             << hex(want[e]) << ", got " << hex(g[e]);
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult same_floats(const std::vector<float>& want, const Tensor& got) {
  if (static_cast<int64_t>(want.size()) != got.numel())
    return ::testing::AssertionFailure() << "size " << want.size() << " vs " << got.numel();
  for (size_t e = 0; e < want.size(); ++e)
    if (float_bits(want[e]) != float_bits(got.data_as<float>()[e]))
      return ::testing::AssertionFailure()
             << "value at " << where(static_cast<int64_t>(e), got.cols()) << ": want " << want[e]
             << ", got " << got.data_as<float>()[e];
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult valid_scale_invs(const Tensor& s, bool pow2) {
  for (int64_t k = 0; k < s.numel(); ++k) {
    const float v = s.data_as<float>()[k];
    int e;
    if (!(std::isfinite(v) && v > 0))
      return ::testing::AssertionFailure() << "scale_inv[" << k << "] = " << v;
    if (pow2 && std::frexp(v, &e) != 0.5f)
      return ::testing::AssertionFailure()
             << "scale_inv[" << k << "] = " << v << " is not a power of 2";
  }
  return ::testing::AssertionSuccess();
}

// Dequantization of one copy: bitwise fl(decode(q) * scale_inv), and within the error budget of the
// format: |x - deq| <= half an FP8 ulp of x * scale, over scale, plus the FP32 roundings.
void check_dequantize(Context& ctx, const QuantTensor& q, Copy copy, const std::vector<float>& x,
                      int64_t rows, int64_t cols, const RefParams& p, const RefQuant& ref) {
  const Fp8Ref f(p.f);
  const Tensor d = dequantize(ctx, q, DType::kF32, copy);
  ASSERT_EQ(d.rows(), rows);
  ASSERT_EQ(d.cols(), cols);
  const uint8_t* codes =
      (copy == Copy::kRowwise ? q.data : q.columnwise_data).data_as<const uint8_t>();
  for (int64_t e = 0; e < rows * cols; ++e) {
    const size_t k = static_cast<size_t>(scale_index(p.g, e / cols, e % cols, cols));
    const float got = d.data_as<float>()[e], xv = x[static_cast<size_t>(e)];
    const float want = static_cast<float>(f.decode(codes[e])) * ref.scale_inv[k];
    ASSERT_TRUE(float_bits(got) == float_bits(want) || (std::isnan(got) && std::isnan(want)))
        << "dequantized " << where(e, cols) << ": want " << want << ", got " << got;
    if (ref.nonfinite[k]) continue;  // saturated groups have no error budget
    const double y = std::fabs(double{xv} * ref.scale[k]);
    const double bound =
        (f.half_ulp(std::min(y, f.max())) + std::max(0.0, y - f.max()) + y * 0x1p-24) *
            ref.scale_inv[k] +
        std::fabs(double{xv}) * 0x1p-20 + 0x1p-149;
    ASSERT_LE(std::fabs(double{xv} - got), bound)
        << where(e, cols) << " x = " << xv << ", deq = " << got;
  }
}

// ---------------------------------------------------------------------------------------------------
// quantize

QuantizeArgs make_args(const Tensor& x, const RefParams& p, QuantizeOutput out) {
  QuantizeArgs a;
  a.input = x;
  a.format = p.f;
  a.granularity = p.g;
  a.rounding = p.pow2 ? ScaleRounding::kPow2 : ScaleRounding::kExact;
  a.epsilon = p.eps;
  a.output = out;
  return a;
}

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
