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

OCTET_HD float compute_scale(float amax, const ScaleRule& r) {
  constexpr float kFltMax = 3.40282347e38f;
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

OCTET_HD float scale_inverse(float scale) {
  return rn::div(1.0f, scale);
}

// One element: q = cvt_rn_satfinite(x * scale) with the product rounded to FP32.
OCTET_HD uint8_t quantize_value(float x, float scale, Fp8Format f) {
  return float_to_fp8(rn::mul(x, scale), f);
}

}  // namespace octet
