// The swiglu ops with gate_up kept in FP8 (swiglu.h; Recipe::moe_swiglu_input fp8) on CUDA: the
// fused outputs (caching forward, and every reader of the copy) bit for bit against the separate
// quantize / dequantize path on the GPU, and against the CPU's fused outputs. Widths: the
// baseline's F = 704 (groups straddle the gate/up halves), DeepSeek-V3's 2048, F % 128 != 0
// (1000, 64), the scalar kernels' F % 8 != 0 (7, 100); the caching forward's row kernel at every
// step count (64: 1, 384: 2, 704: 3, 1000 and 1024: 4; 384 and 1024 with no straddling group) and
// its fallback past F = 1024 (2048); odd row counts and zero rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>
#include <tuple>

#include "swiglu_fp8_input_check.h"

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

using Case = std::tuple<int64_t, int64_t, DType>;  // rows, F, dtype of gate_up and dh

class SwigluFp8InputGpu : public ::testing::TestWithParam<Case> {};

TEST_P(SwigluFp8InputGpu, FusedEqualsSeparateAndCpu) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const auto& [rows, f, dt] = GetParam();
  for (Dist dist : {Dist::kGaussian, Dist::kOutliers, Dist::kWide}) {
    const uint64_t seed = 2000 + rows * 7 + f + static_cast<int>(dist);
    const Tensor gu = random_tensor({rows, 2 * f}, dt, seed, dist);
    const Tensor dh = random_tensor({rows, f}, dt, seed + 1, Dist::kGaussian);
    const Tensor w = test::fp8_input_row_weights(rows, seed + 2);
    const std::string where = "rows " + std::to_string(rows) + " F " + std::to_string(f) + " " +
                              std::string(dtype_name(dt)) + " dist " +
                              std::to_string(static_cast<int>(dist));
    const test::Fp8InputOutputs fused = test::run_fp8_input_ops(gpu, gu, dh, w, true);
    ASSERT_TRUE(test::same_outputs(test::run_fp8_input_ops(gpu, gu, dh, w, false), fused))
        << where << ": fused vs separate on the GPU";
    ASSERT_TRUE(test::same_outputs(test::run_fp8_input_ops(cpu, gu, dh, w, true), fused))
        << where << ": GPU vs CPU";
  }
}

INSTANTIATE_TEST_SUITE_P(Widths, SwigluFp8InputGpu,
                         ::testing::Combine(::testing::Values(0, 1, 3, 129, 517),
                                            ::testing::Values(7, 64, 100, 248, 384, 704, 760, 1000,
                                                              1024, 2048),
                                            ::testing::Values(DType::kBF16, DType::kF32)));

// The copy in other formats and roundings, special values (NaN and infinities in gate_up: the
// copy's NaN code and saturation), an all-zero row, and a gate_up that starts 2 bytes past an
// aligned address (the scalar kernels).
TEST(SwigluFp8InputGpuSpecial, FormatsSpecialsAndUnaligned) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  Tensor gu = random_tensor({9, 2 * 704}, DType::kF32, 2100, Dist::kWide);
  float* p = gu.data_as<float>();
  const float inf = std::numeric_limits<float>::infinity(),
              nan = std::numeric_limits<float>::quiet_NaN();
  const float special[] = {0.0f, -0.0f, inf, -inf, nan, 1e30f, -1e30f, 1e-40f, -88.0f, 88.0f};
  for (int i = 0; i < 10; ++i) {
    p[3 * 1408 + i] = special[i];               // gate of row 3
    p[4 * 1408 + 704 + 60 + i] = special[i];    // up of row 4, the straddling group
    p[5 * 1408 + 640 + i] = special[i] * 0.5f;  // gate, the straddling group
  }
  for (int64_t j = 0; j < 1408; ++j) p[6 * 1408 + j] = 0.0f;
  const Tensor dh = random_tensor({9, 704}, DType::kF32, 2101, Dist::kGaussian);
  const Tensor w = test::fp8_input_row_weights(9, 2102);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const auto as = [&](const Tensor& t) {
      return test::host_tensor(t.shape(), dt, [&](int64_t i) { return t.data_as<float>()[i]; });
    };
    const Tensor g = as(gu), d = as(dh);
    for (Fp8Format fmt : {Fp8Format::kE4M3, Fp8Format::kE5M2})
      for (ScaleRounding rnd : {ScaleRounding::kPow2, ScaleRounding::kExact}) {
        const SwigluInputCache cache{.format = fmt, .rounding = rnd};
        const test::Fp8InputOutputs fused = test::run_fp8_input_ops(gpu, g, d, w, true, cache);
        ASSERT_TRUE(test::same_outputs(test::run_fp8_input_ops(cpu, g, d, w, true, cache), fused))
            << dtype_name(dt) << " " << format_name(fmt) << " GPU vs CPU";
      }
  }
  // Unaligned: the rows read through a view one BF16 element in.
  const int64_t rows = 131, f = 704;
  const Tensor big = random_tensor({rows * 2 * f + 1}, DType::kBF16, 2103);
  Tensor big_d = big.to(gpu, Device::kCuda);
  const Tensor view =
      Tensor::wrap(big_d.data_as<uint16_t>() + 1, {rows, 2 * f}, DType::kBF16, Device::kCuda);
  Tensor host = Tensor::empty({rows, 2 * f}, DType::kBF16);
  std::copy_n(big.data_as<uint16_t>() + 1, rows * 2 * f, host.data_as<uint16_t>());
  const SwigluQuantizeCachedResult c = swiglu_quantize_caching_input(cpu, {.gate_up = host});
  const SwigluQuantizeCachedResult g = swiglu_quantize_caching_input(gpu, {.gate_up = view});
  for (auto [a, b, what] :
       {std::tuple{&c.h.data, &g.h.data, "h data"},
        std::tuple{&c.h.scale_inv, &g.h.scale_inv, "h scale_inv"},
        std::tuple{&c.gate_up.data, &g.gate_up.data, "gate_up data"},
        std::tuple{&c.gate_up.scale_inv, &g.gate_up.scale_inv, "gate_up scales"},
        std::tuple{&c.gate_up.amax, &g.gate_up.amax, "gate_up amax"}})
    ASSERT_TRUE(test::bitwise_equal(*a, b->to_host(gpu))) << "unaligned view " << what;
}

}  // namespace
}  // namespace octet
