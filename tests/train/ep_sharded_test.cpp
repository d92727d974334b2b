// Expert parallelism with ZeRO-1's sharded FP32 masters (EpAdamW over the DP x EP grid: the
// replicated parameters' masters sharded over the world, the experts' over their data group, the
// updated weights all-gathered as the prepared copies the forward reads) and delayed scaling with
// expert parallelism (each expert's amax reduced over its data group), on in-process ranks.
//
// Against what:
//   - the same grid with optim.fused_prepare = false, where no weight is gathered in a prepared
//     form and so no master is sharded (every rank updates whole masters, gathered as FP32, and
//     prepares every copy itself): bit for bit, losses, checkpoints and optimizer state, since the
//     owner's BF16 cast and FP8 128x128 quantization of its rows are the bits every rank's
//     preparation makes (zero_optimizer.h);
//   - one rank on the same global batch: the first loss bit for bit, then within the tolerances of
//     tests/train/expert_parallel_test.cpp (an expert's Wgrad sums the rows of every source rank in
//     one FP32 accumulation where one rank adds micro-batch by micro-batch);
//   - a checkpoint saved by a 2 x 2 run with sharded masters: resumed at 2 x 2 bit for bit, at one
//     rank and at EP 2 with step 3 (the forward of the checkpoint's weights) bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>

#include "backend/backend.h"
#include "dist/inprocess_comm.h"
#include "model/init.h"
#include "model/model.h"
#include "rank_runs.h"
#include "test_util.h"
#include "train/expert_parallel.h"
#include "train/metrics.h"

namespace octet::train {
namespace {

namespace fs = std::filesystem;

class EpShardedMasters : public MoeRunTest {};

// expert_parallel_test.cpp's tolerances over 4 steps of this model (the reasons are there).
double loss_rel(const std::string& recipe) {
  return recipe == "bf16" ? 1e-6 : 1e-3;
}
double weight_abs(const std::string& recipe) {
  return recipe == "bf16" ? 1e-6 : 0.024;
}

StepMetrics last_metrics(const std::string& run_dir) {
  return read_metrics(run_dir + "/metrics.jsonl").back();
}

// EP 2 and DP x EP = 2 x 2 with sharded masters: bit for bit the same grid with whole masters,
// within the stated tolerance of one rank; each rank's masters and moments are reported.
TEST_F(EpShardedMasters, EpTwoAndTwoByTwoMatchWholeMastersAndOneRank) {
  struct Grid {
    int world, ep;
  };
  for (const std::string recipe : {"bf16", "deepseek"}) {
    const std::string one = dir_ + "/one_" + recipe;
    run_ranks(1, moe_run_config(one, corpus_, recipe, 2, 4, 1), cache_);
    for (const Grid g : {Grid{2, 2}, Grid{4, 2}}) {
      const std::string tag =
          recipe + " world " + std::to_string(g.world) + " ep " + std::to_string(g.ep);
      const std::string sharded = dir_ + "/sh_" + recipe + std::to_string(g.world);
      const std::string whole = dir_ + "/wh_" + recipe + std::to_string(g.world);
      const int64_t accum = 4 / g.world;  // the global batch of the one-rank run
      EXPECT_EQ(run_ranks(g.world, moe_run_config(sharded, corpus_, recipe, 2, accum, g.ep), cache_)
                    .steps_done,
                4)
          << tag;
      TrainConfig w = moe_run_config(whole, corpus_, recipe, 2, accum, g.ep);
      apply_set(w, "optim.fused_prepare=false");
      run_ranks(g.world, w, cache_);
      // Sharding changes no bit.
      EXPECT_EQ(logged_losses(sharded), logged_losses(whole)) << tag;
      for (const int step : {2, 4})
        for (const char* file : {"model", "optimizer"})
          expect_bitwise(checkpoint_tensors(whole, step, file),
                         checkpoint_tensors(sharded, step, file),
                         tag + " step " + std::to_string(step) + " " + file);
      // The masters are sharded: fewer bytes than the whole masters of the same grid.
      const StepMetrics ms = last_metrics(sharded), mw = last_metrics(whole);
      ASSERT_TRUE(ms.master_bytes && mw.master_bytes && ms.moment_bytes) << tag;
      EXPECT_LT(*ms.master_bytes, *mw.master_bytes) << tag;
      EXPECT_EQ(*ms.moment_bytes, *mw.moment_bytes) << tag;
      // One rank on the same global batch.
      const std::vector<double> la = logged_losses(one), lb = logged_losses(sharded);
      ASSERT_EQ(la.size(), 4u) << tag;
      ASSERT_EQ(lb.size(), 4u) << tag;
      EXPECT_EQ(la[0], lb[0]) << tag << ": the first step's loss is bit for bit";
      for (size_t i = 1; i < la.size(); ++i)
        EXPECT_NEAR(lb[i], la[i], loss_rel(recipe) * std::fabs(la[i])) << tag << " step " << i + 1;
      const double dw = max_abs_diff(checkpoint_tensors(one, 4, "model"),
                                     checkpoint_tensors(sharded, 4, "model"));
      EXPECT_LE(dw, weight_abs(recipe)) << tag;
      std::printf(
          "[ measured ] %s: masters %lld B (whole %lld B), moments %lld B per rank; "
          "max |weight difference| vs one rank %.3g\n",
          tag.c_str(), static_cast<long long>(*ms.master_bytes),
          static_cast<long long>(*mw.master_bytes), static_cast<long long>(*ms.moment_bytes), dw);
    }
  }
}

// Memory: at EP 2 each rank updates half the experts (over a data group of one) and half the
// replicated parameters' pieces (over the world): its FP32 masters are about half one rank's. Not
// exactly half: the pieces are whole parameters here, dealt unevenly, and the FP32 weights the
// forward reads (embedding, norms, router) stay whole on every rank.
TEST_F(EpShardedMasters, EachEpTwoRankHoldsAboutHalfTheMasters) {
  const std::string one = dir_ + "/one", ep = dir_ + "/ep";
  run_ranks(1, moe_run_config(one, corpus_, "bf16", 2, 2, 1), cache_);
  run_ranks(2, moe_run_config(ep, corpus_, "bf16", 2, 1, 2), cache_);
  const StepMetrics a = last_metrics(one), b = last_metrics(ep);
  ASSERT_TRUE(a.master_bytes && b.master_bytes && a.moment_bytes && b.moment_bytes);
  const double masters =
      static_cast<double>(*b.master_bytes) / static_cast<double>(*a.master_bytes);
  const double moments =
      static_cast<double>(*b.moment_bytes) / static_cast<double>(*a.moment_bytes);
  EXPECT_GE(masters, 0.4);
  EXPECT_LE(masters, 0.65);
  EXPECT_GE(moments, 0.5);  // every shard padded to the largest
  EXPECT_LE(moments, 0.65);
  std::printf("[ measured ] EP 2: masters %.3f, moments %.3f of one rank's (%lld and %lld B)\n",
              masters, moments, static_cast<long long>(*a.master_bytes),
              static_cast<long long>(*a.moment_bytes));
}

// A checkpoint of a 2 x 2 run with sharded masters (every piece written from its owner's shard)
// resumed at 2 x 2 (bit for bit), at one rank and at EP 2 (the same global batch: step 3 is the
// forward of the checkpoint's weights, bit for bit; step 4 follows an update, within tolerance).
TEST_F(EpShardedMasters, SavedAtTwoByTwoResumesAtTwoByTwoOneAndEpTwo) {
  const std::string recipe = "bf16";
  const std::string straight = dir_ + "/straight";
  run_ranks(4, moe_run_config(straight, corpus_, recipe, 2, 1, 2), cache_);
  auto half_then = [&](const std::string& name, int world, int64_t accum, int64_t ep) {
    const std::string d = dir_ + "/" + name;
    TrainConfig h = moe_run_config(d, corpus_, recipe, 2, 1, 2);
    h.steps = 2;
    run_ranks(4, h, cache_);
    run_ranks(world, moe_run_config(d, corpus_, recipe, 2, accum, ep), cache_, d,
              /*allow_change=*/true);
    return d;
  };
  const std::string again = half_then("again", 4, 1, 2);
  EXPECT_EQ(logged_losses(again), logged_losses(straight));
  for (const char* file : {"model", "optimizer"})
    expect_bitwise(checkpoint_tensors(straight, 4, file), checkpoint_tensors(again, 4, file),
                   std::string("2 x 2 -> 2 x 2 ") + file);
  const std::vector<double> want = logged_losses(straight);
  for (const auto& [name, world, accum, ep] :
       {std::tuple{"to_one", 1, 4, 1}, std::tuple{"to_ep2", 2, 2, 2}}) {
    const std::string d = half_then(name, world, accum, ep);
    const std::vector<double> got = logged_losses(d);
    ASSERT_EQ(got.size(), 4u) << name;
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(got[i], want[i]) << name << " step " << i + 1;
    EXPECT_NEAR(got[3], want[3], loss_rel(recipe) * std::fabs(want[3])) << name;
    EXPECT_LE(
        max_abs_diff(checkpoint_tensors(straight, 4, "model"), checkpoint_tensors(d, 4, "model")),
        weight_abs(recipe))
        << name;
  }
}

// Spike rollbacks at EP 2 with sharded masters (a rollback gathers them whole to load into, the
// next step prepares everything and shards them again; the BF16 shadow gathers them every second
// step) take the same steps as the same grid with whole masters, bit for bit.
TEST_F(EpShardedMasters, SpikeRollbacksMatchWholeMasters) {
  auto cfg = [&](const std::string& dir, bool sharded) {
    TrainConfig c = moe_run_config(dir, corpus_, "deepseek", 2, 1, 2);
    // A constant, far too high rate makes the loss jump (data_parallel_test.cpp's rollbacks).
    for (const char* kv :
         {"steps=10", "optim.warmup_steps=0", "optim.lr=1.0", "optim.schedule=constant",
          "safety.spike_window=3", "safety.spike_threshold=1", "safety.spike_action=rollback"})
      apply_set(c, kv);
    if (!sharded) apply_set(c, "optim.fused_prepare=false");
    c.validate();
    return c;
  };
  const std::string sh = dir_ + "/sharded", wh = dir_ + "/whole";
  run_ranks(2, cfg(wh, false), cache_);
  std::string log0;  // rank 0's
  run_ranks(2, cfg(sh, true), cache_, "", false, {}, &log0);
  EXPECT_NE(log0.find("rolled back to"), std::string::npos) << log0;
  EXPECT_NE(log0.find("(sharded)"), std::string::npos) << log0;
  const std::vector<StepMetrics> a = read_metrics(wh + "/metrics.jsonl");
  const std::vector<StepMetrics> b = read_metrics(sh + "/metrics.jsonl");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].loss, b[i].loss) << "record " << i;
    EXPECT_EQ(a[i].skipped, b[i].skipped) << "record " << i;
    EXPECT_EQ(a[i].shadow_bf16_loss, b[i].shadow_bf16_loss) << "record " << i;
  }
  expect_bitwise(checkpoint_tensors(wh, 10, "model"), checkpoint_tensors(sh, 10, "model"),
                 "rollbacks, EP 2");
}

// ---- delayed scaling ----

constexpr int64_t kB = 2, kT = 16;

// Rows [first, first + rows) of a fixed batch.
ModelBatch rows_of(int64_t first, int64_t rows, int64_t vocab) {
  Tensor in = Tensor::empty({rows, kT}, DType::kI32), tg = Tensor::empty({rows, kT}, DType::kI32);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < kT; ++t) {
      const int64_t g = (first + r) * kT + t;
      in.data_as<int32_t>()[r * kT + t] = static_cast<int32_t>((g * 37 + 11) % vocab);
      tg.data_as<int32_t>()[r * kT + t] = static_cast<int32_t>((g * 41 + 48) % vocab);
    }
  return {in, tg};
}

// Two forward and backward passes (the second quantizes with the first's scales) of `rows` rows
// from `first`: the recipe state, gathered over the expert group when the experts are sharded.
io::NamedTensors delayed_state(Context& ctx, const ModelConfig& mc, int64_t first, int64_t rows,
                               float grad_scale, const EpGroups& g, bool reduce_experts) {
  Model model(ctx, mc, Precision{recipe_preset("fp8-tensor-delayed"), DType::kBF16}, g.experts);
  if (g.experts && reduce_experts) model.set_expert_amax_group(g.data);
  model.load(ctx, init_parameters(mc, 3));
  for (int pass = 0; pass < 2; ++pass) {
    model.prepare(ctx);
    model.step(ctx, rows_of(first, rows, mc.vocab_size), Pass::kForwardBackward, grad_scale);
  }
  return model.recipe_state(ctx);
}

std::map<std::string, const Tensor*> by_name(const io::NamedTensors& t) {
  std::map<std::string, const Tensor*> out;
  for (const auto& [n, x] : t) out[n] = &x;
  return out;
}

// Every rank of an EP 2 or 2 x 2 grid holds, after a step, the delayed-scaling state (every
// expert's included, gathered) of one rank that ran the whole batch, bit for bit: the replicated
// layers' amaxes are the maximum over the world, each expert's over its data group (every token
// routed to it passes through one rank of that group), and each row's values do not depend on the
// other rows (tests/train/delayed_scaling_dp_test.cpp). With the experts' amaxes reduced over the
// world instead (every rank's experts mixed), the 2 x 2 grid's expert histories differ (checked,
// so the test can fail).
TEST(DelayedScalingEp, EveryRankHoldsTheStateOfOneRankOnTheWholeBatch) {
  const ModelConfig mc = moe_model_config();
  for (const auto& grid : {std::pair{2, 2}, std::pair{4, 2}}) {
    const int world = grid.first, ep = grid.second;
    const std::string tag = "world " + std::to_string(world) + " ep " + std::to_string(ep);
    Context one = make_context(Device::kCpu);
    const io::NamedTensors want =
        delayed_state(one, mc, 0, world * kB, 1.0f, EpGroups{}, /*reduce_experts=*/true);
    ASSERT_FALSE(want.empty());
    std::vector<io::NamedTensors> got(static_cast<size_t>(world)), mixed(got.size());
    run_inprocess_ranks_or_throw(
        world,
        [&](Context& ctx) {
          const int r = ctx.comm->rank();
          const EpGroups g = make_ep_groups(ctx, ctx.comm, ep, mc.n_routed_experts);
          const float s = 1.0f / static_cast<float>(world);
          got[static_cast<size_t>(r)] = delayed_state(ctx, mc, r * kB, kB, s, g, true);
          mixed[static_cast<size_t>(r)] = delayed_state(ctx, mc, r * kB, kB, s, g, false);
        },
        std::chrono::milliseconds(120000));
    const auto w = by_name(want);
    int experts_differ_mixed = 0;
    for (int r = 0; r < world; ++r) {
      const io::NamedTensors& mine = got[static_cast<size_t>(r)];
      ASSERT_EQ(mine.size(), want.size()) << tag << " rank " << r;
      for (const auto& [n, t] : mine) {
        ASSERT_TRUE(w.count(n)) << tag << ": " << n;
        EXPECT_TRUE(test::bitwise_equal(*w.at(n), t)) << tag << " rank " << r << ": " << n;
      }
      for (const auto& [n, t] : mixed[static_cast<size_t>(r)])
        if (n.find('[') != std::string::npos && !test::bitwise_equal(*w.at(n), t))
          ++experts_differ_mixed;
    }
    // At EP = world each expert is on one rank: the world reduction mixes every rank's experts.
    EXPECT_GT(experts_differ_mixed, 0) << tag;
  }
}

// fp8-tensor-delayed trainer runs at EP 2 and 2 x 2 against one rank on the same global batch of
// 8 sequences, every run with one micro-batch per rank (one rank with several micro-batches would
// record one amax per micro-batch, where the ranks record one maximum per step). Not bit for bit,
// as with data parallelism alone (data_parallel_test.cpp): the ranks' loss is the mean of their
// means where one rank takes one mean over all tokens (the first step's loss differs in the last
// bits already, though the recipe state is the same: the test above), and the updates' gradients
// differ in FP32 accumulation order (an expert's Wgrad: expert_parallel_test.cpp), which moves
// later amaxes, scales and FP8 roundings. Within 1e-6 relative (losses; measured 4.6e-8) and 1e-5
// absolute (weights; measured 6.8e-7).
TEST_F(EpShardedMasters, DelayedScalingAtEpTwoAndTwoByTwoMatchesOneRank) {
  const std::string recipe = "fp8-tensor-delayed";
  const std::string one = dir_ + "/one";
  run_ranks(1, moe_run_config(one, corpus_, recipe, 8, 1, 1), cache_);
  const std::vector<double> la = logged_losses(one);
  ASSERT_EQ(la.size(), 4u);
  for (const auto& [world, ep] : {std::pair{2, 2}, std::pair{4, 2}}) {
    const std::string tag = "world " + std::to_string(world) + " ep " + std::to_string(ep);
    const std::string d = dir_ + "/ep" + std::to_string(world);
    EXPECT_EQ(
        run_ranks(world, moe_run_config(d, corpus_, recipe, 8 / world, 1, ep), cache_).steps_done,
        4)
        << tag;
    const std::vector<double> lb = logged_losses(d);
    ASSERT_EQ(lb.size(), 4u) << tag;
    double worst = 0;
    for (size_t i = 0; i < la.size(); ++i) {
      EXPECT_NEAR(lb[i], la[i], 1e-6 * std::fabs(la[i])) << tag << " step " << i + 1;
      worst = std::max(worst, std::fabs(lb[i] - la[i]) / std::fabs(la[i]));
    }
    const double dw =
        max_abs_diff(checkpoint_tensors(one, 4, "model"), checkpoint_tensors(d, 4, "model"));
    EXPECT_LE(dw, 1e-5) << tag;
    // The recipe state holds every expert's history, by expert index, as one rank's does.
    const io::NamedTensors ra =
        io::read_safetensors(one + "/checkpoints/step_00000004/" + "recipe_state.safetensors")
            .tensors;
    const io::NamedTensors rb =
        io::read_safetensors(d + "/checkpoints/step_00000004/" + "recipe_state.safetensors")
            .tensors;
    const auto na = by_name(ra), nb = by_name(rb);
    EXPECT_EQ(na.size(), nb.size()) << tag;
    for (const auto& [n, t] : na) EXPECT_TRUE(nb.count(n)) << tag << ": " << n;
    std::printf(
        "[ measured ] delayed scaling, %s vs one rank: losses within %.3g relative, "
        "weights within %.3g\n",
        tag.c_str(), worst, dw);
  }
}

// A delayed-scaling run saved at 2 x 2 resumes at 2 x 2 bit for bit (every expert's history came
// back, each to the rank that holds the expert) and at one rank (one micro-batch of the same 8
// sequences) within the tolerance above (the loss is one mean, not a mean of the ranks' means).
TEST_F(EpShardedMasters, DelayedScalingSavedAtTwoByTwoResumesAtTwoByTwoAndOne) {
  const std::string recipe = "fp8-tensor-delayed";
  const std::string straight = dir_ + "/straight";
  run_ranks(4, moe_run_config(straight, corpus_, recipe, 2, 1, 2), cache_);
  const std::vector<double> want = logged_losses(straight);
  for (const auto& [name, world, batch, ep] :
       {std::tuple{"again", 4, 2, 2}, std::tuple{"to_one", 1, 8, 1}}) {
    const std::string d = dir_ + "/" + name;
    TrainConfig h = moe_run_config(d, corpus_, recipe, 2, 1, 2);
    h.steps = 2;
    run_ranks(4, h, cache_);
    run_ranks(world, moe_run_config(d, corpus_, recipe, batch, 1, ep), cache_, d, true);
    const std::vector<double> got = logged_losses(d);
    ASSERT_EQ(got.size(), 4u) << name;
    if (world == 4) {
      EXPECT_EQ(got, want) << name;
      expect_bitwise(checkpoint_tensors(straight, 4, "model"), checkpoint_tensors(d, 4, "model"),
                     name);
    } else {
      for (size_t i = 0; i < 2; ++i) EXPECT_EQ(got[i], want[i]) << name << " step " << i + 1;
      for (size_t i = 2; i < 4; ++i)
        EXPECT_NEAR(got[i], want[i], 1e-6 * std::fabs(want[i])) << name << " step " << i + 1;
    }
  }
}

}  // namespace
}  // namespace octet::train
