// What a model costs under a recipe, from its config alone: parameters, GEMM FLOPs per site and the
// share of them in FP8, and an estimate of weight and activation memory. Backs `octet describe`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "numerics/recipe.h"

namespace octet {

struct ParameterCount {
  int64_t total = 0;
  int64_t per_token = 0;  // parameters a token's forward touches: top-k experts instead of all
  int64_t embedding = 0;  // embeddings and heads (MTP copies included)
  int64_t attention = 0;
  int64_t dense_mlp = 0;
  int64_t routed_experts = 0;
  int64_t shared_experts = 0;
  int64_t router = 0;  // gate weights and correction biases
  int64_t norms = 0;
  int64_t mtp_projection = 0;
};

ParameterCount count_parameters(const ModelConfig& c);

// Forward FLOPs per token of every GEMM site (2 * in * out per Linear, routed experts counted k
// times); training runs each three times (Fprop, Dgrad, Wgrad), so shares are the same for a
// training step.
struct SiteFlops {
  GemmSite site;
  double flops_per_token;
};
std::vector<SiteFlops> gemm_flops_per_token(const ModelConfig& c);

// Share of GEMM FLOPs the recipe runs in FP8, in [0, 1].
double fp8_flop_share(const ModelConfig& c, const Recipe& r);

// Causal attention core (QK^T and PV, BF16 operands) FLOPs per token, averaged over a sequence.
double attention_flops_per_token(const ModelConfig& c, int64_t seq_len);

struct MemoryEstimate {
  double weight_bytes = 0;      // FP32 master + FP32 grad + BF16 moments + the GEMM copy
  double activation_bytes = 0;  // tensors saved for backward over all layers, for `tokens` tokens
};

// An estimate from the saved-tensor plan of DESIGN.md (each GEMM input kept in its site's storage
// precision, attention q/k/v/o in BF16, norms' inputs in BF16), not a measurement.
MemoryEstimate estimate_memory(const ModelConfig& c, const Recipe& r, int64_t tokens);

// The full report `octet describe` prints.
std::string describe_model(const ModelConfig& c, const Recipe& r, int64_t tokens, int64_t seq_len);

}  // namespace octet
