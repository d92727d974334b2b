// Cross-entropy on the CPU: the loss against the formula, the ignore index, the backward against
// FP64 central differences of the mean loss, numerical stability at large logits, the in-place
// backward, and argument errors.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/backend.h"
#include "norm_act_test_util.h"
#include "ops/cross_entropy/cross_entropy.h"

namespace octet {
namespace {

using test::random_tensor;

struct Fwd {
  Tensor losses, lse, count, loss;
};

Fwd forward(Context& ctx, const Tensor& logits, const Tensor& targets) {
  const int64_t rows = logits.rows();
  Fwd f{Tensor::empty({rows}, DType::kF32), Tensor::empty({rows}, DType::kF32),
        Tensor::empty({1}, DType::kI32), Tensor::empty({1}, DType::kF32)};
  for (Tensor* t : {&f.losses, &f.lse, &f.count, &f.loss}) test::poison(*t, 0xFF);
  cross_entropy_forward(ctx, {.logits = logits,
                              .targets = targets,
                              .losses = f.losses,
                              .lse = f.lse,
                              .count = f.count,
                              .loss = f.loss});
  return f;
}

Tensor backward(Context& ctx, const Tensor& logits, const Tensor& targets, const Fwd& f,
                float dloss) {
  Tensor d = Tensor::empty(logits.shape(), logits.dtype());
  test::poison(d, 0xFF);
  const Tensor dl = test::host_tensor({1}, DType::kF32, [&](int64_t) { return dloss; });
  cross_entropy_backward(ctx, {.logits = logits,
                               .targets = targets,
                               .lse = f.lse,
                               .count = f.count,
                               .dloss = dl,
                               .dlogits = d});
  return d;
}

TEST(CrossEntropy, ForwardMatchesFormula) {
  Context cpu = make_context(Device::kCpu);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const Tensor logits = random_tensor({2, 3, 29}, dt, 41, test::Dist::kOutliers);
    Tensor targets = test::random_ints({6}, 0, 28, 42);
    targets.data_as<int32_t>()[4] = kIgnoreIndex;
    const Fwd f = forward(cpu, logits, targets);
    double sum = 0.0;
    for (int64_t r = 0; r < 6; ++r) {
      double s = 0.0;
      for (int64_t v = 0; v < 29; ++v) s += std::exp(test::value_at(logits, r * 29 + v));
      const int32_t t = targets.data_as<int32_t>()[r];
      const double loss =
          t == kIgnoreIndex ? 0.0 : std::log(s) - test::value_at(logits, r * 29 + t);
      EXPECT_NEAR(f.lse.data_as<float>()[r], std::log(s), 1e-6 * std::fabs(std::log(s)) + 1e-6)
          << "row " << r;
      EXPECT_NEAR(f.losses.data_as<float>()[r], loss, 1e-5) << "row " << r;
      sum += loss;
    }
    EXPECT_EQ(f.count.data_as<int32_t>()[0], 5);
    EXPECT_NEAR(f.loss.data_as<float>()[0], sum / 5.0, 1e-5);
  }
}

TEST(CrossEntropy, EqualLogitsGiveLogV) {
  Context cpu = make_context(Device::kCpu);
  const Tensor logits =
      test::host_tensor({3, 1000}, DType::kF32, [](int64_t i) { return 3.25 - (i / 1000); });
  const Tensor targets = test::host_tensor({3}, DType::kI32, [](int64_t r) { return 17 * r; });
  const Fwd f = forward(cpu, logits, targets);
  EXPECT_NEAR(f.loss.data_as<float>()[0], std::log(1000.0), 1e-6);
}

// L = dloss * mean loss; dlogits from the backward against central differences in every logit.
TEST(CrossEntropy, BackwardMatchesFiniteDifferences) {
  Context cpu = make_context(Device::kCpu);
  Tensor logits = random_tensor({4, 7}, DType::kF32, 43);
  Tensor targets =
      test::host_tensor({4}, DType::kI32, [](int64_t r) { return r == 2 ? kIgnoreIndex : 2 * r; });
  const float dloss = 0.75f;
  auto loss = [&] {
    return dloss * static_cast<double>(forward(cpu, logits, targets).loss.data_as<float>()[0]);
  };
  const Tensor d = backward(cpu, logits, targets, forward(cpu, logits, targets), dloss);
  for (int64_t i = 0; i < logits.numel(); ++i) {
    const double fd = test::central_difference(logits.data_as<float>() + i, 1e-2, loss);
    EXPECT_NEAR(d.data_as<float>()[i], fd, 2e-4) << "row " << i / 7 << " col " << i % 7;
  }
  for (int64_t v = 0; v < 7; ++v) EXPECT_EQ(d.data_as<float>()[2 * 7 + v], 0.0f) << "ignored row";
}

TEST(CrossEntropy, GradientRowsSumToZero) {
  Context cpu = make_context(Device::kCpu);
  const Tensor logits = random_tensor({5, 301}, DType::kF32, 44, test::Dist::kOutliers);
  const Tensor targets = test::random_ints({5}, 0, 300, 45);
  const Tensor d = backward(cpu, logits, targets, forward(cpu, logits, targets), 1.0f);
  for (int64_t r = 0; r < 5; ++r) {
    double s = 0.0;
    for (int64_t v = 0; v < 301; ++v) s += d.data_as<float>()[r * 301 + v];
    EXPECT_NEAR(s, 0.0, 1e-7) << "row " << r;
  }
}

TEST(CrossEntropy, StableAtLargeLogits) {
  Context cpu = make_context(Device::kCpu);
  const Tensor base = random_tensor({3, 50}, DType::kF32, 46);
  const Tensor shifted = test::host_tensor({3, 50}, DType::kF32, [&](int64_t i) {
    return 3.0e4 +
           test::value_at(base, i);  // exp overflows FP32 (and FP64 beyond 709) without the max
  });
  const Tensor targets = test::random_ints({3}, 0, 49, 47);
  const Fwd a = forward(cpu, base, targets), b = forward(cpu, shifted, targets);
  ASSERT_TRUE(std::isfinite(b.loss.data_as<float>()[0]));
  // The shifted logits carry 2^-9 of rounding (FP32 near 3e4), so the losses agree to about that.
  EXPECT_NEAR(a.loss.data_as<float>()[0], b.loss.data_as<float>()[0], 4e-3);
  const Tensor d = backward(cpu, shifted, targets, b, 1.0f);
  for (int64_t i = 0; i < d.numel(); ++i) ASSERT_TRUE(std::isfinite(d.data_as<float>()[i])) << i;
}

TEST(CrossEntropy, InPlaceBackwardEqualsOutOfPlace) {
  Context cpu = make_context(Device::kCpu);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Tensor logits = random_tensor({6, 33}, dt, 48);
    const Tensor targets = test::random_ints({6}, 0, 32, 49);
    const Fwd f = forward(cpu, logits, targets);
    const Tensor want = backward(cpu, logits, targets, f, 0.5f);
    const Tensor dl = test::host_tensor({1}, DType::kF32, [](int64_t) { return 0.5; });
    cross_entropy_backward(cpu, {.logits = logits,
                                 .targets = targets,
                                 .lse = f.lse,
                                 .count = f.count,
                                 .dloss = dl,
                                 .dlogits = logits});
    EXPECT_TRUE(test::bitwise_equal(want, logits)) << dtype_name(dt);
  }
}

TEST(CrossEntropy, AllIgnoredGivesZeroLossAndGradient) {
  Context cpu = make_context(Device::kCpu);
  const Tensor logits = random_tensor({3, 10}, DType::kBF16, 50);
  const Tensor targets = test::host_tensor({3}, DType::kI32, [](int64_t) { return kIgnoreIndex; });
  const Fwd f = forward(cpu, logits, targets);
  EXPECT_EQ(f.count.data_as<int32_t>()[0], 0);
  EXPECT_EQ(f.loss.data_as<float>()[0], 0.0f);
  const Tensor d = backward(cpu, logits, targets, f, 1.0f);
  for (int64_t i = 0; i < d.numel(); ++i) ASSERT_EQ(d.data_as<uint16_t>()[i], 0) << i;
}

TEST(CrossEntropy, RejectsBadArguments) {
  Context cpu = make_context(Device::kCpu);
  const Tensor logits = random_tensor({4, 10}, DType::kF32, 51);
  Tensor targets = test::random_ints({4}, 0, 9, 52);
  targets.data_as<int32_t>()[2] = 10;
  test::expect_error([&] { forward(cpu, logits, targets); }, {"row 2", "holds 10", "[0, 10)"});
  targets.data_as<int32_t>()[2] = -1;
  test::expect_error([&] { forward(cpu, logits, targets); }, {"row 2", "holds -1"});
  targets.data_as<int32_t>()[2] = 0;
  test::expect_error([&] { forward(cpu, logits, test::random_ints({5}, 0, 9, 1)); },
                     {"cross_entropy targets", "[4]", "[5]"});
  const Fwd f = forward(cpu, logits, targets);
  const Tensor dl = test::host_tensor({1}, DType::kF32, [](int64_t) { return 1.0; });
  test::expect_error(
      [&] {
        cross_entropy_backward(cpu, {.logits = logits,
                                     .targets = targets,
                                     .lse = f.lse,
                                     .count = f.count,
                                     .dloss = dl,
                                     .dlogits = Tensor::empty({4, 10}, DType::kBF16)});
      },
      {"cross_entropy dlogits", "F32", "BF16"});
  test::expect_error(
      [&] {
        cross_entropy_backward(cpu, {.logits = logits,
                                     .targets = targets,
                                     .lse = f.lse,
                                     .count = f.loss,
                                     .dloss = dl,
                                     .dlogits = logits});
      },
      {"cross_entropy count", "I32", "F32"});
}

}  // namespace
}  // namespace octet
