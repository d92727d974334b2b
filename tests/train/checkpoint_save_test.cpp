// Sharded asynchronous checkpoint writes (train/checkpoint_save.h) on in-process ranks: the files
// every rank writes together are byte for byte those of the single writer (write_checkpoint and
// write_safetensors of the gathered optimizer state), at world sizes 1, 2 and 3 and with several
// model shards; the snapshot is taken at save() (later changes do not reach the files) into a
// buffer allocated once; a rank that fails while writing fails every rank with one error naming it,
// and the previous checkpoint stays whole and loadable.
#include "train/checkpoint_save.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "backend/backend.h"
#include "dist/inprocess_comm.h"
#include "io/atomic_file.h"
#include "io/safetensors_dir.h"
#include "model/init.h"
#include "test_util.h"
#include "tiny_model.h"
#include "train/zero_optimizer.h"

namespace octet::train {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

std::string temp_dir(const std::string& name) {
  return test::fresh_temp_dir("ckpt", name);
}

std::string bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One rank's model and ZeRO-1 optimizer after one step with rank-dependent gradients, so that the
// moments are nonzero and differ per piece.
struct RankState {
  ModelConfig config = test::tiny_model_config();
  std::unique_ptr<Model> model;
  std::unique_ptr<ZeroAdamW> zero;
  int64_t steps = 0;

  explicit RankState(Context& ctx) {
    model = std::make_unique<Model>(ctx, config, Precision{recipe_preset("bf16"), DType::kBF16});
    init_model(ctx, *model, 11);
    zero = std::make_unique<ZeroAdamW>(ctx, ctx.comm, model->parameters(), AdamWConfig{},
                                       ZeroConfig{.piece_elems = 3000, .bucket_elems = 1 << 14});
    int i = 0;
    for (Parameter* p : model->parameters()) {
      const Tensor g = test::random_tensor(p->value.shape(), DType::kF32, 500 + i++);
      ctx.be().copy(p->grad.data(), g.data(), g.nbytes(), CopyKind::kHostToHost);
    }
    zero->step(ctx, 1e-3f);
    steps = zero->steps_taken();
  }

  SaveRequest request(Context& ctx, const std::string& root, const std::string& name,
                      int64_t shard_bytes) {
    const int rank = ctx.comm->rank(), world = ctx.comm->size();
    TrainingCheckpoint tc = training_checkpoint({.model = model.get(),
                                                 .zero = zero.get(),
                                                 .optimizer_steps = &steps,
                                                 .rank = rank,
                                                 .world = world,
                                                 .shard_bytes = shard_bytes});
    SaveRequest req{.root = root,
                    .name = name,
                    .plan = make_checkpoint_plan(std::move(tc.files), tc.holdings, world),
                    .rank0_files = {},
                    .after_commit = {}};
    if (rank == 0) {
      req.rank0_files.emplace_back(
          "config.json", [c = tc.config_json](const std::string& p) { write_model_config(p, c); });
      if (!tc.index_json.empty())
        req.rank0_files.emplace_back(
            io::kShardIndexName,
            [t = tc.index_json](const std::string& p) { io::write_text_file_atomic(p, t); });
      req.after_commit = [root, name] { io::write_text_file_atomic(root + "/latest", name); };
    }
    return req;
  }
};

TEST(CheckpointSave, EveryRankWritesItsPartOfTheSingleWritersBytes) {
  const std::string dir = temp_dir("bytes");
  for (const int world : {1, 2, 3}) {
    for (const int64_t shard_bytes : {int64_t{5'000'000'000}, int64_t{60'000}}) {
      SCOPED_TRACE("world " + std::to_string(world) + " shard " + std::to_string(shard_bytes));
      const std::string root =
          dir + "/w" + std::to_string(world) + "_" + std::to_string(shard_bytes);
      const std::string ref = root + "/ref";
      run_inprocess_ranks_or_throw(
          world,
          [&](Context& ctx) {
            RankState s(ctx);
            CheckpointSaver saver;
            saver.save(ctx, ctx.comm.get(), s.request(ctx, root, "step_1", shard_bytes));
            saver.finish(ctx, ctx.comm.get());
            EXPECT_GT(saver.snapshot_capacity(), 0);
            // The single writer's files, from the gathered state (collective).
            const io::NamedTensors opt = s.zero->state_dict(ctx);
            if (ctx.comm->rank() == 0) {
              write_checkpoint(ref, s.config, s.model->export_tensors(ctx),
                               {.shard_bytes = shard_bytes});
              io::write_safetensors(ref + "/optimizer.safetensors", opt);
            }
          },
          milliseconds(60000));
      size_t files = 0;
      for (const auto& e : fs::directory_iterator(ref)) {
        const fs::path got = fs::path(root) / "step_1" / e.path().filename();
        ASSERT_TRUE(fs::exists(got)) << got;
        EXPECT_TRUE(bytes_of(got) == bytes_of(e.path())) << got;
        ++files;
      }
      // config.json, model.safetensors, optimizer.safetensors; or several shards and the index.
      if (shard_bytes > 1'000'000) EXPECT_EQ(files, 3u);
      size_t written = 0;
      for (const auto& e : fs::directory_iterator(fs::path(root) / "step_1")) (void)e, ++written;
      EXPECT_EQ(written, files);                          // no markers or strays left
      if (shard_bytes < 1'000'000) EXPECT_GT(files, 4u);  // several model shards and the index
      EXPECT_FALSE(fs::exists(root + "/step_1.partial"));
    }
  }
  fs::remove_all(dir);
}

TEST(CheckpointSave, TheSnapshotIsTakenAtSaveIntoOneReusedBuffer) {
  const std::string root = temp_dir("snapshot");
  run_inprocess_ranks_or_throw(
      2,
      [&](Context& ctx) {
        RankState s(ctx);
        const io::NamedTensors before = s.model->export_tensors(ctx);
        CheckpointSaver saver;
        saver.save(ctx, ctx.comm.get(), s.request(ctx, root, "step_1", 5'000'000'000));
        const int64_t cap = saver.snapshot_capacity();
        // The step goes on: the weights change while the files are written.
        for (Parameter* p : s.model->parameters())
          std::fill_n(p->value.data_as<float>(), p->value.numel(), 7.0f);
        saver.save(ctx, ctx.comm.get(), s.request(ctx, root, "step_2", 5'000'000'000));
        saver.finish(ctx, ctx.comm.get());
        EXPECT_EQ(saver.snapshot_capacity(), cap);  // allocated once
        if (ctx.comm->rank() == 0) {
          const LoadedCheckpoint one = read_checkpoint(root + "/step_1");
          for (size_t i = 0; i < before.size(); ++i)
            EXPECT_TRUE(test::bitwise_equal(before[i].second, one.at(before[i].first)))
                << before[i].first;
          const LoadedCheckpoint two = read_checkpoint(root + "/step_2");
          EXPECT_EQ(two.tensors[0].second.data_as<const float>()[0], 7.0f);
        }
      },
      milliseconds(60000));
  fs::remove_all(root);
}

TEST(CheckpointSave, AFailingRankFailsEveryRankAndThePreviousCheckpointStays) {
  const std::string root = temp_dir("fail");
  const std::vector<std::string> errors = run_inprocess_ranks(
      3,
      [&](Context& ctx) {
        RankState s(ctx);
        CheckpointSaver saver;
        saver.save(ctx, ctx.comm.get(), s.request(ctx, root, "step_1", 60'000));
        saver.finish(ctx, ctx.comm.get());
        saver.before_write = [&](const std::string& file) {
          if (ctx.comm->rank() == 1 && file == "optimizer.safetensors")
            throw std::runtime_error("disk full (injected)");
        };
        saver.save(ctx, ctx.comm.get(), s.request(ctx, root, "step_2", 60'000));
        saver.finish(ctx, ctx.comm.get());  // throws on every rank
      },
      milliseconds(60000));
  ASSERT_EQ(errors.size(), 3u);
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("checkpoint " + root + "/step_2 was not written: rank 1 failed: "),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("disk full (injected)"), std::string::npos) << e;
  }
  EXPECT_FALSE(fs::exists(root + "/step_2"));
  EXPECT_EQ(bytes_of(root + "/latest"), "step_1");
  const LoadedCheckpoint ck = read_checkpoint(root + "/step_1");
  EXPECT_FALSE(ck.tensors.empty());
  EXPECT_FALSE(io::read_safetensors(root + "/step_1/optimizer.safetensors").tensors.empty());
  fs::remove_all(root);
}

}  // namespace
}  // namespace octet::train
