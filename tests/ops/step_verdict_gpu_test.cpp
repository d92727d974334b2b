// ops/step_verdict on CUDA against its CPU reference, bit for bit: the means, the flags and the
// window over a long random stream with spikes, non-finite losses and skips.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "ops/step_verdict/step_verdict.h"
#include "step_verdict_test_util.h"
#include "test_util.h"

namespace octet {
namespace {

TEST(StepVerdictGpu, MatchesTheCpuBitForBit) {
  OCTET_REQUIRE_GPU();
  Context cpu = make_context(Device::kCpu), gpu = make_context(Device::kCuda);
  for (const int64_t capacity : {0, 1, 5}) {
    for (const int64_t ranks : {1, 2}) {
      test::DeviceVerdict c(cpu, capacity, ranks, 3, 2), g(gpu, capacity, ranks, 3, 2);
      std::mt19937 rng(static_cast<uint32_t>(capacity * 7 + ranks));
      std::normal_distribution<float> noise(0.0f, 0.05f);
      int spikes = 0;
      for (int step = 0; step < 200; ++step) {
        std::vector<float> main(static_cast<size_t>(3 * ranks)), mtp(2 * main.size());
        for (float& v : main) v = 3.0f + noise(rng);
        for (float& v : mtp) v = 4.0f + noise(rng);
        if (step % 13 == 4) main[1] += 1.5f;
        if (step % 41 == 9) main[0] = std::numeric_limits<float>::infinity();
        const test::VerdictResult a = c.run(cpu, main, mtp, 3.0, true);
        const test::VerdictResult b = g.run(gpu, main, mtp, 3.0, true);
        ASSERT_EQ(a.flags, b.flags) << "step " << step;
        ASSERT_EQ(std::memcmp(a.means.data(), b.means.data(), 24), 0) << "step " << step;
        ASSERT_EQ(std::memcmp(&a.skip, &b.skip, 4), 0) << "step " << step;
        spikes += (a.flags & kVerdictSpike) != 0;
        const bool skipped = (a.flags & kVerdictSkip) != 0 || step % 23 == 2;
        c.remember(cpu, skipped);
        g.remember(gpu, skipped);
        ASSERT_EQ(c.window(cpu), g.window(gpu)) << "step " << step;
      }
      if (capacity > 1) EXPECT_GT(spikes, 0);
    }
  }
  // The router counts: summed, or zero when skipped.
  Tensor a = Tensor::empty({300}, DType::kI32), b = Tensor::empty({300}, DType::kI32);
  for (int i = 0; i < 300; ++i) {
    a.data_as<int32_t>()[i] = i;
    b.data_as<int32_t>()[i] = 2 * i + 1;
  }
  const Tensor ga = a.to(gpu, Device::kCuda), gb = b.to(gpu, Device::kCuda);
  Tensor out = Tensor::empty(gpu, {300}, DType::kI32);
  for (const int32_t s : {0, 1}) {
    Tensor flag = Tensor::empty({1}, DType::kI32);
    flag.data_as<int32_t>()[0] = s;
    const Tensor gflag = flag.to(gpu, Device::kCuda);
    sum_counts_unless_skipped(gpu, {.counts = {ga, gb}, .skipped = gflag, .out = out});
    const Tensor h = out.to_host(gpu);
    for (int i = 0; i < 300; ++i) ASSERT_EQ(h.data_as<const int32_t>()[i], s ? 0 : 3 * i + 1) << i;
  }
}

}  // namespace
}  // namespace octet
