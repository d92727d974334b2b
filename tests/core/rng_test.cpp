// The counter-based generator: Philox-4x32-10 against the published known answers, octet's
// counter/key layout (pinned to those answers), the ranges of the uniforms, the moments of the
// normals over 1e6 draws, distinct and uncorrelated streams, and reproducibility.
#include "core/rng.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

namespace octet {
namespace {

struct Kat {
  PhiloxCounter ctr;
  PhiloxKey key;
  PhiloxCounter expected;
};

// Random123's tests/kat_vectors, the three "philox4x32 10" lines (Salmon et al. 2011): counter,
// key, expected output.
const Kat kKats[] = {
    {{{0x00000000, 0x00000000, 0x00000000, 0x00000000}},
     {{0x00000000, 0x00000000}},
     {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
    {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
     {{0xffffffff, 0xffffffff}},
     {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
    {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
     {{0xa4093822, 0x299f31d0}},
     {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
};

uint64_t join(uint32_t lo, uint32_t hi) {
  return static_cast<uint64_t>(hi) << 32 | lo;
}

TEST(Rng, PhiloxKnownAnswers) {
  for (const Kat& k : kKats) {
    const PhiloxCounter out = philox4x32_10(k.ctr, k.key);
    for (int j = 0; j < 4; ++j)
      EXPECT_EQ(out.w[j], k.expected.w[j])
          << "word " << j << " of KAT with ctr[0] " << std::hex << k.ctr.w[0];
  }
}

// key = {seed lo, seed hi}, counter = {block lo, block hi, stream lo, stream hi}: the known
// answers read through Rng.
TEST(Rng, CounterLayoutReproducesKnownAnswers) {
  for (const Kat& k : kKats) {
    const Rng rng(join(k.key.w[0], k.key.w[1]), join(k.ctr.w[2], k.ctr.w[3]));
    const uint64_t b = join(k.ctr.w[0], k.ctr.w[1]);
    const PhiloxCounter out = rng.block(b);
    for (int j = 0; j < 4; ++j) {
      EXPECT_EQ(out.w[j], k.expected.w[j]);
      // b * 4 wraps for the all-ones counter; block() itself is checked above.
      if (b < (uint64_t{1} << 62)) EXPECT_EQ(rng.u32(b * 4 + j), k.expected.w[j]);
    }
  }
  EXPECT_EQ(Rng(0, 0).u32(2), 0xbc57ac4cu);
}

TEST(Rng, Fnv1aKnownAnswers) {
  // FNV-1a 64 test values of the FNV reference (Fowler, Noll, Vo): "", "a", "foobar".
  EXPECT_EQ(stream_id(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(stream_id("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(stream_id("foobar"), 0x85944171f73967e8ull);
  static_assert(stream_id("a") == 0xaf63dc4c8601ec8cull, "usable at compile time");
}

TEST(Rng, UniformRanges) {
  EXPECT_EQ(Rng::uniform_from(0), 0.0f);
  EXPECT_EQ(Rng::uniform_from(0xffffffffu), 1.0f - 0x1p-24f);
  EXPECT_EQ(Rng::uniform_nonzero_from(0), 0x1p-24f);
  EXPECT_EQ(Rng::uniform_nonzero_from(0xffffffffu), 1.0f);
  EXPECT_EQ(Rng::uniform_from(0x80000000u), 0.5f);

  const Rng rng(12345, 678);
  constexpr int kN = 1'000'000, kBins = 16;
  std::vector<int> hist(kBins, 0);
  double sum = 0, sum_nz = 0;
  for (int i = 0; i < kN; ++i) {
    const float u = rng.uniform(i);
    const float v = rng.split(1).uniform_nonzero(i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    ASSERT_GT(v, 0.0f);
    ASSERT_LE(v, 1.0f);
    sum += u;
    sum_nz += v;
    ++hist[static_cast<int>(u * kBins)];
  }
  // Mean of U(0,1): sd 1/sqrt(12 n) = 2.9e-4; allow 5 sd.
  EXPECT_NEAR(sum / kN, 0.5, 1.5e-3);
  EXPECT_NEAR(sum_nz / kN, 0.5, 1.5e-3);
  // Chi-square with 15 degrees of freedom: P(> 37.7) = 0.001.
  const double expected = double(kN) / kBins;
  double chi2 = 0;
  for (int c : hist) chi2 += (c - expected) * (c - expected) / expected;
  EXPECT_LT(chi2, 37.7);
}

TEST(Rng, NormalMoments) {
  const Rng rng(2024, stream_id("normal"));
  constexpr int64_t kN = 1'000'000;
  double s1 = 0, s2 = 0, s3 = 0, s4 = 0;
  int64_t within1 = 0;
  double z[4];
  for (int64_t b = 0; b < kN / 4; ++b) {
    rng.normal4(b, z);
    for (double x : z) {
      ASSERT_TRUE(std::isfinite(x));
      ASSERT_LT(std::fabs(x), 6.7);  // the 32-bit u1 bounds |z| by sqrt(64 ln 2)
      s1 += x;
      s2 += x * x;
      s3 += x * x * x;
      s4 += x * x * x * x;
      within1 += std::fabs(x) < 1.0;
    }
  }
  const double mean = s1 / kN, var = s2 / kN - mean * mean;
  // Standard errors: mean 1e-3, variance sqrt(2/n) = 1.4e-3, third moment sqrt(15/n) = 3.9e-3,
  // fourth sqrt(96/n) = 9.8e-3, P(|z| < 1) sqrt(p(1-p)/n) = 4.7e-4; 5 of them each.
  EXPECT_NEAR(mean, 0.0, 5e-3);
  EXPECT_NEAR(var, 1.0, 7e-3);
  EXPECT_NEAR(s3 / kN, 0.0, 2e-2);
  EXPECT_NEAR(s4 / kN, 3.0, 5e-2);
  EXPECT_NEAR(within1 / double(kN), 0.682689492, 2.5e-3);
}

TEST(Rng, NormalIsTheRoundedBlockValue) {
  const Rng rng(7, 9);
  double z[4];
  for (uint64_t b = 0; b < 100; ++b) {
    rng.normal4(b, z);
    for (int j = 0; j < 4; ++j) EXPECT_EQ(rng.normal(4 * b + j), static_cast<float>(z[j]));
  }
  // Box-Muller by hand for block 0's first pair.
  const PhiloxCounter w = rng.block(0);
  const double u1 = (w.w[0] + 1.0) / 4294967296.0, theta = 2 * M_PI * (w.w[1] / 4294967296.0);
  rng.normal4(0, z);
  EXPECT_NEAR(z[0], std::sqrt(-2 * std::log(u1)) * std::cos(theta), 1e-12);
  EXPECT_NEAR(z[1], std::sqrt(-2 * std::log(u1)) * std::sin(theta), 1e-12);
}

TEST(Rng, StreamsAreDistinctAndUncorrelated) {
  constexpr int kN = 100'000;
  const Rng a(99, stream_id("model.layers.0.mlp.gate.weight"));
  const Rng b(99, stream_id("model.layers.1.mlp.gate.weight"));
  const Rng c(99, a.stream() + 1);  // adjacent stream ids differ as much as any
  for (const Rng* other : {&b, &c}) {
    int equal = 0;
    double sxy = 0;
    for (int i = 0; i < kN; ++i) {
      equal += a.u32(i) == other->u32(i);
      sxy += (a.uniform(i) - 0.5) * (other->uniform(i) - 0.5);
    }
    EXPECT_LE(equal, 2);  // 2^-32 per pair
    // Correlation coefficient: sd 1/sqrt(n) = 3.2e-3; covariance = corr / 12.
    EXPECT_NEAR(sxy / kN * 12, 0.0, 1.6e-2);
  }
  // Split children: distinct from the parent, from each other, and from another parent's.
  std::set<uint64_t> streams = {a.stream(), b.stream()};
  for (uint64_t child = 0; child < 1000; ++child) {
    EXPECT_TRUE(streams.insert(a.split(child).stream()).second) << child;
    EXPECT_TRUE(streams.insert(b.split(child).stream()).second) << child;
  }
  EXPECT_NE(a.split(0).u32(0), a.u32(0));
  EXPECT_EQ(a.split(5).seed(), a.seed());
}

TEST(Rng, Reproducible) {
  const Rng a(31337, 4), b(31337, 4);
  // Random access: drawing in reverse, or one index alone, gives the same bits.
  std::vector<uint32_t> forward(1000);
  for (int i = 0; i < 1000; ++i) forward[i] = a.u32(i);
  for (int i = 999; i >= 0; --i) EXPECT_EQ(b.u32(i), forward[i]);
  EXPECT_EQ(a.split(3).normal(17), Rng(31337, 4).split(3).normal(17));
  // Seeds differ in their high word only: still different streams of bits.
  const Rng hi(31337 + (uint64_t{1} << 32), 4);
  int equal = 0;
  for (int i = 0; i < 1000; ++i) equal += hi.u32(i) == forward[i];
  EXPECT_LE(equal, 1);
  // Blocks past 2^32 use the counter's second word.
  EXPECT_NE(a.block(uint64_t{1} << 32).w[0], a.block(0).w[0]);
}

}  // namespace
}  // namespace octet
