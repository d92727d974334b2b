// Helpers of the ZeroAdamW tests that check prepared weights (zero_gather_test.cpp,
// zero_shard_test.cpp): the model they train and its prepared weights read to the host.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "model/model.h"
#include "test_util.h"
#include "tiny_model.h"

namespace octet::train::test_zero {

inline ModelConfig config() {
  ModelConfig c = test::tiny_model_config();
  c.hidden_size = 128;           // the experts' stacks are whole 128-row blocks (batch_rows 128)
  c.moe_intermediate_size = 64;  // gate_up (8, 128, 128), down (8, 128, 64)
  return c;
}

// Every prepared weight the optimizer writes, on the host: BF16 copies, FP8 blocks both ways.
inline std::vector<Tensor> output_tensors(Context& ctx, const std::vector<WeightOutput>& outs) {
  std::vector<Tensor> t;
  for (const WeightOutput& w : outs) {
    if (w.bf16.data()) t.push_back(w.bf16.to_host(ctx));
    if (w.fp8.data.data())
      for (const Tensor* x :
           {&w.fp8.data, &w.fp8.scale_inv, &w.fp8.columnwise_data, &w.fp8.columnwise_scale_inv})
        t.push_back(x->to_host(ctx));
  }
  return t;
}

// Every parameter's gradient: random values that depend on the step and the rank.
inline void random_grads(Context& ctx, Model& model, int step, int rank) {
  uint64_t seed = 100 * static_cast<uint64_t>(step) + 10 * static_cast<uint64_t>(rank);
  for (Parameter* p : model.parameters()) {
    const Tensor g = test::random_tensor(p->grad.shape(), DType::kF32, ++seed).to(ctx, ctx.device);
    ctx.be().copy(p->grad.data(), g.data(), g.nbytes(),
                  ctx.device == Device::kCpu ? CopyKind::kHostToHost : CopyKind::kDeviceToDevice);
  }
}

}  // namespace octet::train::test_zero
