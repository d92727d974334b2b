// The independent reference of the quantize tests (quantize_test.cpp, quantize_transpose_test.cpp):
// the FP8 formats from their definition (a table of values, nearest-even search), scales looked up
// element by element through the granularity, arithmetic in double where it must be exact, and the
// checks that compare an op's output with it at named coordinates.
#pragma once

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

namespace octet::test::quantize_ref {

inline constexpr float kInf = std::numeric_limits<float>::infinity();
inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline constexpr Granularity kAllGranularities[] = {Granularity::kTensor, Granularity::kRow,
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
inline Shape ref_scale_shape(Granularity g, int64_t rows, int64_t cols) {
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
inline int64_t scale_index(Granularity g, int64_t i, int64_t j, int64_t cols) {
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
inline float ref_scale(double amax, bool nonfinite, const RefParams& p) {
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

inline RefQuant ref_quantize(const std::vector<float>& x, int64_t rows, int64_t cols,
                             const RefParams& p) {
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

inline std::vector<float> host_floats(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = t.dtype() == DType::kF32
               ? t.data_as<float>()[i]
               : bits_float(static_cast<uint32_t>(t.data_as<uint16_t>()[i]) << 16);
  return v;
}

// (rows, cols) -> (cols, rows), on the raw elements of any 2- or 4-byte dtype.
inline Tensor transpose(const Tensor& t) {
  const int64_t rows = t.rows(), cols = t.cols(), es = dtype_size(t.dtype());
  Tensor out = Tensor::empty({cols, rows}, t.dtype());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      std::copy_n(static_cast<const char*>(t.data()) + (i * cols + j) * es, es,
                  static_cast<char*>(out.data()) + (j * rows + i) * es);
  return out;
}

inline std::string hex(int v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

inline std::string where(int64_t e, int64_t cols) {
  std::ostringstream os;
  os << "(row " << e / std::max<int64_t>(cols, 1) << ", col " << e % std::max<int64_t>(cols, 1)
     << ")";
  return os.str();
}

// Codes equal bit for bit, except that any NaN code matches any NaN code (the NaN sign is
// unspecified).
inline ::testing::AssertionResult same_codes(const std::vector<uint8_t>& want, const Tensor& got,
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

inline ::testing::AssertionResult same_floats(const std::vector<float>& want, const Tensor& got) {
  if (static_cast<int64_t>(want.size()) != got.numel())
    return ::testing::AssertionFailure() << "size " << want.size() << " vs " << got.numel();
  for (size_t e = 0; e < want.size(); ++e)
    if (float_bits(want[e]) != float_bits(got.data_as<float>()[e]))
      return ::testing::AssertionFailure()
             << "value at " << where(static_cast<int64_t>(e), got.cols()) << ": want " << want[e]
             << ", got " << got.data_as<float>()[e];
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult valid_scale_invs(const Tensor& s, bool pow2) {
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
inline void check_dequantize(Context& ctx, const QuantTensor& q, Copy copy,
                             const std::vector<float>& x, int64_t rows, int64_t cols,
                             const RefParams& p, const RefQuant& ref) {
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

inline QuantizeArgs make_args(const Tensor& x, const RefParams& p, QuantizeOutput out) {
  QuantizeArgs a;
  a.input = x;
  a.format = p.f;
  a.granularity = p.g;
  a.rounding = p.pow2 ? ScaleRounding::kPow2 : ScaleRounding::kExact;
  a.epsilon = p.eps;
  a.output = out;
  return a;
}

}  // namespace octet::test::quantize_ref
