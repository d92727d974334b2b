// The Linear layer on CUDA against the CPU reference, for every recipe (bf16, deepseek's fp8-block,
// fp8-tensor-current, fp8-tensor-delayed over two steps), on T in {128, 256, 384} tokens and
// (In, Out) pairs from {128, 256, 384, 512}: multiples of 16 as the FP8 GEMMs need on CUDA (see
// model/linear.h), and of 128 so every 1x128 / 128x128 group is whole.
//
// What must agree, and why:
//   saved x (FP8 column-wise copy and its scales)  bitwise: quantization is bit-exact CPU vs CUDA,
//                                                  and so is the delayed-scaling state it reads
//   dW (FP32, +=)   relative Frobenius 2.5e-4 of the accumulated product: cuBLASLt adds inside each
//                   128-element chunk of K with ~1.3e-4 relative error (docs/numerics.md); the CPU
//                   reference adds in FP32 exactly rounded
//   y, dx (BF16)    relative Frobenius 1e-3: the same 1.3e-4 on the FP32 result, then a BF16
//                   rounding that flips by one ulp (2^-8) wherever the two FP32 values straddle a
//                   rounding boundary (a few percent of the elements)
// The GPU results must also meet the recipe's FP64 budget of tests/model/linear_test.cpp.
// Outputs: dW starts from random values (the += is checked); y and dx are allocated by the layer,
// so they are checked finite and element by element through the CPU comparison.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "../ops/norm_act_test_util.h"
#include "backend/backend.h"
#include "model/linear.h"
#include "ops/cast/cast.h"

namespace octet {
namespace {

using test::random_tensor;

struct Devices {
  Context cpu = make_context(Device::kCpu);
  Context gpu = make_context(Device::kCuda);
};

Devices& devices() {
  static Devices d;
  return d;
}

struct Problem {
  Tensor x, w, dy, dw0;  // host: (T, In) bf16, (Out, In) f32, (T, Out) bf16, (Out, In) f32
};

Tensor scaled(const Tensor& t, float s, DType dt) {
  Context& cpu = devices().cpu;
  Tensor f = cast(cpu, t, DType::kF32);
  for (int64_t i = 0; i < f.numel(); ++i) f.data_as<float>()[i] *= s;
  return cast(cpu, f, dt);
}

// The scales of linear_test.cpp: x ~ N(0, 1), W ~ N(0, 0.02^2), dy ~ N(0, 1e-3^2); dW0 of the
// magnitude of one dW so the += is visible in every element.
Problem make_problem(int64_t t, int64_t in, int64_t out, uint64_t seed) {
  return {random_tensor({t, in}, DType::kBF16, seed),
          scaled(random_tensor({out, in}, DType::kF32, seed + 1), 0.02f, DType::kF32),
          scaled(random_tensor({t, out}, DType::kF32, seed + 2), 1e-3f, DType::kBF16),
          scaled(random_tensor({out, in}, DType::kF32, seed + 3), 0.02f, DType::kF32)};
}

struct Step {
  Tensor y, dx, dw;     // host
  QuantTensor saved_x;  // host copies of the column-wise copy (FP8 recipes)
};

Tensor host(Context& ctx, const Tensor& t) {
  return t.defined() && t.data() ? t.to_host(ctx) : t;
}

Step run_step(Context& ctx, const Problem& p, const GemmRecipe& r, LinearScalingState* st) {
  auto put = [&](const Tensor& t) { return t.to(ctx, ctx.device); };
  const GemmSite site = GemmSite::kAttnQUp;
  const PreparedWeight pw =
      prepare_weight(ctx, {.site = site, .weight = put(p.w), .recipe = r, .state = st});
  LinearSaved saved;
  const Tensor y = linear_forward(
      ctx, {.site = site, .x = put(p.x), .weight = pw, .recipe = r, .state = st}, saved);
  LinearGrads g{put(p.dw0)};
  const Tensor dx = linear_backward(
      ctx, {.site = site, .dy = put(p.dy), .saved = saved, .weight = pw, .recipe = r, .state = st},
      g);
  Step s{host(ctx, y), host(ctx, dx), host(ctx, g.weight), {}};
  s.saved_x.columnwise_data = host(ctx, saved.qx.columnwise_data);
  s.saved_x.columnwise_scale_inv = host(ctx, saved.qx.columnwise_scale_inv);
  return s;
}

std::vector<double> values(const Tensor& t, const Tensor* minus = nullptr) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i)
    v[static_cast<size_t>(i)] = test::value_at(t, i) - (minus ? test::value_at(*minus, i) : 0.0);
  return v;
}

// ||got - ref|| / ||ref||; any non-finite value gives +inf.
double rel_err(const std::vector<double>& ref, const std::vector<double>& got) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

// FP64 C (M, N) = A B^T over host matrices.
std::vector<double> abt(const Tensor& a, const Tensor& b) {
  const int64_t m = a.rows(), n = b.rows(), k = a.cols();
  const std::vector<double> av = values(a), bv = values(b);
  std::vector<double> c(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t q = 0; q < k; ++q)
        s += av[static_cast<size_t>(i * k + q)] * bv[static_cast<size_t>(j * k + q)];
      c[static_cast<size_t>(i * n + j)] = s;
    }
  return c;
}

constexpr double kBf16OutTol = 1e-3;
constexpr double kDwTol = 2.5e-4;

struct RecipeCase {
  const char* preset;
  double budget_y, budget_dx, budget_dw;  // FP64 budgets of linear_test.cpp
};

// bf16 dW: the CPU budget (1e-6, exact FP32 sums) is widened to cuBLASLt's accumulation error.
const RecipeCase kRecipes[] = {{"bf16", 4e-3, 4e-3, kDwTol},
                               {"deepseek", 5e-2, 5e-2, 5e-2},
                               {"fp8-tensor-current", 5e-2, 8e-2, 8e-2},
                               {"fp8-tensor-delayed", 5e-2, 8e-2, 8e-2}};

struct Dims {
  int64_t t, in, out;
};

std::vector<Dims> shapes() {
  const std::pair<int64_t, int64_t> io[] = {{128, 512}, {256, 384}, {384, 128}, {512, 256}};
  std::vector<Dims> v;
  for (int64_t t : {128, 256, 384})
    for (const auto& [in, out] : io) v.push_back({t, in, out});
  return v;
}

void compare(const Problem& p, const Step& want, const Step& got, const RecipeCase& rc, bool fp8,
             const std::string& where) {
  const std::vector<double> y = values(got.y), dx = values(got.dx);
  const std::vector<double> dw = values(got.dw, &p.dw0), dw_cpu = values(want.dw, &p.dw0);
  const double ey = rel_err(values(want.y), y), edx = rel_err(values(want.dx), dx),
               edw = rel_err(dw_cpu, dw);
  std::printf("  %-44s vs CPU: y %.2e dx %.2e dW %.2e\n", where.c_str(), ey, edx, edw);
  EXPECT_LE(ey, kBf16OutTol) << where << " y";
  EXPECT_LE(edx, kBf16OutTol) << where << " dx";
  EXPECT_LE(edw, kDwTol) << where << " dW";
  if (fp8) {
    EXPECT_TRUE(test::bitwise_equal(want.saved_x.columnwise_data, got.saved_x.columnwise_data))
        << where << " saved x";
    EXPECT_TRUE(
        test::bitwise_equal(want.saved_x.columnwise_scale_inv, got.saved_x.columnwise_scale_inv))
        << where << " saved x scales";
  }
  // The recipe's error budget against FP64 on the unquantized inputs holds on the GPU too.
  Context& cpu = devices().cpu;
  EXPECT_LE(rel_err(abt(p.x, p.w), y), rc.budget_y) << where << " y vs FP64";
  EXPECT_LE(rel_err(abt(p.dy, transpose(cpu, p.w)), dx), rc.budget_dx) << where << " dx vs FP64";
  EXPECT_LE(rel_err(abt(transpose(cpu, p.dy), transpose(cpu, p.x)), dw), rc.budget_dw)
      << where << " dW vs FP64";
}

class LinearGpuTest : public ::testing::TestWithParam<RecipeCase> {};

TEST_P(LinearGpuTest, MatchesCpuReference) {
  OCTET_REQUIRE_GPU();
  Context& cpu = devices().cpu;
  Context& gpu = devices().gpu;
  const RecipeCase& rc = GetParam();
  const Recipe recipe = recipe_preset(rc.preset);
  const GemmRecipe r = recipe.at(GemmSite::kAttnQUp);
  const bool delayed =
      r.precision == GemmPrecision::kFp8Tensor && r.scaling == ScalingMode::kDelayed;
  for (const Dims& d : shapes()) {
    const Problem p = make_problem(d.t, d.in, d.out, static_cast<uint64_t>(d.t + d.in + d.out));
    const std::string where = std::string(rc.preset) + " T=" + std::to_string(d.t) +
                              " In=" + std::to_string(d.in) + " Out=" + std::to_string(d.out);
    if (!delayed) {
      compare(p, run_step(cpu, p, r, nullptr), run_step(gpu, p, r, nullptr), rc, r.is_fp8(), where);
      continue;
    }
    // Two steps with their own state per device: step 1 quantizes with scale 1, step 2 with the
    // scales step 1 recorded. Both must agree, and the states must hold the same scales.
    LinearScalingState sc = make_linear_scaling_state(cpu, recipe);
    LinearScalingState sg = make_linear_scaling_state(gpu, recipe);
    for (int step = 1; step <= 2; ++step) {
      const Step want = run_step(cpu, p, r, &sc), got = run_step(gpu, p, r, &sg);
      const std::string w = where + " step " + std::to_string(step);
      if (step == 2)
        compare(p, want, got, rc, true, w);
      else {
        // Scale 1 on step 1: only the CPU comparison applies (not the FP64 budget).
        EXPECT_LE(rel_err(values(want.y), values(got.y)), kBf16OutTol) << w << " y";
        EXPECT_LE(rel_err(values(want.dx), values(got.dx)), kBf16OutTol) << w << " dx";
      }
      EXPECT_TRUE(test::bitwise_equal(sc.x.scale, sg.x.scale.to_host(gpu))) << w << " x scale";
      EXPECT_TRUE(test::bitwise_equal(sc.w.scale, sg.w.scale.to_host(gpu))) << w << " w scale";
      EXPECT_TRUE(test::bitwise_equal(sc.dy.scale, sg.dy.scale.to_host(gpu))) << w << " dy scale";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllRecipes, LinearGpuTest, ::testing::ValuesIn(kRecipes),
                         [](const auto& info) {
                           std::string n = info.param.preset;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

TEST(LinearGpu, RejectsShapesCublasLtCannotRun) {
  OCTET_REQUIRE_GPU();
  Context& gpu = devices().gpu;
  const GemmRecipe block = recipe_preset("deepseek").at(GemmSite::kAttnOut);
  const Tensor w200 = random_tensor({128, 200}, DType::kF32, 1).to(gpu, Device::kCuda);
  test::expect_error(
      [&] {
        (void)prepare_weight(
            gpu, {.site = GemmSite::kAttnOut, .weight = w200, .recipe = block, .state = nullptr});
      },
      {"attn.out", "CUDA", "In = 200", "multiple of 16"});
  const Tensor w = random_tensor({128, 256}, DType::kF32, 2).to(gpu, Device::kCuda);
  const PreparedWeight pw = prepare_weight(
      gpu, {.site = GemmSite::kAttnOut, .weight = w, .recipe = block, .state = nullptr});
  const Tensor x100 = random_tensor({100, 256}, DType::kBF16, 3).to(gpu, Device::kCuda);
  LinearSaved saved;
  test::expect_error(
      [&] {
        (void)linear_forward(gpu,
                             {.site = GemmSite::kAttnOut,
                              .x = x100,
                              .weight = pw,
                              .recipe = block,
                              .state = nullptr},
                             saved);
      },
      {"attn.out", "T (tokens) = 100", "Wgrad"});
  // The BF16 recipe has no such rule.
  const GemmRecipe bf16 = recipe_preset("bf16").at(GemmSite::kAttnOut);
  const PreparedWeight pb = prepare_weight(
      gpu, {.site = GemmSite::kAttnOut, .weight = w200, .recipe = bf16, .state = nullptr});
  const Tensor x = random_tensor({100, 200}, DType::kBF16, 4).to(gpu, Device::kCuda);
  const Tensor y = linear_forward(
      gpu, {.site = GemmSite::kAttnOut, .x = x, .weight = pb, .recipe = bf16, .state = nullptr},
      saved);
  EXPECT_EQ(y.shape(), (Shape{100, 128}));
}

}  // namespace
}  // namespace octet
