// The pieces of the graphed step that run on the CPU too (train/step_graph.h): AdamW's constants
// computed from a step count held with the tensors equal the host's bit for bit, the count
// advances only over applied steps, sections run eagerly without CUDA, pinned uploads copy, the
// cuda_graphs key, and when a section captures (CaptureSchedule): never in the middle of a step's
// micro-batches, so a step never holds an eager and a graphed working set at once.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda_graph.h"
#include "ops/adamw/adamw.h"
#include "train/step_graph.h"
#include "train/train_config.h"

namespace octet::train {
namespace {

Tensor filled(int64_t n, float start, float step) {
  Tensor t = Tensor::empty({n}, DType::kF32);
  for (int64_t i = 0; i < n; ++i) t.data_as<float>()[i] = start + step * static_cast<float>(i);
  return t;
}

TEST(StepGraph, DeviceConstantsMatchTheHostsBitForBit) {
  Context cpu = make_context(Device::kCpu);
  const int64_t n = 1000;
  Tensor steps = Tensor::empty({1}, DType::kI64);
  steps.data_as<int64_t>()[0] = 0;
  Tensor consts = Tensor::empty({2 * kAdamWConstsFloats}, DType::kF32);
  Tensor skipped = Tensor::empty({1}, DType::kI32);
  struct Pair {
    Tensor p, m, v;
  };
  auto fresh = [&] {
    Pair x{filled(n, -0.5f, 0.001f), Tensor::empty({n}, DType::kBF16),
           Tensor::empty({n}, DType::kBF16)};
    std::memset(x.m.data(), 0, x.m.nbytes());
    std::memset(x.v.data(), 0, x.v.nbytes());
    return x;
  };
  Pair host = fresh(), dev = fresh();
  const Tensor g = filled(n, 0.3f, -0.0007f);
  int64_t host_step = 0;
  for (int s = 0; s < 6; ++s) {
    const bool skip = s == 2;  // a skipped step leaves the count (and everything else) alone
    skipped.data_as<int32_t>()[0] = skip ? 1 : 0;
    const float lr = 1e-3f * static_cast<float>(s + 1);
    AdamWArgs a;
    a.grad = g;
    a.found_inf = skipped;
    a.lr = lr;
    a.weight_decay = 0.1f;
    a.step = host_step + 1;
    a.param = host.p;
    a.exp_avg = host.m;
    a.exp_avg_sq = host.v;
    adamw_step(cpu, a);
    adamw_device_consts(cpu, {.lr = lr, .weight_decay = 0.1f, .steps_taken = steps, .out = consts});
    a.consts = Tensor::wrap(consts.data(), {kAdamWConstsFloats}, DType::kF32, Device::kCpu);
    a.lr = 123.0f;  // not read when the constants come with the tensors
    a.step = 99;
    a.param = dev.p;
    a.exp_avg = dev.m;
    a.exp_avg_sq = dev.v;
    adamw_step(cpu, a);
    adamw_advance_steps(cpu, steps, skipped);
    if (!skip) ++host_step;
    EXPECT_EQ(steps.data_as<int64_t>()[0], host_step) << "step " << s;
    EXPECT_EQ(std::memcmp(host.p.data(), dev.p.data(), host.p.nbytes()), 0) << "step " << s;
    EXPECT_EQ(std::memcmp(host.m.data(), dev.m.data(), host.m.nbytes()), 0) << "step " << s;
    EXPECT_EQ(std::memcmp(host.v.data(), dev.v.data(), host.v.nbytes()), 0) << "step " << s;
  }
  // The no-decay half: decay exactly 1.
  float k[kAdamWConstsFloats];
  std::memcpy(k, consts.data_as<float>() + kAdamWConstsFloats, sizeof k);
  EXPECT_EQ(k[4], 1.0f);
}

TEST(StepGraph, DeviceConstantsRefuseBadArguments) {
  Context cpu = make_context(Device::kCpu);
  Tensor steps = Tensor::empty({1}, DType::kI32);  // must be i64
  Tensor consts = Tensor::empty({16}, DType::kF32);
  EXPECT_THROW(adamw_device_consts(cpu, {.steps_taken = steps, .out = consts}), Error);
  Tensor steps64 = Tensor::empty({1}, DType::kI64);
  steps64.data_as<int64_t>()[0] = 0;
  EXPECT_THROW(adamw_device_consts(cpu, {.lr = -1.0f, .steps_taken = steps64, .out = consts}),
               Error);
  Tensor short_out = Tensor::empty({8}, DType::kF32);
  EXPECT_THROW(adamw_device_consts(cpu, {.steps_taken = steps64, .out = short_out}), Error);
}

TEST(StepGraph, SectionsRunEagerlyWithoutCuda) {
  Context cpu = make_context(Device::kCpu);
  EXPECT_FALSE(cuda_graphs_supported(cpu));
  GraphedSection s("test");
  int runs = 0;
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(s.run(cpu, true, "k", [&] { ++runs; }), GraphedSection::Ran::kEager);
  EXPECT_EQ(runs, 4);
  EXPECT_EQ(s.replays(), 0);
  EXPECT_EQ(s.failure(), "");
  EXPECT_EQ(device_reserved_bytes(cpu), 0);
  release_cached_device_memory(cpu);  // nothing to give back on the CPU
  EXPECT_EQ(device_memory_releases(cpu), 0);
  EXPECT_EQ(s.run(
                cpu, true, "k", [&] { ++runs; }, false),
            GraphedSection::Ran::kEager);
  EXPECT_EQ(runs, 5);
}

using Action = CaptureSchedule::Action;

// The trainer's micro-batch section over a run: `keys[s]` is step s's weights key ("" for a probe
// step, whose micro-batches run eagerly without consulting the schedule), `accum` runs a step.
// Returns each step's actions, the capture succeeding.
std::vector<std::vector<Action>> micro_actions(const std::vector<std::string>& keys, int accum) {
  CaptureSchedule sched;
  bool captured = false;
  std::vector<std::vector<Action>> steps;
  for (const std::string& key : keys) {
    std::vector<Action> step;
    for (int m = 0; m < accum; ++m) {
      if (key.empty()) {
        step.push_back(Action::kEager);
        continue;
      }
      const CaptureSchedule::Choice c = sched.next(key, m == 0, captured);
      if (c.drop) captured = false;
      if (c.action == Action::kCapture) captured = true;
      step.push_back(c.action);
    }
    steps.push_back(step);
  }
  return steps;
}

// The key sequence of a trainer run: step 1 probes, the fused first preparation (key 1), the
// section's eager preparation (2), its capture (3) moving the prepared weights; steady from there;
// a probe at step 8; a rollback at step 10 starts over (4, 5, 6).
const std::vector<std::string> kRunKeys = {"", "2", "3", "3", "3", "3", "3",
                                           "", "3", "4", "5", "6", "6", "6"};

TEST(StepGraph, AStepsMicroBatchesAllRunEagerlyOrAllReplayOneGraph) {
  for (const int accum : {1, 2, 3, 8}) {
    const auto steps = micro_actions(kRunKeys, accum);
    int captures = 0;
    for (size_t s = 0; s < steps.size(); ++s) {
      const std::vector<Action>& a = steps[s];
      const bool eager = a[0] == Action::kEager;
      for (size_t m = 1; m < a.size(); ++m) {
        // Only the first micro-batch may capture; the rest replay that one graph.
        EXPECT_EQ(a[m], eager ? Action::kEager : Action::kReplay)
            << "accum " << accum << ", step " << s + 1 << ", micro-batch " << m;
      }
      captures += a[0] == Action::kCapture ? 1 : 0;
    }
    // Key 3: eager through step 3 (its first round), captured at step 4's first micro-batch,
    // replayed to step 7 and again after the probe; the rollback's keys 4 and 5 last one step each
    // (no graph), key 6 is captured at step 13.
    EXPECT_EQ(captures, 2) << "accum " << accum;
    EXPECT_EQ(steps[3][0], Action::kCapture) << "accum " << accum;
    EXPECT_EQ(steps[8][0], Action::kReplay) << "accum " << accum;
    EXPECT_EQ(steps[12][0], Action::kCapture) << "accum " << accum;
    for (const size_t s : {0, 1, 2, 7, 9, 10, 11})
      EXPECT_EQ(steps[s][0], Action::kEager) << "accum " << accum << ", step " << s + 1;
  }
}

TEST(StepGraph, SectionsRunOnceAStepCaptureOnTheirSecondRun) {
  // The preparation and the optimizer: every run opens a round (unchanged from one run a key).
  CaptureSchedule sched;
  bool captured = false;
  std::vector<Action> got;
  for (const char* key : {"a", "a", "a", "a", "b", "b", "b"}) {
    const CaptureSchedule::Choice c = sched.next(key, true, captured);
    EXPECT_EQ(c.drop, captured && std::string(key) == "b" && got.size() == 4) << got.size();
    if (c.drop) captured = false;
    if (c.action == Action::kCapture) captured = true;
    got.push_back(c.action);
  }
  EXPECT_EQ(got,
            (std::vector<Action>{Action::kEager, Action::kCapture, Action::kReplay, Action::kReplay,
                                 Action::kEager, Action::kCapture, Action::kReplay}));
}

TEST(StepGraph, AKeyFirstSeenMidRoundWaitsForAWholeEagerRound) {
  CaptureSchedule sched;
  // Seen first on a round's second run: that round is not a whole one.
  EXPECT_EQ(sched.next("k", false, false).action, Action::kEager);
  EXPECT_EQ(sched.next("k", true, false).action, Action::kEager);
  EXPECT_EQ(sched.next("k", false, false).action, Action::kEager);
  EXPECT_EQ(sched.next("k", true, false).action, Action::kCapture);
  EXPECT_EQ(sched.next("k", false, true).action, Action::kReplay);
  sched.reset();  // invalidate(): the same key starts over
  EXPECT_EQ(sched.next("k", true, false).action, Action::kEager);
}

TEST(StepGraph, PinnedUploadCopiesAndChecksSizes) {
  Context cpu = make_context(Device::kCpu);
  PinnedUploader up(cpu, 2);
  Tensor src = Tensor::empty({5}, DType::kI32), dst = Tensor::empty({5}, DType::kI32);
  for (int i = 0; i < 5; ++i) src.data_as<int32_t>()[i] = 7 * i;
  up.upload(cpu, dst, src);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(dst.data_as<int32_t>()[i], 7 * i);
  Tensor small = Tensor::empty({4}, DType::kI32);
  EXPECT_THROW(up.upload(cpu, small, src), Error);
  EXPECT_THROW(PinnedUploader(cpu, 0), Error);
}

TEST(StepGraph, CudaGraphsKeyDefaultsOnAndMayChangeOnResume) {
  TrainConfig c;
  EXPECT_TRUE(c.cuda_graphs);
  apply_set(c, "cuda_graphs=false");
  EXPECT_FALSE(c.cuda_graphs);
  EXPECT_TRUE(resume_may_change("cuda_graphs"));
  EXPECT_NE(to_toml(c).find("cuda_graphs = false"), std::string::npos) << to_toml(c);
}

}  // namespace
}  // namespace octet::train
