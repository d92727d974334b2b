// The scale rule of numerics/scale.h: every defined result listed at the top of that header, the
// exact arithmetic (correctly rounded FP32 division, exact margin, power-of-2 round-down) and the
// promise that no amax, epsilon or margin gives a NaN, infinite or zero scale or scale_inv.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "numerics/scale.h"

namespace octet {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

ScaleRule rule(Fp8Format f, ScaleRounding r = ScaleRounding::kExact, float eps = 0.0f,
               int margin = 0) {
  return ScaleRule{.format = f, .rounding = r, .epsilon = eps, .margin = margin};
}

bool is_pow2(float x) {
  int e;
  return x > 0 && std::frexp(x, &e) == 0.5f;
}

// q is the correctly rounded FP32 quotient n / d iff no neighbour of q is closer; the products are
// exact in double (24 x 24 significant bits), so the comparison is exact.
bool is_correctly_rounded_quotient(float q, float n, float d) {
  const double err = std::fabs(double{q} * d - n);
  for (float nb : {std::nextafter(q, 0.0f), std::nextafter(q, kInf)}) {
    const double e = std::fabs(double{nb} * d - n);
    if (e < err) return false;
    if (e == err && (float_bits(q) & 1u)) return false;  // a tie goes to the even significand
  }
  return true;
}

TEST(Scale, FormatMaxima) {
  EXPECT_EQ(fp8_max(Fp8Format::kE4M3), 448.0f);
  EXPECT_EQ(fp8_max(Fp8Format::kE5M2), 57344.0f);
  EXPECT_EQ(ceil_div(0, 128), 0);
  EXPECT_EQ(ceil_div(1, 128), 1);
  EXPECT_EQ(ceil_div(128, 128), 1);
  EXPECT_EQ(ceil_div(129, 128), 2);
}

TEST(Scale, KnownValues) {
  const ScaleRule e4 = rule(Fp8Format::kE4M3), e5 = rule(Fp8Format::kE5M2);
  EXPECT_EQ(compute_scale(448.0f, e4), 1.0f);
  EXPECT_EQ(compute_scale(1.0f, e4), 448.0f);
  EXPECT_EQ(compute_scale(2.0f, e5), 28672.0f);
  EXPECT_EQ(compute_scale(3.0f, e4), 448.0f / 3.0f);
  EXPECT_TRUE(is_correctly_rounded_quotient(compute_scale(3.0f, e4), 448.0f, 3.0f));
  EXPECT_EQ(compute_scale(FLT_MAX, e4), 448.0f / FLT_MAX);  // large amax: small but normal scale
  EXPECT_GT(compute_scale(FLT_MAX, e4), FLT_MIN);
}

TEST(Scale, DefinedResultsForZeroAndNonFinite) {
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    for (ScaleRounding r : {ScaleRounding::kExact, ScaleRounding::kPow2}) {
      for (float eps : {0.0f, 1e-4f}) {
        const ScaleRule ru = rule(f, r, eps);
        // An all-zero group gets scale 1, whatever the epsilon (the spec's rule; its data is all
        // zeros under any scale).
        EXPECT_EQ(compute_scale(0.0f, ru), 1.0f);
        EXPECT_EQ(compute_scale(-0.0f, ru), 1.0f);
        EXPECT_EQ(compute_scale(kNaN, ru), 1.0f);
        EXPECT_EQ(compute_scale(-kNaN, ru), 1.0f);
        EXPECT_EQ(compute_scale(bits_float(0x7F800001u), ru), 1.0f);
        EXPECT_EQ(compute_scale(kInf, ru), 1.0f);
      }
    }
  }
}

TEST(Scale, TinyAmaxOverflowsToFltMax) {
  const ScaleRule e4 = rule(Fp8Format::kE4M3), p2 = rule(Fp8Format::kE4M3, ScaleRounding::kPow2);
  for (float tiny : {FLT_TRUE_MIN, 1e-40f, FLT_MIN, 1e-37f}) {
    EXPECT_EQ(compute_scale(tiny, e4), FLT_MAX) << tiny;
    EXPECT_EQ(compute_scale(tiny, p2), 0x1p127f) << tiny;
    EXPECT_EQ(scale_inverse(compute_scale(tiny, p2)), 0x1p-127f);  // subnormal, exact
    EXPECT_GT(scale_inverse(compute_scale(tiny, e4)), 0.0f);
  }
  // Just above the overflow threshold the quotient is finite and used as is.
  const float a = 448.0f / 0x1p127f;  // 1.75 * 2^-119
  EXPECT_EQ(compute_scale(a, e4), 0x1p127f);
  EXPECT_EQ(compute_scale(a, p2), 0x1p127f);
}

TEST(Scale, Epsilon) {
  const ScaleRule r = rule(Fp8Format::kE4M3, ScaleRounding::kExact, 1e-4f);
  EXPECT_EQ(compute_scale(1e-6f, r), 448.0f / 1e-4f);
  EXPECT_EQ(compute_scale(1e-4f, r), 448.0f / 1e-4f);
  EXPECT_EQ(compute_scale(2e-4f, r), 448.0f / 2e-4f);
  EXPECT_EQ(compute_scale(FLT_TRUE_MIN, r), 448.0f / 1e-4f);  // no overflow with a floor
  EXPECT_EQ(compute_scale(3.0f, r), 448.0f / 3.0f);
}

TEST(Scale, MarginIsAnExactPowerOfTwo) {
  for (int m = 0; m <= 64; ++m) {
    const float s = compute_scale(3.0f, rule(Fp8Format::kE4M3, ScaleRounding::kExact, 0.0f, m));
    EXPECT_EQ(s, std::ldexp(448.0f / 3.0f, -m)) << m;
  }
  EXPECT_EQ(compute_scale(1.0f, rule(Fp8Format::kE4M3, ScaleRounding::kExact, 0.0f, 2)), 112.0f);
  EXPECT_EQ(compute_scale(1.0f, rule(Fp8Format::kE4M3, ScaleRounding::kPow2, 0.0f, 1)), 128.0f);
  // An overflowing quotient stays FLT_MAX (documented), a margin does not bring infinity back.
  EXPECT_EQ(compute_scale(1e-40f, rule(Fp8Format::kE4M3, ScaleRounding::kExact, 0.0f, 3)), FLT_MAX);
  // A margin that would push the scale below the normal range is clamped there, keeping 1/s finite.
  const float s = compute_scale(FLT_MAX, rule(Fp8Format::kE4M3, ScaleRounding::kExact, 0.0f, 64));
  EXPECT_EQ(s, FLT_MIN);
  EXPECT_EQ(scale_inverse(s), 0x1p126f);
  // Margins beyond the exponent range (no single FP32 factor 2^-margin exists) still scale exactly
  // while the result is normal, and clamp after.
  const float big = compute_scale(FLT_TRUE_MIN, rule(Fp8Format::kE4M3));  // FLT_MAX
  EXPECT_EQ(compute_scale(FLT_TRUE_MIN, rule(Fp8Format::kE4M3, ScaleRounding::kExact, 0.0f, 127)),
            big);
  EXPECT_EQ(compute_scale(FLT_TRUE_MIN, rule(Fp8Format::kE4M3, ScaleRounding::kPow2, 0.0f, 127)),
            0x1p127f);
  EXPECT_EQ(compute_scale(0x1p-100f, rule(Fp8Format::kE4M3, ScaleRounding::kPow2, 0.0f, 127)),
            0x1p-19f);
  EXPECT_EQ(compute_scale(0x1p-100f, rule(Fp8Format::kE4M3, ScaleRounding::kPow2, 0.0f, 200)),
            0x1p-92f);
  EXPECT_EQ(compute_scale(0x1p-100f, rule(Fp8Format::kE4M3, ScaleRounding::kPow2, 0.0f, 300)),
            FLT_MIN);
  EXPECT_EQ(compute_scale(1.0f, rule(Fp8Format::kE4M3, ScaleRounding::kPow2, 0.0f, 1 << 30)),
            FLT_MIN);
}

// The pow2 rule takes the power of two from amax's exponent and one significand compare
// (pow2_scale, subnormal amaxes included) instead of dividing, and its inverse from the exponent
// (pow2_scale_inverse); both must give the division's bits for every amax and sign:
// reference = the exact rule's quotient rounded down to a power of two, as compute_scale did it.
float pow2_by_division(float amax, Fp8Format f, float eps) {
  const float s = compute_scale(amax, rule(f, ScaleRounding::kExact, eps));
  const float p = bits_float(float_bits(s) & 0xFF800000u);
  return p < FLT_MIN ? FLT_MIN : p;
}

TEST(Scale, Pow2WithoutDivisionGivesTheDivisionsBits) {
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    for (float eps : {0.0f, 1e-4f, FLT_MIN, 1e-40f}) {
      const ScaleRule r = rule(f, ScaleRounding::kPow2, eps);
      int64_t bad = 0;
      auto check = [&](uint32_t bits) {
        const float a = bits_float(bits);
        const float want = pow2_by_division(a, f, eps);
        for (float x : {a, -a}) {
          const float s = compute_scale(x, r);
          if ((float_bits(s) != float_bits(want) ||
               float_bits(pow2_scale_inverse(s)) != float_bits(1.0f / want)) &&
              ++bad <= 5)
            ADD_FAILURE() << format_name(f) << " eps " << eps << " amax bits 0x" << std::hex
                          << float_bits(x) << ": " << s << " vs " << want;
        }
      };
      // Every significand at a few exponents (subnormal, small, 1, large, the top binade).
      for (uint32_t exp : {0u, 1u, 100u, 127u, 200u, 254u})
        for (uint32_t m = 0; m < (1u << 23); m += exp == 127u ? 1u : 7u) check(exp << 23 | m);
      // Every exponent at the significands around 1.75, where the quotient changes binade.
      for (uint32_t exp = 0; exp <= 254; ++exp)
        for (uint32_t m : {0u, 1u, 0x5FFFFFu, 0x600000u, 0x600001u, 0x7FFFFEu, 0x7FFFFFu})
          check(exp << 23 | m);
      // Zero, inf and NaNs: scale 1.
      for (uint32_t bits : {0u, 0x7F800000u, 0x7FC00000u, 0x7F800001u, 0x7FFFFFFFu}) check(bits);
      EXPECT_EQ(bad, 0);
    }
  }
}

TEST(Scale, AmaxSignIsIgnored) {
  for (float a : {3.0f, 1e-30f, FLT_TRUE_MIN, 448.0f})
    for (ScaleRounding r : {ScaleRounding::kExact, ScaleRounding::kPow2})
      EXPECT_EQ(compute_scale(-a, rule(Fp8Format::kE4M3, r)),
                compute_scale(a, rule(Fp8Format::kE4M3, r)))
          << a;
}

TEST(Scale, Pow2IsExactRoundDown) {
  const ScaleRule p2 = rule(Fp8Format::kE4M3, ScaleRounding::kPow2);
  EXPECT_EQ(compute_scale(1.0f, p2), 256.0f);
  EXPECT_EQ(compute_scale(448.0f, p2), 1.0f);
  EXPECT_EQ(compute_scale(449.0f, p2), 0.5f);
  EXPECT_EQ(compute_scale(3.0f, p2), 128.0f);
  EXPECT_EQ(compute_scale(3.5f, p2), 128.0f);  // 448 / 3.5 = 128 exactly
  std::mt19937 rng(3);
  for (int i = 0; i < 200000; ++i) {
    // amax over every positive finite FP32 pattern, subnormals included.
    const float amax = bits_float(rng() % 0x7F800000u);
    for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
      const float exact = compute_scale(amax, rule(f));
      const float p = compute_scale(amax, rule(f, ScaleRounding::kPow2));
      ASSERT_TRUE(is_pow2(p)) << amax;
      ASSERT_LE(p, exact) << amax;
      ASSERT_GT(2.0 * p, double{exact}) << amax;
      // Round-down keeps amax * scale within the format: nothing saturates under a pow2 scale. (The
      // correctly rounded quotient cannot round up onto a power of two from below: fp8_max = 1.75 *
      // 2^k leaves no FP32 amax close enough.)
      if (amax != 0) {
        ASSERT_LE(double{amax} * p, double{fp8_max(f)}) << amax;
      }
    }
  }
}

TEST(Scale, ExactQuotientIsCorrectlyRounded) {
  std::mt19937 rng(5);
  for (int i = 0; i < 200000; ++i) {
    const float amax = bits_float(0x00800000u + rng() % (0x7F800000u - 0x00800000u));
    for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
      const float s = compute_scale(amax, rule(f));
      if (s == FLT_MAX) continue;  // overflow, checked above
      ASSERT_TRUE(is_correctly_rounded_quotient(s, fp8_max(f), amax)) << amax;
      ASSERT_TRUE(is_correctly_rounded_quotient(scale_inverse(s), 1.0f, s)) << s;
    }
  }
}

// scale_inverse writes 2^-e for a power of two instead of dividing: the division's bits.
TEST(Scale, ScaleInverseOfPowersOfTwoIsExact) {
  for (int e = -126; e <= 127; ++e) {
    const float s = std::ldexp(1.0f, e);
    EXPECT_EQ(scale_inverse(s), std::ldexp(1.0f, -e)) << e;  // 2^-127 is subnormal and still exact
    EXPECT_EQ(float_bits(scale_inverse(s)), float_bits(rn::div(1.0f, s))) << e;
  }
  for (float s : {3.0f, 448.0f / 3.0f, FLT_MAX, 1e-30f, 0.1f, 1e-40f})
    EXPECT_EQ(float_bits(scale_inverse(s)), float_bits(rn::div(1.0f, s))) << s;
}

// No input of any kind gives a NaN, infinite or zero scale or scale_inv.
TEST(Scale, AlwaysFiniteAndPositive) {
  std::mt19937 rng(9);
  const float eps_values[] = {0.0f, 1e-4f, FLT_TRUE_MIN, 1.0f, 1e30f};
  std::vector<float> amaxes = {0.0f,    -0.0f,    kInf,     -kInf,        kNaN,
                               FLT_MAX, -FLT_MAX, FLT_MIN,  FLT_TRUE_MIN, -1.0f,
                               1.0f,    448.0f,   57344.0f, 3e38f,        1e-38f};
  while (amaxes.size() < 20000) amaxes.push_back(bits_float(static_cast<uint32_t>(rng())));
  for (float amax : amaxes) {
    for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2})
      for (ScaleRounding r : {ScaleRounding::kExact, ScaleRounding::kPow2})
        for (float eps : eps_values)
          for (int margin : {0, 1, 7, 64, 126, 127, 128, 129, 200, 1000}) {
            const float s = compute_scale(amax, rule(f, r, eps, margin));
            const float inv = scale_inverse(s);
            ASSERT_TRUE(std::isfinite(s) && s > 0)
                << amax << " eps " << eps << " margin " << margin;
            ASSERT_TRUE(std::isfinite(inv) && inv > 0)
                << amax << " eps " << eps << " margin " << margin;
            if (r == ScaleRounding::kPow2) {
              ASSERT_TRUE(is_pow2(s)) << amax;
            }
          }
  }
}

TEST(Scale, QuantizeValueRoundsTheProductToFp32First) {
  // x * s = 1.0625 + 2^-27 - 2^-46 exactly, just above the E4M3 tie between 1 and 1.125; the FP32
  // product is the tie itself, which rounds to the even 1.0. A single rounding would give 1.125.
  const float x = std::nextafter(1.0625f, 0.0f), s = 1.0f + 0x1p-23f;
  EXPECT_EQ(rn::mul(x, s), 1.0625f);
  EXPECT_EQ(quantize_value(x, s, Fp8Format::kE4M3), 0x38);
  EXPECT_EQ(quantize_value(5.0f, 100.0f, Fp8Format::kE4M3), 0x7E);  // 500 saturates
  EXPECT_EQ(quantize_value(2.0f, 100.0f, Fp8Format::kE5M2), float_to_e5m2(200.0f));
  EXPECT_EQ(quantize_value(-0.0f, 3.0f, Fp8Format::kE4M3), 0x80);
  EXPECT_EQ(quantize_value(kInf, 1.0f, Fp8Format::kE5M2), 0x7B);
  EXPECT_EQ(quantize_value(kNaN, 1.0f, Fp8Format::kE4M3) & 0x7F, 0x7F);
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(fp8_to_float(static_cast<uint8_t>(c), Fp8Format::kE4M3),
              e4m3_to_float(static_cast<uint8_t>(c)));
    EXPECT_EQ(float_to_fp8(e4m3_to_float(static_cast<uint8_t>(c)), Fp8Format::kE4M3), c);
  }
}

TEST(Scale, AbsBitsOrdersNaNAboveInfinity) {
  EXPECT_EQ(abs_bits(-2.0f), float_bits(2.0f));
  EXPECT_GT(abs_bits(kNaN), abs_bits(kInf));
  EXPECT_GT(abs_bits(-kNaN), abs_bits(-kInf));
  EXPECT_GT(abs_bits(bits_float(0x7F800001u)), abs_bits(kInf));
  EXPECT_GT(abs_bits(kInf), abs_bits(FLT_MAX));
  EXPECT_GT(abs_bits(FLT_TRUE_MIN), abs_bits(-0.0f));
}

}  // namespace
}  // namespace octet
