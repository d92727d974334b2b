// ZeroAdamW with sharded masters on CUDA (NCCL at world size 1): the shard is copied, updated,
// quantized and gathered on the device, and the prepared weights, the gathered masters and the
// moments after two steps are the unsharded optimizer's bit for bit, as on the CPU
// (zero_shard_test.cpp).
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "dist/nccl_comm.h"
#include "model/init.h"
#include "model/model.h"
#include "test_util.h"
#include "train/zero_optimizer.h"
#include "zero_weights.h"

namespace octet::train {
namespace {

struct End {
  std::vector<Tensor> outputs, masters;
  io::NamedTensors moments;
  int64_t released = 0;
  bool no_storage = true;
};

End run(Context& ctx, const std::shared_ptr<Comm>& comm, bool shard) {
  ModelConfig c = test_zero::config();
  c.intermediate_size = 192;  // FP8 GEMM dimensions are multiples of 16 on CUDA
  Model model(ctx, c, Precision{recipe_preset("deepseek"), DType::kBF16});
  model.load(ctx, init_parameters(c, 7));
  model.prepare(ctx);
  AdamWConfig a;
  a.lr = 1e-2f;
  ZeroConfig z{16384, INT64_MAX};
  z.shard_masters = shard;
  ZeroAdamW opt(ctx, comm, model.parameters(), a, z);
  const std::vector<WeightOutput> outs = model.weight_outputs(OutputCopies::kBf16AndFp8);
  opt.set_weight_outputs(ctx, outs);
  End e;
  for (int s = 0; s < 2; ++s) {
    opt.zero_grad(ctx);
    test_zero::random_grads(ctx, model, s, 0);
    EXPECT_FALSE(opt.step(ctx, 1e-2f).skipped);
    model.prepare(ctx, PrepareScope::kNotFused);
  }
  e.outputs = test_zero::output_tensors(ctx, outs);
  for (size_t i = 0; i < opt.params().size(); ++i)
    if (opt.master_released(i)) {
      ++e.released;
      e.no_storage = e.no_storage && opt.params()[i]->value.data() == nullptr;
    }
  e.moments = opt.state_dict(ctx);
  opt.gather_masters(ctx);
  for (const Parameter* p : opt.params()) e.masters.push_back(p->value.to_host(ctx));
  return e;
}

TEST(ZeroShardGpu, ShardedMastersGiveTheUnshardedBits) {
  OCTET_REQUIRE_GPU();
  if (!nccl_built()) GTEST_SKIP() << "this build has no NCCL";
  Context gpu = make_context(Device::kCuda);
  const std::shared_ptr<Comm> comm =
      make_nccl_comm(gpu, nccl_unique_id(), 0, 1, std::chrono::milliseconds(60000));
  const End s = run(gpu, comm, true);
  const End w = run(gpu, comm, false);
  EXPECT_GT(s.released, 4);
  EXPECT_TRUE(s.no_storage);
  EXPECT_EQ(w.released, 0);
  ASSERT_EQ(s.outputs.size(), w.outputs.size());
  for (size_t i = 0; i < s.outputs.size(); ++i)
    EXPECT_TRUE(test::bitwise_equal(w.outputs[i], s.outputs[i])) << "prepared tensor " << i;
  ASSERT_EQ(s.masters.size(), w.masters.size());
  for (size_t i = 0; i < s.masters.size(); ++i)
    EXPECT_TRUE(test::bitwise_equal(w.masters[i], s.masters[i])) << "master " << i;
  ASSERT_EQ(s.moments.size(), w.moments.size());
  for (size_t i = 0; i < s.moments.size(); ++i)
    EXPECT_TRUE(test::bitwise_equal(w.moments[i].second, s.moments[i].second))
        << s.moments[i].first;
}

}  // namespace
}  // namespace octet::train
