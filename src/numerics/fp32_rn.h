// Correctly rounded FP32 / FP64 arithmetic with the same result on host and device, for ops whose
// CPU reference and CUDA kernels must agree bit for bit (moe_router, moe_permute, adamw).
//
// Why not plain operators: nvcc contracts `a * b + c` into one FMA by default (-fmad=true) and a
// host compiler may do the same where the target has FMA (aarch64, -march=native). Each function
// here is one IEEE operation rounded to nearest even: on the device the __f*_rn intrinsics (never
// contracted), on the host a product passes through a volatile store so that it cannot be fused
// into a later addition. exp_rn is not correctly rounded, but it is built only from these
// operations, so host and device give the same bits (within about 1 ulp of exp).
#pragma once

#include <cmath>
#include <cstdint>

#include "numerics/fp8.h"  // OCTET_HD, float_bits, bits_float

namespace octet::rn {

OCTET_HD float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

OCTET_HD float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

OCTET_HD float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  volatile float p = a * b;  // rounded here: never fused into a following add
  return p;
#endif
}

OCTET_HD float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

OCTET_HD float fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

OCTET_HD float sqrt(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

OCTET_HD double add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

OCTET_HD double mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  volatile double p = a * b;
  return p;
#endif
}

OCTET_HD double div(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

OCTET_HD double sqrt(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// 2^n for n in [-126, 127], exact.
OCTET_HD float pow2i(int n) {
  return bits_float(static_cast<uint32_t>(n + 127) << 23);
}

// exp(x) in FP32: x = n ln2 + r with |r| <= ln2/2 (Cody-Waite with an FMA), exp(r) by its Taylor
// polynomial of degree 7 (truncation below 0.05 ulp), then an exact scaling by 2^n (two factors for
// the subnormal range so that the only rounding is the final one). Overflow gives +inf, underflow
// +0, NaN stays NaN.
OCTET_HD float exp_rn(float x) {
  if (x != x) return x;
  if (x > 88.72283935546875f) return bits_float(0x7F800000u);
  if (x < -103.97283172607422f) return 0.0f;
  constexpr float kLog2e = 1.44269502162933349609375f;
  constexpr float kLn2Hi = 0.693147182464599609375f;  // float(ln 2)
  constexpr float kLn2Lo = -1.904654323148236e-09f;   // ln 2 - kLn2Hi
  constexpr float kRound = 12582912.0f;               // 1.5 * 2^23: adding it rounds to an integer
  const float n = sub(add(mul(x, kLog2e), kRound), kRound);
  float r = fma(-n, kLn2Hi, x);
  r = fma(-n, kLn2Lo, r);
  float p = 1.0f / 5040.0f;
  p = fma(p, r, 1.0f / 720.0f);
  p = fma(p, r, 1.0f / 120.0f);
  p = fma(p, r, 1.0f / 24.0f);
  p = fma(p, r, 1.0f / 6.0f);
  p = fma(p, r, 0.5f);
  p = fma(p, r, 1.0f);
  p = fma(p, r, 1.0f);
  const int ni = static_cast<int>(n);
  if (ni > 127) return mul(mul(p, pow2i(127)), pow2i(ni - 127));
  if (ni < -126) return mul(mul(p, pow2i(ni + 64)), pow2i(-64));
  return mul(p, pow2i(ni));
}

// sigmoid(x) = 1 / (1 + exp(-x)), as the transformers library computes router scores
// (torch.sigmoid).
OCTET_HD float sigmoid_rn(float x) {
  return div(1.0f, add(1.0f, exp_rn(-x)));
}

}  // namespace octet::rn
