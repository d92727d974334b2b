// SwiGLU's element math, shared by the CPU reference and the CUDA kernels so that both give the
// same bits: every step is one correctly rounded FP32 operation, and exp is numerics/fp32_rn.h's
// (library expf differs between host and device in the last bit).
#pragma once

#include <cmath>
#include <cstdint>

#include "numerics/fp32_rn.h"
#include "numerics/fp8.h"
#include "numerics/scale.h"

namespace octet::swiglu_math {

// NaN results leave as the canonical quiet NaN: the payload and sign of a NaN made by an invalid
// operation (0 * inf) differ between x86 (0xFFC00000) and the GPU (0x7FFFFFFF), and BF16 and FP8
// conversions keep the sign.
OCTET_HD float canonical_nan(float x) {
  return x != x ? bits_float(0x7FC00000u) : x;
}

// sigmoid(g) = 1 / (1 + exp(-g)) with numerics/fp32_rn.h's exp: exact 0 and 1 in the tails, NaN for
// NaN, the same bits on host and device.
OCTET_HD float sigmoid(float g) {
  return rn::sigmoid_rn(g);
}

// h = silu(g) * u = (g * sigmoid(g)) * u.
OCTET_HD float swiglu(float g, float u) {
  return canonical_nan(rn::mul(rn::mul(g, sigmoid(g)), u));
}

// Gradients of h = silu(g) * u given dh:
//   du = dh * silu(g)
//   dg = (dh * u) * s * (1 + g * (1 - s)),  s = sigmoid(g)
struct SwigluGrad {
  float dg, du;
};
OCTET_HD SwigluGrad swiglu_grad(float g, float u, float dh) {
  const float s = sigmoid(g);
  const float du = rn::mul(dh, rn::mul(g, s));
  const float dsilu = rn::mul(s, rn::add(1.0f, rn::mul(g, rn::add(1.0f, -s))));
  return {canonical_nan(rn::mul(rn::mul(dh, u), dsilu)), canonical_nan(du)};
}

}  // namespace octet::swiglu_math
