// Internal: the scalar rotation shared by the CPU reference and the CUDA kernel (host + device), so
// both round identically: one product rounded, then one fma.
#pragma once

#include <cmath>
#include <cstdint>

#include "numerics/fp8.h"  // OCTET_HD

namespace octet::rope_math {

// s carries the direction: +sin forward, -sin backward (negation is exact).
OCTET_HD float rotate_first(float p, float q, float c, float s) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(p, c, -__fmul_rn(q, s));
#else
  return std::fma(p, c, -(q * s));
#endif
}
OCTET_HD float rotate_second(float p, float q, float c, float s) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(q, c, __fmul_rn(p, s));
#else
  return std::fma(q, c, p * s);
#endif
}

// Which two inputs output channel i (0 <= i < d, d = 2 * half) of a rope part reads, which pair j
// its angle belongs to, and whether it is the first (p*c - q*s) or second (q*c + p*s) output of the
// pair. Forward reads the source layout and writes [first half | second half]; backward reads that
// layout and writes the source layout (for kInterleave: even channel = first, odd = second).
struct RopePick {
  int p, q, j;
  bool first;
};
OCTET_HD RopePick rope_pick(int i, int half, bool interleave, bool forward) {
  RopePick r;
  if (forward || !interleave) {
    r.j = i < half ? i : i - half;
    r.first = i < half;
  } else {
    r.j = i >> 1;
    r.first = (i & 1) == 0;
  }
  if (forward && interleave) {
    r.p = 2 * r.j;
    r.q = 2 * r.j + 1;
  } else {
    r.p = r.j;
    r.q = r.j + half;
  }
  return r;
}

// n / d for 0 <= n < 2^31 and a divisor 1 <= d < 2^31 fixed at launch, in a multiply-high, an
// add and a shift (Granlund and Montgomery's round-up method): with l = ceil(log2 d) and
// mul = floor(2^32 (2^l - d) / d) + 1, n / d = (mulhi(n, mul) + n) >> l; the sum fits in 32 bits
// because n < 2^31. rope_key_cuda.cu's index arithmetic (tests/ops/rope_key_test.cpp checks it).
struct FastDiv {
  uint32_t d = 1, mul = 1, shift = 0;

  FastDiv() = default;
  explicit FastDiv(uint32_t divisor) : d(divisor) {
    while ((uint64_t{1} << shift) < d) ++shift;
    mul = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }
  OCTET_HD uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, mul);
#else
    const auto hi = static_cast<uint32_t>((uint64_t{n} * mul) >> 32);
#endif
    return (hi + n) >> shift;
  }
};

}  // namespace octet::rope_math
