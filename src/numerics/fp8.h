// Number formats: FP8 (E4M3fn, E5M2), BF16, E8M0 scales, and a generic ExMy rounding used to
// emulate storage formats such as DeepSeek-V3's E5M6. Host and device share this code; CUDA kernels
// may use the hardware conversion instead (cvt.rn.satfinite), and tests/numerics prove the two
// bit-identical over every FP32 input.
//
// Conversion from FP32 (reference/fp8-facts.md section 1): round to nearest, ties to even; finite
// values and infinities saturate to the largest finite value of the sign (the `satfinite`
// semantics); signed zero is kept; NaN becomes the format's positive all-ones NaN code (0x7F for
// both FP8 formats), as the hardware conversion does, so the sign of a NaN is not carried.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/hd.h"

namespace octet {

OCTET_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

OCTET_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// How the all-ones exponent is used. kIeee: reserved for inf/NaN (E5M2, E5M6). kFiniteOnly:
// ordinary binade whose all-ones mantissa is the only NaN (E4M3fn: max 448, no infinities).
enum class ExMyKind : uint8_t { kIeee, kFiniteOnly };

struct ExMyFormat {
  int exp_bits;
  int man_bits;
  ExMyKind kind;

  constexpr int bias() const { return (1 << (exp_bits - 1)) - 1; }
  constexpr uint32_t nan_code() const { return (1u << (exp_bits + man_bits)) - 1u; }  // all ones
  constexpr uint32_t sign_bit() const { return 1u << (exp_bits + man_bits); }
  constexpr uint32_t max_code() const {
    return kind == ExMyKind::kIeee
               ? ((((1u << exp_bits) - 2u) << man_bits) | ((1u << man_bits) - 1u))
               : ((((1u << exp_bits) - 1u) << man_bits) | ((1u << man_bits) - 2u));
  }
};

inline constexpr ExMyFormat kE4M3Format{4, 3, ExMyKind::kFiniteOnly};
inline constexpr ExMyFormat kE5M2Format{5, 2, ExMyKind::kIeee};
// DeepSeek-V3 stores the input of the attention output projection in "E5M6" (reference section 4).
inline constexpr ExMyFormat kE5M6Format{5, 6, ExMyKind::kIeee};

// Round-to-nearest-even shift right of a non-negative integer by s >= 0 bits.
OCTET_HD uint32_t rne_shift_right(uint32_t v, int s) {
  if (s <= 0) return v;   // man_bits == 23: nothing to round (and 1u << (s - 1) would be undefined)
  if (s >= 32) return 0;  // v < 2^25 here, so everything shifted out is below half an ulp
  const uint32_t q = v >> s;
  const uint32_t rem = v & ((1u << s) - 1u);
  const uint32_t half = 1u << (s - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

// FP32 -> ExMy code (sign in bit exp_bits + man_bits), RNE, saturating.
OCTET_HD uint32_t encode_exmy(float x, ExMyFormat f) {
  const uint32_t bits = float_bits(x);
  const uint32_t sign = (bits >> 31) ? f.sign_bit() : 0u;
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return f.nan_code();
  if (abs == 0x7F800000u) return sign | f.max_code();
  const int e = static_cast<int>(abs >> 23);  // biased FP32 exponent, 0 for subnormals
  const int emin = 1 - f.bias();              // unbiased exponent of the smallest normal
  const int shift = 23 - f.man_bits;
  if (e - 127 >= emin) {
    // Normal in the target: round the 23-bit mantissa to man_bits, carry ripples into the exponent.
    const uint32_t r = rne_shift_right(abs, shift);
    const uint32_t code = r - (static_cast<uint32_t>(127 - f.bias()) << f.man_bits);
    return sign | (code > f.max_code() ? f.max_code() : code);
  }
  // Subnormal or zero in the target: count units of the smallest subnormal 2^(emin - man_bits).
  // x = m * 2^(ex - 23) with the implicit bit made explicit.
  const uint32_t m = e ? ((abs & 0x7FFFFFu) | 0x800000u) : (abs & 0x7FFFFFu);
  const int ex = e ? e - 127 : -126;
  const int s = (emin - f.man_bits) - (ex - 23);  // > 0 here
  return sign | rne_shift_right(m, s);            // 2^man_bits rounds up into the smallest normal
}

// ExMy code -> FP32 (exact: every ExMy value with exp_bits <= 8 and man_bits <= 23 is an FP32
// value).
OCTET_HD float decode_exmy(uint32_t code, ExMyFormat f) {
  const uint32_t sign = (code & f.sign_bit()) ? 0x80000000u : 0u;
  const uint32_t mag = code & (f.sign_bit() - 1u);
  const uint32_t ef = mag >> f.man_bits;
  const uint32_t mf = mag & ((1u << f.man_bits) - 1u);
  const uint32_t emax_field = (1u << f.exp_bits) - 1u;
  if (f.kind == ExMyKind::kIeee && ef == emax_field)
    return bits_float(sign | (mf ? 0x7FC00000u : 0x7F800000u));
  if (f.kind == ExMyKind::kFiniteOnly && mag == f.nan_code()) return bits_float(sign | 0x7FC00000u);
  if (ef == 0) {
    // Subnormal: mf * 2^(1 - bias - man_bits), exact in FP32. Two power-of-2 factors, because the
    // single factor 2^(1 - bias - man_bits) is not a normal FP32 number for exp_bits == 8: first
    // mf / 2^man_bits in [2^-man_bits, 1), then 2^(1 - bias) >= 2^-126; both products are exact.
    if (mf == 0) return bits_float(sign);
    const float frac =
        static_cast<float>(mf) * bits_float(static_cast<uint32_t>(127 - f.man_bits) << 23);
    const float unit = bits_float(static_cast<uint32_t>(127 + 1 - f.bias()) << 23);
    return bits_float(sign | float_bits(frac * unit));
  }
  const uint32_t e32 = ef + static_cast<uint32_t>(127 - f.bias());
  return bits_float(sign | (e32 << 23) | (mf << (23 - f.man_bits)));
}

// Emulated storage: x rounded to ExMy and back to FP32.
OCTET_HD float round_to_exmy(float x, ExMyFormat f) {
  return decode_exmy(encode_exmy(x, f), f);
}

OCTET_HD uint8_t float_to_e4m3(float x) {
  return static_cast<uint8_t>(encode_exmy(x, kE4M3Format));
}
OCTET_HD uint8_t float_to_e5m2(float x) {
  return static_cast<uint8_t>(encode_exmy(x, kE5M2Format));
}
OCTET_HD float e4m3_to_float(uint8_t c) {
  return decode_exmy(c, kE4M3Format);
}
OCTET_HD float e5m2_to_float(uint8_t c) {
  return decode_exmy(c, kE5M2Format);
}

// BF16: round to nearest even; overflow goes to infinity (BF16 has FP32's range); NaN becomes the
// canonical 0x7FFF with the input's sign bit, as CUDA's __float2bfloat16_rn does.
OCTET_HD uint16_t float_to_bf16(float x) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x7FFFu);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
OCTET_HD float bf16_to_float(uint16_t b) {
  return bits_float(static_cast<uint32_t>(b) << 16);
}

// Element i of an F32 (float) or BF16 (uint16_t bits) buffer as FP32, and back (BF16 rounds to
// nearest even): the loads and stores the ops' kernels and references share.
template <typename T>
OCTET_HD float load_float(const T* p, int64_t i) {
  if constexpr (sizeof(T) == 4)
    return p[i];
  else
    return bf16_to_float(p[i]);
}
template <typename T>
OCTET_HD void store_float(T* p, int64_t i, float v) {
  if constexpr (sizeof(T) == 4)
    p[i] = v;
  else
    p[i] = float_to_bf16(v);
}

// E8M0 (unsigned, bias 127, 0xFF is NaN): the OCP MX scale format. Decoding code c gives 2^(c-127).
OCTET_HD float e8m0_to_float(uint8_t c) {
  if (c == 0xFF) return bits_float(0x7FC00000u);
  if (c == 0) return bits_float(0x00400000u);  // 2^-127 is an FP32 subnormal
  return bits_float(static_cast<uint32_t>(c) << 23);
}

enum class E8M0Rounding : uint8_t { kDown, kUp, kNearestEven };

// Positive finite x -> E8M0 code, clamped to [2^-127, 2^127]; zero, negative or NaN inputs give
// 0xFF.
OCTET_HD uint8_t float_to_e8m0(float x, E8M0Rounding mode) {
  const uint32_t u = float_bits(x);
  if ((u >> 31) || u == 0 || u > 0x7F800000u) return 0xFF;
  if (u >= 0x7F000000u) return 0xFE;  // >= 2^127 (inf included) saturates
  if (u < 0x00800000u) {
    // FP32 subnormal: codes 0 (2^-127) and 1 (2^-126) bracket it; smaller values clamp to code 0.
    if (mode == E8M0Rounding::kUp) return u > 0x00400000u ? 1 : 0;
    if (mode == E8M0Rounding::kDown) return 0;
    return u > 0x00600000u ? 1 : 0;  // the midpoint 1.5 * 2^-127 ties to the even code 0
  }
  uint32_t e = u >> 23;
  const uint32_t mant = u & 0x7FFFFFu;
  if (mode == E8M0Rounding::kUp && mant) ++e;
  if (mode == E8M0Rounding::kNearestEven && (mant > 0x400000u || (mant == 0x400000u && (e & 1u))))
    ++e;
  return static_cast<uint8_t>(e > 0xFE ? 0xFE : e);
}

}  // namespace octet
