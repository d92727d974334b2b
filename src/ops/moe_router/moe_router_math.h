// Host/device pieces of the router that the CPU reference and the CUDA kernels share, so that both
// compute the same bits: the score, the total order used for every top-k, and the weight formulas.
#pragma once

#include <cstdint>

#include "numerics/fp32_rn.h"

namespace octet::router {

// Selection value: -0.0 counts as +0.0 and NaN as -inf, so that "larger" is a total order on
// values.
OCTET_HD float canonical(float v) {
  if (v != v) return bits_float(0xFF800000u);
  return v == 0.0f ? 0.0f : v;
}

// Monotone map of a canonical float onto uint32 (larger float -> larger key). -inf maps to
// 0x007FFFFF, so a key of 0 never belongs to a real value and marks "not a candidate".
OCTET_HD uint32_t order_key(float v) {
  const uint32_t u = float_bits(canonical(v));
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// 64-bit key of (value, index): larger value first, then lower index. Every top-k in the router
// picks the largest keys, so any algorithm that does so gives the same, unique answer.
OCTET_HD uint64_t select_key(float v, uint32_t index) {
  return (static_cast<uint64_t>(order_key(v)) << 32) | (0xFFFFFFFFu - index);
}
OCTET_HD uint32_t key_index(uint64_t key) {
  return 0xFFFFFFFFu - static_cast<uint32_t>(key);
}

// The denominator of the normalised weights: sum of the chosen scores in slot order, plus the
// transformers library's 1e-20.
inline constexpr float kNormEpsilon = 1e-20f;

}  // namespace octet::router
