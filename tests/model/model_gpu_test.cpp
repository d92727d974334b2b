// The model on CUDA against the CPU reference, every recipe, forward and backward: the same weights
// and batch on both devices, two optimizer-free steps (so the delayed recipe's scales come from a
// recorded history in the second). GEMM kernels accumulate in a different order than the CPU
// reference and BF16 activations round the differences, so the comparison is a relative error:
// the losses, and every parameter's gradient in relative Frobenius norm.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "model/init.h"
#include "model/model.h"
#include "test_util.h"
#include "tiny_model.h"

namespace octet {
namespace {

ModelBatch batch_for(const ModelConfig& c, int64_t B, int64_t T, int salt) {
  ModelBatch b{Tensor::empty({B, T}, DType::kI32), Tensor::empty({B, T}, DType::kI32)};
  for (int64_t i = 0; i < B * T; ++i) {
    b.inputs.data_as<int32_t>()[i] = static_cast<int32_t>((i * 37 + 11 + salt) % c.vocab_size);
    b.targets.data_as<int32_t>()[i] = static_cast<int32_t>((i * 53 + 5 + salt) % c.vocab_size);
  }
  return b;
}

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

class ModelCudaVsCpu : public ::testing::TestWithParam<const char*> {};

TEST_P(ModelCudaVsCpu, ForwardAndBackward) {
  OCTET_REQUIRE_GPU();
  const std::string recipe = GetParam();
  const ModelConfig c = test::tiny_model_config();
  Context cpu = make_context(Device::kCpu), gpu = make_context(Device::kCuda);
  const Precision p{recipe_preset(recipe), DType::kBF16};
  Model mc(cpu, c, p), mg(gpu, c, p);
  const io::NamedTensors init = init_parameters(c, 21);
  mc.load(cpu, init);
  mg.load(gpu, init);
  const double tol = recipe == "bf16" ? 0.03 : 0.08;
  for (int step = 0; step < 2; ++step) {
    mc.prepare(cpu);
    mg.prepare(gpu);
    mc.zero_grad(cpu);
    mg.zero_grad(gpu);
    const ModelBatch b = batch_for(c, 2, 48, step);
    const LossValues lc = mc.read_losses(cpu, mc.step(cpu, b, Pass::kForwardBackward));
    const LossValues lg = mg.read_losses(gpu, mg.step(gpu, b, Pass::kForwardBackward));
    EXPECT_NEAR(lg.main, lc.main, 2e-3 * lc.main) << recipe << " step " << step;
    ASSERT_EQ(lg.mtp.size(), lc.mtp.size());
    EXPECT_NEAR(lg.mtp[0], lc.mtp[0], 2e-3 * lc.mtp[0]) << recipe << " step " << step;
    double worst = 0;
    std::string worst_name;
    for (Parameter* pc : mc.parameters()) {
      if (!pc->trainable) continue;
      const double e = rel_frobenius(gpu, mg.parameter(pc->name).grad, pc->grad);
      EXPECT_LT(e, tol) << recipe << " step " << step << " grad of " << pc->name;
      if (e > worst) worst = e, worst_name = pc->name;
    }
    std::printf("%s step %d: loss cpu %.6f cuda %.6f, worst grad error %.4f (%s)\n", recipe.c_str(),
                step, lc.total, lg.total, worst, worst_name.c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, ModelCudaVsCpu,
                         ::testing::Values("bf16", "deepseek", "fp8-tensor-delayed",
                                           "fp8-tensor-current"));

// Training-size shapes run (no CPU comparison: the reference would take minutes): the baseline
// configuration's layer shapes at a long sequence, one step in deepseek, finite losses.
TEST(ModelCuda, LongSequenceDeepseekStep) {
  OCTET_REQUIRE_GPU();
  ModelConfig c = test::tiny_model_config();
  c.max_position_embeddings = 8192;
  Context gpu = make_context(Device::kCuda);
  Model m(gpu, c, {recipe_preset("deepseek"), DType::kBF16});
  m.load(gpu, init_parameters(c, 5));
  m.prepare(gpu);
  const LossValues l =
      m.read_losses(gpu, m.step(gpu, batch_for(c, 1, 8192, 0), Pass::kForwardBackward));
  EXPECT_TRUE(std::isfinite(l.total));
  EXPECT_NEAR(l.main, std::log(double(c.vocab_size)), 0.5);
}

}  // namespace
}  // namespace octet
