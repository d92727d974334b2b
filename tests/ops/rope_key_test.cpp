// rope_key.h on the CPU: the fused MLA key forward and backward bitwise against the composition of
// rope_forward / rope_backward and copy_columns, both pairings, F32 and BF16, and clear errors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ops/rope/rope_math.h"
#include "rope_key_test_util.h"

namespace octet {
namespace {

TEST(RopeKey, MatchesCompositionBitwise) {
  Context cpu = make_context(Device::kCpu);
  uint64_t seed = 40;
  for (const RopePairing pairing : {RopePairing::kHalf, RopePairing::kInterleave})
    for (const DType dtype : {DType::kBF16, DType::kF32}) {
      // MLA-like: kv = [nope | v], kr = [latent | rope key].
      test::expect_rope_key_matches_composition(cpu, {2, 7, 3, 16, 8, 32, 40, 32, pairing, dtype},
                                                seed++);
      // Odd widths, nope not a multiple of 8, the key in the middle of kr's row.
      test::expect_rope_key_matches_composition(cpu, {1, 5, 2, 6, 4, 11, 13, 5, pairing, dtype},
                                                seed++);
      // No nope columns.
      test::expect_rope_key_matches_composition(cpu, {1, 3, 4, 0, 6, 8, 6, 0, pairing, dtype},
                                                seed++);
    }
}

// rope_math::FastDiv (the CUDA kernel's index division) against integer division: every divisor
// up to 1100 and the kernel's usual ones past it, every numerator up to 70000 and, near the top of
// the range (2^31 - 1), the multiples of d and their neighbours.
TEST(RopeKey, FastDivDividesExactly) {
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 1100; ++d) divisors.push_back(d);
  for (uint32_t d : {3072u, 4096u, 65535u, 65536u, 65537u, 1000003u, (1u << 30) - 1, 1u << 30,
                     (1u << 30) + 1, (1u << 31) - 1})
    divisors.push_back(d);
  int64_t failures = 0;
  for (uint32_t d : divisors) {
    const rope_math::FastDiv fd(d);
    const auto check = [&](uint32_t n) {
      if (fd.div(n) != n / d && ++failures <= 5)
        ADD_FAILURE() << n << " / " << d << ": got " << fd.div(n);
    };
    for (uint32_t n = 0; n <= 70000; ++n) check(n);
    const uint32_t top = (1u << 31) - 1;
    for (uint32_t q = top / d, i = 0; i < 64 && q > 0; ++i, --q)
      for (uint32_t n : {q * d - 1, q * d, q * d + 1})
        if (n <= top) check(n);
    check(top);
  }
  EXPECT_EQ(failures, 0);
}

TEST(RopeKey, ClearErrors) {
  Context cpu = make_context(Device::kCpu);
  const RopeTable tb = make_rope_table(cpu, 8, 4, 10000.0);
  const Tensor kv = test::random_tensor({1, 4, 2, 8}, DType::kBF16, 1);
  const Tensor kr = test::random_tensor({1, 4, 6}, DType::kBF16, 2);
  const auto expect_error = [](auto fn, const std::string& word) {
    try {
      fn();
      ADD_FAILURE() << "expected octet::Error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  };
  expect_error(
      [&] { rope_key_forward(cpu, {.kv = kv, .nope = 4, .kr = kr, .kr_col = 4, .table = tb}); },
      "[4, 8)");
  expect_error(
      [&] { rope_key_forward(cpu, {.kv = kv, .nope = 9, .kr = kr, .kr_col = 2, .table = tb}); },
      "nope = 9");
  const Tensor kr_f32 = test::random_tensor({1, 4, 6}, DType::kF32, 3);
  expect_error(
      [&] { rope_key_forward(cpu, {.kv = kv, .nope = 4, .kr = kr_f32, .kr_col = 2, .table = tb}); },
      "dtype");
  const Tensor dk = test::random_tensor({1, 4, 2, 14}, DType::kBF16, 4);  // dn = 10 > W = 8
  Tensor dkv = test::random_tensor({1, 4, 2, 8}, DType::kBF16, 5);
  Tensor dkr = test::random_tensor({1, 4, 6}, DType::kBF16, 6);
  expect_error(
      [&] {
        rope_key_backward(cpu,
                          {.grad_k = dk, .grad_kv = dkv, .grad_kr = dkr, .kr_col = 2, .table = tb});
      },
      "dn = 10");
}

}  // namespace
}  // namespace octet
