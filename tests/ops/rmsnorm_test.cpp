// RMSNorm on the CPU: the forward against the formula, the backward against FP64 central
// differences of the FP32 op, the += contract of dweight, and argument errors.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/backend.h"
#include "norm_act_test_util.h"
#include "ops/rmsnorm/rmsnorm.h"
#include "rmsnorm_residual_check.h"

namespace octet {
namespace {

using test::Dist;
using test::random_tensor;

struct Fwd {
  Tensor y, rstd;
};

Fwd forward(Context& ctx, const Tensor& x, const Tensor& w, float eps, DType ydt) {
  Fwd f{Tensor::empty(x.shape(), ydt), Tensor::empty({x.rows()}, DType::kF32)};
  test::poison(f.y, 0xFF);
  test::poison(f.rstd, 0xFF);
  rmsnorm_forward(ctx, {.x = x, .weight = w, .epsilon = eps, .y = f.y, .rstd = f.rstd});
  return f;
}

TEST(RmsNorm, ForwardMatchesFormula) {
  Context cpu = make_context(Device::kCpu);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const Tensor x = random_tensor({2, 3, 37}, dt, 1, Dist::kOutliers);
    const Tensor w = random_tensor({37}, DType::kF32, 2);
    const float eps = 1e-5f;
    const Fwd f = forward(cpu, x, w, eps, dt);
    Tensor want_y = Tensor::empty(x.shape(), dt);
    Tensor want_rstd = Tensor::empty({6}, DType::kF32);
    for (int64_t r = 0; r < 6; ++r) {
      double ms = 0.0;
      for (int64_t j = 0; j < 37; ++j) ms += std::pow(test::value_at(x, r * 37 + j), 2) / 37.0;
      const double rs = 1.0 / std::sqrt(ms + eps);
      want_rstd.data_as<float>()[r] = static_cast<float>(rs);
      for (int64_t j = 0; j < 37; ++j) {
        const double y =
            test::value_at(x, r * 37 + j) / std::sqrt(ms + eps) * w.data_as<float>()[j];
        if (dt == DType::kF32)
          want_y.data_as<float>()[r * 37 + j] = static_cast<float>(y);
        else
          want_y.data_as<uint16_t>()[r * 37 + j] = float_to_bf16(static_cast<float>(y));
      }
    }
    EXPECT_TRUE(test::all_close(want_rstd, f.rstd, 1e-7, 0.0, "rstd"));
    if (dt == DType::kF32)
      EXPECT_TRUE(test::all_close(want_y, f.y, 2.5e-7, 1e-30, "y f32"));
    else
      EXPECT_TRUE(test::bf16_close(
          want_y, f.y, 1, [](int64_t) { return 0.0; }, "y bf16"));
  }
}

TEST(RmsNorm, MixedDtypesRoundOnce) {
  Context cpu = make_context(Device::kCpu);
  const Tensor x = random_tensor({5, 19}, DType::kBF16, 3);
  const Tensor w = random_tensor({19}, DType::kF32, 4);
  const Fwd f32 = forward(cpu, x, w, 1e-6f, DType::kF32);
  const Fwd bf = forward(cpu, x, w, 1e-6f, DType::kBF16);
  for (int64_t i = 0; i < x.numel(); ++i)
    ASSERT_EQ(float_to_bf16(f32.y.data_as<float>()[i]), bf.y.data_as<uint16_t>()[i])
        << "element " << i;
}

// L = sum(y * R); dL/dx and dL/dw from the backward with dy = R, against central differences.
TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  Context cpu = make_context(Device::kCpu);
  const int64_t rows = 3, d = 6;
  Tensor x = random_tensor({rows, d}, DType::kF32, 5);
  Tensor w = random_tensor({d}, DType::kF32, 6);
  const Tensor r = random_tensor({rows, d}, DType::kF32, 7);
  const float eps = 1e-3f;  // large enough to matter in the derivative
  auto loss = [&] { return test::weighted_sum(forward(cpu, x, w, eps, DType::kF32).y, r); };

  const Fwd f = forward(cpu, x, w, eps, DType::kF32);
  Tensor dx = Tensor::empty({rows, d}, DType::kF32);
  test::poison(dx, 0xFF);
  const Tensor dw0 = random_tensor({d}, DType::kF32, 8);
  Tensor dw = dw0.to_host(cpu);
  rmsnorm_backward(cpu, {.dy = r, .x = x, .weight = w, .rstd = f.rstd, .dx = dx, .dweight = dw});
  for (int64_t i = 0; i < rows * d; ++i) {
    const double fd = test::central_difference(x.data_as<float>() + i, 1e-2, loss);
    EXPECT_NEAR(dx.data_as<float>()[i], fd, 2e-3 * std::max(1.0, std::fabs(fd)))
        << "dx element " << i;
  }
  for (int64_t j = 0; j < d; ++j) {
    const double fd = test::central_difference(w.data_as<float>() + j, 1e-2, loss);
    const double got = static_cast<double>(dw.data_as<float>()[j]) - dw0.data_as<float>()[j];  // +=
    EXPECT_NEAR(got, fd, 2e-3 * std::max(1.0, std::fabs(fd))) << "dw element " << j;
  }
}

TEST(RmsNorm, DweightAccumulates) {
  Context cpu = make_context(Device::kCpu);
  const Tensor x = random_tensor({9, 11}, DType::kBF16, 9);
  const Tensor w = random_tensor({11}, DType::kF32, 10);
  const Tensor dy = random_tensor({9, 11}, DType::kBF16, 11);
  const Fwd f = forward(cpu, x, w, 1e-6f, DType::kBF16);
  Tensor dx = Tensor::empty({9, 11}, DType::kBF16);
  auto zeros = [] { return test::host_tensor({11}, DType::kF32, [](int64_t) { return 0.0; }); };
  Tensor once = zeros(), twice = zeros();
  rmsnorm_backward(cpu, {.dy = dy, .x = x, .weight = w, .rstd = f.rstd, .dx = dx, .dweight = once});
  rmsnorm_backward(cpu,
                   {.dy = dy, .x = x, .weight = w, .rstd = f.rstd, .dx = dx, .dweight = twice});
  rmsnorm_backward(cpu,
                   {.dy = dy, .x = x, .weight = w, .rstd = f.rstd, .dx = dx, .dweight = twice});
  for (int64_t j = 0; j < 11; ++j)
    EXPECT_FLOAT_EQ(twice.data_as<float>()[j], 2.0f * once.data_as<float>()[j]) << "column " << j;
}

TEST(RmsNorm, ZeroRowsIsANoOp) {
  Context cpu = make_context(Device::kCpu);
  const Tensor x = Tensor::empty({0, 8}, DType::kBF16);
  const Tensor w = random_tensor({8}, DType::kF32, 12);
  Tensor y = Tensor::empty({0, 8}, DType::kBF16), rstd = Tensor::empty({0}, DType::kF32);
  rmsnorm_forward(cpu, {.x = x, .weight = w, .epsilon = 1e-6f, .y = y, .rstd = rstd});
  Tensor dw = w.to_host(cpu);
  rmsnorm_backward(cpu, {.dy = x, .x = x, .weight = w, .rstd = rstd, .dx = y, .dweight = dw});
  EXPECT_TRUE(test::bitwise_equal(w, dw));
}

TEST(RmsNorm, RejectsBadArguments) {
  Context cpu = make_context(Device::kCpu);
  const Tensor x = random_tensor({4, 8}, DType::kBF16, 13);
  const Tensor w = random_tensor({8}, DType::kF32, 14);
  Tensor y = Tensor::empty({4, 8}, DType::kBF16), rstd = Tensor::empty({4}, DType::kF32);
  test::expect_error(
      [&] {
        rmsnorm_forward(cpu, {.x = x,
                              .weight = random_tensor({7}, DType::kF32, 1),
                              .epsilon = 1e-6f,
                              .y = y,
                              .rstd = rstd});
      },
      {"rmsnorm weight", "expected shape [8]", "got [7]"});
  test::expect_error(
      [&] {
        rmsnorm_forward(cpu, {.x = x,
                              .weight = random_tensor({8}, DType::kBF16, 1),
                              .epsilon = 1e-6f,
                              .y = y,
                              .rstd = rstd});
      },
      {"rmsnorm weight", "F32", "BF16"});
  test::expect_error(
      [&] {
        rmsnorm_forward(cpu, {.x = x,
                              .weight = w,
                              .epsilon = 1e-6f,
                              .y = Tensor::empty({4, 9}, DType::kBF16),
                              .rstd = rstd});
      },
      {"rmsnorm y", "[4, 8]", "[4, 9]"});
  test::expect_error(
      [&] {
        rmsnorm_forward(cpu, {.x = x,
                              .weight = w,
                              .epsilon = 1e-6f,
                              .y = y,
                              .rstd = Tensor::empty({5}, DType::kF32)});
      },
      {"rmsnorm rstd", "[4]", "[5]"});
  test::expect_error(
      [&] { rmsnorm_forward(cpu, {.x = x, .weight = w, .epsilon = 0.0f, .y = y, .rstd = rstd}); },
      {"epsilon"});
  Tensor dw = Tensor::empty({8}, DType::kF32);
  test::expect_error(
      [&] {
        rmsnorm_backward(cpu, {.dy = x,
                               .x = x,
                               .weight = w,
                               .rstd = rstd,
                               .dx = Tensor::empty({4, 8}, DType::kF32),
                               .dweight = dw});
      },
      {"rmsnorm dx", "BF16", "F32"});
  test::expect_error(
      [&] {
        rmsnorm_backward(cpu, {.dy = x,
                               .x = x,
                               .weight = w,
                               .rstd = rstd,
                               .dx = y,
                               .dweight = Tensor::empty({8}, DType::kBF16)});
      },
      {"rmsnorm dweight", "F32"});
}

// The fused residual adds give the bits of add_into followed by the plain call.
TEST(RmsNorm, FusedResidualEqualsAddIntoThenNorm) {
  Context ctx = make_context(Device::kCpu);
  for (DType dt : {DType::kBF16, DType::kF32}) {
    test::expect_residual_fusion_exact(ctx, 5, 24, dt, 70);
    test::expect_residual_fusion_exact(ctx, 3, 7, dt, 80);
  }
}

}  // namespace
}  // namespace octet
