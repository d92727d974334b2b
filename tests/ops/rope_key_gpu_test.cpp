// rope_key.h on CUDA: the fused MLA key forward and backward bitwise against the same composition
// on the GPU and against the CPU reference, on MLA's shapes (the baseline's and DeepSeek-V3's), on
// the block kernel's corners and on odd ones that take the per-chunk kernel's scalar paths.
#include <gtest/gtest.h>

#include "rope_key_test_util.h"

namespace octet {
namespace {

TEST(RopeKeyGpu, MatchesCompositionAndCpuBitwise) {
  OCTET_REQUIRE_GPU();
  Context gpu = make_context(Device::kCuda);
  Context cpu = make_context(Device::kCpu);
  uint64_t seed = 70;
  for (const RopePairing pairing : {RopePairing::kHalf, RopePairing::kInterleave}) {
    const test::RopeKeyCase cases[] = {
        {2, 33, 16, 64, 32, 128, 288, 256, pairing, DType::kBF16},  // baseline-h100's MLA
        {1, 17, 8, 128, 64, 256, 576, 512, pairing, DType::kBF16},  // DeepSeek-V3's head dims
        {1, 5, 3, 6, 4, 11, 13, 5, pairing, DType::kBF16},          // scalar paths
        {2, 9, 3, 16, 8, 32, 40, 32, pairing, DType::kF32},         // F32
        // The block kernel's corners: DeepSeek-V3's 128 heads (a block's chunks take several
        // rounds), no nope columns, kv no wider than the nope part, 5 heads and 11 tokens (a
        // partial last block), F32 with 4-value chunks.
        {1, 3, 128, 128, 64, 256, 576, 512, pairing, DType::kBF16},
        {2, 5, 4, 0, 16, 8, 24, 8, pairing, DType::kBF16},
        {1, 11, 5, 8, 8, 8, 24, 16, pairing, DType::kBF16},
        {1, 7, 3, 4, 4, 12, 12, 8, pairing, DType::kF32},
    };
    for (const test::RopeKeyCase& c : cases) {
      test::expect_rope_key_matches_composition(gpu, c, seed);
      const test::RopeKeyOut g = test::run_rope_key(gpu, c, true, seed);
      const test::RopeKeyOut h = test::run_rope_key(cpu, c, true, seed);
      EXPECT_TRUE(test::bitwise_equal(h.k, g.k)) << "k against the CPU";
      EXPECT_TRUE(test::bitwise_equal(h.grad_kv, g.grad_kv)) << "grad_kv against the CPU";
      EXPECT_TRUE(test::bitwise_equal(h.grad_kr, g.grad_kr)) << "grad_kr against the CPU";
      ++seed;
    }
  }
}

// The baseline configuration's key at full size (B 8 x T 2048, 16 heads, dn 64 + d 32 from kv's 128
// columns and k_pe's 288): the block kernel and the per-chunk kernel give the CPU's bits.
TEST(RopeKeyGpu, BaselineShapeBothKernelsMatchCpu) {
  OCTET_REQUIRE_GPU();
  Context gpu = make_context(Device::kCuda);
  Context cpu = make_context(Device::kCpu);
  const test::RopeKeyCase c{8, 2048, 16, 64, 32, 128, 288, 256, RopePairing::kHalf, DType::kBF16};
  const test::RopeKeyOut want = test::run_rope_key(cpu, c, true, 90);
  for (RopeKeyKernel kernel : {RopeKeyKernel::kAuto, RopeKeyKernel::kPerChunk}) {
    const test::RopeKeyOut got = test::run_rope_key(gpu, c, true, 90, kernel);
    EXPECT_TRUE(test::bitwise_equal(want.k, got.k))
        << (kernel == RopeKeyKernel::kAuto ? "block kernel" : "per-chunk kernel");
  }
}

}  // namespace
}  // namespace octet
