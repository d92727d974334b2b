// Model configuration: a DeepSeek-V3-style transformer, with the field names of the transformers
// library's DeepseekV3Config and of DeepSeek-V3's released config.json, so that either file reads
// as is and what octet writes reads back in the ecosystem.
//
// Strings become enums here, once. Keys octet does not use (architectures, auto_map, torch_dtype,
// bos_token_id, ...) are kept verbatim in `extra` and written back, so a config survives a round
// trip.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "numerics/recipe.h"

namespace octet {

enum class ScoringFunc : uint8_t { kSigmoid };

struct ModelConfig {
  // Sizes (defaults: DeepSeek-V3 671B as DeepseekV3Config defines it).
  int64_t vocab_size = 129280;
  int64_t hidden_size = 7168;
  int64_t intermediate_size = 18432;     // dense MLP of the first first_k_dense_replace layers
  int64_t moe_intermediate_size = 2048;  // each routed and shared expert
  int64_t num_hidden_layers = 61;
  int64_t first_k_dense_replace = 3;
  int64_t num_attention_heads = 128;
  int64_t max_position_embeddings = 4096;

  // Multi-head Latent Attention.
  std::optional<int64_t> q_lora_rank = 1536;  // absent or null: a plain q_proj
  int64_t kv_lora_rank = 512;
  int64_t qk_nope_head_dim = 128;
  int64_t qk_rope_head_dim = 64;
  int64_t v_head_dim = 128;
  double rope_theta = 10000.0;
  bool rope_interleave = true;

  // Mixture of experts.
  int64_t n_routed_experts = 256;
  int64_t n_shared_experts = 1;
  int64_t num_experts_per_tok = 8;
  int64_t n_group = 8;
  int64_t topk_group = 4;
  double routed_scaling_factor = 2.5;
  bool norm_topk_prob = true;
  ScoringFunc scoring_func = ScoringFunc::kSigmoid;

  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;
  int64_t num_nextn_predict_layers = 1;  // Multi-Token Prediction depth (DeepSeek-V3 release: 1)

  // octet's own keys (prefixed "octet_" in config.json so they never collide with the ecosystem's).
  // The precision recipe, preset and overrides (config.json: octet_recipe, octet_recipe_overrides);
  // numerics/recipe.h resolve_recipe makes the Recipe the model runs.
  RecipeSpec recipe;
  double mtp_loss_weight = 0.3;        // lambda of DeepSeek-V3's MTP loss (0.3 early, 0.1 late)
  double bias_update_rate = 0.001;     // gamma of the auxiliary-loss-free balancing
  double seq_aux_loss_alpha = 0.0001;  // sequence-wise balance loss weight; 0 disables it
  // Tokens per chunk of the output heads' projection + cross-entropy (model/head.h); 0: automatic
  // (at most 256 MiB of logits at a time).
  int64_t head_chunk_tokens = 0;
  // The MoE backward recomputes the SwiGLU output and the experts' outputs from gu instead of
  // keeping them (model/moe.h recompute_down): less memory, one more down-projection Fprop.
  bool moe_recompute = true;
  // MLA's backward rebuilds k (one rope_key pass over kv and kv_a's output) instead of keeping it
  // from the forward (model/mla.h recompute_k): N H (nope + rope) BF16 less per layer.
  bool attention_recompute_k = true;
  // Attention's backward on CUDA: cuDNN's deterministic algorithm (bitwise reproducible runs,
  // resumes and graph replays) or, false, the faster one that sums dQ with FP32 atomics.
  bool deterministic_attention = true;
  // Attention's backward on CUDA runs in chunks whose cuDNN workspace stays under this many MiB
  // (ops/attention/attention.h): 0 the default (520 MiB), -1 one call whatever its workspace
  // (faster at some shapes, at the cost of B H T^2 BF16 of transient memory).
  int64_t attention_workspace_mib = 0;

  nlohmann::json extra = nlohmann::json::object();  // unknown keys, written back unchanged

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool is_moe_layer(int64_t layer) const { return layer >= first_k_dense_replace; }

  // Rejects invalid combinations; the message names the field, the rule and the value.
  void validate() const;
};

// Parses a config.json object (either the transformers library's or DeepSeek-V3's release layout;
// `rope_parameters: {rope_theta, rope_type}` of recent transformers versions is read as well as
// `rope_theta`). Validates. `source` names the file in error messages.
ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& source = "config");
nlohmann::json model_config_to_json(const ModelConfig& c);

ModelConfig read_model_config(const std::string& path);
// Atomic (temporary file, then rename), like every file octet writes.
void write_model_config(const std::string& path, const ModelConfig& c);

}  // namespace octet
