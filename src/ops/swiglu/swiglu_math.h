// SwiGLU's element math, shared by the CPU reference and the CUDA kernels so that both give the
// same bits. Every step is one correctly rounded FP32 operation (add, mul, div, fma, rint), which
// IEEE 754 defines exactly on host and device; library expf is not used because host and device
// versions differ in the last bit. (Host code must not be compiled with FMA contraction of a * b +
// c, which the baseline x86-64 target cannot emit; numerics/scale.h makes the same assumption.)
#pragma once

#include <cmath>
#include <cstdint>

#include "numerics/fp8.h"
#include "numerics/scale.h"

namespace octet::swiglu_math {

OCTET_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

OCTET_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

OCTET_HD float rint_fp32(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::rint(x);  // the default rounding mode: nearest, ties to even
#endif
}

// exp(x) in FP32, within 2 ulp (tests/ops/swiglu_test.cpp measures it against FP64 exp). Range
// reduction x = n ln2 + r with ln2 split in two (Cody & Waite; fdlibm's split: the high part has 8
// trailing zero bits, so n * ln2_hi is exact for |n| <= 2^8), exp(r) by its Taylor series to degree
// 7 (truncation below 2^-27 for |r| <= ln2 / 2), then 2^n applied in two exact halves so that a
// subnormal result is rounded once.
OCTET_HD float exp_fp32(float x) {
  constexpr float kLog2e = 1.44269502f, kLn2Hi = 6.93145751953125e-1f, kLn2Lo = 1.4286067653e-6f;
  if (x != x) return x;
  if (x > 88.7228394f) return bits_float(0x7F800000u);  // beyond FLT_MAX
  if (x < -103.972084f) return 0.0f;                    // below half the smallest subnormal
  const float n = rint_fp32(fp32_mul_rn(x, kLog2e));
  float r = fma_rn(-n, kLn2Hi, x);
  r = fma_rn(-n, kLn2Lo, r);
  float p = 1.0f / 5040.0f;
  p = fma_rn(p, r, 1.0f / 720.0f);
  p = fma_rn(p, r, 1.0f / 120.0f);
  p = fma_rn(p, r, 1.0f / 24.0f);
  p = fma_rn(p, r, 1.0f / 6.0f);
  p = fma_rn(p, r, 0.5f);
  p = fma_rn(p, r, 1.0f);
  p = fma_rn(p, r, 1.0f);
  const int ni = static_cast<int>(n);  // in [-150, 128]
  const int half = ni / 2;
  p = fp32_mul_rn(p, bits_float(static_cast<uint32_t>(127 + half) << 23));
  return fp32_mul_rn(p, bits_float(static_cast<uint32_t>(127 + ni - half) << 23));
}

// NaN results leave as the canonical quiet NaN: the payload and sign of a NaN made by an invalid
// operation (0 * inf) differ between x86 (0xFFC00000) and the GPU (0x7FFFFFFF), and BF16 and FP8
// conversions keep the sign.
OCTET_HD float canonical_nan(float x) {
  return x != x ? bits_float(0x7FC00000u) : x;
}

// sigmoid(g) = 1 / (1 + exp(-g)); exact 0 and 1 in the tails, NaN for NaN.
OCTET_HD float sigmoid(float g) {
  return fp32_div_rn(1.0f, add_rn(1.0f, exp_fp32(-g)));
}

// h = silu(g) * u = (g * sigmoid(g)) * u.
OCTET_HD float swiglu(float g, float u) {
  return canonical_nan(fp32_mul_rn(fp32_mul_rn(g, sigmoid(g)), u));
}

// Gradients of h = silu(g) * u given dh:
//   du = dh * silu(g)
//   dg = (dh * u) * s * (1 + g * (1 - s)),  s = sigmoid(g)
struct SwigluGrad {
  float dg, du;
};
OCTET_HD SwigluGrad swiglu_grad(float g, float u, float dh) {
  const float s = sigmoid(g);
  const float du = fp32_mul_rn(dh, fp32_mul_rn(g, s));
  const float dsilu = fp32_mul_rn(s, add_rn(1.0f, fp32_mul_rn(g, add_rn(1.0f, -s))));
  return {canonical_nan(fp32_mul_rn(fp32_mul_rn(dh, u), dsilu)), canonical_nan(du)};
}

}  // namespace octet::swiglu_math
