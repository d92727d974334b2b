// ops/step_verdict against the host formulas the trainer used before the verdict moved to the
// device (the mean over micro-batches in global order, Run::is_spike, Run::remember_loss): bit for
// bit, on a window not yet full, a window with sd = 0, NaN and infinite losses, several ranks, and
// a long random stream with skips.
#include "ops/step_verdict/step_verdict.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "step_verdict_test_util.h"

namespace octet {
namespace {

using test::HostVerdict;

TEST(StepVerdict, MatchesTheHostFormulaOnEdgeCases) {
  Context ctx = make_context(Device::kCpu);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    const char* what;
    std::vector<double> window;
    int64_t capacity;
    std::vector<float> losses;
    double threshold;
  };
  const std::vector<Case> cases = {
      {"window not full", {1.0, 1.0}, 3, {100.0f}, 1.0},
      {"empty window", {}, 3, {2.0f, 3.0f}, 6.0},
      {"detection off", {}, 0, {2.0f}, 6.0},
      {"sd 0, equal loss", {2.0, 2.0, 2.0}, 3, {2.0f}, 6.0},
      {"sd 0, larger loss", {2.0, 2.0, 2.0}, 3, {2.0f, 2.0000002f}, 6.0},
      {"spike", {1.0, 1.1, 0.9}, 3, {3.0f}, 6.0},
      {"just below", {1.0, 1.1, 0.9}, 3, {1.4898979f}, 6.0},
      {"NaN loss", {1.0, 1.1, 0.9}, 3, {1.0f, nan}, 6.0},
      {"inf loss", {1.0, 1.1, 0.9}, 3, {inf, 1.0f}, 6.0},
      {"-inf loss", {1.0, 1.1, 0.9}, 3, {-inf}, 6.0},
      {"inf and -inf", {}, 3, {inf, -inf}, 6.0},
      {"threshold 0", {1.0, 2.0, 3.0}, 3, {2.0000001f}, 0.0},
  };
  for (const Case& c : cases) {
    for (const bool skips : {false, true}) {
      HostVerdict host(c.capacity, c.threshold, skips);
      for (double v : c.window) host.remember(v);
      test::DeviceVerdict dev(ctx, c.capacity, 1, static_cast<int64_t>(c.losses.size()), 0);
      dev.set_window(ctx, host.window);
      const test::VerdictResult d = dev.run(ctx, c.losses, {}, c.threshold, skips);
      const test::VerdictResult h = host.judge(c.losses, {}, 1);
      EXPECT_EQ(std::memcmp(&d.means[0], &h.means[0], 8), 0)
          << c.what << ": mean " << d.means[0] << " vs " << h.means[0];
      EXPECT_EQ(d.flags, h.flags) << c.what << " (skips " << skips << ")";
      EXPECT_EQ(std::isnan(d.skip), (h.flags & kVerdictSkip) != 0) << c.what;
      EXPECT_EQ(d.skip == 0.0f, (h.flags & kVerdictSkip) == 0) << c.what;
    }
  }
}

// The flags of a few cases, against hand-worked values (so the host formula above is itself
// checked): a full window of 1.0, 1.1, 0.9 has mean 1 and sd sqrt(0.02 / 3) = 0.0816...
TEST(StepVerdict, FlagsOfHandWorkedCases) {
  Context ctx = make_context(Device::kCpu);
  HostVerdict host(3, 6.0, true);
  for (double v : {1.0, 1.1, 0.9}) host.remember(v);
  test::DeviceVerdict dev(ctx, 3, 1, 1, 0);
  dev.set_window(ctx, host.window);
  EXPECT_EQ(dev.run(ctx, {1.48f}, {}, 6.0, true).flags, 0);  // 1.48 < 1 + 6 * 0.0816 = 1.49
  EXPECT_EQ(dev.run(ctx, {1.5f}, {}, 6.0, true).flags, kVerdictSpike | kVerdictSkip);
  EXPECT_EQ(dev.run(ctx, {1.5f}, {}, 6.0, false).flags, kVerdictSpike);
  EXPECT_EQ(dev.run(ctx, {NAN}, {}, 6.0, false).flags, kVerdictNonFinite | kVerdictSkip);
}

// Several ranks: the mean is summed in global micro-batch order (rank r's m-th is m * R + r),
// which a rank-major sum would not reproduce with these magnitudes.
TEST(StepVerdict, SeveralRanksSumInGlobalOrder) {
  Context ctx = make_context(Device::kCpu);
  const std::vector<float> main = {1e-3f, 1e-3f, 1e8f, 0.3f, 0.1f, 3.0f};  // R = 2, K = 3
  const std::vector<float> mtp = {2.0f, 1e9f, 0.5f, -1e9f, 0.25f, 3.0f};
  HostVerdict host(2, 6.0, false);
  test::DeviceVerdict dev(ctx, 2, 2, 3, 1);
  const test::VerdictResult d = dev.run(ctx, main, mtp, 6.0, false);
  const test::VerdictResult h = host.judge(main, mtp, 2);
  ASSERT_EQ(d.means.size(), 2u);
  for (size_t i = 0; i < 2; ++i)
    EXPECT_EQ(std::memcmp(&d.means[i], &h.means[i], 8), 0) << d.means[i] << " vs " << h.means[i];
  double rank_major = 0;  // what the order matters against
  for (float v : main) rank_major += v / 6.0;
  EXPECT_NE(rank_major, d.means[0]);
}

// A long stream: losses with occasional jumps and non-finite values, remembered unless skipped
// (the verdict or, at random, the gradients), the window compared after every step.
TEST(StepVerdict, ARandomStreamKeepsTheHostsWindowAndVerdicts) {
  Context ctx = make_context(Device::kCpu);
  for (const int64_t capacity : {1, 3, 8}) {
    HostVerdict host(capacity, 2.0, true);
    test::DeviceVerdict dev(ctx, capacity, 1, 2, 1);
    std::mt19937 rng(static_cast<uint32_t>(capacity));
    std::normal_distribution<float> noise(0.0f, 0.05f);
    int spikes = 0;
    for (int step = 0; step < 300; ++step) {
      std::vector<float> main = {3.0f + noise(rng), 3.0f + noise(rng)};
      if (step % 17 == 5) main[1] += 2.0f;
      if (step % 53 == 7) main[0] = std::numeric_limits<float>::quiet_NaN();
      const std::vector<float> mtp = {4.0f + noise(rng), 4.0f + noise(rng)};
      const test::VerdictResult h = host.judge(main, mtp, 1);
      const test::VerdictResult d = dev.run(ctx, main, mtp, 2.0, true);
      ASSERT_EQ(d.flags, h.flags) << "capacity " << capacity << " step " << step;
      ASSERT_EQ(std::memcmp(d.means.data(), h.means.data(), 16), 0) << "step " << step;
      spikes += (h.flags & kVerdictSpike) != 0;
      const bool grad_skip = step % 29 == 3;
      const bool skipped = (h.flags & kVerdictSkip) != 0 || grad_skip;
      if (!skipped) host.remember(h.means[0]);
      dev.remember(ctx, skipped);
      ASSERT_EQ(dev.window(ctx), std::vector<double>(host.window.begin(), host.window.end()))
          << "capacity " << capacity << " step " << step;
    }
    EXPECT_GT(spikes, 3) << "capacity " << capacity;
  }
}

TEST(StepVerdict, CountsAreSummedOrZeroedWhenSkipped) {
  Context ctx = make_context(Device::kCpu);
  Tensor a = Tensor::empty({4}, DType::kI32), b = Tensor::empty({4}, DType::kI32);
  for (int i = 0; i < 4; ++i) {
    a.data_as<int32_t>()[i] = i + 1;
    b.data_as<int32_t>()[i] = 10 * i;
  }
  Tensor out = Tensor::empty({4}, DType::kI32), flag = Tensor::empty({1}, DType::kI32);
  for (const int32_t skipped : {0, 1}) {
    flag.data_as<int32_t>()[0] = skipped;
    sum_counts_unless_skipped(ctx, {.counts = {a, b}, .skipped = flag, .out = out});
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(out.data_as<const int32_t>()[i], skipped ? 0 : 11 * i + 1) << i;
  }
  sum_counts_unless_skipped(ctx, {.counts = {a}, .skipped = Tensor{}, .out = out});
  EXPECT_EQ(out.data_as<const int32_t>()[3], 4);
}

TEST(StepVerdict, BadArgumentsAreRefused) {
  Context ctx = make_context(Device::kCpu);
  test::DeviceVerdict dev(ctx, 3, 1, 2, 0);
  Tensor three = Tensor::empty({3}, DType::kF32);
  EXPECT_THROW(step_loss_verdict(ctx, {.main = three,
                                       .mtp = {},
                                       .ranks = 2,
                                       .depths = 0,
                                       .window = dev.w,
                                       .spike_threshold = 6.0,
                                       .spike_skips = false,
                                       .means = dev.means,
                                       .flags = dev.flags,
                                       .skip = dev.skip}),
               Error);
  EXPECT_THROW(make_loss_window(ctx, -1), Error);
}

}  // namespace
}  // namespace octet
