// Shared test helpers: GPU detection with explicit skips, seeded random data (never zeros or
// constants), and bitwise comparisons that report the first mismatching coordinate.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "core/context.h"

namespace octet::test {

bool has_gpu();

#define OCTET_REQUIRE_GPU()                                               \
  do {                                                                    \
    if (!::octet::test::has_gpu()) GTEST_SKIP() << "no CUDA GPU visible"; \
  } while (0)

enum class Dist : uint8_t {
  kGaussian,  // N(0, 1)
  kOutliers,  // N(0, 1) with 1% of values scaled by up to 2^12 and some rows scaled down by 2^-20
  kWide,      // random sign * 2^U(-40, 40): exercises scales, subnormals and saturation
};

// Host tensor (f32 or bf16) of the given shape, reproducible from the seed.
Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed, Dist dist = Dist::kGaussian);

// Fills a host tensor with a poison byte pattern, so unwritten outputs show up.
void poison(Tensor& t, uint8_t byte = 0xA5);

// Bitwise equality of two host tensors of the same dtype and shape; on mismatch the failure names
// the first differing (row, col) of the matrix view and both values in hex.
::testing::AssertionResult bitwise_equal(const Tensor& expected, const Tensor& actual);

// An empty directory <system temp>/octet_<prefix>_<name>_<pid> (removed first if it exists).
std::string fresh_temp_dir(const std::string& prefix, const std::string& name);
// dir/corpus.txt: `lines` lines of pangrams with varying numbers, a small English text a tiny
// model learns from; returns its path.
std::string write_pangram_corpus(const std::string& dir, int lines);

}  // namespace octet::test
