// Expert-parallel checkpoints and initialisation on in-process ranks (threads on the CPU):
//   - init_model at EP 2 and 4 draws each rank's own experts, bit for bit the single rank's;
//   - a checkpoint written by the trainer at EP 2, or by one rank, loaded at every grid (one rank,
//     DP 2, EP 2, EP 4, DP 2 x EP 2; each rank reading only what it holds) and saved again by
//     every rank's writer gives the same model and optimizer files, byte for byte;
//   - the save moves nothing between the ranks of an expert group (a collective counter on the
//     expert group stays still) and each rank writes its own experts only;
//   - the trainer saved at EP 2 resumes at EP 4 and at DP 2 x EP 2.
#include <gtest/gtest.h>

#include <atomic>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "backend/backend.h"
#include "dist/inprocess_comm.h"
#include "io/atomic_file.h"
#include "io/safetensors_dir.h"
#include "model/init.h"
#include "model/model.h"
#include "rank_runs.h"
#include "test_util.h"
#include "train/checkpoint_save.h"
#include "train/expert_parallel.h"
#include "train/zero_optimizer.h"

namespace octet::train {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

std::string bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Forwards everything to `inner` and counts the collectives that went through it.
class CountingComm : public Comm {
 public:
  explicit CountingComm(std::shared_ptr<Comm> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return inner_->name(); }
  void all_reduce(Context& ctx, const void* send, void* recv, int64_t count, DType dtype,
                  ReduceOp op) override {
    ++calls;
    inner_->all_reduce(ctx, send, recv, count, dtype, op);
  }
  void reduce_scatter(Context& ctx, const void* send, void* recv, int64_t recv_count, DType dtype,
                      ReduceOp op) override {
    ++calls;
    inner_->reduce_scatter(ctx, send, recv, recv_count, dtype, op);
  }
  void all_gather(Context& ctx, const void* send, void* recv, int64_t send_count,
                  DType dtype) override {
    ++calls;
    inner_->all_gather(ctx, send, recv, send_count, dtype);
  }
  void all_to_all_v(Context& ctx, const void* send, const int64_t* send_counts,
                    const int64_t* send_displs, void* recv, const int64_t* recv_counts,
                    const int64_t* recv_displs, DType dtype) override {
    ++calls;
    inner_->all_to_all_v(ctx, send, send_counts, send_displs, recv, recv_counts, recv_displs,
                         dtype);
  }
  void broadcast(Context& ctx, void* buf, int64_t count, DType dtype, int root) override {
    ++calls;
    inner_->broadcast(ctx, buf, count, dtype, root);
  }
  void barrier(Context& ctx) override {
    ++calls;
    inner_->barrier(ctx);
  }
  std::shared_ptr<Comm> split(Context& ctx, int color, int key) override {
    ++calls;
    return inner_->split(ctx, color, key);
  }
  void abort(const std::string& reason) noexcept override { inner_->abort(reason); }

  std::atomic<int64_t> calls{0};

 private:
  std::shared_ptr<Comm> inner_;
};

class EpCheckpoint : public MoeRunTest {};

TEST(EpInit, EachRankDrawsItsOwnExpertsAsOneRank) {
  const ModelConfig mc = moe_model_config();
  const Precision p{recipe_preset("bf16"), DType::kBF16};
  Context c1 = make_context(Device::kCpu);
  Model one(c1, mc, p);
  init_model(c1, one, 7);
  for (const int world : {2, 4}) {
    std::atomic<int> experts_seen{0};
    run_inprocess_ranks_or_throw(
        world,
        [&](Context& ctx) {
          const int r = ctx.comm->rank();
          const EpGroups g = make_ep_groups(ctx, ctx.comm, world, mc.n_routed_experts);
          Model m(ctx, mc, p, g.experts);
          std::set<std::string> experts;
          for (Parameter* e : m.expert_parameters()) experts.insert(e->name);
          // Poison first: every element must be written by init_model.
          for (Parameter* q : m.parameters())
            for (int64_t i = 0; i < q->value.numel(); ++i)
              q->value.data_as<float>()[i] = std::nanf("");
          init_model(ctx, m, 7);
          for (Parameter* q : m.parameters()) {
            const Tensor& full = one.parameter(q->name).value;
            const int64_t n = q->value.numel();
            const int64_t from = experts.count(q->name) ? r * n : 0;
            if (experts.count(q->name)) {
              ASSERT_EQ(n * world, full.numel()) << q->name;
              ++experts_seen;
            }
            EXPECT_EQ(std::memcmp(q->value.data(), full.data_as<const float>() + from, n * 4), 0)
                << "EP " << world << " rank " << r << ": " << q->name;
          }
        },
        milliseconds(60000));
    EXPECT_EQ(experts_seen.load(), 2 * world);  // gate_up and down of the one MoE layer per rank
  }
}

// One rank of a grid: the model and optimizer of a trainer run at (world, ep), loaded from `from`
// and saved by every rank into root/step_00000002.
struct GridRank {
  std::unique_ptr<Model> model;
  std::unique_ptr<ZeroAdamW> zero;
  std::unique_ptr<EpAdamW> ep;
  std::shared_ptr<CountingComm> expert_group;
  int64_t steps = 0;

  GridRank(Context& ctx, const ModelConfig& mc, int ep_size) {
    const Precision p{recipe_preset("bf16"), DType::kBF16};
    EpGroups g = make_ep_groups(ctx, ctx.comm, ep_size, mc.n_routed_experts);
    if (g.experts) {
      expert_group = std::make_shared<CountingComm>(g.experts);
      g.experts = expert_group;
    }
    model = std::make_unique<Model>(ctx, mc, p, g.experts);
    if (g.experts)
      ep = std::make_unique<EpAdamW>(ctx, ctx.comm, g, *model, AdamWConfig{});
    else
      zero = std::make_unique<ZeroAdamW>(ctx, ctx.comm, model->parameters(), AdamWConfig{});
  }

  TrainingSources sources(Context& ctx) {
    return {.model = model.get(),
            .zero = zero.get(),
            .ep = ep.get(),
            .optimizer_steps = &steps,
            .rank = ctx.comm->rank(),
            .world = ctx.comm->size()};
  }

  // Saves as the trainer does (config.json by rank 0) and waits; returns the plan.
  CheckpointPlan save(Context& ctx, CheckpointSaver& saver, const std::string& root) {
    steps = ep ? ep->steps_taken() : zero->steps_taken();
    TrainingCheckpoint tc = training_checkpoint(sources(ctx));
    const int world = ctx.comm->size();
    SaveRequest req{.root = root,
                    .name = "step_00000002",
                    .plan = make_checkpoint_plan(std::move(tc.files), tc.holdings, world),
                    .rank0_files = {},
                    .after_commit = {}};
    CheckpointPlan plan = req.plan;
    if (ctx.comm->rank() == 0)
      req.rank0_files.emplace_back(
          "config.json", [c = tc.config_json](const std::string& p) { write_model_config(p, c); });
    saver.save(ctx, ctx.comm.get(), std::move(req));
    saver.finish(ctx, ctx.comm.get());
    return plan;
  }
};

TEST_F(EpCheckpoint, AnyGridLoadsAndSavesTheSameFilesWithoutGathering) {
  // The sources: two steps of the trainer at EP 2, and at one rank (grad_accum 2: the same batch).
  const std::string at_ep2 = dir_ + "/ep2", at_one = dir_ + "/one";
  TrainConfig c2 = moe_run_config(at_ep2, corpus_, "bf16", 2, 1, 2);
  c2.steps = 2;
  run_ranks(2, c2, cache_);
  TrainConfig c1 = moe_run_config(at_one, corpus_, "bf16", 2, 2, 1);
  c1.steps = 2;
  run_ranks(1, c1, cache_);
  struct Grid {
    int world, ep;
  };
  for (const std::string& src : {at_ep2, at_one}) {
    const std::string from = src + "/checkpoints/step_00000002";
    const ModelConfig mc = read_model_config(from + "/config.json");  // the data's vocabulary
    for (const Grid g : {Grid{1, 1}, Grid{2, 1}, Grid{2, 2}, Grid{4, 4}, Grid{4, 2}}) {
      const std::string tag =
          src + " -> world " + std::to_string(g.world) + " ep " + std::to_string(g.ep);
      SCOPED_TRACE(tag);
      const std::string root = dir_ + "/again_" + fs::path(src).filename().string() +
                               std::to_string(g.world) + std::to_string(g.ep);
      run_inprocess_ranks_or_throw(
          g.world,
          [&](Context& ctx) {
            GridRank s(ctx, mc, g.ep);
            load_training_checkpoint(ctx, from, s.sources(ctx));
            const int64_t before = s.expert_group ? s.expert_group->calls.load() : 0;
            CheckpointSaver saver;
            const CheckpointPlan plan = s.save(ctx, saver, root);
            if (!s.ep) return;
            // Nothing moved over the expert group during the save: no gather.
            EXPECT_EQ(s.expert_group->calls.load(), before);
            // This rank wrote its own experts only (weights and moments), and its snapshot held
            // only what it writes.
            const int rank = ctx.comm->rank();
            const int64_t per_rank = mc.n_routed_experts / g.ep;
            for (const WriteRange& w : plan.ranges) {
              if (w.rank != rank) continue;
              const io::TensorDecl& t = plan.files[w.file].tensors[w.tensor];
              const std::string key = ".mlp.experts.";
              const size_t at = t.name.find(key);
              if (at == std::string::npos) continue;
              int64_t first = 0, last = 0;
              if (std::isdigit(static_cast<unsigned char>(t.name[at + key.size()]))) {
                first = last = std::stoll(t.name.substr(at + key.size()));
              } else {  // a stacked moment (E, ...): the experts of its elements
                const int64_t per = shape_numel(t.shape) / t.shape[0];
                first = w.begin / per;
                last = (w.end - 1) / per;
              }
              EXPECT_EQ(first / per_rank, s.ep->ep_rank()) << t.name;
              EXPECT_EQ(last / per_rank, s.ep->ep_rank()) << t.name;
            }
            int64_t total = 0;
            for (int q = 0; q < g.world; ++q) total += plan.bytes_of(q);
            EXPECT_LE(saver.snapshot_capacity(),
                      plan.bytes_of(rank) + 64 * static_cast<int64_t>(plan.ranges.size()));
            if (rank == 0)
              std::cout << "[ measured ] " << tag << ": rank 0 writes " << plan.bytes_of(0)
                        << " of " << total << " bytes\n";
            EXPECT_LE(plan.bytes_of(rank) * g.world, total * 3 / 2);
          },
          milliseconds(120000));
      for (const char* f : {"model.safetensors", "optimizer.safetensors", "config.json"}) {
        const fs::path want = fs::path(from) / f, got = fs::path(root) / "step_00000002" / f;
        ASSERT_TRUE(fs::exists(got)) << got;
        EXPECT_TRUE(bytes_of(got) == bytes_of(want)) << tag << ": " << f;
      }
    }
  }
}

// The trainer saved at EP 2 resumes at EP 4 and DP 2 x EP 2 (world 4, one sequence per rank: the
// same global batch cut into other micro-batches, so within a tolerance of the uninterrupted run).
TEST_F(EpCheckpoint, SavedAtEpTwoResumesAtEpFourAndTwoByTwo) {
  const std::string straight = dir_ + "/straight";
  run_ranks(2, moe_run_config(straight, corpus_, "bf16", 2, 1, 2), cache_);
  const std::vector<double> want = logged_losses(straight);
  ASSERT_EQ(want.size(), 4u);
  for (const int ep : {4, 2}) {
    const std::string r = dir_ + "/to_ep" + std::to_string(ep);
    TrainConfig half = moe_run_config(r, corpus_, "bf16", 2, 1, 2);
    half.steps = 2;
    run_ranks(2, half, cache_);
    const RunResult res = run_ranks(4, moe_run_config(r, corpus_, "bf16", 1, 1, ep), cache_, r,
                                    /*allow_change=*/true);
    EXPECT_EQ(res.steps_done, 4) << "ep " << ep;
    const std::vector<double> got = logged_losses(r);
    ASSERT_EQ(got.size(), 4u) << "ep " << ep;
    for (size_t i = 0; i < 2; ++i) EXPECT_EQ(got[i], want[i]) << "ep " << ep;
    for (size_t i = 2; i < 4; ++i)
      EXPECT_NEAR(got[i], want[i], 1e-5 * std::fabs(want[i])) << "ep " << ep << " step " << i + 1;
    const double dw =
        max_abs_diff(checkpoint_tensors(straight, 4, "model"), checkpoint_tensors(r, 4, "model"));
    EXPECT_LE(dw, 1e-5) << "ep " << ep;
    std::cout << "[ measured ] EP 2 -> world 4 EP " << ep << ": losses " << got[2] << ", " << got[3]
              << " vs " << want[2] << ", " << want[3] << "; max |weight difference| " << dw << "\n";
  }
}

}  // namespace
}  // namespace octet::train
