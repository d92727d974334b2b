// Helpers for the rmsnorm, swiglu, embedding and cross_entropy tests: host data, tolerance
// comparisons that name the first failing coordinate, poisoned device outputs and central finite
// differences.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/context.h"
#include "numerics/fp8.h"
#include "test_util.h"

namespace octet::test {

inline double value_at(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kF32:
      return t.data_as<const float>()[i];
    case DType::kBF16:
      return bf16_to_float(t.data_as<const uint16_t>()[i]);
    case DType::kI32:
      return t.data_as<const int32_t>()[i];
    default:
      ADD_FAILURE() << "value_at: unsupported dtype " << dtype_name(t.dtype());
      return 0.0;
  }
}

// Host tensor with every element from `f(i)`, rounded to the dtype.
inline Tensor host_tensor(const Shape& shape, DType dtype,
                          const std::function<double(int64_t)>& f) {
  Tensor t = Tensor::empty(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::kF32)
      t.data_as<float>()[i] = static_cast<float>(f(i));
    else if (dtype == DType::kBF16)
      t.data_as<uint16_t>()[i] = float_to_bf16(static_cast<float>(f(i)));
    else
      t.data_as<int32_t>()[i] = static_cast<int32_t>(f(i));
  }
  return t;
}

// Uniform random int32 values in [lo, hi], reproducible from the seed.
inline Tensor random_ints(const Shape& shape, int32_t lo, int32_t hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(lo, hi);
  return host_tensor(shape, DType::kI32, [&](int64_t) { return dist(rng); });
}

// A host tensor of varied, non-constant values, reproducible from the seed: a hash of the index
// mapped to +-[1, 2) * 2^[-4, 4). Much cheaper than random_tensor for tables of 10^8 elements.
inline Tensor hashed_tensor(const Shape& shape, DType dtype, uint64_t seed) {
  return host_tensor(shape, dtype, [seed](int64_t i) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i) + 1;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const double mant = 1.0 + static_cast<double>(z & 0xFFFFFF) / 16777216.0;
    const int exp = static_cast<int>((z >> 24) % 9) - 4;
    return ((z >> 40) & 1 ? -1.0 : 1.0) * std::ldexp(mant, exp);
  });
}

// An uninitialised device tensor filled with 0xFF bytes: NaN in F32 and BF16, -1 in I32, so an
// element a kernel forgets to write fails every comparison.
inline Tensor poisoned(Context& ctx, const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(ctx, shape, dtype);
  if (t.nbytes()) ctx.be().memset(t.data(), 0xFF, t.nbytes());
  return t;
}

// |got - want| <= rtol * |want| + atol(i) element by element (NaN matches only NaN; infinities must
// be equal). The failure names the first bad coordinate of the matrix view and counts the bad
// elements.
inline ::testing::AssertionResult all_close(const Tensor& want, const Tensor& got, double rtol,
                                            const std::function<double(int64_t)>& atol,
                                            const std::string& what) {
  if (want.shape() != got.shape() || want.dtype() != got.dtype())
    return ::testing::AssertionFailure()
           << what << ": shape/dtype " << shape_str(want.shape()) << " " << dtype_name(want.dtype())
           << " vs " << shape_str(got.shape()) << " " << dtype_name(got.dtype());
  const int64_t cols = std::max<int64_t>(want.cols(), 1);
  int64_t bad = 0, first = -1;
  double worst = 0.0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double a = value_at(want, i), b = value_at(got, i);
    bool ok;
    if (std::isnan(a) || std::isnan(b))
      ok = std::isnan(a) && std::isnan(b);
    else if (std::isinf(a) || std::isinf(b))
      ok = a == b;
    else
      ok = std::fabs(a - b) <= rtol * std::fabs(a) + atol(i);
    if (!ok) {
      if (first < 0) first = i;
      ++bad;
      if (!std::isnan(a - b)) worst = std::max(worst, std::fabs(a - b));
    }
  }
  if (!bad) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os.precision(9);
  os << what << ": " << bad << " of " << want.numel() << " elements outside rtol " << rtol
     << " + atol; first at (row " << first / cols << ", col " << first % cols << "): expected "
     << value_at(want, first) << ", got " << value_at(got, first) << " (atol there " << atol(first)
     << "); largest difference " << worst;
  return ::testing::AssertionFailure() << os.str();
}

inline ::testing::AssertionResult all_close(const Tensor& want, const Tensor& got, double rtol,
                                            double atol, const std::string& what) {
  return all_close(
      want, got, rtol, [atol](int64_t) { return atol; }, what);
}

// BF16 results of an FP32 computation whose summation order differs: at most `ulps` codes apart, or
// within `atol(i)` (cancellation near zero can move a tiny value by more codes).
inline ::testing::AssertionResult bf16_close(const Tensor& want, const Tensor& got, int ulps,
                                             const std::function<double(int64_t)>& atol,
                                             const std::string& what) {
  if (want.shape() != got.shape() || want.dtype() != DType::kBF16 || got.dtype() != DType::kBF16)
    return ::testing::AssertionFailure() << what << ": expected two BF16 tensors of one shape";
  const int64_t cols = std::max<int64_t>(want.cols(), 1);
  const auto* a = want.data_as<const uint16_t>();
  const auto* b = got.data_as<const uint16_t>();
  auto ordered = [](uint16_t u) {
    return u & 0x8000 ? -static_cast<int32_t>(u & 0x7FFF) : static_cast<int32_t>(u);
  };
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double fa = bf16_to_float(a[i]), fb = bf16_to_float(b[i]);
    const bool nan_a = std::isnan(fa), nan_b = std::isnan(fb);
    bool ok;
    if (nan_a || nan_b)
      ok = nan_a && nan_b;
    else
      ok = std::abs(ordered(a[i]) - ordered(b[i])) <= ulps || std::fabs(fa - fb) <= atol(i);
    if (!ok) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  if (!bad) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os.precision(9);
  os << what << ": " << bad << " of " << want.numel() << " BF16 elements more than " << ulps
     << " ulp apart; first at (row " << first / cols << ", col " << first % cols << "): expected "
     << bf16_to_float(a[first]) << " (0x" << std::hex << a[first] << "), got " << std::dec
     << bf16_to_float(b[first]) << " (0x" << std::hex << b[first] << ")";
  return ::testing::AssertionFailure() << os.str();
}

// Central difference of `loss` in one F32 element: (L(p + h) - L(p - h)) / (p+ - p-), with the
// actual perturbed FP32 values in the denominator. Restores the element.
inline double central_difference(float* p, double h, const std::function<double()>& loss) {
  const float orig = *p;
  const float plus = static_cast<float>(orig + h), minus = static_cast<float>(orig - h);
  *p = plus;
  const double lp = loss();
  *p = minus;
  const double lm = loss();
  *p = orig;
  return (lp - lm) / (static_cast<double>(plus) - static_cast<double>(minus));
}

// sum_i a[i] * w[i] in FP64 over two host tensors of the same size.
inline double weighted_sum(const Tensor& a, const Tensor& w) {
  double s = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) s += value_at(a, i) * value_at(w, i);
  return s;
}

// Runs `fn`, expecting an octet::Error whose message contains every fragment.
inline void expect_error(const std::function<void()>& fn,
                         const std::vector<std::string>& fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected an octet::Error";
  } catch (const Error& e) {
    for (const auto& f : fragments)
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos)
          << "'" << f << "' not in: " << e.what();
  }
}

}  // namespace octet::test
