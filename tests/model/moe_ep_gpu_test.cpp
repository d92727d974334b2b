// The expert-parallel exchange (model/moe_ep.h) on the GPU through NCCL at world size 1: the
// counts read back, the FP8 payload with its scales and a BF16 tensor sent to the owner (itself)
// and back unchanged, and the local layout the single-rank permutation's (expert-major, padded to
// 128). Several ranks run on in-process ranks in tests/train/expert_parallel_test.cpp.
#include <gtest/gtest.h>

#include <cstring>

#include "backend/backend.h"
#include "dist/nccl_comm.h"
#include "model/moe_ep.h"
#include "test_util.h"

namespace octet {
namespace {

TEST(MoeEpGpu, ExchangeThroughNcclAtWorldSizeOne) {
  OCTET_REQUIRE_GPU();
  if (!nccl_built()) GTEST_SKIP() << "this build has no NCCL";
  Context ctx = make_context(Device::kCuda);
  const std::shared_ptr<Comm> c =
      make_nccl_comm(ctx, nccl_unique_id(), 0, 1, std::chrono::milliseconds(60000));
  const int64_t T = 300, k = 4, E = 16, D = 256;
  Tensor idx = Tensor::empty({T, k}, DType::kI32);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j)
      idx.data_as<int32_t>()[t * k + j] = static_cast<int32_t>((t * 7 + j * 5) % E);
  const PermuteMap map = moe_permute_map(
      ctx,
      {.topk_idx = idx.to(ctx, ctx.device), .num_experts = E, .padding = PermutePadding::kNone});
  const EpRoute r = ep_plan(ctx, *c, map, /*pad=*/true);
  ASSERT_EQ(r.send_rows, std::vector<int64_t>{T * k});
  ASSERT_EQ(r.recv_rows, std::vector<int64_t>{T * k});
  // The local layout: each expert's rows padded to 128, as the single-rank padded map has them.
  const PermuteMap padded = moe_permute_map(
      ctx,
      {.topk_idx = idx.to(ctx, ctx.device), .num_experts = E, .padding = PermutePadding::kTo128});
  EXPECT_TRUE(
      test::bitwise_equal(r.local.group_sizes.to_host(ctx), padded.group_sizes.to_host(ctx)));

  const Tensor x = test::random_tensor({T, D}, DType::kBF16, 3).to(ctx, ctx.device);
  const QuantTensor q = moe_permute_quantize(ctx, map,
                                             {.input = x,
                                              .format = Fp8Format::kE4M3,
                                              .granularity = Granularity::k1x128,
                                              .rounding = ScaleRounding::kPow2,
                                              .output = QuantizeOutput::kRowwise});
  const QuantTensor sent = ep_exchange(ctx, *c, r, q, true);
  EXPECT_TRUE(test::bitwise_equal(sent.data.to_host(ctx), q.data.to_host(ctx)));
  EXPECT_TRUE(test::bitwise_equal(sent.scale_inv.to_host(ctx), q.scale_inv.to_host(ctx)));
  const Tensor xp = moe_permute(ctx, map, x);
  const Tensor back = ep_exchange(ctx, *c, r, ep_exchange(ctx, *c, r, xp, true), false);
  EXPECT_TRUE(test::bitwise_equal(back.to_host(ctx), xp.to_host(ctx)));
}

}  // namespace
}  // namespace octet
