// Helpers shared by the GEMM tests (CPU and GPU): the three training GEMMs of a recipe built from
// random host data, FP64 references, and error measures that print what they compare.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "ops/gemm/gemm.h"
#include "ops/quantize/quantize.h"
#include "test_util.h"

namespace octet::test {

enum class Pass : uint8_t { kFprop, kDgrad, kWgrad };
enum class Recipe : uint8_t { kTensor, kRow, kBlockwise };

inline const char* pass_name(Pass p) {
  return p == Pass::kFprop ? "fprop" : p == Pass::kDgrad ? "dgrad" : "wgrad";
}
inline const char* recipe_name(Recipe r) {
  return r == Recipe::kTensor ? "tensor" : r == Recipe::kRow ? "row" : "blockwise";
}

inline Tensor transpose_host(const Tensor& t) {
  const int64_t r = t.rows(), c = t.cols();
  Tensor out = Tensor::empty({c, r}, DType::kF32);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j)
      out.data_as<float>()[j * r + i] = t.data_as<const float>()[i * c + j];
  return out;
}

// One training GEMM D (M, N) = A (M, K) B^T of a recipe, quantized on the CPU from Gaussian data:
// Fprop x (M, K), w (N, K); Dgrad dy (M, K), w (K, N); Wgrad dy (K tokens, M), x (K tokens, N).
struct GemmCase {
  std::string name;
  QuantTensor qa, qb;
  Copy ca = Copy::kRowwise, cb = Copy::kRowwise;
  Tensor a, b;  // the unquantized A (M, K) and B (N, K), f32 host

  Fp8Operand op_a() const {
    return ca == Copy::kRowwise ? rowwise_operand(qa) : columnwise_operand(qa);
  }
  Fp8Operand op_b() const {
    return cb == Copy::kRowwise ? rowwise_operand(qb) : columnwise_operand(qb);
  }
};

inline QuantTensor quant(Context& cpu, const Tensor& x, Granularity g, Fp8Format f,
                         QuantizeOutput out) {
  QuantizeArgs qa;
  qa.input = x;
  qa.granularity = g;
  qa.format = f;
  qa.output = out;
  return quantize(cpu, qa);
}

inline GemmCase make_case(Context& cpu, Recipe r, Pass p, int64_t m, int64_t n, int64_t k,
                          uint64_t seed, Dist dist = Dist::kGaussian) {
  const Granularity act = r == Recipe::kTensor ? Granularity::kTensor
                          : r == Recipe::kRow  ? Granularity::kRow
                                               : Granularity::k1x128;
  const Granularity wgt = r == Recipe::kBlockwise ? Granularity::k128x128 : act;
  // Per-tensor recipes use E4M3 forward and E5M2 for gradients (TransformerEngine's HYBRID).
  const Fp8Format grad = r == Recipe::kTensor ? Fp8Format::kE5M2 : Fp8Format::kE4M3;
  GemmCase c;
  c.name = std::string(recipe_name(r)) + " " + pass_name(p) + " M=" + std::to_string(m) +
           " N=" + std::to_string(n) + " K=" + std::to_string(k);
  if (p == Pass::kFprop) {
    c.a = random_tensor({m, k}, DType::kF32, seed, dist);
    c.b = random_tensor({n, k}, DType::kF32, seed + 1, dist);
    c.qa = quant(cpu, c.a, act, Fp8Format::kE4M3, QuantizeOutput::kRowwise);
    c.qb = quant(cpu, c.b, wgt, Fp8Format::kE4M3, QuantizeOutput::kRowwise);
  } else if (p == Pass::kDgrad) {
    c.a = random_tensor({m, k}, DType::kF32, seed, dist);                 // dY (T, Out)
    const Tensor w = random_tensor({k, n}, DType::kF32, seed + 1, dist);  // W (Out, In)
    c.b = transpose_host(w);
    c.qa = quant(cpu, c.a, act, grad, QuantizeOutput::kRowwise);
    c.qb = quant(cpu, w, wgt, Fp8Format::kE4M3, QuantizeOutput::kColumnwise);
    c.cb = Copy::kColumnwise;
  } else {
    const Tensor dy = random_tensor({k, m}, DType::kF32, seed, dist);     // dY (T, Out)
    const Tensor x = random_tensor({k, n}, DType::kF32, seed + 1, dist);  // X (T, In)
    c.a = transpose_host(dy);
    c.b = transpose_host(x);
    c.qa = quant(cpu, dy, act, grad, QuantizeOutput::kColumnwise);
    c.qb = quant(cpu, x, act, Fp8Format::kE4M3, QuantizeOutput::kColumnwise);
    c.ca = c.cb = Copy::kColumnwise;
  }
  return c;
}

// D = A B^T in FP64 for f32 host A (M, K), B (N, K).
inline std::vector<double> gemm_f64(const Tensor& a, const Tensor& b) {
  const int64_t m = a.rows(), n = b.rows(), k = a.cols();
  std::vector<double> d(static_cast<size_t>(m * n));
  const float* pa = a.data_as<const float>();
  const float* pb = b.data_as<const float>();
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t c = 0; c < k; ++c) s += static_cast<double>(pa[i * k + c]) * pb[j * k + c];
      d[static_cast<size_t>(i * n + j)] = s;
    }
  return d;
}

// The FP64 product of the dequantized FP8 operands (quantize.h's own dequantize: independent of
// gemm).
inline std::vector<double> dequantized_reference(Context& cpu, const GemmCase& c) {
  return gemm_f64(dequantize(cpu, c.qa, DType::kF32, c.ca),
                  dequantize(cpu, c.qb, DType::kF32, c.cb));
}

inline std::vector<double> to_doubles(const Tensor& host) {
  std::vector<double> v(static_cast<size_t>(host.numel()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = host.dtype() == DType::kF32 ? host.data_as<const float>()[i]
                                       : bf16_to_float(host.data_as<const uint16_t>()[i]);
  return v;
}

// ||x - ref|| / ||ref|| (Frobenius); non-finite values give +inf.
inline double rel_frobenius(const std::vector<double>& ref, const std::vector<double>& x) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(x[i])) return INFINITY;
    num += (x[i] - ref[i]) * (x[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// DeepGEMM's calc_diff: 1 - 2<x, y> / (|x|^2 + |y|^2).
inline double calc_diff(const std::vector<double>& x, const std::vector<double>& y) {
  double xy = 0, xx = 0, yy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    xy += x[i] * y[i];
    xx += x[i] * x[i];
    yy += y[i] * y[i];
  }
  return 1.0 - 2.0 * xy / (xx + yy);
}

// Where x differs most from ref, for failure messages.
inline std::string worst_element(const std::vector<double>& ref, const std::vector<double>& x,
                                 int64_t cols) {
  size_t worst = 0;
  double err = -1;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = std::isfinite(x[i]) ? std::fabs(x[i] - ref[i]) : INFINITY;
    if (e > err) {
      err = e;
      worst = i;
    }
  }
  if (ref.empty()) return "(empty)";
  const int64_t c = std::max<int64_t>(cols, 1);
  return "worst at (" + std::to_string(static_cast<int64_t>(worst) / c) + ", " +
         std::to_string(static_cast<int64_t>(worst) % c) + "): expected " +
         std::to_string(ref[worst]) + ", got " + std::to_string(x[worst]);
}

inline Tensor make_output(int64_t m, int64_t n, DType dt, uint8_t poison_byte = 0xA5) {
  Tensor d = Tensor::empty({m, n}, dt);
  poison(d, poison_byte);
  return d;
}

}  // namespace octet::test
