// ZeroAdamW's weight all-gather in the prepared forms (zero_optimizer.h, stage 4) on in-process
// ranks: at DP 2 and 4, for the deepseek recipe (FP8 128x128 block weights, with the stacked
// experts) and bf16, the prepared GEMM weights every rank ends with are bit for bit what a full
// preparation from the (gathered) masters gives; the FP8 weights travel at about 1 byte per element
// (half of BF16's 2, a quarter of FP32's 4).
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

struct Counts {
  int64_t outputs = 0, fp8 = 0, elems = 0, bytes = 0;
};

Counts run(const std::string& recipe, int world) {
  Counts counts;
  run_inprocess_ranks_or_throw(
      world,
      [&](Context& ctx) {
        const ModelConfig c = config();
        Model model(ctx, c, Precision{recipe_preset(recipe), DType::kBF16});
        model.load(ctx, init_parameters(c, 7));
        model.prepare(ctx);
        AdamWConfig a;
        a.lr = 1e-2f;
        ZeroAdamW opt(ctx, ctx.comm, model.parameters(), a, {20000, 50000});
        const std::vector<WeightOutput> outs = model.weight_outputs(OutputCopies::kBf16AndFp8);
        opt.set_weight_outputs(ctx, outs);
        const int me = ctx.comm->rank();
        for (int s = 0; s < 2; ++s) {
          opt.zero_grad(ctx);
          test_zero::random_grads(ctx, model, s, me);
          EXPECT_FALSE(opt.step(ctx, 1e-2f).skipped);
          model.prepare(ctx, PrepareScope::kNotFused);
        }
        const std::vector<Tensor> got = output_tensors(ctx, outs);
        // The reference: every master gathered, a fresh model prepared from them.
        opt.gather_masters(ctx);
        Model ref(ctx, c, Precision{recipe_preset(recipe), DType::kBF16});
        ref.load(ctx, model.export_tensors(ctx));
        ref.prepare(ctx);
        const std::vector<Tensor> want = output_tensors(ctx, ref.weight_outputs());
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i)
          EXPECT_TRUE(test::bitwise_equal(got[i], want[i]))
              << recipe << ", DP " << world << ", rank " << me << ", output tensor " << i;
        if (me == 0) {
          counts.outputs = static_cast<int64_t>(outs.size());
          for (const WeightOutput& w : outs) counts.fp8 += w.fp8.data.data() != nullptr;
          const int bf16 = recipe == "bf16" ? 1 : 0;
          counts.elems = opt.output_elems(bf16);
          counts.bytes = opt.output_bytes(bf16);
        }
      },
      std::chrono::milliseconds(120000));
  return counts;
}

TEST(ZeroGather, Fp8BlockWeightsGatheredInFp8AreThePreparedBits) {
  for (int world : {2, 4}) {
    const Counts c = run("deepseek", world);
    EXPECT_GT(c.fp8, 4) << "the experts and the dense GEMMs have FP8 block outputs";
    // 1 byte per element, one FP32 scale per 128x128 block (partial blocks here), padding.
    EXPECT_GT(c.elems, 0);
    EXPECT_LT(static_cast<double>(c.bytes), 1.05 * static_cast<double>(c.elems)) << world;
  }
}

TEST(ZeroGather, Bf16WeightsGatheredInBf16AreThePreparedBits) {
  for (int world : {2, 4}) {
    const Counts c = run("bf16", world);
    EXPECT_GT(c.outputs, 4);
    EXPECT_EQ(c.fp8, 0);
    EXPECT_EQ(c.bytes, 2 * c.elems) << world;
  }
}

}  // namespace
}  // namespace octet::train
