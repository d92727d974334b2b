// The graphed training step on CUDA never waits for the device (issue 11): between a step's batch
// upload and the next step's launch the host makes no device-to-host copy and no synchronisation
// (the backend's host_waits counter counts both); it reads each step's results a step late from
// pinned memory after an event, which is not one of them. Counted over the steady steps of a run
// (RunResult::steady_steps: after the graphs' capture, with no probe, shadow, evaluation or
// checkpoint due; logging steps included), which must also train as the eager run does.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "test_util.h"
#include "tiny_model.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace octet::train {
namespace {

TrainConfig steady(const std::string& run_dir, const std::string& corpus, const std::string& recipe,
                   bool graphs) {
  TrainConfig c;
  for (const char* kv : {"steps=12", "checkpoint_every=-1", "batch_size=2", "seq_len=64",
                         "grad_accum=2", "log_every=3", "eval.every=0", "sites_every=0",
                         "optim.warmup_steps=2", "device=cuda", "safety.spike_window=4"})
    apply_set(c, kv);
  for (const char* kv : test::kTinyGpuTrainModelKeys) apply_set(c, kv);
  apply_set(c, "recipe=" + recipe);
  apply_set(c, "run_dir=" + run_dir);
  apply_set(c, "data.text=\"" + corpus + "\"");
  apply_set(c, std::string("cuda_graphs=") + (graphs ? "true" : "false"));
  c.validate();
  return c;
}

TEST(TrainerLaggedGpu, TheSteadyGraphedStepNeverWaitsForTheDevice) {
  OCTET_REQUIRE_GPU();
  const std::string dir = test::fresh_temp_dir("lagged_gpu", "steady");
  const std::string corpus = test::write_pangram_corpus(dir, 400);
  for (const char* recipe : {"deepseek", "bf16"}) {
    RunOptions o;
    o.cache_dir = dir + "/cache";
    std::ostringstream log;
    const std::string graphed = dir + "/" + recipe + "_graphed", eager = dir + "/" + recipe;
    const RunResult r = run_training(steady(graphed, corpus, recipe, true), o, log);
    run_training(steady(eager, corpus, recipe, false), o, log);
    EXPECT_GE(r.steady_steps, 6) << recipe << "\n" << log.str();
    EXPECT_EQ(r.steady_host_waits, 0)
        << recipe << ": the steady steps waited for the device " << r.steady_host_waits
        << " times over " << r.steady_steps << " steps";
    const std::vector<StepMetrics> a = read_metrics(graphed + "/metrics.jsonl"),
                                   b = read_metrics(eager + "/metrics.jsonl");
    ASSERT_EQ(a.size(), 12u);
    ASSERT_EQ(b.size(), 12u);
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(std::memcmp(&a[i].loss, &b[i].loss, 8), 0) << recipe << " step " << i + 1;
      EXPECT_EQ(std::memcmp(&a[i].grad_norm, &b[i].grad_norm, 8), 0) << recipe << " step " << i + 1;
    }
    std::printf("[ measured ] %s: %lld steady steps, %lld host waits; last step %.2f ms\n", recipe,
                static_cast<long long>(r.steady_steps), static_cast<long long>(r.steady_host_waits),
                a.back().step_ms);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace octet::train
