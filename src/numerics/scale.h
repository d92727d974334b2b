// Scaling: FP8 formats, group granularities, and the exact rule that turns an amax into a scale.
//
// Notation (reference/fp8-facts.md section 2): q = cvt_rn_satfinite(x * scale), x ~ q * scale_inv.
// Every step is one correctly rounded FP32 operation, so the CPU reference and the CUDA kernels
// agree bit for bit:
//   amax      = max |x| over the group (NaN if the group holds a NaN)
//   scale     = fp8_max / max(amax, epsilon)              FP32 division, correctly rounded
//               * 2^-margin                                 exact (delayed scaling only)
//               rounded down to a power of two              when pow2 scales are asked for
//   scale_inv = 1 / scale                                  FP32 division, correctly rounded
// Defined results instead of NaN or inf:
//   amax == 0 (an all-zero group)       -> scale 1, whatever the epsilon
//   amax NaN or inf (non-finite input)  -> scale 1; the finite values of the group saturate, +-inf
//                                          become +-fp8_max and NaN stays NaN
//   fp8_max / amax overflows (tiny amax) -> scale = FLT_MAX (2^127 with pow2 scales)
//   a margin pushes it below FLT_MIN     -> scale = FLT_MIN (so scale_inv = 2^126 stays finite)
#pragma once

#include <cstdint>

#include "core/quant_types.h"
#include "numerics/fp32_rn.h"
#include "numerics/fp8.h"

namespace octet {

// Delayed scaling: which amax of the history sets the scale (TransformerEngine's
// amax_compute_algo "max" / "most_recent").
enum class AmaxReduction : uint8_t { kMax, kMostRecent };

const char* granularity_name(Granularity g);  // "1x128", ...
const char* format_name(Fp8Format f);         // "e4m3", "e5m2"

OCTET_HD float fp8_max(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? 448.0f : 57344.0f;
}

OCTET_HD uint8_t float_to_fp8(float x, Fp8Format f) {
  return f == Fp8Format::kE4M3 ? float_to_e4m3(x) : float_to_e5m2(x);
}
OCTET_HD float fp8_to_float(uint8_t c, Fp8Format f) {
  return f == Fp8Format::kE4M3 ? e4m3_to_float(c) : e5m2_to_float(c);
}

// |x| as bits: unsigned-integer max over these is max |x| with NaN winning (NaN patterns sort above
// inf), independent of reduction order, on host and device alike.
OCTET_HD uint32_t abs_bits(float x) {
  return float_bits(x) & 0x7FFFFFFFu;
}

struct ScaleRule {
  Fp8Format format = Fp8Format::kE4M3;
  ScaleRounding rounding = ScaleRounding::kExact;
  float epsilon = 0.0f;  // amax floor (DeepSeek's inference kernel uses 1e-4); 0 means none
  int margin = 0;        // delayed scaling: scale / 2^margin
};

// The power-of-two scale without the division (margin 0), the same bits as compute_scale's
// division path: amax = m 2^e (m in [1, 2)) and fp8_max = 1.75 2^k (448 = 1.75 2^8,
// 57344 = 1.75 2^15), so fp8_max / amax = (1.75 / m) 2^(k - e), which lies in [1, 1.75] 2^(k - e)
// for m <= 1.75 and in (0.875, 1) 2^(k - e) for m > 1.75. Rounding cannot carry it into the next
// binade: the largest quotient below 1, 1.75 / (1.75 + 2^-23), is more than half an ulp under 1.
// Its exponent is therefore k - e - (m > 1.75), and the power of two it rounds down to is that,
// capped at 2^127 (the overflow to inf becomes FLT_MAX, whose power of two is 2^127). No margin
// means no result below 2^-126. A subnormal amax (exponent field 0, read here as e = -127) gives
// an exponent above 127 and so 2^127, as the division does: its quotient overflows. So this holds
// for every finite nonzero amax.
OCTET_HD float pow2_scale_of_normal(uint32_t amax_bits, Fp8Format f) {
  const int e = static_cast<int>(amax_bits >> 23) - 127;
  const int k = f == Fp8Format::kE4M3 ? 8 : 15;
  const int p = k - e - ((amax_bits & 0x7FFFFFu) > 0x600000u ? 1 : 0);
  return bits_float(static_cast<uint32_t>((p < 127 ? p : 127) + 127) << 23);
}

// compute_scale for ScaleRule{f, kPow2, epsilon, margin 0} (epsilon finite) as straight-line code:
// selects, no branch on the data, so that kernels which fix this rule at compile time (the 1x128
// quantizers of every FP8 recipe) spend a few integer operations a group on it.
OCTET_HD float pow2_scale(float amax, float epsilon, Fp8Format f) {
  uint32_t a = abs_bits(amax);
  const bool one = a >= 0x7F800000u || a == 0;  // NaN or inf; all-zero group
  if (bits_float(a) < epsilon) a = float_bits(epsilon);
  const float s = pow2_scale_of_normal(a, f);
  return one ? 1.0f : s;
}

// scale_inverse of a power of two 2^p with p in [-126, 127] (every pow2_scale): 2^-p written
// directly, 2^-127 being the subnormal 0x00400000.
OCTET_HD float pow2_scale_inverse(float scale) {
  const uint32_t x = float_bits(scale) >> 23;  // biased exponent in [1, 254]
  return bits_float(x == 254 ? 0x00400000u : (254u - x) << 23);
}

OCTET_HD float compute_scale(float amax, const ScaleRule& r) {
  constexpr float kFltMax = 3.40282347e38f;
  if (r.rounding == ScaleRounding::kPow2 && r.margin == 0)
    return pow2_scale(amax, r.epsilon, r.format);
  if (abs_bits(amax) >= 0x7F800000u) return 1.0f;  // NaN or inf
  amax = bits_float(abs_bits(amax));  // a magnitude: a stray sign must not flip the scale
  if (amax == 0.0f)
    return 1.0f;  // all-zero group: scale 1 even with an epsilon (its data is all 0)
  if (amax < r.epsilon) amax = r.epsilon;
  float s = rn::div(fp8_max(r.format), amax);
  // 2^-margin in factors of at most 2^-126 (a single factor is not a normal FP32 beyond 126). Once
  // a product is subnormal the result ends below FLT_MIN and is clamped below, so only normal
  // products need to be exact; beyond 300 every scale is already clamped.
  for (int m = r.margin < 300 ? r.margin : 300; m > 0; m -= 126)
    s = rn::mul(s, bits_float(static_cast<uint32_t>(127 - (m < 126 ? m : 126)) << 23));
  if (abs_bits(s) == 0x7F800000u) s = kFltMax;
  if (r.rounding == ScaleRounding::kPow2) s = bits_float(float_bits(s) & 0xFF800000u);
  if (s < 1.17549435e-38f) s = 1.17549435e-38f;  // only a large margin gets here; keep 1/s finite
  return s;
}

// 1 / scale, correctly rounded. A power of two 2^p (every pow2 scale, p in [-126, 127]) has the
// exact inverse 2^-p (pow2_scale_inverse); other scales divide.
OCTET_HD float scale_inverse(float scale) {
  const uint32_t b = float_bits(scale);
  const uint32_t x = b >> 23;  // biased exponent, with the sign bit above it
  if ((b & 0x7FFFFFu) == 0 && x >= 1 && x <= 254) return pow2_scale_inverse(scale);
  return rn::div(1.0f, scale);
}

// One element: q = cvt_rn_satfinite(x * scale) with the product rounded to FP32.
OCTET_HD uint8_t quantize_value(float x, float scale, Fp8Format f) {
  return float_to_fp8(rn::mul(x, scale), f);
}

}  // namespace octet
