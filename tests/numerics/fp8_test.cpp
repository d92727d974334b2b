// Known values and edge cases of every number format in numerics/fp8.h: E4M3fn, E5M2, E8M0, BF16
// and the emulated E5M6. The exhaustive comparison with ml_dtypes over all FP32 inputs lives in
// fp8_exhaustive.py; these tests pin down the cases a reader checks by hand (boundaries, ties,
// saturation, signed zero, NaN) and compare against a reference built from the formats'
// definitions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "numerics/fp8.h"

namespace octet {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float next_up(float x) {
  return std::nextafter(x, kInf);
}
float next_down(float x) {
  return std::nextafter(x, -kInf);
}

bool e4m3_is_nan(uint8_t c) {
  return (c & 0x7F) == 0x7F;
}
bool e5m2_is_nan(uint8_t c) {
  return (c & 0x7F) > 0x7C;
}

// Non-negative finite values of a format, indexed by code, from the definition (sign, biased
// exponent, mantissa with an implicit leading one for normals), independent of fp8.h's bit
// manipulation.
std::vector<double> finite_values(int exp_bits, int man_bits, bool ieee) {
  const int bias = (1 << (exp_bits - 1)) - 1;
  const int codes = ieee ? ((1 << exp_bits) - 1) << man_bits : (1 << (exp_bits + man_bits)) - 1;
  std::vector<double> v;
  for (int c = 0; c < codes; ++c) {
    const int e = c >> man_bits, m = c & ((1 << man_bits) - 1);
    v.push_back(e == 0 ? std::ldexp(m, 1 - bias - man_bits)
                       : std::ldexp((1 << man_bits) + m, e - bias - man_bits));
  }
  return v;
}

// Round-to-nearest-even with saturation over that table: the nearest value, the even code on a tie.
uint32_t nearest_code(double x, const std::vector<double>& v, uint32_t sign_bit) {
  const uint32_t sign = std::signbit(x) ? sign_bit : 0u;
  const double a = std::fabs(x);
  if (a >= v.back()) return sign | static_cast<uint32_t>(v.size() - 1);
  const size_t hi = static_cast<size_t>(std::upper_bound(v.begin(), v.end(), a) - v.begin());
  const size_t lo = hi - 1;
  const double dlo = a - v[lo], dhi = v[hi] - a;
  const size_t c = dlo < dhi ? lo : (dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi));
  return sign | static_cast<uint32_t>(c);
}

// Random FP32 values spread over every binade, both signs, plus the subnormals.
std::vector<float> random_floats(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> v;
  for (int i = 0; i < n; ++i) v.push_back(bits_float(static_cast<uint32_t>(rng()) & 0xFFFFFFFFu));
  return v;
}

// ---------------------------------------------------------------------------------------------------
// E4M3fn

TEST(Fp8E4M3, KnownValues) {
  EXPECT_EQ(float_to_e4m3(1.0f), 0x38);
  EXPECT_EQ(float_to_e4m3(-2.0f), 0xC0);
  EXPECT_EQ(float_to_e4m3(448.0f), 0x7E);  // max finite: S.1111.110
  EXPECT_EQ(float_to_e4m3(-448.0f), 0xFE);
  EXPECT_EQ(float_to_e4m3(0x1p-6f), 0x08);      // min normal
  EXPECT_EQ(float_to_e4m3(0x1p-9f), 0x01);      // min subnormal
  EXPECT_EQ(float_to_e4m3(7 * 0x1p-9f), 0x07);  // max subnormal
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), 0x1p-9f);
  EXPECT_EQ(e4m3_to_float(0x08), 0x1p-6f);
  EXPECT_EQ(e4m3_to_float(0x07), 7 * 0x1p-9f);
  EXPECT_EQ(e4m3_to_float(0xB9), -1.125f);
  EXPECT_EQ(kE4M3Format.max_code(), 0x7Eu);
  EXPECT_EQ(kE4M3Format.nan_code(), 0x7Fu);
}

TEST(Fp8E4M3, SignedZeroAndUnderflow) {
  EXPECT_EQ(float_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(float_to_e4m3(-0x1p-12f), 0x80);  // underflows to zero, keeps the sign
  EXPECT_EQ(float_to_e4m3(-FLT_TRUE_MIN), 0x80);
  EXPECT_TRUE(std::signbit(e4m3_to_float(0x80)));
  EXPECT_EQ(e4m3_to_float(0x80), 0.0f);
}

TEST(Fp8E4M3, TiesToEvenAtSubnormals) {
  EXPECT_EQ(float_to_e4m3(0x1p-10f), 0x00);           // half the min subnormal: tie to 0
  EXPECT_EQ(float_to_e4m3(next_up(0x1p-10f)), 0x01);  // just above: rounds up
  EXPECT_EQ(float_to_e4m3(3 * 0x1p-10f), 0x02);       // 1.5 units: tie to 2
  EXPECT_EQ(float_to_e4m3(5 * 0x1p-10f), 0x02);       // 2.5 units: tie to 2
  EXPECT_EQ(float_to_e4m3(next_up(5 * 0x1p-10f)), 0x03);
  // 7.5 units sits between the largest subnormal (7, odd) and the smallest normal (8): up into
  // normals.
  EXPECT_EQ(float_to_e4m3(15 * 0x1p-10f), 0x08);
  EXPECT_EQ(float_to_e4m3(next_down(15 * 0x1p-10f)), 0x07);
}

TEST(Fp8E4M3, TiesToEvenAtNormals) {
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);  // between 1 (even) and 1.125
  EXPECT_EQ(float_to_e4m3(next_up(1.0625f)), 0x39);
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3A);  // between 1.125 (odd) and 1.25
  EXPECT_EQ(float_to_e4m3(next_down(1.1875f)), 0x39);
  // The tie between the largest mantissa of a binade and the next power of two carries into the
  // exponent.
  EXPECT_EQ(float_to_e4m3(1.9375f), 0x40);
  EXPECT_EQ(float_to_e4m3(1.95f), 0x40);
  EXPECT_EQ(float_to_e4m3(next_down(1.9375f)), 0x3F);
  EXPECT_EQ(float_to_e4m3(-0x1.fp-6f), 0x90);  // the same tie in the smallest normal binade
  EXPECT_EQ(e4m3_to_float(0x90), -0x1p-5f);
}

TEST(Fp8E4M3, Saturation) {
  EXPECT_EQ(float_to_e4m3(464.0f), 0x7E);  // would round to 480, which is the NaN encoding
  EXPECT_EQ(float_to_e4m3(next_down(464.0f)), 0x7E);
  EXPECT_EQ(float_to_e4m3(480.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(1e9f), 0x7E);
  EXPECT_EQ(float_to_e4m3(FLT_MAX), 0x7E);
  EXPECT_EQ(float_to_e4m3(-FLT_MAX), 0xFE);
  EXPECT_EQ(float_to_e4m3(kInf), 0x7E);  // satfinite: infinities saturate too
  EXPECT_EQ(float_to_e4m3(-kInf), 0xFE);
}

TEST(Fp8E4M3, NaN) {
  EXPECT_TRUE(e4m3_is_nan(float_to_e4m3(kNaN)));
  EXPECT_TRUE(e4m3_is_nan(float_to_e4m3(-kNaN)));
  EXPECT_TRUE(e4m3_is_nan(float_to_e4m3(bits_float(0x7F800001u))));  // signalling, tiny payload
  EXPECT_TRUE(e4m3_is_nan(float_to_e4m3(bits_float(0xFFFFFFFFu))));
  // fp8.h: the positive all-ones code whatever the input's sign, as the hardware conversion gives.
  EXPECT_EQ(float_to_e4m3(bits_float(0x7FC00000u)), 0x7F);
  EXPECT_EQ(float_to_e4m3(bits_float(0xFFC00000u)), 0x7F);
  EXPECT_EQ(float_to_e4m3(bits_float(0xFF800001u)), 0x7F);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
}

TEST(Fp8E4M3, DecodeMatchesDefinitionAndRoundTrips) {
  const std::vector<double> v = finite_values(4, 3, /*ieee=*/false);
  ASSERT_EQ(v.size(), 127u);
  EXPECT_EQ(v.back(), 448.0);
  for (uint32_t c = 0; c < 256; ++c) {
    if (e4m3_is_nan(static_cast<uint8_t>(c))) continue;
    const double want = (c & 0x80 ? -1.0 : 1.0) * v[c & 0x7F];
    const float got = e4m3_to_float(static_cast<uint8_t>(c));
    EXPECT_EQ(static_cast<double>(got), want) << "code " << c;
    EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << "code " << c;
    EXPECT_EQ(float_to_e4m3(got), c) << "code " << c;
  }
}

// ---------------------------------------------------------------------------------------------------
// E5M2

TEST(Fp8E5M2, KnownValuesAndEdges) {
  EXPECT_EQ(float_to_e5m2(1.0f), 0x3C);
  EXPECT_EQ(float_to_e5m2(57344.0f), 0x7B);
  EXPECT_EQ(float_to_e5m2(0x1p-14f), 0x04);  // min normal
  EXPECT_EQ(float_to_e5m2(0x1p-16f), 0x01);  // min subnormal
  EXPECT_EQ(float_to_e5m2(0x1p-17f), 0x00);  // tie to 0
  EXPECT_EQ(float_to_e5m2(3 * 0x1p-17f), 0x02);
  EXPECT_EQ(float_to_e5m2(7 * 0x1p-17f), 0x04);  // 3.5 units: up into the normal range
  EXPECT_EQ(float_to_e5m2(1.125f), 0x3C);        // tie between 1 (even) and 1.25
  EXPECT_EQ(float_to_e5m2(1.375f), 0x3E);        // tie between 1.25 (odd) and 1.5
  EXPECT_EQ(float_to_e5m2(1.875f), 0x40);        // tie carries into 2
  EXPECT_EQ(float_to_e5m2(-0.0f), 0x80);
  EXPECT_EQ(e5m2_to_float(0x7B), 57344.0f);
  EXPECT_EQ(e5m2_to_float(0x01), 0x1p-16f);
  EXPECT_EQ(e5m2_to_float(0x7C), kInf);
  EXPECT_EQ(e5m2_to_float(0xFC), -kInf);
  for (uint8_t c : {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF})
    EXPECT_TRUE(std::isnan(e5m2_to_float(c))) << int(c);
  EXPECT_EQ(kE5M2Format.max_code(), 0x7Bu);
}

TEST(Fp8E5M2, SaturationAndNaN) {
  EXPECT_EQ(float_to_e5m2(61440.0f), 0x7B);  // the tie with 65536 would round to infinity
  EXPECT_EQ(float_to_e5m2(1e6f), 0x7B);
  EXPECT_EQ(float_to_e5m2(kInf), 0x7B);  // satfinite: inf -> max
  EXPECT_EQ(float_to_e5m2(-kInf), 0xFB);
  EXPECT_TRUE(e5m2_is_nan(float_to_e5m2(kNaN)));
  EXPECT_TRUE(e5m2_is_nan(float_to_e5m2(bits_float(0x7F800001u))));
  EXPECT_TRUE(e5m2_is_nan(float_to_e5m2(-kNaN)));
  EXPECT_EQ(float_to_e5m2(bits_float(0xFFC00000u)), 0x7F);  // positive all-ones code, as for E4M3
}

TEST(Fp8E5M2, DecodeMatchesDefinitionAndRoundTrips) {
  const std::vector<double> v = finite_values(5, 2, /*ieee=*/true);
  ASSERT_EQ(v.size(), 124u);
  EXPECT_EQ(v.back(), 57344.0);
  for (uint32_t c = 0; c < 256; ++c) {
    if ((c & 0x7F) >= 0x7C) continue;  // inf and NaN
    const float got = e5m2_to_float(static_cast<uint8_t>(c));
    EXPECT_EQ(static_cast<double>(got), (c & 0x80 ? -1.0 : 1.0) * v[c & 0x7F]) << "code " << c;
    EXPECT_EQ(float_to_e5m2(got), c) << "code " << c;
  }
}

// Both FP8 formats against the table's nearest-even search, on random FP32 inputs from every binade
// and on the midpoints between neighbouring codes (the ties) and their FP32 neighbours.
TEST(Fp8, EncodeMatchesNearestEvenReference) {
  struct F {
    ExMyFormat fmt;
    bool ieee;
  };
  for (const F f : {F{kE4M3Format, false}, F{kE5M2Format, true}}) {
    const std::vector<double> v = finite_values(f.fmt.exp_bits, f.fmt.man_bits, f.ieee);
    std::vector<float> xs = random_floats(200000, 7);
    for (size_t c = 0; c + 1 < v.size(); ++c) {
      const float mid =
          static_cast<float>((v[c] + v[c + 1]) / 2);  // exact: one more bit than the format
      for (float x : {mid, next_up(mid), next_down(mid), -mid, static_cast<float>(v[c])})
        xs.push_back(x);
    }
    for (float x : xs) {
      if (std::isnan(x)) continue;
      const uint32_t want = nearest_code(x, v, f.fmt.sign_bit());
      ASSERT_EQ(encode_exmy(x, f.fmt), want)
          << "x = " << x << " (e" << f.fmt.exp_bits << "m" << f.fmt.man_bits << ")";
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// E8M0

TEST(E8M0, Decode) {
  EXPECT_EQ(e8m0_to_float(127), 1.0f);
  EXPECT_EQ(e8m0_to_float(128), 2.0f);
  EXPECT_EQ(e8m0_to_float(254), 0x1p127f);
  EXPECT_EQ(e8m0_to_float(1), 0x1p-126f);
  EXPECT_EQ(e8m0_to_float(0), 0x1p-127f);  // an FP32 subnormal, still exact
  EXPECT_TRUE(std::isnan(e8m0_to_float(255)));
  for (int c = 0; c < 255; ++c)
    EXPECT_EQ(e8m0_to_float(static_cast<uint8_t>(c)), std::ldexp(1.0f, c - 127));
}

TEST(E8M0, EncodeRoundingModes) {
  using R = E8M0Rounding;
  struct Case {
    float x;
    uint8_t down, up, nearest;
  };
  const Case cases[] = {
      {1.0f, 127, 127, 127},
      {1.25f, 127, 128, 127},
      {1.5f, 127, 128, 128},  // the midpoint ties to the even code 128
      {3.0f, 128, 129, 128},  // the midpoint ties to the even code 128
      {1.75f, 127, 128, 128},
      {next_down(2.0f), 127, 128, 128},
      {0x1p127f, 254, 254, 254},
      {0x1.8p127f, 254, 254, 254},  // beyond 2^127 saturates
      {FLT_MAX, 254, 254, 254},
      {kInf, 254, 254, 254},
      {0x1p-126f, 1, 1, 1},
      {next_down(0x1p-126f), 0, 1, 1},  // largest FP32 subnormal
      {0x1p-127f, 0, 0, 0},
      {0x1.8p-127f, 0, 1, 0},  // midpoint of codes 0 and 1: even code 0
      {next_up(0x1.8p-127f), 0, 1, 1},
      {FLT_TRUE_MIN, 0, 0, 0},  // below 2^-127: clamped to the smallest code
  };
  for (const Case& c : cases) {
    EXPECT_EQ(float_to_e8m0(c.x, R::kDown), c.down) << c.x;
    EXPECT_EQ(float_to_e8m0(c.x, R::kUp), c.up) << c.x;
    EXPECT_EQ(float_to_e8m0(c.x, R::kNearestEven), c.nearest) << c.x;
  }
  for (float bad : {0.0f, -0.0f, -1.0f, -kInf, kNaN})
    for (R m : {R::kDown, R::kUp, R::kNearestEven}) EXPECT_EQ(float_to_e8m0(bad, m), 0xFF) << bad;
}

TEST(E8M0, EncodeBracketsTheInput) {
  for (float x : random_floats(100000, 11)) {
    x = std::fabs(x);
    if (!(x >= 0x1p-127f && x <= 0x1p127f)) continue;
    const float down = e8m0_to_float(float_to_e8m0(x, E8M0Rounding::kDown));
    const float up = e8m0_to_float(float_to_e8m0(x, E8M0Rounding::kUp));
    const float near = e8m0_to_float(float_to_e8m0(x, E8M0Rounding::kNearestEven));
    ASSERT_LE(down, x);
    ASSERT_GE(up, x);
    ASSERT_TRUE(up == down || up == 2 * down) << x;
    ASSERT_TRUE(near == down || near == up) << x;
    const double other = near == up ? down : up;
    ASSERT_LE(std::fabs(double{near} - x), std::fabs(other - x)) << x;
  }
}

// ---------------------------------------------------------------------------------------------------
// BF16

TEST(Bf16, RoundingAndSpecials) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(bits_float(0x3F808000u)), 0x3F80);  // tie: even 0x3F80
  EXPECT_EQ(float_to_bf16(bits_float(0x3F818000u)), 0x3F82);  // tie: even 0x3F82
  EXPECT_EQ(float_to_bf16(bits_float(0x3F808001u)), 0x3F81);
  EXPECT_EQ(float_to_bf16(bits_float(0x3F807FFFu)), 0x3F80);
  EXPECT_EQ(float_to_bf16(bits_float(0x3FFF8000u)), 0x4000);  // tie carries into the exponent
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(bits_float(0x00008000u)), 0x0000);  // subnormal tie to even
  EXPECT_EQ(float_to_bf16(bits_float(0x00018000u)), 0x0002);
  EXPECT_EQ(float_to_bf16(kInf), 0x7F80);
  EXPECT_EQ(float_to_bf16(-kInf), 0xFF80);
  EXPECT_EQ(float_to_bf16(bits_float(0x7F7F7FFFu)), 0x7F7F);  // largest BF16
  EXPECT_EQ(float_to_bf16(bits_float(0x7F7F8000u)),
            0x7F80);  // BF16 does not saturate: overflows to inf
  EXPECT_EQ(float_to_bf16(FLT_MAX), 0x7F80);
  // A NaN whose payload lies only in the low half would truncate to inf; it must stay NaN.
  for (uint32_t nan : {0x7F800001u, 0xFF800001u, 0x7FC00000u, 0xFFFFFFFFu}) {
    const uint16_t b = float_to_bf16(bits_float(nan));
    EXPECT_GT(b & 0x7FFF, 0x7F80) << std::hex << nan;
    EXPECT_EQ(b & 0x8000, (nan >> 16) & 0x8000) << std::hex << nan;  // sign kept on the host
  }
  EXPECT_EQ(bf16_to_float(0x3F80), 1.0f);
  EXPECT_TRUE(std::isnan(bf16_to_float(0x7FC1)));
  EXPECT_EQ(bf16_to_float(0xFF80), -kInf);
}

// ---------------------------------------------------------------------------------------------------
// E5M6 (DeepSeek-V3 storage), emulated by rounding through the generic ExMy code

TEST(E5M6, RangeAndSaturation) {
  EXPECT_EQ(decode_exmy(kE5M6Format.max_code(), kE5M6Format), 65024.0f);
  EXPECT_EQ(round_to_exmy(65024.0f, kE5M6Format), 65024.0f);
  EXPECT_EQ(round_to_exmy(65280.0f, kE5M6Format), 65024.0f);  // tie with 65536 (= inf) saturates
  EXPECT_EQ(round_to_exmy(65100.0f, kE5M6Format), 65024.0f);
  EXPECT_EQ(round_to_exmy(1e9f, kE5M6Format), 65024.0f);
  EXPECT_EQ(round_to_exmy(kInf, kE5M6Format), 65024.0f);
  EXPECT_EQ(round_to_exmy(-kInf, kE5M6Format), -65024.0f);
  EXPECT_TRUE(std::isnan(round_to_exmy(kNaN, kE5M6Format)));
  EXPECT_TRUE(std::signbit(round_to_exmy(-0.0f, kE5M6Format)));
  EXPECT_EQ(round_to_exmy(0x1p-20f, kE5M6Format), 0x1p-20f);  // min subnormal
  EXPECT_EQ(round_to_exmy(0x1p-21f, kE5M6Format), 0.0f);      // tie to 0
  EXPECT_EQ(round_to_exmy(3 * 0x1p-21f, kE5M6Format), 0x1p-19f);
}

TEST(E5M6, TiesToEven) {
  EXPECT_EQ(round_to_exmy(1.0f + 0x1p-7f, kE5M6Format), 1.0f);  // half a step of 2^-6
  EXPECT_EQ(round_to_exmy(1.0f + 3 * 0x1p-7f, kE5M6Format), 1.0f + 0x1p-5f);
  EXPECT_EQ(round_to_exmy(next_up(1.0f + 0x1p-7f), kE5M6Format), 1.0f + 0x1p-6f);
  EXPECT_EQ(round_to_exmy(2.0f - 0x1p-7f, kE5M6Format), 2.0f);  // carries into the next binade
  EXPECT_EQ(round_to_exmy(-1000.25f, kE5M6Format), -1000.0f);   // 1000 = 1.953125 * 2^9, step 8
}

TEST(E5M6, RepresentableValuesAreExactAndTheRestNearestEven) {
  const std::vector<double> v = finite_values(5, 6, /*ieee=*/true);
  EXPECT_EQ(v.back(), 65024.0);
  for (size_t c = 0; c < v.size(); ++c) {
    for (float s : {1.0f, -1.0f}) {
      const float x = s * static_cast<float>(v[c]);
      ASSERT_EQ(float_bits(round_to_exmy(x, kE5M6Format)), float_bits(x)) << x;
      ASSERT_EQ(decode_exmy(encode_exmy(x, kE5M6Format), kE5M6Format), x);
    }
  }
  for (float x : random_floats(200000, 13)) {
    if (std::isnan(x)) continue;
    const uint32_t code = nearest_code(x, v, kE5M6Format.sign_bit());
    ASSERT_EQ(encode_exmy(x, kE5M6Format), code) << x;
  }
}

// Formats at the edges of what fp8.h accepts (exp_bits <= 8, man_bits <= 23): the BF16-range E8M7
// must decode its subnormals, and E5M23 keeps every mantissa bit.
TEST(ExMy, WideFormats) {
  const ExMyFormat e8m7{8, 7, ExMyKind::kIeee};
  for (uint32_t c = 1; c < 128; ++c)
    ASSERT_EQ(decode_exmy(c, e8m7), bf16_to_float(static_cast<uint16_t>(c))) << c;
  for (float x : random_floats(100000, 17)) {
    if (std::isnan(x) || std::fabs(x) > bf16_to_float(0x7F7F)) continue;
    ASSERT_EQ(float_bits(round_to_exmy(x, e8m7)), float_bits(bf16_to_float(float_to_bf16(x)))) << x;
  }
  const ExMyFormat e5m23{5, 23, ExMyKind::kIeee};
  EXPECT_EQ(round_to_exmy(1.0f + 0x1p-23f, e5m23), 1.0f + 0x1p-23f);
  EXPECT_EQ(round_to_exmy(0x1p-20f, e5m23), 0x1p-20f);
}

}  // namespace
}  // namespace octet
