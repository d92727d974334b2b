// CUDA rope against the CPU reference, bit for bit (both run rope_math.h's scalar rotation), on odd
// shapes, both pairings, F32 and BF16, forward and backward.
#include <gtest/gtest.h>

#include <tuple>

#include "backend/backend.h"
#include "numerics/fp8.h"
#include "ops/rope/rope.h"
#include "test_util.h"

namespace octet {
namespace {

using test::bitwise_equal;
using test::random_tensor;

struct Devices {
  Context cpu = make_context(Device::kCpu);
  Context gpu = make_context(Device::kCuda);
};
Devices& devices() {
  static Devices d;
  return d;
}

// Every byte 0xFF: NaN in F32 and BF16, so an output element the kernel skips cannot pass.
void poison_pool(Context& gpu, int64_t bytes) {
  Tensor t = Tensor::empty(gpu, {bytes}, DType::kU8);
  gpu.be().memset(t.data(), 0xFF, bytes);
}

struct Case {
  Shape shape;
  int64_t offset, dim;
};
using Param = std::tuple<Case, RopePairing, DType>;
class RopeGpu : public ::testing::TestWithParam<Param> {};

TEST_P(RopeGpu, MatchesCpuBitwise) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const auto& [c, pairing, dt] = GetParam();
  const int64_t T = c.shape[1];
  const RopeTable tc = make_rope_table(cpu, T + 5, c.dim, 10000.0);
  const RopeTable tg = make_rope_table(gpu, T + 5, c.dim, 10000.0);
  const Tensor x = random_tensor(c.shape, dt, 77);
  const Tensor xg = x.to(gpu, Device::kCuda);
  for (bool forward : {true, false}) {
    const Tensor want =
        forward
            ? rope_forward(cpu, {.input = x, .table = tc, .pairing = pairing, .offset = c.offset})
            : rope_backward(cpu, {.input = x, .table = tc, .pairing = pairing, .offset = c.offset});
    poison_pool(gpu, 4 * x.nbytes() + (1 << 20));
    const Tensor got =
        forward
            ? rope_forward(gpu, {.input = xg, .table = tg, .pairing = pairing, .offset = c.offset})
            : rope_backward(gpu,
                            {.input = xg, .table = tg, .pairing = pairing, .offset = c.offset});
    ASSERT_TRUE(bitwise_equal(want, got.to_host(gpu)))
        << (forward ? "forward" : "backward") << " shape " << shape_str(c.shape) << " offset "
        << c.offset << " dim " << c.dim;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, RopeGpu,
    ::testing::Combine(
        ::testing::Values(Case{{2, 127, 3, 96}, 64, 32},     // q of a small MLA: nope 64 + rope 32
                          Case{{1, 129, 16, 192}, 128, 64},  // DeepSeek-V3 q: 128 + 64
                          Case{{3, 300, 64}, 0, 64},         // shared k_pe (B, T, d)
                          Case{{1, 1, 1, 2}, 0, 2}, Case{{2, 17, 5, 30}, 3, 26}),
        ::testing::Values(RopePairing::kHalf, RopePairing::kInterleave),
        ::testing::Values(DType::kF32, DType::kBF16)));

// rope_vec_kernel: W, offset and d multiples of 8 (the first three Shapes cases take it too). The
// baseline model's k_pe row (kv_lora 256 + rope 32), a rope part between two copied parts, one quad
// (d = 8), and a tensor large enough that the grid-stride loop wraps.
INSTANTIATE_TEST_SUITE_P(
    VectorPath, RopeGpu,
    ::testing::Combine(::testing::Values(Case{{2, 33, 288}, 256, 32}, Case{{2, 9, 4, 48}, 8, 16},
                                         Case{{3, 50, 2, 24}, 16, 8},
                                         Case{{2, 2048, 16, 96}, 64, 32}),
                       ::testing::Values(RopePairing::kHalf, RopePairing::kInterleave),
                       ::testing::Values(DType::kF32, DType::kBF16)));

TEST(RopeGpuSpecial, TableMatchesCpuTable) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const RopeTable tc = make_rope_table(cpu, 8192, 64, 10000.0),
                  tg = make_rope_table(gpu, 8192, 64, 10000.0);
  EXPECT_TRUE(bitwise_equal(tc.cos, tg.cos.to_host(gpu)));
  EXPECT_TRUE(bitwise_equal(tc.sin, tg.sin.to_host(gpu)));
}

}  // namespace
}  // namespace octet
