// CUDA cross_entropy against the CPU reference (FP64 sums) on odd and prime shapes, with about 10%
// of rows ignored. Summation order differs, so the stated tolerances are:
//   lse, losses   |d| <= 2e-5 + 2e-6 |lse|   (FP32 sum of exp: ~1e-6 relative, plus lse's own
//   rounding) loss (mean)   |d| <= 2e-5 + 2e-6 |loss|, count exact dlogits F32   |d| <= 1e-5 |ref|
//   + 2e-6 dloss / count   (exp(x - lse) with x - lse rounded in FP32;
//                 the target element cancels to (p - 1))     BF16: at most 1 ulp apart, or that
//                 bound
// The backward is compared given the same saved lse and count (the CPU's), so forward and backward
// errors are measured separately. The CUDA forward and backward are bitwise deterministic, and the
// in-place backward equals the out-of-place one bit for bit. Outputs are poisoned with NaN first.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>

#include "backend/backend.h"
#include "norm_act_test_util.h"
#include "ops/cross_entropy/cross_entropy.h"

namespace octet {
namespace {

using test::bitwise_equal;
using test::Dist;
using test::random_tensor;

struct Devices {
  Context cpu = make_context(Device::kCpu);
  Context gpu = make_context(Device::kCuda);
};

Devices& devices() {
  static Devices d;
  return d;
}

struct Fwd {
  Tensor losses, lse, count, loss;  // on the context's device
};

Tensor make(Context& ctx, const Shape& s, DType dt) {
  if (ctx.device == Device::kCuda) return test::poisoned(ctx, s, dt);
  Tensor t = Tensor::empty(s, dt);
  test::poison(t, 0xFF);
  return t;
}

Fwd forward(Context& ctx, const Tensor& logits, const Tensor& targets) {
  const int64_t rows = logits.rows();
  Fwd f{make(ctx, {rows}, DType::kF32), make(ctx, {rows}, DType::kF32), make(ctx, {1}, DType::kI32),
        make(ctx, {1}, DType::kF32)};
  cross_entropy_forward(ctx, {.logits = logits,
                              .targets = targets,
                              .losses = f.losses,
                              .lse = f.lse,
                              .count = f.count,
                              .loss = f.loss});
  return f;
}

Tensor backward(Context& ctx, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                const Tensor& count, const Tensor& dloss) {
  Tensor d = make(ctx, logits.shape(), logits.dtype());
  cross_entropy_backward(ctx, {.logits = logits,
                               .targets = targets,
                               .lse = lse,
                               .count = count,
                               .dloss = dloss,
                               .dlogits = d});
  return d.to_host(ctx);
}

Tensor targets_with_ignored(int64_t rows, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> pick(0, vocab - 1);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  return test::host_tensor({rows}, DType::kI32, [&](int64_t) {
    return uni(rng) < 0.1 ? static_cast<double>(kIgnoreIndex) : static_cast<double>(pick(rng));
  });
}

void check(const Tensor& logits, const Tensor& targets, float dloss_value,
           const std::string& where) {
  auto& [cpu, gpu] = devices();
  const Tensor logits_d = logits.to(gpu, Device::kCuda), targets_d = targets.to(gpu, Device::kCuda);
  const Fwd want = forward(cpu, logits, targets);
  const Fwd got = forward(gpu, logits_d, targets_d);
  const Tensor got_lse = got.lse.to_host(gpu), got_losses = got.losses.to_host(gpu);
  auto lse_atol = [&](int64_t i) { return 2e-5 + 2e-6 * std::fabs(want.lse.data_as<float>()[i]); };
  EXPECT_TRUE(test::all_close(want.lse, got_lse, 0.0, lse_atol, where + " lse"));
  EXPECT_TRUE(test::all_close(want.losses, got_losses, 0.0, lse_atol, where + " losses"));
  EXPECT_TRUE(bitwise_equal(want.count, got.count.to_host(gpu))) << where << " count";
  const double loss_want = want.loss.data_as<float>()[0];
  EXPECT_NEAR(got.loss.to_host(gpu).data_as<float>()[0], loss_want,
              2e-5 + 2e-6 * std::fabs(loss_want))
      << where << " mean loss";

  const Tensor dloss = test::host_tensor({1}, DType::kF32, [&](int64_t) { return dloss_value; });
  const Tensor dloss_d = dloss.to(gpu, Device::kCuda);
  const Tensor dwant = backward(cpu, logits, targets, want.lse, want.count, dloss);
  const Tensor dgot = backward(gpu, logits_d, targets_d, want.lse.to(gpu, Device::kCuda),
                               want.count.to(gpu, Device::kCuda), dloss_d);
  const int32_t count = want.count.data_as<int32_t>()[0];
  const double scale = count ? std::fabs(dloss_value) / count : 0.0;
  auto atol = [&](int64_t) { return 2e-6 * scale; };
  if (logits.dtype() == DType::kF32)
    EXPECT_TRUE(test::all_close(dwant, dgot, 1e-5, atol, where + " dlogits"));
  else
    EXPECT_TRUE(test::bf16_close(dwant, dgot, 1, atol, where + " dlogits"));

  // Determinism of the whole CUDA path, and the in-place backward.
  const Fwd again = forward(gpu, logits_d, targets_d);
  EXPECT_TRUE(bitwise_equal(got_lse, again.lse.to_host(gpu))) << where << " lse not deterministic";
  EXPECT_TRUE(bitwise_equal(got.loss.to_host(gpu), again.loss.to_host(gpu)))
      << where << " loss not deterministic";
  const Tensor d1 = backward(gpu, logits_d, targets_d, got.lse, got.count, dloss_d);
  const Tensor d2 = backward(gpu, logits_d, targets_d, got.lse, got.count, dloss_d);
  EXPECT_TRUE(bitwise_equal(d1, d2)) << where << " dlogits not deterministic";
  Tensor in_place = logits.to(gpu, Device::kCuda);
  cross_entropy_backward(gpu, {.logits = in_place,
                               .targets = targets_d,
                               .lse = got.lse,
                               .count = got.count,
                               .dloss = dloss_d,
                               .dlogits = in_place});
  EXPECT_TRUE(bitwise_equal(d1, in_place.to_host(gpu))) << where << " in-place backward differs";
}

using Case = std::tuple<int64_t, int64_t, DType>;  // rows, V, logits dtype

class CrossEntropyGpu : public ::testing::TestWithParam<Case> {};

TEST_P(CrossEntropyGpu, MatchesCpu) {
  OCTET_REQUIRE_GPU();
  const auto& [rows, vocab, dt] = GetParam();
  const std::string where = "rows " + std::to_string(rows) + " V " + std::to_string(vocab) + " " +
                            std::string(dtype_name(dt));
  // Logits of a trained head spread over a few units, with outliers up to 2^12.
  const Tensor logits = random_tensor({rows, vocab}, dt, 3000 + rows + vocab, Dist::kOutliers);
  check(logits, targets_with_ignored(rows, vocab, 3100 + rows), 1.0f, where);
}

// V % 8 == 0 takes the 16-byte path (1000, 4096), the others the element-wise one.
INSTANTIATE_TEST_SUITE_P(OddShapes, CrossEntropyGpu,
                         ::testing::Combine(::testing::Values(1, 127, 129, 1481),
                                            ::testing::Values(7, 129, 1000, 4096, 32003),
                                            ::testing::Values(DType::kBF16, DType::kF32)));

TEST(CrossEntropyGpuSpecial, LargestVocabulary) {
  OCTET_REQUIRE_GPU();
  for (DType dt : {DType::kBF16, DType::kF32}) {
    check(random_tensor({37, 131072}, dt, 3200, Dist::kOutliers),
          targets_with_ignored(37, 131072, 3201), 0.3f, "V 131072 " + std::string(dtype_name(dt)));
    check(random_tensor({3, 131071}, dt, 3202), targets_with_ignored(3, 131071, 3203), 1.0f,
          "V 131071 " + std::string(dtype_name(dt)));
  }
}

TEST(CrossEntropyGpuSpecial, ManyRowsAndLargeLogits) {
  OCTET_REQUIRE_GPU();
  check(random_tensor({32768, 129}, DType::kBF16, 3300), targets_with_ignored(32768, 129, 3301),
        1.0f, "32768 rows");
  // A shift of 2e4 overflows exp without the max subtraction.
  const Tensor base = random_tensor({129, 1000}, DType::kF32, 3302);
  const Tensor shifted = test::host_tensor(
      {129, 1000}, DType::kF32, [&](int64_t i) { return 2e4 + test::value_at(base, i); });
  check(shifted, targets_with_ignored(129, 1000, 3303), 2.0f, "shifted by 2e4");
}

TEST(CrossEntropyGpuSpecial, AllIgnored) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const Tensor logits = random_tensor({5, 77}, DType::kBF16, 3400);
  const Tensor targets = test::host_tensor({5}, DType::kI32, [](int64_t) { return kIgnoreIndex; });
  const Fwd f = forward(gpu, logits.to(gpu, Device::kCuda), targets.to(gpu, Device::kCuda));
  EXPECT_EQ(f.count.to_host(gpu).data_as<int32_t>()[0], 0);
  EXPECT_EQ(f.loss.to_host(gpu).data_as<float>()[0], 0.0f);
  const Tensor dloss =
      test::host_tensor({1}, DType::kF32, [](int64_t) { return 1.0; }).to(gpu, Device::kCuda);
  const Tensor d = backward(gpu, logits.to(gpu, Device::kCuda), targets.to(gpu, Device::kCuda),
                            f.lse, f.count, dloss);
  for (int64_t i = 0; i < d.numel(); ++i) ASSERT_EQ(d.data_as<uint16_t>()[i], 0) << "element " << i;
  (void)cpu;
}

}  // namespace
}  // namespace octet
