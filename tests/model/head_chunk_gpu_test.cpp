// The chunked output head and the MoE's recomputed down projection on CUDA (model/head.h,
// model/moe.h; the CPU side is head_chunk_test.cpp):
//
//   cross_entropy_rows over two chunks + cross_entropy_mean  ==  cross_entropy_forward, bitwise
//   (one block per row either way; the mean kernel reads the same row losses).
//   The tiny model with head chunks of 32 and 40 rows against one chunk: losses within 1e-6
//   relative and every gradient within 1e-3 relative Frobenius norm (cuBLASLt may pick another
//   kernel for another row count, so a logit can differ in its last BF16 bit; printed: whether
//   they came out bitwise).
//   recompute_down against the saved down projection: bitwise (the same kernels on the same inputs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "memory_test_util.h"
#include "ops/cross_entropy/cross_entropy.h"
#include "test_util.h"

namespace octet {
namespace {

Tensor slice_rows(const Tensor& t, int64_t first, int64_t count) {
  const int64_t cols = t.rank() == 1 ? 1 : t.cols();
  const Shape shape = t.rank() == 1 ? Shape{count} : Shape{count, cols};
  return Tensor::wrap(static_cast<char*>(t.data()) + first * cols * dtype_size(t.dtype()), shape,
                      t.dtype(), t.device());
}

TEST(CrossEntropyChunksCuda, RowsAndMeanAreTheForwardBitwise) {
  OCTET_REQUIRE_GPU();
  Context gpu = make_context(Device::kCuda);
  const int64_t rows = 96, vocab = 1000;
  for (DType dt : {DType::kBF16, DType::kF32}) {
    const Tensor logits = test::random_tensor({rows, vocab}, dt, 5).to(gpu, Device::kCuda);
    Tensor targets_h = Tensor::empty({rows}, DType::kI32);
    for (int64_t r = 0; r < rows; ++r)
      targets_h.data_as<int32_t>()[r] = r % 5 == 1 ? kIgnoreIndex : static_cast<int32_t>(r * 7);
    const Tensor targets = targets_h.to(gpu, Device::kCuda);
    auto f32 = [&](int64_t n) { return Tensor::empty(gpu, {n}, DType::kF32); };
    Tensor losses = f32(rows), lse = f32(rows), loss = f32(1);
    Tensor count = Tensor::empty(gpu, {1}, DType::kI32);
    cross_entropy_forward(gpu, {.logits = logits,
                                .targets = targets,
                                .losses = losses,
                                .lse = lse,
                                .count = count,
                                .loss = loss});
    Tensor losses2 = f32(rows), lse2 = f32(rows), loss2 = f32(1);
    Tensor count2 = Tensor::empty(gpu, {1}, DType::kI32), count_only = count2;
    cross_entropy_mean(
        gpu, {.losses = Tensor(), .targets = targets, .count = count_only, .loss = Tensor()});
    EXPECT_TRUE(test::bitwise_equal(count.to_host(gpu), count_only.to_host(gpu)));
    for (int64_t first : {0, 40}) {
      const int64_t n = first == 0 ? 40 : rows - 40;
      cross_entropy_rows(gpu, {.logits = slice_rows(logits, first, n),
                               .targets = slice_rows(targets, first, n),
                               .losses = slice_rows(losses2, first, n),
                               .lse = slice_rows(lse2, first, n)});
    }
    cross_entropy_mean(gpu,
                       {.losses = losses2, .targets = targets, .count = count2, .loss = loss2});
    EXPECT_TRUE(test::bitwise_equal(losses.to_host(gpu), losses2.to_host(gpu)));
    EXPECT_TRUE(test::bitwise_equal(lse.to_host(gpu), lse2.to_host(gpu)));
    EXPECT_TRUE(test::bitwise_equal(loss.to_host(gpu), loss2.to_host(gpu)));
    EXPECT_TRUE(test::bitwise_equal(count.to_host(gpu), count2.to_host(gpu)));
  }
}

double rel_frobenius(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data_as<const float>()[i], y = b.data_as<const float>()[i];
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

class HeadChunkCuda : public ::testing::TestWithParam<const char*> {};

TEST_P(HeadChunkCuda, SameLossAndGradientsAsUnchunked) {
  OCTET_REQUIRE_GPU();
  Context gpu = make_context(Device::kCuda);
  const std::string recipe = GetParam();
  const test::StepResult whole = test::run_step(gpu, {.recipe = recipe});
  for (int64_t chunk : {32, 48}) {
    const test::StepResult part =
        test::run_step(gpu, {.recipe = recipe, .head_chunk_tokens = chunk});
    const std::string what = recipe + " chunk " + std::to_string(chunk);
    EXPECT_NEAR(part.loss.main, whole.loss.main, 1e-6 * std::fabs(whole.loss.main)) << what;
    ASSERT_EQ(part.loss.mtp.size(), whole.loss.mtp.size());
    EXPECT_NEAR(part.loss.mtp[0], whole.loss.mtp[0], 1e-6 * std::fabs(whole.loss.mtp[0])) << what;
    bool bitwise = part.loss.main == whole.loss.main && part.loss.mtp == whole.loss.mtp;
    double worst = 0;
    for (const auto& [name, g] : whole.grads) {
      const double e = rel_frobenius(part.grads.at(name), g);
      EXPECT_LT(e, 1e-3) << what << " grad of " << name;
      worst = std::max(worst, e);
      if (name != "lm_head.weight") bitwise = bitwise && same_bits(part.grads.at(name), g);
    }
    std::printf("%s: worst gradient error %.3g; losses and non-head gradients bitwise: %s\n",
                what.c_str(), worst, bitwise ? "yes" : "no");
  }
}

// With gu kept in BF16 (moe_swiglu_input=bf16; deepseek and fp8-flow keep it in FP8 by default,
// which moves the gradients by FP8 noise: head_chunk_test's RecomputedDownFromTheRecipesGu).
TEST_P(HeadChunkCuda, RecomputedDownProjectionIsBitwiseTheSaved) {
  OCTET_REQUIRE_GPU();
  Context gpu = make_context(Device::kCuda);
  const std::string recipe = GetParam();
  const std::vector<std::string> bf16_gu = {"moe_swiglu_input=bf16"};
  const test::StepResult saved =
      test::run_step(gpu, {.recipe = recipe, .recompute_down = false, .overrides = bf16_gu});
  const test::StepResult again = test::run_step(gpu, {.recipe = recipe, .overrides = bf16_gu});
  EXPECT_EQ(again.loss.main, saved.loss.main) << recipe;
  EXPECT_EQ(again.loss.mtp, saved.loss.mtp) << recipe;
  for (const auto& [name, g] : saved.grads)
    EXPECT_TRUE(test::bitwise_equal(g, again.grads.at(name))) << recipe << " " << name;
}

INSTANTIATE_TEST_SUITE_P(Recipes, HeadChunkCuda,
                         ::testing::Values("bf16", "deepseek", "fp8-tensor-current", "fp8-flow"));

}  // namespace
}  // namespace octet
