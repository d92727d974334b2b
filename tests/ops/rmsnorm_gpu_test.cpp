// CUDA rmsnorm against the CPU reference on odd and prime shapes. The sums run in a different order
// (FP32 trees on the GPU, FP64 on the CPU), so results are compared with stated tolerances:
//   rstd     relative 2e-6 (FP32 sum of squares: at most ~24 rounded adds in sequence, halved by
//   sqrt) y  F32   relative 4e-6 (rstd's error plus two roundings);  BF16: at most 1 ulp apart dx
//   F32   relative 1e-5 + 1e-5 * max |dx| of the row (the row dot product cancels);  BF16: 1 ulp or
//   that dw       2e-5 * sum_r |dy * xhat| of the column + 2^-22 |dw| (FP32 partial sums over up to
//   576 terms)
// and the CUDA results must be bitwise identical run to run. Outputs are poisoned with NaN first.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "backend/backend.h"
#include "norm_act_test_util.h"
#include "ops/rmsnorm/rmsnorm.h"
#include "rmsnorm_residual_check.h"

namespace octet {
namespace {

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

struct Result {
  Tensor y, rstd, dx, dw;  // host copies
};

Result run(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dw0,
           DType ydt) {
  const bool gpu = ctx.device == Device::kCuda;
  auto put = [&](const Tensor& t) { return gpu ? t.to(ctx, Device::kCuda) : t.to_host(ctx); };
  auto out = [&](const Shape& s, DType dt) {
    if (gpu) return test::poisoned(ctx, s, dt);
    Tensor t = Tensor::empty(s, dt);
    test::poison(t, 0xFF);
    return t;
  };
  const Tensor dx_ = put(x), dw_ = put(w), ddy = put(dy);
  Tensor y = out(x.shape(), ydt), rstd = out({x.rows()}, DType::kF32),
         dx = out(x.shape(), dy.dtype());
  Tensor dw = put(dw0);
  rmsnorm_forward(ctx, {.x = dx_, .weight = dw_, .epsilon = 1e-6f, .y = y, .rstd = rstd});
  rmsnorm_backward(ctx,
                   {.dy = ddy, .x = dx_, .weight = dw_, .rstd = rstd, .dx = dx, .dweight = dw});
  return {y.to_host(ctx), rstd.to_host(ctx), dx.to_host(ctx), dw.to_host(ctx)};
}

// Per-row max |t| for the matrix view of a host tensor.
std::vector<double> row_max(const Tensor& t) {
  std::vector<double> m(static_cast<size_t>(t.rows()), 0.0);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double v = std::fabs(test::value_at(t, i));
    if (std::isfinite(v))
      m[static_cast<size_t>(i / t.cols())] = std::max(m[static_cast<size_t>(i / t.cols())], v);
  }
  return m;
}

void compare(const Tensor& x, const Tensor& dy, const Result& want, const Result& got,
             const std::string& where) {
  const int64_t d = x.cols();
  EXPECT_TRUE(test::all_close(want.rstd, got.rstd, 2e-6, 0.0, where + " rstd"));
  if (want.y.dtype() == DType::kF32)
    EXPECT_TRUE(test::all_close(want.y, got.y, 4e-6, 1e-37, where + " y"));
  else
    EXPECT_TRUE(test::bf16_close(
        want.y, got.y, 1, [](int64_t) { return 0.0; }, where + " y"));
  const std::vector<double> dxmax = row_max(want.dx);
  auto dx_atol = [&](int64_t i) { return 1e-5 * dxmax[static_cast<size_t>(i / d)]; };
  if (want.dx.dtype() == DType::kF32)
    EXPECT_TRUE(test::all_close(want.dx, got.dx, 1e-5, dx_atol, where + " dx"));
  else
    EXPECT_TRUE(test::bf16_close(want.dx, got.dx, 1, dx_atol, where + " dx"));
  std::vector<double> mag(static_cast<size_t>(d), 0.0);  // sum_r |dy * xhat| per column
  for (int64_t i = 0; i < x.numel(); ++i)
    mag[static_cast<size_t>(i % d)] +=
        std::fabs(test::value_at(dy, i) * test::value_at(x, i) * want.rstd.data_as<float>()[i / d]);
  auto dw_atol = [&](int64_t j) {
    return 2e-5 * mag[static_cast<size_t>(j)] + 0x1p-22 * std::fabs(want.dw.data_as<float>()[j]);
  };
  EXPECT_TRUE(test::all_close(want.dw, got.dw, 0.0, dw_atol, where + " dw"));
}

using Case = std::tuple<int64_t, int64_t, DType, DType>;  // rows, D, x dtype, y (and dy, dx) dtype

class RmsNormGpu : public ::testing::TestWithParam<Case> {};

TEST_P(RmsNormGpu, MatchesCpuAndIsDeterministic) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const auto& [rows, d, xdt, ydt] = GetParam();
  const std::string where = "rows " + std::to_string(rows) + " D " + std::to_string(d) + " x " +
                            std::string(dtype_name(xdt)) + " y " + std::string(dtype_name(ydt));
  const Tensor x = random_tensor({rows, d}, xdt, 100 + rows + d, Dist::kOutliers);
  const Tensor w = random_tensor({d}, DType::kF32, 200 + d);
  const Tensor dy = random_tensor({rows, d}, ydt, 300 + rows);
  const Tensor dw0 = random_tensor({d}, DType::kF32, 400 + d);
  const Result want = run(cpu, x, w, dy, dw0, ydt);
  const Result got = run(gpu, x, w, dy, dw0, ydt);
  compare(x, dy, want, got, where);
  const Result again = run(gpu, x, w, dy, dw0, ydt);
  EXPECT_TRUE(test::bitwise_equal(got.y, again.y)) << where << " y not deterministic";
  EXPECT_TRUE(test::bitwise_equal(got.rstd, again.rstd)) << where << " rstd not deterministic";
  EXPECT_TRUE(test::bitwise_equal(got.dx, again.dx)) << where << " dx not deterministic";
  EXPECT_TRUE(test::bitwise_equal(got.dw, again.dw)) << where << " dw not deterministic";
}

INSTANTIATE_TEST_SUITE_P(OddShapes, RmsNormGpu,
                         ::testing::Combine(::testing::Values(1, 127, 129, 1481),
                                            ::testing::Values(7, 129, 1000, 4099),
                                            ::testing::Values(DType::kBF16, DType::kF32),
                                            ::testing::Values(DType::kBF16, DType::kF32)));

// The model's widths (the vectorised BF16 kernels: D a multiple of 8), with rows that leave a
// partial block of warps and a partial last dw part.
INSTANTIATE_TEST_SUITE_P(ModelWidths, RmsNormGpu,
                         ::testing::Combine(::testing::Values(1, 8, 1481, 4133),
                                            ::testing::Values(8, 256, 384, 1024, 1536),
                                            ::testing::Values(DType::kBF16),
                                            ::testing::Values(DType::kBF16)));

// The fused residual adds give the bits of add_into followed by the plain call, on the vectorised
// path (BF16, D % 8 == 0) and on the general one.
TEST(RmsNormGpuResidual, FusedEqualsAddIntoThenNorm) {
  OCTET_REQUIRE_GPU();
  Context& gpu = devices().gpu;
  for (const auto& [rows, d] : {std::pair<int64_t, int64_t>{16384, 1024},
                                {1000, 384},
                                {37, 7168},
                                {129, 1000},
                                {64, 7},
                                {33, 129}})
    for (DType dt : {DType::kBF16, DType::kF32})
      test::expect_residual_fusion_exact(gpu, rows, d, dt, 900 + rows + d);
}

// Many BF16 rows on the vectorised path: 128 dw parts of 512 rows.
TEST(RmsNormGpuWide, ManyRowsBf16) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const Tensor x = random_tensor({65536, 256}, DType::kBF16, 610, Dist::kGaussian);
  const Tensor w = random_tensor({256}, DType::kF32, 611);
  const Tensor dy = random_tensor({65536, 256}, DType::kBF16, 612);
  const Tensor dw0 = random_tensor({256}, DType::kF32, 613);
  compare(x, dy, run(cpu, x, w, dy, dw0, DType::kBF16), run(gpu, x, w, dy, dw0, DType::kBF16),
          "65536 rows BF16");
}

// DeepSeek-V3's hidden size, and a width whose dw partial needs the opt-in shared memory (> 48
// KiB).
TEST(RmsNormGpuWide, ModelWidthAndOptInSharedMemory) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  for (int64_t d : {7168, 16411}) {
    const Tensor x = random_tensor({300, d}, DType::kBF16, 500 + d, Dist::kOutliers);
    const Tensor w = random_tensor({d}, DType::kF32, 501);
    const Tensor dy = random_tensor({300, d}, DType::kBF16, 502);
    const Tensor dw0 = random_tensor({d}, DType::kF32, 503);
    compare(x, dy, run(cpu, x, w, dy, dw0, DType::kBF16), run(gpu, x, w, dy, dw0, DType::kBF16),
            "D " + std::to_string(d));
  }
}

// Many rows: every dw part holds 64 rows and the reduction adds 512 parts.
TEST(RmsNormGpuWide, ManyRows) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const Tensor x = random_tensor({32768, 67}, DType::kF32, 600, Dist::kGaussian);
  const Tensor w = random_tensor({67}, DType::kF32, 601);
  const Tensor dy = random_tensor({32768, 67}, DType::kF32, 602);
  const Tensor dw0 = random_tensor({67}, DType::kF32, 603);
  compare(x, dy, run(cpu, x, w, dy, dw0, DType::kF32), run(gpu, x, w, dy, dw0, DType::kF32),
          "32768 rows");
}

}  // namespace
}  // namespace octet
