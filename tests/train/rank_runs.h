// Helpers of the data- and expert-parallel trainer tests: runs of the trainer on in-process ranks
// and what they left on disk.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "dist/inprocess_comm.h"
#include "io/safetensors.h"
#include "test_util.h"
#include "tiny_model.h"
#include "train/metrics.h"
#include "train/train_config.h"
#include "train/trainer.h"

namespace octet::train {

// The train loss of every step the run logged.
inline std::vector<double> logged_losses(const std::string& run_dir) {
  std::vector<double> out;
  for (const StepMetrics& m : read_metrics(run_dir + "/metrics.jsonl")) out.push_back(m.loss);
  return out;
}

// The tensors of checkpoint step_<step>'s files whose names start with `prefix` ("model",
// "optimizer"), sorted by name.
inline io::NamedTensors checkpoint_tensors(const std::string& run_dir, int step,
                                           const std::string& prefix) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08d", step);
  io::NamedTensors out;
  namespace fs = std::filesystem;
  for (const auto& e : fs::directory_iterator(fs::path(run_dir) / "checkpoints" / name)) {
    const std::string f = e.path().filename().string();
    if (f.rfind(prefix, 0) == 0 && e.path().extension() == ".safetensors")
      for (auto& t : io::read_safetensors(e.path().string()).tensors) out.push_back(std::move(t));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

// Every rank runs the trainer; rank 0's result is returned (and its output, into rank0_log).
inline RunResult run_ranks(int world, const TrainConfig& cfg, const std::string& cache,
                           const std::string& resume = "", bool allow_change = false,
                           const std::function<void(int, const std::string&)>& fault = {},
                           std::string* rank0_log = nullptr) {
  RunResult r0;
  run_inprocess_ranks_or_throw(
      world,
      [&](Context& ctx) {
        RunOptions o;
        o.cache_dir = cache;
        o.comm = ctx.comm;
        o.resume_from = resume;
        o.allow_config_change = allow_change;
        o.checkpoint_fault = fault;
        std::ostringstream sink;
        const RunResult r = run_training(cfg, o, sink);
        if (ctx.comm->rank() != 0) return;
        r0 = r;
        if (rank0_log) *rank0_log = sink.str();
      },
      std::chrono::milliseconds(120000));
  return r0;
}

// The expert-parallel tests' model: 8 routed experts (top 2) and a shared one in layer 1 of 2.
// (test::kTinyTrainModelKeys without MTP.)
inline void apply_moe_model_keys(TrainConfig& c) {
  for (const char* kv : test::kTinyTrainModelKeys) apply_set(c, kv);
  apply_set(c, "model.num_nextn_predict_layers=0");
}

inline ModelConfig moe_model_config() {
  TrainConfig tc;
  apply_moe_model_keys(tc);
  return tc.model;
}

// 4 steps of that model on the CPU, a checkpoint every 2, at parallel.ep = ep.
inline TrainConfig moe_run_config(const std::string& run_dir, const std::string& corpus,
                                  const std::string& recipe, int64_t batch, int64_t accum,
                                  int64_t ep) {
  TrainConfig c;
  for (const char* kv :
       {"steps=4", "checkpoint_every=2", "keep_checkpoints=3", "seq_len=16", "log_every=1",
        "eval.every=0", "optim.warmup_steps=1", "device=cpu", "safety.shadow_bf16=2"})
    apply_set(c, kv);
  apply_moe_model_keys(c);
  apply_set(c, "recipe=" + recipe);
  apply_set(c, "batch_size=" + std::to_string(batch));
  apply_set(c, "grad_accum=" + std::to_string(accum));
  apply_set(c, "parallel.ep=" + std::to_string(ep));
  apply_set(c, "run_dir=" + run_dir);
  apply_set(c, "data.text=\"" + corpus + "\"");
  c.validate();
  return c;
}

// The largest |a - b| over every element of same-named F32 tensors (same names and shapes
// required).
inline double max_abs_diff(const io::NamedTensors& a, const io::NamedTensors& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(a[i].second.shape(), b[i].second.shape()) << a[i].first;
    if (a[i].second.shape() != b[i].second.shape() || a[i].second.dtype() != DType::kF32) continue;
    for (int64_t k = 0; k < a[i].second.numel(); ++k)
      worst = std::max<double>(worst, std::fabs(a[i].second.data_as<const float>()[k] -
                                                b[i].second.data_as<const float>()[k]));
  }
  return worst;
}

// A fixture with a fresh directory per test (removed after it), a small corpus in it and a data
// cache, for the runs of the MoE model above.
class MoeRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::fresh_temp_dir("moe",
                                ::testing::UnitTest::GetInstance()->current_test_info()->name());
    corpus_ = test::write_pangram_corpus(dir_, 300);
    cache_ = dir_ + "/cache";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_, corpus_, cache_;
};

inline void expect_bitwise(const io::NamedTensors& a, const io::NamedTensors& b,
                           const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(test::bitwise_equal(a[i].second, b[i].second)) << what << ": " << a[i].first;
  }
}

}  // namespace octet::train
