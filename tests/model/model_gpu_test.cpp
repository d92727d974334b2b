// The model on CUDA against the CPU reference, every recipe, forward and backward: the same weights
// and batch on both devices, two optimizer-free steps (so the delayed recipe's scales come from a
// recorded history in the second). GEMM kernels accumulate in a different order than the CPU
// reference and BF16 activations round the differences, so the comparison is a relative error:
// the losses, and every parameter's gradient in relative Frobenius norm.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <tuple>

#include "backend/backend.h"
#include "model/init.h"
#include "model/model.h"
#include "test_util.h"
#include "tiny_model.h"

namespace octet {
namespace {

double rel_frobenius(Context& gpu, const Tensor& a_dev, const Tensor& b_host) {
  const Tensor a = a_dev.to_host(gpu);
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = double(a.data_as<float>()[i]) - b_host.data_as<float>()[i];
    num += d * d;
    den += double(b_host.data_as<float>()[i]) * b_host.data_as<float>()[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// The tiny model with every dimension a multiple of 16 (the FP8 GEMMs' rule on CUDA) and an
// expert gate_up of 128 rows (the stacked one-shot weight quantization) next to a down projection
// of 64 (quantized expert by expert).
ModelConfig gpu_config() {
  ModelConfig c = test::tiny_model_config();
  c.intermediate_size = 192;
  c.moe_intermediate_size = 64;
  return c;
}

std::vector<std::vector<int32_t>> loads(Context& ctx, const ModelLosses& l) {
  std::vector<std::vector<int32_t>> out;
  for (const Tensor& t : l.expert_load) {
    const Tensor h = t.device() == Device::kCpu ? t : t.to_host(ctx);
    out.emplace_back(h.data_as<const int32_t>(), h.data_as<const int32_t>() + h.numel());
  }
  return out;
}

// The MoE index (ModelLosses::expert_load order) of a parameter's layer, -1 outside MoE layers'
// feed-forward parts.
int moe_index(const ModelConfig& c, const std::string& name) {
  int layer = -1;
  if (std::sscanf(name.c_str(), "model.layers.%d.", &layer) != 1) return -1;
  const bool ffn = name.find(".mlp.") != std::string::npos ||
                   name.find("post_attention_layernorm") != std::string::npos;
  return ffn && layer >= c.first_k_dense_replace ? layer - static_cast<int>(c.first_k_dense_replace)
                                                 : -1;
}

// Routing: kNatural as initialised; kForced sets every correction bias to prefer experts 0 and 1
// (and so group 0) by a margin no rounding can overturn, so both devices route identically and
// every gradient is compared strictly (the other experts see the empty-expert path).
enum class Routing { kNatural, kForced };

class ModelCudaVsCpu : public ::testing::TestWithParam<std::tuple<const char*, Routing>> {};

TEST_P(ModelCudaVsCpu, ForwardAndBackward) {
  OCTET_REQUIRE_GPU();
  const std::string recipe = std::get<0>(GetParam());
  const Routing routing = std::get<1>(GetParam());
  const ModelConfig c = gpu_config();
  Context cpu = make_context(Device::kCpu), gpu = make_context(Device::kCuda);
  const Precision p{recipe_preset(recipe), DType::kBF16};
  Model mc(cpu, c, p), mg(gpu, c, p);
  io::NamedTensors init = init_parameters(c, 21);
  if (routing == Routing::kForced)
    for (auto& [name, t] : init)
      if (name.find("e_score_correction_bias") != std::string::npos)
        for (int64_t e = 0; e < t.numel(); ++e) t.data_as<float>()[e] = e < 2 ? 4.0f : 0.0f;
  mc.load(cpu, init);
  mg.load(gpu, init);
  // bf16: the devices differ by accumulation order and BF16 rounding only. FP8 recipes: an input
  // that differs in its last BF16 bit can round to a neighbouring FP8 value (6% apart in E4M3), so
  // CUDA and CPU differ by FP8 noise of the recipe's own size (model_recipe_test: 0.11-0.12 of the
  // global gradient against bf16); small sums that cancel (norm weights) show it most. Measured
  // per-parameter worst 0.09-0.18 (forced routing), global 0.03-0.06. The delayed recipe's first
  // step quantizes with the initial scale 1, which flushes most gradients to zero on both devices
  // alike but not identically, so its step 0 is held to the global bound only.
  const bool fp8 = recipe != "bf16";
  // bf16 measured: global 0.007 with forced routing, 0.028 when a layer reroutes.
  const double tol = fp8 ? 0.3 : 0.05;
  const double global_tol = fp8 ? 0.12 : routing == Routing::kForced ? 0.015 : 0.04;
  for (int step = 0; step < 2; ++step) {
    mc.prepare(cpu);
    mg.prepare(gpu);
    mc.zero_grad(cpu);
    mg.zero_grad(gpu);
    const ModelBatch b = test::patterned_batch(c, 2, 48, step);
    const ModelLosses rc = mc.step(cpu, b, Pass::kForwardBackward);
    const ModelLosses rg = mg.step(gpu, b, Pass::kForwardBackward);
    const LossValues lc = mc.read_losses(cpu, rc), lg = mg.read_losses(gpu, rg);
    // Routing is discrete: a score within rounding of the k-th best may pick another expert on
    // the other device, which changes that layer's expert gradients wholesale. Report it.
    const auto load_c = loads(cpu, rc), load_g = loads(gpu, rg);
    std::vector<bool> same(load_c.size(), true);
    for (size_t m = 0; m < load_c.size(); ++m) {
      same[m] = load_c[m] == load_g[m];
      if (!same[m])
        std::printf("%s step %d: MoE layer %zu routes differently on the two devices\n",
                    recipe.c_str(), step, m);
    }
    if (routing == Routing::kForced)
      for (size_t m = 0; m < same.size(); ++m) EXPECT_TRUE(same[m]) << "MoE layer " << m;
    EXPECT_NEAR(lg.main, lc.main, 2e-3 * lc.main) << recipe << " step " << step;
    ASSERT_EQ(lg.mtp.size(), lc.mtp.size());
    EXPECT_NEAR(lg.mtp[0], lc.mtp[0], 2e-3 * lc.mtp[0]) << recipe << " step " << step;
    double worst = 0, num = 0, den = 0;
    std::string worst_name;
    const bool per_param = !(recipe == "fp8-tensor-delayed" && step == 0);
    for (Parameter* pc : mc.parameters()) {
      if (!pc->trainable) continue;
      const double e = rel_frobenius(gpu, mg.parameter(pc->name).grad, pc->grad);
      const int m = moe_index(c, pc->name);
      const bool rerouted = m >= 0 && !same[static_cast<size_t>(m)];
      // A layer whose routing differs can only be held to the same order of magnitude.
      if (per_param)
        EXPECT_LT(e, rerouted ? 0.5 : tol) << recipe << " step " << step << " grad of " << pc->name;
      if (rerouted) continue;
      const Tensor g = mg.parameter(pc->name).grad.to_host(gpu);
      for (int64_t i = 0; i < g.numel(); ++i) {
        const double d = double(g.data_as<float>()[i]) - pc->grad.data_as<float>()[i];
        num += d * d;
        den += double(pc->grad.data_as<float>()[i]) * pc->grad.data_as<float>()[i];
      }
      if (e > worst) worst = e, worst_name = pc->name;
    }
    const double global = std::sqrt(num / den);
    EXPECT_LT(global, global_tol) << recipe << " step " << step << ": all gradients together";
    std::printf("%s step %d: loss cpu %.6f cuda %.6f, global grad error %.4f, worst %.4f (%s)\n",
                recipe.c_str(), step, lc.total, lg.total, global, worst, worst_name.c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Recipes, ModelCudaVsCpu,
    ::testing::Combine(::testing::Values("bf16", "deepseek", "fp8-tensor-delayed",
                                         "fp8-tensor-current", "fp8-flow"),
                       ::testing::Values(Routing::kNatural, Routing::kForced)));

// Training-size shapes run (no CPU comparison: the reference would take minutes): the baseline
// configuration's layer shapes at a long sequence, one step in deepseek, finite losses.
TEST(ModelCuda, LongSequenceDeepseekStep) {
  OCTET_REQUIRE_GPU();
  ModelConfig c = gpu_config();
  c.max_position_embeddings = 8192;
  Context gpu = make_context(Device::kCuda);
  Model m(gpu, c, {recipe_preset("deepseek"), DType::kBF16});
  m.load(gpu, init_parameters(c, 5));
  m.prepare(gpu);
  const LossValues l =
      m.read_losses(gpu, m.step(gpu, test::patterned_batch(c, 1, 8192, 0), Pass::kForwardBackward));
  EXPECT_TRUE(std::isfinite(l.total));
  EXPECT_NEAR(l.main, std::log(double(c.vocab_size)), 0.5);
}

}  // namespace
}  // namespace octet
