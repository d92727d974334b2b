// Shared by head_chunk_test.cpp and head_chunk_gpu_test.cpp: one forward + backward of the tiny
// model with a chosen head chunk and MoE recomputation, its losses and every gradient on the host.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/init.h"
#include "model/model.h"
#include "ops/cross_entropy/cross_entropy.h"
#include "tiny_model.h"

namespace octet::test {

struct StepResult {
  LossValues loss;
  std::map<std::string, Tensor> grads;  // host f32, every trainable parameter
};

struct StepOptions {
  std::string recipe = "bf16";
  int64_t head_chunk_tokens = 0;  // ModelConfig::head_chunk_tokens
  bool recompute_down = true;     // MoeLayer::recompute_down
  Pass pass = Pass::kForwardBackward;
  std::vector<std::string> overrides = {};  // recipe overrides
};

// Dimensions multiples of 16 (the FP8 GEMMs' rule on CUDA), as model_gpu_test's config.
inline ModelConfig memory_test_config() {
  ModelConfig c = tiny_model_config();
  c.intermediate_size = 192;
  c.moe_intermediate_size = 64;
  return c;
}

inline StepResult run_step(Context& ctx, const StepOptions& o, int64_t B = 2, int64_t T = 48) {
  ModelConfig c = memory_test_config();
  c.head_chunk_tokens = o.head_chunk_tokens;
  Model m(ctx, c, {resolve_recipe({.preset = o.recipe, .overrides = o.overrides}), DType::kBF16});
  m.load(ctx, init_parameters(c, 7));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    if (m.layer(l).moe) m.layer(l).moe->recompute_down = o.recompute_down;
  for (int64_t k = 0; k < c.num_nextn_predict_layers; ++k)
    if (m.mtp(k).layer.moe) m.mtp(k).layer.moe->recompute_down = o.recompute_down;
  m.prepare(ctx);
  m.zero_grad(ctx);
  ModelBatch b{Tensor::empty({B, T}, DType::kI32), Tensor::empty({B, T}, DType::kI32)};
  for (int64_t i = 0; i < B * T; ++i) {
    b.inputs.data_as<int32_t>()[i] = static_cast<int32_t>((i * 37 + 11) % c.vocab_size);
    // Every seventh target ignored: the count is not the row count.
    b.targets.data_as<int32_t>()[i] =
        i % 7 == 3 ? kIgnoreIndex : static_cast<int32_t>((i * 53 + 5) % c.vocab_size);
  }
  StepResult r;
  r.loss = m.read_losses(ctx, m.step(ctx, b, o.pass));
  for (Parameter* p : m.parameters())
    if (p->trainable) r.grads[p->name] = p->grad.to_host(ctx);
  return r;
}

}  // namespace octet::test
