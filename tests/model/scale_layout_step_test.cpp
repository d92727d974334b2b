// A deepseek training step's dense FP8 GEMMs read their 1x128 scales in place: the Linear layers'
// quantizers write cuBLASLt's MN-major layout (core/scale_layout.h), so no GEMM operand needs the
// per-call re-layout of gemm_cuda.cu. Counted on the CPU (cast_counter.h kScaleRelayout counts
// exactly the operands the CUDA backend would re-lay out).
#include <gtest/gtest.h>

#include <memory>

#include "backend/backend.h"
#include "core/cast_counter.h"
#include "model/init.h"
#include "model/model.h"
#include "tiny_model.h"

namespace octet {
namespace {

TEST(ScaleLayoutStep, DeepseekStepHasNoScaleRelayout) {
  Context ctx = make_context(Device::kCpu);
  const ModelConfig c = test::tiny_model_config();
  Model model(ctx, c, {recipe_preset("deepseek"), DType::kBF16});
  model.load(ctx, init_parameters(c, 3));
  model.prepare(ctx);
  constexpr int64_t kB = 2, kT = 32;
  const ModelBatch batch = test::patterned_batch(c, kB, kT);
  ctx.casts = std::make_shared<CastCounter>();
  model.read_losses(ctx, model.step(ctx, batch, Pass::kForwardBackward));
  int64_t quantized = 0, relayouts = 0;
  for (const auto& [scope, n] : ctx.casts->by_scope) {
    quantized += n[CastKind::kQuantize];
    relayouts += n[CastKind::kScaleRelayout];
    EXPECT_EQ(n[CastKind::kScaleRelayout], 0) << "scope " << scope;
  }
  EXPECT_GT(quantized, 0) << "the step ran no FP8 quantization";
  EXPECT_EQ(relayouts, 0);
}

}  // namespace
}  // namespace octet
