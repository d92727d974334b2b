// The chunked output head and the MoE's recomputed down projection (model/head.h, model/moe.h) on
// the CPU: the same losses and gradients as the unchunked head and the saved down projection.
//
//   head chunks    losses (main, MTP) and every gradient but lm_head's: bitwise (each row is
//                  computed as unchunked; the mean sums the same row losses in the same order).
//                  lm_head.weight: one FP32 += per chunk instead of one sum over all tokens, so
//                  |chunked - unchunked| <= 1e-6 max|dW| (measured: a few FP32 ulps).
//   recompute_down bitwise, every loss and gradient (the same ops on the same inputs).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "memory_test_util.h"
#include "test_util.h"

namespace octet {
namespace {

void expect_same_losses(const LossValues& a, const LossValues& b, const std::string& what) {
  EXPECT_EQ(a.main, b.main) << what;
  EXPECT_EQ(a.aux, b.aux) << what;
  ASSERT_EQ(a.mtp.size(), b.mtp.size()) << what;
  for (size_t k = 0; k < a.mtp.size(); ++k) EXPECT_EQ(a.mtp[k], b.mtp[k]) << what << " mtp " << k;
}

// Largest |a - b| over max |b| of one gradient.
double max_rel(const Tensor& a, const Tensor& b) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data_as<const float>()[i], y = b.data_as<const float>()[i];
    diff = std::max(diff, std::fabs(x - y));
    scale = std::max(scale, std::fabs(y));
  }
  return scale > 0 ? diff / scale : diff;
}

class HeadChunk : public ::testing::TestWithParam<const char*> {};

TEST_P(HeadChunk, SameLossAndGradientsAsUnchunked) {
  Context cpu = make_context(Device::kCpu);
  const std::string recipe = GetParam();
  const test::StepResult whole = test::run_step(cpu, {.recipe = recipe});
  ASSERT_TRUE(std::isfinite(whole.loss.main));
  // 96 rows: chunks of 32 (three whole ones), 40 (the last partial) and 16 (six).
  for (int64_t chunk : {32, 40, 16}) {
    const std::string what = recipe + " chunk " + std::to_string(chunk);
    const test::StepResult part =
        test::run_step(cpu, {.recipe = recipe, .head_chunk_tokens = chunk});
    expect_same_losses(part.loss, whole.loss, what);
    for (const auto& [name, g] : whole.grads) {
      if (name == "lm_head.weight") {
        const double e = max_rel(part.grads.at(name), g);
        EXPECT_LE(e, 1e-6) << what << " " << name;
        std::printf("%s: lm_head.weight max |d| / max |dW| = %.3g\n", what.c_str(), e);
      } else {
        EXPECT_TRUE(test::bitwise_equal(g, part.grads.at(name))) << what << " " << name;
      }
    }
  }
}

TEST_P(HeadChunk, ForwardOnlyGivesTheSameLoss) {
  Context cpu = make_context(Device::kCpu);
  const std::string recipe = GetParam();
  const test::StepResult whole = test::run_step(cpu, {.recipe = recipe, .pass = Pass::kForward});
  const test::StepResult part =
      test::run_step(cpu, {.recipe = recipe, .head_chunk_tokens = 40, .pass = Pass::kForward});
  expect_same_losses(part.loss, whole.loss, recipe + " forward only");
}

// With gu kept in BF16 (moe_swiglu_input=bf16; deepseek and fp8-flow keep it in FP8 by default).
TEST_P(HeadChunk, RecomputedDownProjectionIsBitwiseTheSaved) {
  Context cpu = make_context(Device::kCpu);
  const std::string recipe = GetParam();
  const std::vector<std::string> bf16_gu = {"moe_swiglu_input=bf16"};
  const test::StepResult saved =
      test::run_step(cpu, {.recipe = recipe, .recompute_down = false, .overrides = bf16_gu});
  const test::StepResult again = test::run_step(cpu, {.recipe = recipe, .overrides = bf16_gu});
  expect_same_losses(again.loss, saved.loss, recipe + " recompute");
  for (const auto& [name, g] : saved.grads)
    EXPECT_TRUE(test::bitwise_equal(g, again.grads.at(name))) << recipe << " " << name;
}

// The recipe's default: with FP8 gu (deepseek, fp8-flow) the forward is unchanged (the same losses)
// and the backward reads the FP8 copy (gradients moved by FP8 noise); the other recipes bitwise.
TEST_P(HeadChunk, RecomputedDownFromTheRecipesGu) {
  Context cpu = make_context(Device::kCpu);
  const std::string recipe = GetParam();
  const test::StepResult saved = test::run_step(cpu, {.recipe = recipe, .recompute_down = false});
  const test::StepResult again = test::run_step(cpu, {.recipe = recipe});
  expect_same_losses(again.loss, saved.loss, recipe + " recompute, recipe's gu");
  const bool fp8_gu = resolve_recipe({.preset = recipe}).moe_swiglu_input == Storage::kFp8;
  double worst = 0.0;
  for (const auto& [name, g] : saved.grads) {
    if (!fp8_gu) EXPECT_TRUE(test::bitwise_equal(g, again.grads.at(name))) << recipe << " " << name;
    worst = std::max(worst, max_rel(again.grads.at(name), g));
  }
  std::printf("%s: FP8 gu %d, largest max |d| / max |g| of a gradient %.3g\n", recipe.c_str(),
              fp8_gu, worst);
  EXPECT_LT(worst, 0.25) << recipe;
}

INSTANTIATE_TEST_SUITE_P(Recipes, HeadChunk,
                         ::testing::Values("bf16", "deepseek", "fp8-tensor-current", "fp8-flow"));

TEST(HeadChunkRows, AutomaticChoice) {
  Context cpu = make_context(Device::kCpu);
  const ModelConfig c = test::memory_test_config();
  Model m(cpu, c, {recipe_preset("deepseek"), DType::kBF16});
  const Precision& p = m.precision();
  OutputHead h = m.head();
  // 256 MiB of BF16 logits over a 32768 vocabulary: 4096 rows (the baseline's 16384 in four).
  EXPECT_EQ(h.chunk_rows(p, 16384, 32768), 4096);
  EXPECT_EQ(h.chunk_rows(p, 1000, 32768), 1000);
  EXPECT_EQ(h.chunk_rows(p, 1 << 20, 129280),
            1024);  // DeepSeek-V3's vocabulary: 1038, down to 128s
  h.chunk_tokens = 300;
  EXPECT_EQ(h.chunk_rows(p, 16384, 32768), 300);
  // Delayed scaling at the head: one chunk (each would record its own amax).
  Precision delayed = p;
  delayed.recipe =
      resolve_recipe({.preset = "fp8-tensor-delayed", .overrides = {"gemm.head=fp8-tensor"}});
  EXPECT_EQ(h.chunk_rows(delayed, 16384, 32768), 16384);
  h.chunk_tokens = -1;
  EXPECT_THROW(h.chunk_rows(p, 16384, 32768), Error);
}

TEST(HeadChunkRows, ConfigRejectsANegativeChunk) {
  ModelConfig c = test::memory_test_config();
  c.head_chunk_tokens = -4;
  try {
    c.validate();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("octet_head_chunk_tokens must be >= 0"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace octet
