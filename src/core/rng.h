// Counter-based random numbers: Philox-4x32-10 (J. K. Salmon, M. A. Moraes, R. O. Dror, D. E. Shaw,
// "Parallel random numbers: as easy as 1, 2, 3", SC'11), for host and device code alike.
//
// A counter-based generator is a pure function, bits = philox(counter, key): nothing carries over
// from one draw to the next, so element i of a tensor can be drawn by whichever thread owns it, in
// any order, and the same (seed, stream, index) gives the same bits on every platform (the
// algorithm is 32-bit integer multiplies, xors and adds only).
//
// octet's use of Philox's 128-bit counter and 64-bit key:
//   key     = {seed low 32 bits, seed high 32 bits}
//   counter = {block low, block high, stream low, stream high},  block = index / 4
// One Philox call yields four 32-bit words, which serve the four consecutive indices 4b .. 4b+3.
// A stream is a 64-bit id, e.g. stream_id(tensor name); Rng::split derives child streams.
//
// The views of index i (u32, uniform, uniform_nonzero, normal) all read words of block i / 4, so
// one stream should be read through one view only (split it for a second one); otherwise the
// values of different views are correlated.
//
// Normals (Box-Muller): from the word pair (w0, w1) of a block, u1 = (w0 + 1) * 2^-32 in (0, 1]
// and theta = 2 pi w1 * 2^-32 give z0 = r cos(theta), z1 = r sin(theta) with r = sqrt(-2 ln u1);
// the pair (w2, w3) gives the next two. Computed in FP64. The integer and uniform outputs are
// exact everywhere; the normals go through log, cos and sin, which no libm rounds correctly in
// every case, so a host library and CUDA's may differ by an FP64 ulp. That changes the FP32 value
// (or the FP32 product std * z that init rounds once) only when the FP64 result lies within an
// ulp of an FP32 rounding boundary, about one draw in 2^28; on one platform the results are
// bitwise reproducible. The 32-bit u1 bounds |z| by sqrt(64 ln 2) ~ 6.66, which truncates a tail
// of probability ~3e-11: irrelevant for initialisation and dropout.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/hd.h"

namespace octet {

struct PhiloxCounter {
  uint32_t w[4];
};
struct PhiloxKey {
  uint32_t w[2];
};

// Multipliers and Weyl key increments of Philox-4x32 (Salmon et al. 2011, table 2 and section
// 4.2: the increments are the golden ratio and sqrt(3) - 1 in 0.32 fixed point).
inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
inline constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
inline constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;
inline constexpr int kPhiloxRounds = 10;  // the paper's recommended count ("Philox-4x32-10")

// One Philox-4x32 round: two 32x32->64 multiplies whose high halves are xored with the other two
// words and the round key, followed by the fixed word permutation of the paper.
OCTET_HD PhiloxCounter philox4x32_round(PhiloxCounter x, PhiloxKey k) {
  const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * x.w[0];
  const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * x.w[2];
  PhiloxCounter y;
  y.w[0] = static_cast<uint32_t>(p1 >> 32) ^ x.w[1] ^ k.w[0];
  y.w[1] = static_cast<uint32_t>(p1);
  y.w[2] = static_cast<uint32_t>(p0 >> 32) ^ x.w[3] ^ k.w[1];
  y.w[3] = static_cast<uint32_t>(p0);
  return y;
}

// Philox-4x32-10 of one counter: the key is bumped by the Weyl increments between rounds.
OCTET_HD PhiloxCounter philox4x32_10(PhiloxCounter ctr, PhiloxKey key) {
  for (int r = 0; r < kPhiloxRounds; ++r) {
    if (r > 0) {
      key.w[0] += kPhiloxW0;
      key.w[1] += kPhiloxW1;
    }
    ctr = philox4x32_round(ctr, key);
  }
  return ctr;
}

// FNV-1a, 64-bit (offset basis and prime of the FNV specification): a stable hash of a name,
// the same on every platform and compiler, to serve as a stream id.
OCTET_HD constexpr uint64_t fnv1a64(const char* s, size_t n) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<uint8_t>(s[i]);
    h *= 0x100000001B3ull;
  }
  return h;
}

// The stream of the thing called `name` (a tensor, say): its values then depend on the seed and
// the name only, never on what else is drawn or in which order.
inline constexpr uint64_t stream_id(std::string_view name) {
  return fnv1a64(name.data(), name.size());
}

// splitmix64's finaliser (Steele, Lea, Flood 2014; constants of Stafford's "mix13"): a bijection
// of 64-bit words that spreads every input bit over the output.
OCTET_HD constexpr uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

class Rng {
 public:
  OCTET_HD Rng(uint64_t seed, uint64_t stream) : seed_(seed), stream_(stream) {}

  OCTET_HD uint64_t seed() const { return seed_; }
  OCTET_HD uint64_t stream() const { return stream_; }

  // A child stream, a function of (stream, child) only. Children of different parents or with
  // different ids, and the parent itself, differ except with probability ~2^-64 per pair (the
  // stream space is hashed, not partitioned).
  OCTET_HD Rng split(uint64_t child) const {
    return Rng(seed_, mix64(stream_ + 0x9E3779B97F4A7C15ull * (child + 1)));
  }

  // The four words of block `b` (indices 4b .. 4b+3).
  OCTET_HD PhiloxCounter block(uint64_t b) const {
    const PhiloxCounter ctr = {{static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32),
                                static_cast<uint32_t>(stream_),
                                static_cast<uint32_t>(stream_ >> 32)}};
    const PhiloxKey key = {{static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32)}};
    return philox4x32_10(ctr, key);
  }

  OCTET_HD uint32_t u32(uint64_t i) const { return block(i >> 2).w[i & 3]; }

  // Uniform in [0, 1): the top 24 bits, so every value is an exact FP32 multiple of 2^-24.
  OCTET_HD static float uniform_from(uint32_t w) { return static_cast<float>(w >> 8) * 0x1p-24f; }
  // Uniform in (0, 1]: safe as the argument of a logarithm.
  OCTET_HD static float uniform_nonzero_from(uint32_t w) {
    return static_cast<float>((w >> 8) + 1) * 0x1p-24f;
  }
  OCTET_HD float uniform(uint64_t i) const { return uniform_from(u32(i)); }
  OCTET_HD float uniform_nonzero(uint64_t i) const { return uniform_nonzero_from(u32(i)); }

  // Standard normals of indices 4b .. 4b+3, in FP64 (see the top of this file).
  OCTET_HD void normal4(uint64_t b, double z[4]) const {
    const PhiloxCounter w = block(b);
    for (int p = 0; p < 2; ++p) {
      const double u1 = (static_cast<double>(w.w[2 * p]) + 1.0) * 0x1p-32;
      const double theta = 6.283185307179586 * (static_cast<double>(w.w[2 * p + 1]) * 0x1p-32);
      const double r = ::sqrt(-2.0 * ::log(u1));
      z[2 * p] = r * ::cos(theta);
      z[2 * p + 1] = r * ::sin(theta);
    }
  }
  // One standard normal, rounded to FP32 (computes the whole block: use normal4 in loops).
  OCTET_HD float normal(uint64_t i) const {
    double z[4];
    normal4(i >> 2, z);
    return static_cast<float>(z[i & 3]);
  }

 private:
  uint64_t seed_;
  uint64_t stream_;
};

}  // namespace octet
