// Delayed scaling (fp8-tensor-delayed) with data parallelism, at the model level on in-process
// ranks: each amax is the maximum over the ranks before it enters its history
// (reduce_amax_over_ranks, model/linear.h), so after a forward and backward every rank holds the
// same histories and scales, bit for bit those of one rank that ran the whole batch at once (the
// maximum of the halves' amaxes is the whole batch's amax; each row's values do not depend on the
// other rows, and the loss gradient 1 / (2 B T) is 0.5 x 1 / (B T) exactly). Without the reduction
// the ranks' histories differ (checked, so the test can fail).
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "dist/inprocess_comm.h"
#include "model/init.h"
#include "model/model.h"
#include "test_util.h"
#include "tiny_model.h"

namespace octet {
namespace {

constexpr int64_t kB = 2, kT = 16;

// Rows [first, first + rows) of a fixed batch of 2 kB sequences.
ModelBatch batch(int64_t first, int64_t rows, int64_t vocab) {
  Tensor in = Tensor::empty({rows, kT}, DType::kI32), tg = Tensor::empty({rows, kT}, DType::kI32);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < kT; ++t) {
      const int64_t g = (first + r) * kT + t;
      in.data_as<int32_t>()[r * kT + t] = static_cast<int32_t>((g * 37 + 11) % vocab);
      tg.data_as<int32_t>()[r * kT + t] = static_cast<int32_t>((g * 37 + 48) % vocab);
    }
  return {in, tg};
}

// One forward and backward of `rows` sequences from `first` on a fresh model: its recipe state.
io::NamedTensors state_after_step(Context& ctx, int64_t first, int64_t rows, float grad_scale) {
  const ModelConfig c = test::tiny_model_config();
  Model model(ctx, c, Precision{recipe_preset("fp8-tensor-delayed"), DType::kBF16});
  model.load(ctx, init_parameters(c, 3));
  for (int pass = 0; pass < 2; ++pass) {  // the second pass quantizes with the first's scales
    model.prepare(ctx);
    model.step(ctx, batch(first, rows, c.vocab_size), Pass::kForwardBackward, grad_scale);
  }
  return model.recipe_state(ctx);
}

TEST(DelayedScalingDp, EveryRankHoldsTheHistoriesOfOneRankOnTheWholeBatch) {
  Context one = make_context(Device::kCpu);
  const io::NamedTensors want = state_after_step(one, 0, 2 * kB, 1.0f);
  ASSERT_FALSE(want.empty());
  std::vector<io::NamedTensors> got(2), alone(2);
  run_inprocess_ranks_or_throw(
      2,
      [&](Context& ctx) {
        const int r = ctx.comm->rank();
        got[static_cast<size_t>(r)] = state_after_step(ctx, r * kB, kB, 0.5f);
        Context solo = make_context(Device::kCpu);  // the same rows without the reduction
        alone[static_cast<size_t>(r)] = state_after_step(solo, r * kB, kB, 0.5f);
      },
      std::chrono::milliseconds(120000));
  int differs_alone = 0;
  for (int r = 0; r < 2; ++r) {
    const io::NamedTensors& g = got[static_cast<size_t>(r)];
    ASSERT_EQ(g.size(), want.size());
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_EQ(g[i].first, want[i].first);
      EXPECT_TRUE(test::bitwise_equal(want[i].second, g[i].second))
          << "rank " << r << ": " << g[i].first;
      differs_alone +=
          !test::bitwise_equal(want[i].second, alone[static_cast<size_t>(r)][i].second);
    }
  }
  EXPECT_GT(differs_alone, 0) << "each half alone has other amaxes somewhere";
}

}  // namespace
}  // namespace octet
