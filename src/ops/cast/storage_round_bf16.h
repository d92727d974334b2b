// Internal: round_to_storage's element (cast.h) for BF16 data, in integer operations on the BF16
// bits, for formats with 2 <= exp_bits <= 5 and 1 <= man_bits <= 7 (E5M6, E4M3, E5M2). It gives
// the bits of the reference, float_to_bf16(storage_round(x, 2^k, f)) (cast_backends.h), for every
// BF16 x and every tile scale 2^k that a tile holding x can get (tests/ops/cast_test.cpp checks
// all of them); the CUDA kernel uses it because the reference's generic ExMy encode and decode
// cost about ten times the instructions and bound the kernel.
//
// With a = |x|'s 15 bits and E their exponent field, the format's value grid at scale 2^k, seen
// from x (the reference's x * 2^k is exact, or below 2^-126 and rounds to zero either way), is:
//   normal     E >= 127 + emin - k (emin = 1 - bias): x's 7 mantissa bits rounded to man_bits, ties
//              to even, on the bits (a carry moves into the exponent), then capped at the format's
//              largest value times 2^-k. That cap is the reference's saturation (inf saturates
//              too); where it lies beyond BF16's range, a round-up may reach inf as the reference's
//              q * 2^-k does. Zero takes this branch (its rounding is 0).
//   subnormal  below that: x's significand counted in units of 2^(emin - man_bits - k), ties to
//              even, back to BF16 through an exact int-to-float conversion of the count (at most
//              man_bits + 1 bits) with the unit's exponent added to its exponent field.
//   NaN        0x7FFF: the reference decodes the format's NaN as +NaN and float_to_bf16 makes it
//              0x7FFF (on both backends).
// The sign is carried over unchanged (signed zeros included).
#pragma once

#include <cstdint>

#include "numerics/fp8.h"

namespace octet {

// The format's constants (storage_bf16_format).
struct StorageBf16Format {
  uint32_t drop = 0;       // 7 - man_bits: the mantissa bits rounded off in the normal range
  uint32_t round_add = 0;  // 2^(drop - 1) - 1, 0 when drop == 0
  uint32_t lsb_one = 0;    // 1 when drop > 0: the kept lowest bit breaks a tie
  uint32_t keep = 0;       // ~(2^drop - 1)
  int emin = 0;            // 1 - bias
  int man_bits = 0;
  uint32_t max_bits = 0;  // BF16 bits of the largest finite value (at most 8 significant bits)
};

// One tile's constants at scale 2^k (storage_bf16_tile).
struct StorageBf16Tile {
  uint32_t normal_min;  // (127 + emin - k) << 7: the smallest |x| bits in the normal branch
  uint32_t max_bits;    // the cap: max_bits - k * 2^7 (may lie above 0x7F80)
  uint32_t max_pair;    // min(the cap, 0x7FFF) in both halves (the same cap for a <= 0x7F80)
  int sub_shift;        // 134 + emin - man_bits - k: the significand's shift is this - max(E, 1)
  int sub_exp;          // emin - man_bits - k: the exponent of one unit below the normal range
};

// Per-half unsigned min, max and difference (mod 2^16) of two pairs of 16-bit values: one
// instruction each on the GPU (VIMNMX.U16x2, VIADD.16x2), per_half on the host.
template <typename Op>
OCTET_HD uint32_t per_half(uint32_t x, uint32_t y, Op op) {
  return (op(x & 0xFFFFu, y & 0xFFFFu) & 0xFFFFu) | (op(x >> 16, y >> 16) << 16);
}
OCTET_HD uint32_t min_u16x2(uint32_t x, uint32_t y) {
#if defined(__CUDA_ARCH__)
  return __vminu2(x, y);
#else
  return per_half(x, y, [](uint32_t a, uint32_t b) { return a < b ? a : b; });
#endif
}
OCTET_HD uint32_t max_u16x2(uint32_t x, uint32_t y) {
#if defined(__CUDA_ARCH__)
  return __vmaxu2(x, y);
#else
  return per_half(x, y, [](uint32_t a, uint32_t b) { return a > b ? a : b; });
#endif
}
OCTET_HD uint32_t sub_u16x2(uint32_t x, uint32_t y) {
#if defined(__CUDA_ARCH__)
  return __vsub2(x, y);
#else
  return per_half(x, y, [](uint32_t a, uint32_t b) { return a - b; });
#endif
}

OCTET_HD bool storage_bf16_supported(ExMyFormat f) {
  return f.exp_bits >= 2 && f.exp_bits <= 5 && f.man_bits >= 1 && f.man_bits <= 7;
}

OCTET_HD StorageBf16Format storage_bf16_format(ExMyFormat f) {
  StorageBf16Format g;
  g.drop = static_cast<uint32_t>(7 - f.man_bits);
  g.round_add = g.drop ? (1u << (g.drop - 1)) - 1u : 0u;
  g.lsb_one = g.drop ? 1u : 0u;
  g.keep = ~((1u << g.drop) - 1u);
  g.emin = 1 - f.bias();
  g.man_bits = f.man_bits;
  g.max_bits = float_bits(decode_exmy(f.max_code(), f)) >> 16;
  return g;
}

// scale: the tile's power of 2 from storage_tile_scale, 2^-126 <= scale <= 2^100.
OCTET_HD StorageBf16Tile storage_bf16_tile(const StorageBf16Format& g, float scale) {
  const int k = static_cast<int>(float_bits(scale) >> 23) - 127;
  StorageBf16Tile t;
  t.normal_min = static_cast<uint32_t>(127 + g.emin - k) << 7;  // >= 13 << 7: emin >= -14
  t.max_bits = static_cast<uint32_t>(static_cast<int>(g.max_bits) - k * 128);  // > 0: max >= 1
  t.max_pair = (t.max_bits < 0x7FFFu ? t.max_bits : 0x7FFFu) * 0x10001u;
  t.sub_shift = 134 + g.emin - g.man_bits - k;
  t.sub_exp = g.emin - g.man_bits - k;
  return t;
}

// The normal branch, for a == 0 or normal_min <= a <= 0x7F80 (|x|'s bits, no sign).
OCTET_HD uint32_t storage_bf16_normal(uint32_t a, const StorageBf16Format& g,
                                      const StorageBf16Tile& t) {
  const uint32_t r = (a + g.round_add + ((a >> g.drop) & g.lsb_one)) & g.keep;
  return r < t.max_bits ? r : t.max_bits;
}

// storage_bf16_normal on both halves of w (two BF16 values with their signs), each of which takes
// the normal branch: the rounding add cannot carry out of a half (a <= 0x7F80, the add <= 2^6).
OCTET_HD uint32_t storage_bf16_normal_pair(uint32_t w, const StorageBf16Format& g,
                                           const StorageBf16Tile& t) {
  const uint32_t a = w & 0x7FFF7FFFu;
  const uint32_t r = (a + g.round_add * 0x10001u + ((a >> g.drop) & (g.lsb_one * 0x10001u))) &
                     ((g.keep & 0xFFFFu) * 0x10001u);
  return (w & 0x80008000u) | min_u16x2(r, t.max_pair);
}

// Whether a (|x|'s bits) takes the normal branch.
OCTET_HD bool storage_bf16_is_normal(uint32_t a, const StorageBf16Tile& t) {
  return a - 1u >= t.normal_min - 1u && a <= 0x7F80u;
}

// Subnormal results and NaN: the branches that real data rarely takes.
OCTET_HD uint32_t storage_bf16_rare(uint32_t b, const StorageBf16Tile& t) {
  const uint32_t a = b & 0x7FFFu, sign = b & 0x8000u;
  if (a > 0x7F80u) return 0x7FFFu;
  const uint32_t e = a >> 7;
  const uint32_t m = e ? (a & 0x7Fu) | 0x80u : a;
  int sh = t.sub_shift - (e ? static_cast<int>(e) : 1);  // >= 1 below the normal range
  sh = sh < 9 ? sh : 9;                                  // m < 2^8: 9 already gives 0
  const uint32_t c = (m + (1u << (sh - 1)) - 1u + ((m >> sh) & 1u)) >> sh;
  if (c == 0) return sign;
  const uint32_t bits =
      float_bits(static_cast<float>(c)) + (static_cast<uint32_t>(t.sub_exp) << 23);
  return sign | (bits >> 16);
}

// b: x's BF16 bits -> the result's BF16 bits.
OCTET_HD uint32_t storage_round_bf16(uint32_t b, const StorageBf16Format& g,
                                     const StorageBf16Tile& t) {
  const uint32_t a = b & 0x7FFFu;
  if (storage_bf16_is_normal(a, t)) return (b & 0x8000u) | storage_bf16_normal(a, g, t);
  return storage_bf16_rare(b, t);
}

}  // namespace octet
