// NCCL at world size 1 on the GPU: every collective of the Comm interface moves the right bytes,
// split and barrier work, and ZeRO-1 AdamW on NCCL gives the weights the in-process communicator
// gives on the CPU, bit for bit (ops/adamw is bitwise equal on CPU and CUDA).
#include <gtest/gtest.h>

#include <cstring>

#include "backend/backend.h"
#include "dist/inprocess_comm.h"
#include "dist/nccl_comm.h"
#include "test_util.h"
#include "train/zero_optimizer.h"

namespace octet {
namespace {

using std::chrono::milliseconds;

std::shared_ptr<Comm> nccl_world_one(Context& ctx) {
  return make_nccl_comm(ctx, nccl_unique_id(), 0, 1, milliseconds(60000));
}

#define OCTET_REQUIRE_NCCL()                                     \
  do {                                                           \
    OCTET_REQUIRE_GPU();                                         \
    if (!nccl_built()) GTEST_SKIP() << "this build has no NCCL"; \
  } while (0)

TEST(NcclGpu, CollectivesAtWorldSizeOne) {
  OCTET_REQUIRE_NCCL();
  Context ctx = make_context(Device::kCuda);
  std::shared_ptr<Comm> c = nccl_world_one(ctx);
  ASSERT_EQ(c->size(), 1);
  ASSERT_EQ(c->rank(), 0);
  EXPECT_FALSE(nccl_version().empty());
  std::printf("[ measured ] NCCL %s\n", nccl_version().c_str());
  const Tensor x = test::random_tensor({1000}, DType::kF32, 7);
  Tensor d = x.to(ctx, Device::kCuda);
  Tensor y = Tensor::empty(ctx, {1000}, DType::kF32);
  c->all_reduce(ctx, d.data(), y.data(), 1000, DType::kF32, ReduceOp::kSum);
  EXPECT_TRUE(test::bitwise_equal(x, y.to_host(ctx)));
  c->reduce_scatter(ctx, d.data(), y.data(), 1000, DType::kF32, ReduceOp::kMax);
  EXPECT_TRUE(test::bitwise_equal(x, y.to_host(ctx)));
  c->all_gather(ctx, d.data(), y.data(), 1000, DType::kF32);
  EXPECT_TRUE(test::bitwise_equal(x, y.to_host(ctx)));
  const int64_t n = 333, zero = 0;
  c->all_to_all_v(ctx, d.data(), &n, &zero, y.data(), &n, &zero, DType::kE4M3);
  const Tensor back = y.to_host(ctx);
  EXPECT_EQ(0, std::memcmp(back.data(), x.data(), 333));
  c->broadcast(ctx, d.data(), 1000, DType::kF32, 0);
  c->barrier(ctx);
  const std::shared_ptr<Comm> sub = c->split(ctx, 0, 0);
  ASSERT_TRUE(sub);
  EXPECT_EQ(sub->size(), 1);
  sub->all_reduce(ctx, d.data(), y.data(), 1000, DType::kF32, ReduceOp::kSum);
  EXPECT_TRUE(test::bitwise_equal(x, y.to_host(ctx)));
  const std::vector<double> v = all_gather_values(ctx, *c, 2.5);
  EXPECT_EQ(v, std::vector<double>{2.5});
}

TEST(NcclGpu, ZeroAdamWMatchesTheCpu) {
  OCTET_REQUIRE_NCCL();
  const std::vector<int64_t> sizes = {5000, 37, 4096};
  auto run = [&](Context& ctx, std::shared_ptr<Comm> comm) {
    std::vector<Parameter> ps(sizes.size());
    std::vector<Parameter*> ptrs;
    for (size_t i = 0; i < sizes.size(); ++i) {
      ps[i].name = "p" + std::to_string(i);
      ps[i].value = test::random_tensor({sizes[i]}, DType::kF32, 1 + i).to(ctx, ctx.device);
      ps[i].grad = test::random_tensor({sizes[i]}, DType::kF32, 10 + i).to(ctx, ctx.device);
      ptrs.push_back(&ps[i]);
    }
    train::AdamWConfig a;
    a.grad_clip = 0.5f;
    train::ZeroAdamW opt(ctx, comm, ptrs, a, {1000, 1500});
    for (int s = 0; s < 3; ++s) {
      // Steps 1 and 2 send the buckets as the gradients are named final (on CUDA from the side
      // stream, overlapping), step 0 after the fact; the same bits either way.
      if (s > 0) {
        opt.begin_final_backward();
        for (size_t i = ps.size(); i-- > 0;) opt.grads_ready(ctx, {&ps[i]});
        EXPECT_EQ(opt.buckets_sent_early(), static_cast<int64_t>(opt.layout().buckets.size()));
      }
      opt.step(ctx, 1e-2f);
    }
    std::vector<Tensor> out;
    for (Parameter& p : ps) out.push_back(p.value.to_host(ctx));
    return out;
  };
  Context gpu = make_context(Device::kCuda);
  const std::vector<Tensor> g = run(gpu, nccl_world_one(gpu));
  std::vector<Tensor> c;
  run_inprocess_ranks_or_throw(
      1, [&](Context& ctx) { c = run(ctx, ctx.comm); }, milliseconds(60000));
  for (size_t i = 0; i < g.size(); ++i) EXPECT_TRUE(test::bitwise_equal(c[i], g[i])) << "p" << i;
}

}  // namespace
}  // namespace octet
