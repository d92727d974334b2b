// Every FP8 recipe against the bf16 recipe, block by block and for the whole model, on the CPU
// (the FP8 GEMMs run the CPU reference of ops/gemm, which the GPU tests hold the cuBLASLt kernels
// to). Inputs, weights and the output gradient are the same for both recipes; the error is the
// relative Frobenius norm ||fp8 - bf16|| / ||bf16|| of the block output y, the input gradient dx
// and the weight gradients dW (all weights of the block together). The budgets are the measured
// errors (printed by the test, and quoted in docs/model.md) with headroom of about 1.5x.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>

#include "backend/backend.h"
#include "model/init.h"
#include "model/model.h"
#include "ops/cast/cast.h"
#include "test_util.h"
#include "tiny_model.h"

namespace octet {
namespace {

double rel_err(Context& ctx, const Tensor& a, const Tensor& b) {
  const Tensor x = cast(ctx, a, DType::kF32), y = cast(ctx, b, DType::kF32);
  double num = 0, den = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double d = x.data_as<const float>()[i] - y.data_as<const float>()[i];
    num += d * d;
    den += static_cast<double>(y.data_as<const float>()[i]) * y.data_as<const float>()[i];
  }
  return std::sqrt(num / den);
}

struct Errors {
  double y = 0, dx = 0, dw = 0;
};

struct RecipeModel {
  Context ctx = make_context(Device::kCpu);
  Model model;
  explicit RecipeModel(const std::string& recipe)
      : model(ctx, test::tiny_model_config(), {recipe_preset(recipe), DType::kBF16}) {
    model.load(ctx, init_parameters(test::tiny_model_config(), 3));
    model.prepare(ctx);
  }
};

using BlockRun =
    std::function<std::pair<Tensor, Tensor>(Model&, Context&, const Tensor& x, const Tensor& dy)>;

// Runs the block in `recipe` and in bf16; the weight-gradient error is over `params` together.
Errors compare(const std::string& recipe, const BlockRun& run,
               const std::vector<std::string>& params) {
  RecipeModel a(recipe), b("bf16");
  Context& ctx = a.ctx;
  const Tensor x = cast(ctx, test::random_tensor({64, 64}, DType::kF32, 5), DType::kBF16);
  const Tensor dy = cast(ctx, test::random_tensor({64, 64}, DType::kF32, 6), DType::kBF16);
  const auto [ya, dxa] = run(a.model, a.ctx, x, dy);
  const auto [yb, dxb] = run(b.model, b.ctx, x, dy);
  Errors e{rel_err(ctx, ya, yb), rel_err(ctx, dxa, dxb), 0};
  double num = 0, den = 0;
  for (const std::string& n : params) {
    const double r = rel_err(ctx, a.model.parameter(n).grad, b.model.parameter(n).grad);
    const Tensor g = b.model.parameter(n).grad;
    double sq = 0;
    for (int64_t i = 0; i < g.numel(); ++i)
      sq += double(g.data_as<float>()[i]) * g.data_as<float>()[i];
    num += r * r * sq;
    den += sq;
  }
  e.dw = std::sqrt(num / den);
  return e;
}

constexpr int64_t kB = 2, kT = 32;

std::pair<Tensor, Tensor> run_mla(Model& m, Context& ctx, const Tensor& x, const Tensor& dy) {
  MlaLayer::Saved s;
  MlaLayer& a = m.layer(0).attn;
  Tensor y = a.forward(ctx, m.precision(), m.rope(), x, kB, kT, s);
  return {y, a.backward(ctx, m.precision(), m.rope(), dy, s)};
}

std::pair<Tensor, Tensor> run_mlp(Model& m, Context& ctx, const Tensor& x, const Tensor& dy) {
  SwigluMlp::Saved s;
  SwigluMlp& l = *m.layer(0).mlp;
  Tensor y = l.forward(ctx, m.precision(), x, s);
  return {y, l.backward(ctx, m.precision(), dy, s)};
}

std::pair<Tensor, Tensor> run_moe(Model& m, Context& ctx, const Tensor& x, const Tensor& dy) {
  MoeLayer::Saved s;
  MoeLayer& l = *m.layer(1).moe;
  Tensor y = l.forward(ctx, m.precision(), x, kB, s);
  return {y, l.backward(ctx, m.precision(), dy, s)};
}

const std::vector<std::string> kMla = {
    "model.layers.0.self_attn.q_a_proj.weight", "model.layers.0.self_attn.q_b_proj.weight",
    "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
    "model.layers.0.self_attn.kv_b_proj.weight", "model.layers.0.self_attn.o_proj.weight"};
const std::vector<std::string> kMlp = {"model.layers.0.mlp.gate_up_proj.weight",
                                       "model.layers.0.mlp.down_proj.weight"};
const std::vector<std::string> kMoe = {
    "model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj",
    "model.layers.1.mlp.shared_experts.gate_up_proj.weight", "model.layers.1.mlp.gate.weight"};

struct Budget {
  const char* recipe;
  const char* block;
  BlockRun run;
  const std::vector<std::string>* params;
  Errors budget;
};

class RecipeBudget : public ::testing::TestWithParam<int> {};

const std::vector<Budget>& budgets() {
  static const std::vector<Budget> b = {
      // Measured (y, dx, dW): deepseek mla 0.065 0.068 0.067, dense 0.060 0.065 0.062,
      // moe 0.067 0.064 0.066; fp8-tensor-delayed mla 0.081 0.115 0.100, dense 0.082 0.101 0.094,
      // moe 0.082 0.098 0.095; fp8-tensor-current mla 0.064 0.107 0.095, dense 0.064 0.093
      // 0.088, moe 0.066 0.090 0.087; fp8-flow moe 0.069 0.063 0.071. Per-tensor recipes quantize
      // gradients to E5M2 (2 mantissa bits), hence their larger dx and dW errors.
      {"deepseek", "mla", run_mla, &kMla, {0.10, 0.10, 0.10}},
      {"deepseek", "dense_mlp", run_mlp, &kMlp, {0.09, 0.10, 0.10}},
      {"deepseek", "moe", run_moe, &kMoe, {0.10, 0.10, 0.10}},
      {"fp8-tensor-delayed", "mla", run_mla, &kMla, {0.12, 0.17, 0.15}},
      {"fp8-tensor-delayed", "dense_mlp", run_mlp, &kMlp, {0.12, 0.15, 0.14}},
      {"fp8-tensor-delayed", "moe", run_moe, &kMoe, {0.12, 0.15, 0.14}},
      {"fp8-tensor-current", "mla", run_mla, &kMla, {0.10, 0.16, 0.14}},
      {"fp8-tensor-current", "dense_mlp", run_mlp, &kMlp, {0.10, 0.14, 0.13}},
      {"fp8-tensor-current", "moe", run_moe, &kMoe, {0.10, 0.14, 0.13}},
      {"fp8-flow", "moe", run_moe, &kMoe, {0.10, 0.10, 0.10}},
  };
  return b;
}

TEST_P(RecipeBudget, AgainstBf16) {
  const Budget& b = budgets()[static_cast<size_t>(GetParam())];
  const Errors e = compare(b.recipe, b.run, *b.params);
  std::printf("budget %-20s %-10s y %.4f dx %.4f dW %.4f\n", b.recipe, b.block, e.y, e.dx, e.dw);
  EXPECT_LT(e.y, b.budget.y);
  EXPECT_LT(e.dx, b.budget.dx);
  EXPECT_LT(e.dw, b.budget.dw);
  EXPECT_GT(e.y, 0.0) << "the FP8 recipe ran in BF16?";
}

INSTANTIATE_TEST_SUITE_P(Blocks, RecipeBudget, ::testing::Range(0, 10));

// The whole model: the loss of each recipe against bf16's, and the global weight gradient.
TEST(RecipeModel, LossAndGradientsAgainstBf16) {
  for (const char* recipe : {"deepseek", "fp8-tensor-delayed", "fp8-tensor-current", "fp8-flow"}) {
    RecipeModel a(recipe), b("bf16");
    ModelBatch batch{Tensor::empty({kB, kT}, DType::kI32), Tensor::empty({kB, kT}, DType::kI32)};
    for (int64_t i = 0; i < kB * kT; ++i) {
      batch.inputs.data_as<int32_t>()[i] = static_cast<int32_t>((i * 37 + 11) % 160);
      batch.targets.data_as<int32_t>()[i] = static_cast<int32_t>((i * 53 + 5) % 160);
    }
    const LossValues la =
        a.model.read_losses(a.ctx, a.model.step(a.ctx, batch, Pass::kForwardBackward));
    const LossValues lb =
        b.model.read_losses(b.ctx, b.model.step(b.ctx, batch, Pass::kForwardBackward));
    double num = 0, den = 0, worst = 0;
    std::string worst_name;
    for (Parameter* p : b.model.parameters()) {
      const Tensor& gb = p->grad;
      const Tensor& ga = a.model.parameter(p->name).grad;
      double pn = 0, pd = 0;
      for (int64_t i = 0; i < gb.numel(); ++i) {
        const double d = double(ga.data_as<float>()[i]) - gb.data_as<float>()[i];
        pn += d * d;
        pd += double(gb.data_as<float>()[i]) * gb.data_as<float>()[i];
      }
      num += pn;
      den += pd;
      if (pd > 0 && std::sqrt(pn / pd) > worst) worst = std::sqrt(pn / pd), worst_name = p->name;
    }
    const double loss_err = std::fabs(la.total - lb.total) / lb.total;
    const double grad_err = std::sqrt(num / den);
    std::printf(
        "budget %-20s model      loss %.2e grad %.4f (loss %.5f vs %.5f), worst %.4f (%s)\n",
        recipe, loss_err, grad_err, la.total, lb.total, worst, worst_name.c_str());
    // Measured: loss 6.6e-5 / 1.1e-4 / 4.3e-5 / 2.2e-5, gradient 0.112 / 0.115 / 0.116 / 0.113
    // (fp8-flow's router gradient comes from the FP8 dy through dSwiGLU, docs/numerics.md).
    EXPECT_LT(loss_err, 5e-4) << recipe;
    EXPECT_LT(grad_err, 0.17) << recipe;
    // Per tensor, measured worst 0.400 / 1.0 / 0.413 / 0.398: the routed experts, whose tokens
    // change when a routing score near a tie moves (the delayed recipe's first step flushes with
    // its initial scale 1, so it is held to the global bound only). fp8-flow scored 1.0 on the
    // MTP layer's experts while its scaling-aware transpose let padding rows set the tile scale.
    if (std::string(recipe) != "fp8-tensor-delayed")
      EXPECT_LT(worst, 0.45) << recipe << ": " << worst_name;
  }
}

}  // namespace
}  // namespace octet
