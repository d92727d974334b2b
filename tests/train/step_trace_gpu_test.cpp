// `octet train --trace` (train/step_trace.h): the kernel timeline of a window of graphed steps is
// written as CSV and summarised, and tracing changes nothing the run computes.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "backend/backend.h"
#include "backend/kernel_trace.h"
#include "test_util.h"
#include "tiny_model.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace octet::train {
namespace {

TrainConfig tiny(const std::string& run_dir, const std::string& corpus) {
  TrainConfig c;
  for (const char* kv : {"steps=10", "checkpoint_every=-1", "batch_size=2", "seq_len=64",
                         "log_every=5", "eval.every=0", "sites_every=0", "optim.warmup_steps=2",
                         "device=cuda", "recipe=deepseek", "cuda_graphs=true"})
    apply_set(c, kv);
  for (const char* kv : test::kTinyGpuTrainModelKeys) apply_set(c, kv);
  apply_set(c, "run_dir=" + run_dir);
  apply_set(c, "data.text=\"" + corpus + "\"");
  c.validate();
  return c;
}

TEST(StepTraceGpu, TracedStepsAreWrittenSummarisedAndTrainAsUntracedOnes) {
  OCTET_REQUIRE_GPU();
  {
    Context ctx = make_context(Device::kCuda);
    try {
      trace_kernels(ctx, [] {});
    } catch (const std::exception& e) {
      if (std::string(e.what()).find("libcupti") != std::string::npos)
        GTEST_SKIP() << "no libcupti on LD_LIBRARY_PATH: " << e.what();
      throw;
    }
  }
  const std::string dir = test::fresh_temp_dir("step_trace_gpu", "window");
  const std::string corpus = test::write_pangram_corpus(dir, 400);
  RunOptions plain;
  plain.cache_dir = dir + "/cache";
  RunOptions traced = plain;
  traced.trace_path = dir + "/trace.csv";
  traced.trace_first = 4;
  traced.trace_last = 6;
  std::ostringstream log_a, log_b;
  run_training(tiny(dir + "/traced", corpus), traced, log_a);
  run_training(tiny(dir + "/plain", corpus), plain, log_b);
  // Step 7 was launched before step 6 was read back: the trace holds steps 4 to 7.
  EXPECT_NE(log_a.str().find("kernel trace of steps 4-7:"), std::string::npos) << log_a.str();
  std::ifstream f(traced.trace_path);
  std::string header, line;
  ASSERT_TRUE(std::getline(f, header));
  EXPECT_EQ(header, "start_us,end_us,dur_us,stream,graph_node,name");
  int64_t rows = 0, graphed = 0;
  while (std::getline(f, line)) {
    ++rows;
    // stream and graph node: the fifth field is non-zero inside a graph replay
    std::istringstream in(line);
    std::string field;
    for (int i = 0; i < 5; ++i) std::getline(in, field, ',');
    if (field != "0") ++graphed;
  }
  EXPECT_GT(rows, 100) << "a few steps of a MoE model run hundreds of kernels";
  EXPECT_GT(graphed, rows / 2) << "the steady steps replay graphs";
  const std::vector<StepMetrics> a = read_metrics(dir + "/traced/metrics.jsonl"),
                                 b = read_metrics(dir + "/plain/metrics.jsonl");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(std::memcmp(&a[i].loss, &b[i].loss, 8), 0) << "step " << i + 1;
    EXPECT_EQ(std::memcmp(&a[i].grad_norm, &b[i].grad_norm, 8), 0) << "step " << i + 1;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace octet::train
