// The AdamW element update of adamw.h, shared by the CPU reference and the CUDA kernel
// (host/device), so that both perform the same FP32 operations in the same order.
#pragma once

#include <cstdint>

#include "numerics/fp32_rn.h"
#include "ops/adamw/adamw_backends.h"

namespace octet::adamw_math {

struct Element {
  float p;  // in/out: master weight
  float m;  // in/out: first moment, widened from BF16
  float v;  // in/out: second moment, widened from BF16
};

OCTET_HD void update(Element& x, float g, const AdamWConsts& k) {
  x.m = rn::add(rn::mul(k.beta1, x.m), rn::mul(k.one_minus_beta1, g));
  x.v = rn::add(rn::mul(k.beta2, x.v), rn::mul(k.one_minus_beta2, rn::mul(g, g)));
  x.p = rn::mul(x.p, k.decay);
  const float denom = rn::add(rn::div(rn::sqrt(x.v), k.bc2_sqrt), k.eps);
  x.p = rn::sub(x.p, rn::mul(k.step_size, rn::div(x.m, denom)));
}

// Clipping coefficient: min(1, max_norm / (norm + 1e-6)); NaN stays NaN.
OCTET_HD float clip_coefficient(float norm, float max_norm) {
  const float c = rn::div(max_norm, rn::add(norm, kClipEpsilon));
  return c > 1.0f ? 1.0f : c;
}

}  // namespace octet::adamw_math
