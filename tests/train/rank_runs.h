// Helpers of the data- and expert-parallel trainer tests: runs of the trainer on in-process ranks
// and what they left on disk.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "dist/inprocess_comm.h"
#include "io/safetensors.h"
#include "test_util.h"
#include "train/metrics.h"
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

// Every rank runs the trainer; rank 0's result is returned.
inline RunResult run_ranks(int world, const TrainConfig& cfg, const std::string& cache,
                           const std::string& resume = "", bool allow_change = false,
                           const std::function<void(int, const std::string&)>& fault = {}) {
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
        if (ctx.comm->rank() == 0) r0 = r;
      },
      std::chrono::milliseconds(120000));
  return r0;
}

inline void expect_bitwise(const io::NamedTensors& a, const io::NamedTensors& b,
                           const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(test::bitwise_equal(a[i].second, b[i].second)) << what << ": " << a[i].first;
  }
}

}  // namespace octet::train
