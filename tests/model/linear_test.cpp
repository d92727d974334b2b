// The Linear layer on the CPU, for every recipe: forward and backward against FP64 products of the
// unquantized inputs (x and dy in BF16, W in FP32), the += contract of dW, delayed-scaling state,
// and argument errors.
//
// Error budgets: relative Frobenius error ||got - ref|| / ||ref|| against FP64, Gaussian data
// (x ~ N(0, 1), W ~ N(0, 0.02^2) as the model initialises it, dy ~ N(0, 1e-3^2)), measured on the
// CPU at T=256, In=384, Out=256 and at the odd shape T=129, In=200, Out=72 (the larger of the two),
// and the bounds the test enforces:
//
//   recipe               y (Fprop)   dx (Dgrad)   dW (Wgrad)   bounds y / dx / dW
//   bf16                 2.35e-3     2.35e-3      7.8e-8       4e-3 / 4e-3 / 1e-6
//   deepseek (block)     3.79e-2     3.71e-2      3.66e-2      5e-2 / 5e-2 / 5e-2
//   fp8-tensor-current   3.81e-2     5.91e-2      5.92e-2      5e-2 / 8e-2 / 8e-2
//
// bf16: x and dy are exact in BF16; the error is W's one rounding to BF16 plus the BF16 rounding of
// y and dx (2^-9 relative each, uniform: ~2.3e-3 together). dW is the FP32 sum of exact products.
// FP8: both operands quantized, E4M3 (3 mantissa bits) in Fprop and everywhere in the block recipe;
// E5M2 (2 bits) gradients in the tensor recipes make their Dgrad and Wgrad ~1.6x worse. On Gaussian
// data without outliers 1x128 tiles gain little over one scale per tensor; they pay off on
// token-correlated outliers (reference/fp8-facts.md section 2).
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

Context& cpu() {
  static Context c = make_context(Device::kCpu);
  return c;
}

struct Problem {
  Tensor x;   // (T, In) bf16
  Tensor w;   // (Out, In) f32
  Tensor dy;  // (T, Out) bf16
};

Tensor scaled(const Tensor& t, float s, DType dt) {
  Tensor f = cast(cpu(), t, DType::kF32);
  for (int64_t i = 0; i < f.numel(); ++i) f.data_as<float>()[i] *= s;
  return cast(cpu(), f, dt);
}

Problem make_problem(int64_t t, int64_t in, int64_t out, uint64_t seed) {
  return {random_tensor({t, in}, DType::kBF16, seed),
          scaled(random_tensor({out, in}, DType::kF32, seed + 1), 0.02f, DType::kF32),
          scaled(random_tensor({t, out}, DType::kF32, seed + 2), 1e-3f, DType::kBF16)};
}

struct RecipeCase {
  const char* name;
  GemmRecipe gemm;
  Recipe recipe;  // for the delayed-scaling state
};

RecipeCase recipe_case(const char* preset) {
  Recipe r = recipe_preset(preset);
  return {preset, r.at(GemmSite::kAttnQUp), r};
}

struct Step {
  Tensor y, dx, dw;  // host; dw = the grads after the backward
};

// prepare_weight, forward, backward: one optimizer step of one micro-batch.
Step run_step(Context& ctx, const Problem& p, const GemmRecipe& r, LinearScalingState* st,
              const Tensor& dw0) {
  const PreparedWeight pw =
      prepare_weight(ctx, {.site = GemmSite::kAttnQUp, .weight = p.w, .recipe = r, .state = st});
  LinearSaved saved;
  const Tensor y = linear_forward(
      ctx, {.site = GemmSite::kAttnQUp, .x = p.x, .weight = pw, .recipe = r, .state = st}, saved);
  LinearGrads g{cast(ctx, dw0, DType::kF32)};  // a copy: backward accumulates into it
  const Tensor dx = linear_backward(ctx,
                                    {.site = GemmSite::kAttnQUp,
                                     .dy = p.dy,
                                     .saved = saved,
                                     .weight = pw,
                                     .recipe = r,
                                     .state = st},
                                    g);
  return {y, dx, g.weight};
}

Tensor zeros(const Shape& s) {
  Tensor t = Tensor::empty(s, DType::kF32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = 0.0f;
  return t;
}

// FP64 C (M, N) = A B^T over the matrix views of host f32 / bf16 A (M, K) and B (N, K).
std::vector<double> abt(const Tensor& a, const Tensor& b) {
  const int64_t m = a.rows(), n = b.rows(), k = a.cols();
  std::vector<double> av(static_cast<size_t>(a.numel())), bv(static_cast<size_t>(b.numel()));
  for (int64_t i = 0; i < a.numel(); ++i) av[static_cast<size_t>(i)] = test::value_at(a, i);
  for (int64_t i = 0; i < b.numel(); ++i) bv[static_cast<size_t>(i)] = test::value_at(b, i);
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

// ||got - ref|| / ||ref||; any non-finite value gives +inf.
double rel_err(const std::vector<double>& ref, const Tensor& got) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = test::value_at(got, static_cast<int64_t>(i));
    if (!std::isfinite(g)) return INFINITY;
    num += (g - ref[i]) * (g - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

struct Budget {
  const char* preset;
  double y, dx, dw;  // bounds on the relative Frobenius error, see the table at the top
};

const Budget kBudgets[] = {{"bf16", 4e-3, 4e-3, 1e-6},
                           {"deepseek", 5e-2, 5e-2, 5e-2},
                           {"fp8-tensor-current", 5e-2, 8e-2, 8e-2}};

TEST(Linear, EveryRecipeMatchesFp64WithinItsBudget) {
  struct Dims {
    int64_t t, in, out;
  };
  for (const Dims d : {Dims{256, 384, 256}, Dims{129, 200, 72}}) {
    const Problem p = make_problem(d.t, d.in, d.out, 7);
    const std::vector<double> y_ref = abt(p.x, p.w);
    const std::vector<double> dx_ref = abt(p.dy, transpose(cpu(), p.w));
    const std::vector<double> dw_ref = abt(transpose(cpu(), p.dy), transpose(cpu(), p.x));
    for (const Budget& b : kBudgets) {
      const RecipeCase rc = recipe_case(b.preset);
      const Step s = run_step(cpu(), p, rc.gemm, nullptr, zeros({d.out, d.in}));
      ASSERT_EQ(s.y.shape(), (Shape{d.t, d.out}));
      ASSERT_EQ(s.dx.shape(), (Shape{d.t, d.in}));
      const double ey = rel_err(y_ref, s.y), edx = rel_err(dx_ref, s.dx),
                   edw = rel_err(dw_ref, s.dw);
      std::printf("  %-20s T=%-4lld In=%-4lld Out=%-4lld  y %.2e  dx %.2e  dW %.2e\n", b.preset,
                  static_cast<long long>(d.t), static_cast<long long>(d.in),
                  static_cast<long long>(d.out), ey, edx, edw);
      EXPECT_LE(ey, b.y) << b.preset << " y";
      EXPECT_LE(edx, b.dx) << b.preset << " dx";
      EXPECT_LE(edw, b.dw) << b.preset << " dW";
    }
  }
}

TEST(Linear, LeadingDimensionsAreFlattenedIntoTokens) {
  const Problem p = make_problem(24, 40, 16, 9);
  for (const Budget& b : kBudgets) {
    const RecipeCase rc = recipe_case(b.preset);
    const Step flat = run_step(cpu(), p, rc.gemm, nullptr, zeros({16, 40}));
    const Problem p3{p.x.reshape({2, 12, 40}), p.w, p.dy.reshape({2, 12, 16})};
    const Step batched = run_step(cpu(), p3, rc.gemm, nullptr, zeros({16, 40}));
    EXPECT_EQ(batched.y.shape(), (Shape{2, 12, 16}));
    EXPECT_EQ(batched.dx.shape(), (Shape{2, 12, 40}));
    EXPECT_TRUE(test::bitwise_equal(flat.y, batched.y.reshape({24, 16}))) << b.preset;
    EXPECT_TRUE(test::bitwise_equal(flat.dx, batched.dx.reshape({24, 40}))) << b.preset;
    EXPECT_TRUE(test::bitwise_equal(flat.dw, batched.dw)) << b.preset;
  }
}

TEST(Linear, WeightGradientAccumulates) {
  // Two micro-steps on the same prepared weight: dW = dW0 + 2 (dy^T x), and dx is the same twice.
  const Problem p = make_problem(128, 256, 128, 11);
  const Tensor dw0 = random_tensor({128, 256}, DType::kF32, 12);
  for (const Budget& b : kBudgets) {
    const RecipeCase rc = recipe_case(b.preset);
    const Step once = run_step(cpu(), p, rc.gemm, nullptr, zeros({128, 256}));
    const PreparedWeight pw = prepare_weight(
        cpu(), {.site = GemmSite::kAttnQUp, .weight = p.w, .recipe = rc.gemm, .state = nullptr});
    LinearSaved saved;
    (void)linear_forward(
        cpu(),
        {.site = GemmSite::kAttnQUp, .x = p.x, .weight = pw, .recipe = rc.gemm, .state = nullptr},
        saved);
    LinearGrads g{cast(cpu(), dw0, DType::kF32)};
    const LinearBackwardArgs args{.site = GemmSite::kAttnQUp,
                                  .dy = p.dy,
                                  .saved = saved,
                                  .weight = pw,
                                  .recipe = rc.gemm,
                                  .state = nullptr};
    const Tensor dx1 = linear_backward(cpu(), args, g);
    const Tensor dx2 = linear_backward(cpu(), args, g);  // += again
    EXPECT_TRUE(test::bitwise_equal(dx1, dx2)) << b.preset;
    EXPECT_TRUE(test::bitwise_equal(once.dx, dx1)) << b.preset;
    for (int64_t i = 0; i < g.weight.numel(); ++i) {
      const double d = once.dw.data_as<const float>()[i];
      const double want = dw0.data_as<const float>()[i] + 2.0 * d;
      // Two FP32 adds into a value of magnitude ~1: a few ulps of |dW0| + 2 |d|.
      ASSERT_NEAR(g.weight.data_as<const float>()[i], want,
                  4e-7 * (std::fabs(dw0.data_as<const float>()[i]) + 2.0 * std::fabs(d)))
          << b.preset << " element " << i;
    }
  }
}

TEST(Linear, DelayedScalingUsesThePreviousStepsAmax) {
  const Problem p = make_problem(256, 256, 128, 13);
  const RecipeCase delayed = recipe_case("fp8-tensor-delayed");
  const RecipeCase current = recipe_case("fp8-tensor-current");
  ASSERT_EQ(delayed.gemm.scaling, ScalingMode::kDelayed);
  LinearScalingState st = make_linear_scaling_state(cpu(), delayed.recipe);
  EXPECT_EQ(st.x.amax_history.numel(), delayed.recipe.amax_history_len);
  EXPECT_EQ(st.x.scale.data_as<const float>()[0], 1.0f) << "no history yet: scale 1";

  // Step 1 quantizes with scale 1, then records the amaxes: the scales become the current ones.
  const Step s1 = run_step(cpu(), p, delayed.gemm, &st, zeros({128, 256}));
  EXPECT_EQ(st.x_steps, 1);
  EXPECT_EQ(st.w_steps, 1);
  EXPECT_EQ(st.dy_steps, 1);
  const float ax = amax(cpu(), p.x).data_as<const float>()[0];
  const float aw = amax(cpu(), p.w).data_as<const float>()[0];
  const float ady = amax(cpu(), p.dy).data_as<const float>()[0];
  EXPECT_EQ(st.x.scale.data_as<const float>()[0], compute_scale(ax, {.format = Fp8Format::kE4M3}));
  EXPECT_EQ(st.w.scale.data_as<const float>()[0], compute_scale(aw, {.format = Fp8Format::kE4M3}));
  EXPECT_EQ(st.dy.scale.data_as<const float>()[0],
            compute_scale(ady, {.format = Fp8Format::kE5M2}));
  EXPECT_NE(st.dy.scale.data_as<const float>()[0], 1.0f);
  EXPECT_EQ(st.x.amax_history.data_as<const float>()[0], ax);

  // Step 2, same data: the history holds exactly this data's amax, so delayed == current, bitwise.
  const Step s2 = run_step(cpu(), p, delayed.gemm, &st, zeros({128, 256}));
  const Step cur = run_step(cpu(), p, current.gemm, nullptr, zeros({128, 256}));
  EXPECT_TRUE(test::bitwise_equal(cur.y, s2.y));
  EXPECT_TRUE(test::bitwise_equal(cur.dx, s2.dx));
  EXPECT_TRUE(test::bitwise_equal(cur.dw, s2.dw));
  // Step 1 quantized with scale 1 (dy ~ 1e-3 sits low in E5M2's range, its small values
  // subnormal), so its result differs from the current-scaled one.
  EXPECT_FALSE(test::bitwise_equal(cur.dx, s1.dx));
  EXPECT_EQ(st.x_steps, 2);
}

TEST(Linear, DelayedScalingKeepsTheScaleOnAZeroAmax) {
  // TransformerEngine: a zero amax leaves the previous scale (quantize.h delayed_scaling_update).
  const Recipe r = recipe_preset("fp8-tensor-delayed");
  const GemmRecipe g = r.at(GemmSite::kAttnQUp);
  Recipe most_recent = r;
  most_recent.amax_reduction = AmaxReduction::kMostRecent;
  LinearScalingState st = make_linear_scaling_state(cpu(), most_recent);
  EXPECT_EQ(st.reduce, AmaxReduction::kMostRecent);
  Problem p = make_problem(32, 64, 32, 17);
  (void)run_step(cpu(), p, g, &st, zeros({32, 64}));
  const float sx = st.x.scale.data_as<const float>()[0];
  p.x = cast(cpu(), zeros({32, 64}), DType::kBF16);
  const Step s = run_step(cpu(), p, g, &st, zeros({32, 64}));
  EXPECT_EQ(st.x.scale.data_as<const float>()[0], sx);
  for (int64_t i = 0; i < s.y.numel(); ++i) ASSERT_EQ(test::value_at(s.y, i), 0.0);
}

TEST(Linear, RejectsMismatchedArguments) {
  const Problem p = make_problem(16, 32, 16, 19);
  const GemmRecipe block = recipe_case("deepseek").gemm;
  const GemmRecipe bf16 = recipe_case("bf16").gemm;
  const GemmRecipe delayed = recipe_case("fp8-tensor-delayed").gemm;
  const PreparedWeight pw = prepare_weight(
      cpu(), {.site = GemmSite::kAttnOut, .weight = p.w, .recipe = block, .state = nullptr});
  LinearSaved saved;
  test::expect_error(
      [&] {
        (void)linear_forward(
            cpu(),
            {.site = GemmSite::kAttnOut, .x = p.x, .weight = pw, .recipe = bf16, .state = nullptr},
            saved);
      },
      {"attn.out", "fp8-block", "bf16"});
  test::expect_error(
      [&] {
        (void)prepare_weight(
            cpu(),
            {.site = GemmSite::kExpertDown, .weight = p.w, .recipe = delayed, .state = nullptr});
      },
      {"expert.down", "LinearScalingState"});
  const Tensor x_wide = random_tensor({16, 48}, DType::kBF16, 20);
  test::expect_error(
      [&] {
        (void)linear_forward(cpu(),
                             {.site = GemmSite::kAttnOut,
                              .x = x_wide,
                              .weight = pw,
                              .recipe = block,
                              .state = nullptr},
                             saved);
      },
      {"attn.out", "48", "32"});
  const Tensor x_f32 = random_tensor({16, 32}, DType::kF32, 21);
  test::expect_error(
      [&] {
        (void)linear_forward(cpu(),
                             {.site = GemmSite::kAttnOut,
                              .x = x_f32,
                              .weight = pw,
                              .recipe = block,
                              .state = nullptr},
                             saved);
      },
      {"linear x"});
  (void)linear_forward(
      cpu(),
      {.site = GemmSite::kAttnOut, .x = p.x, .weight = pw, .recipe = block, .state = nullptr},
      saved);
  LinearGrads g{zeros({16, 32})};
  const Tensor dy_short = random_tensor({8, 16}, DType::kBF16, 22);
  test::expect_error(
      [&] {
        (void)linear_backward(cpu(),
                              {.site = GemmSite::kAttnOut,
                               .dy = dy_short,
                               .saved = saved,
                               .weight = pw,
                               .recipe = block,
                               .state = nullptr},
                              g);
      },
      {"attn.out", "16 tokens", "8"});
  LinearGrads bad{zeros({32, 16})};
  test::expect_error(
      [&] {
        (void)linear_backward(cpu(),
                              {.site = GemmSite::kAttnOut,
                               .dy = p.dy,
                               .saved = saved,
                               .weight = pw,
                               .recipe = block,
                               .state = nullptr},
                              bad);
      },
      {"grads.weight", "[16, 32]", "[32, 16]"});
}

}  // namespace
}  // namespace octet
