// The error of a MoE layer's FP8 dataflow against FP64 (issue 14 item 3, docs/numerics.md): one
// MoE layer (router, routed experts, shared expert) runs forward and backward under a recipe on the
// CPU, and the same layer is recomputed in FP64 from the same unquantized inputs: the BF16 input x
// and output gradient dy, the FP32 master weights, and the routing decision of the run (the top-k
// choice is discrete; taking it from the run keeps a near-tie from dominating the error, and every
// recipe routes with the same BF16 router). The errors are relative Frobenius norms
// ||run - ref|| / ||ref|| of the layer output y, the input gradient dx and the weight gradients
// (all of the layer's together, and the routed experts' gate/up and down projections apart).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "numerics/recipe.h"

namespace octet {

struct MoeErrorConfig {
  int64_t hidden = 256;      // D
  int64_t expert_ffn = 256;  // F (moe_intermediate_size; the shared expert has the same)
  int64_t experts = 8;       // E
  int64_t top_k = 2;         // k
  int64_t tokens = 256;      // T
  std::vector<uint64_t> seeds = {1, 2, 3};  // weights and inputs; the errors are the seeds' mean
};

struct MoeErrors {
  double y = 0, dx = 0, dw = 0;        // dw: every weight gradient of the layer together
  double dw_gate_up = 0, dw_down = 0;  // the routed experts' projections
};

MoeErrors measure_moe_error(const Recipe& recipe, const MoeErrorConfig& cfg = {});

// The model both measurements build (this one and count_moe_casts): layer 1 is the MoE layer of
// cfg's widths, with one shared expert, no MTP and no balance loss.
ModelConfig moe_probe_config(const MoeErrorConfig& cfg);
// A host BF16 tensor of N(0, 1) values from `seed`.
Tensor random_bf16(const Shape& shape, uint64_t seed);

}  // namespace octet
