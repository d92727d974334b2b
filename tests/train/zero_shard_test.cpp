// ZeroAdamW with sharded masters (ZeroConfig::shard_masters, zero_optimizer.h) on in-process ranks:
// each rank allocates only its own pieces of the FP32 masters and of the AdamW moments (at DP 4
// about a quarter of what one rank holds), the masters of the weights gathered as weight outputs
// have no storage, and the arithmetic is the unsharded optimizer's bit for bit: the same prepared
// weights after two steps, the same masters once gathered, the same moments; gather_masters() and
// shard_masters() go back and forth without changing a bit.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "dist/inprocess_comm.h"
#include "model/init.h"
#include "model/model.h"
#include "test_util.h"
#include "train/zero_optimizer.h"
#include "zero_weights.h"

namespace octet::train {
namespace {

using test_zero::config;
using test_zero::output_tensors;

// What one rank ends with after two steps on rank-dependent gradients.
struct RankEnd {
  std::vector<Tensor> outputs, masters;  // prepared weights; masters once gathered
  io::NamedTensors moments;
  int64_t master_bytes = 0, moment_bytes = 0;  // while sharded
  int64_t whole_f32 = 0;  // bytes of the masters left whole (the forward reads them)
  int64_t all_elems = 0;  // trainable elements of the model
  int64_t released = 0;   // parameters without a whole master
  bool released_have_no_storage = true;
};

std::vector<RankEnd> run(const std::string& recipe, int world, bool shard) {
  std::vector<RankEnd> ends(static_cast<size_t>(world));
  run_inprocess_ranks_or_throw(
      world,
      [&](Context& ctx) {
        const ModelConfig c = config();
        Model model(ctx, c, Precision{recipe_preset(recipe), DType::kBF16});
        model.load(ctx, init_parameters(c, 7));
        model.prepare(ctx);
        AdamWConfig a;
        a.lr = 1e-2f;
        // Pieces of 16 Ki elements (128 rows of the 128-wide matrices) in one bucket: each rank's
        // part is within a piece of a quarter (the trainer's 4 Mi pieces and 8 Mi buckets are as
        // fine against a real model).
        ZeroConfig z{16384, INT64_MAX};
        z.shard_masters = shard;
        ZeroAdamW opt(ctx, ctx.comm, model.parameters(), a, z);
        const std::vector<WeightOutput> outs = model.weight_outputs(OutputCopies::kBf16AndFp8);
        opt.set_weight_outputs(ctx, outs);
        const int me = ctx.comm->rank();
        RankEnd& e = ends[static_cast<size_t>(me)];
        EXPECT_EQ(opt.masters_sharded(), shard);
        for (int s = 0; s < 2; ++s) {
          opt.zero_grad(ctx);
          test_zero::random_grads(ctx, model, s, me);
          EXPECT_FALSE(opt.step(ctx, 1e-2f).skipped);
          model.prepare(ctx, PrepareScope::kNotFused);
          if (s == 0 && shard) {  // a round trip through whole masters changes nothing
            opt.gather_masters(ctx);
            EXPECT_FALSE(opt.masters_sharded());
            opt.shard_masters(ctx);
            EXPECT_TRUE(opt.masters_sharded());
          }
        }
        e.outputs = output_tensors(ctx, outs);
        e.master_bytes = opt.master_bytes();
        e.moment_bytes = opt.moment_bytes();
        for (size_t i = 0; i < opt.params().size(); ++i) {
          const Parameter& p = *opt.params()[i];
          e.all_elems += p.value.numel();
          if (opt.master_released(i)) {
            ++e.released;
            e.released_have_no_storage = e.released_have_no_storage && p.value.data() == nullptr;
          } else {
            e.whole_f32 += p.value.nbytes();
          }
        }
        e.moments = opt.state_dict(ctx);
        opt.gather_masters(ctx);
        for (const Parameter* p : opt.params()) e.masters.push_back(p->value.to_host(ctx));
      },
      std::chrono::milliseconds(120000));
  return ends;
}

void expect_same(const std::vector<Tensor>& a, const std::vector<Tensor>& b,
                 const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(test::bitwise_equal(a[i], b[i])) << what << ", tensor " << i;
}

TEST(ZeroShard, EachOfFourRanksHoldsAQuarterOfTheMastersAndMoments) {
  for (const char* recipe : {"deepseek", "bf16"}) {
    const std::vector<RankEnd> sharded = run(recipe, 4, true);
    const std::vector<RankEnd> whole = run(recipe, 4, false);
    for (int r = 0; r < 4; ++r) {
      const RankEnd& s = sharded[static_cast<size_t>(r)];
      const RankEnd& w = whole[static_cast<size_t>(r)];
      const std::string what = std::string(recipe) + ", rank " + std::to_string(r);
      // The arithmetic is the unsharded optimizer's.
      expect_same(s.outputs, w.outputs, what + ": prepared weights");
      expect_same(s.masters, w.masters, what + ": masters");
      ASSERT_EQ(s.moments.size(), w.moments.size());
      for (size_t i = 0; i < s.moments.size(); ++i)
        EXPECT_TRUE(test::bitwise_equal(s.moments[i].second, w.moments[i].second))
            << what << ": " << s.moments[i].first;
      // The memory: the GEMM weights' masters freed, the shard a quarter of everything.
      EXPECT_GT(s.released, 4) << what;
      EXPECT_TRUE(s.released_have_no_storage) << what;
      const double one_rank = 4.0 * static_cast<double>(s.all_elems);  // FP32, or 2 x BF16
      const double shard = static_cast<double>(s.master_bytes - s.whole_f32);
      EXPECT_GT(shard, 0.24 * one_rank) << what;
      EXPECT_LT(shard, 0.30 * one_rank) << what;  // a quarter, plus the padding of the parts
      EXPECT_EQ(static_cast<double>(s.moment_bytes), shard) << what;  // the same layout
      // Without sharding every master is whole.
      EXPECT_EQ(static_cast<double>(w.master_bytes), one_rank) << what;
      EXPECT_LT(static_cast<double>(s.whole_f32), 0.25 * one_rank) << what;
      std::printf(
          "%s rank %d: masters %lld B (shard %.0f + whole %lld), moments %lld B; one "
          "rank: %.0f + %.0f B\n",
          recipe, r, static_cast<long long>(s.master_bytes), shard,
          static_cast<long long>(s.whole_f32), static_cast<long long>(s.moment_bytes), one_rank,
          one_rank);
    }
  }
}

}  // namespace
}  // namespace octet::train
