// The tiny DeepSeek-V3-style config the model, init and checkpoint tests share: hidden 64, 3 layers
// (the first dense), 8 experts in 2 groups, top-2, one MTP layer. Linear shapes span one to two
// 128-blocks with partial blocks, so FP8 scales have several entries.
#pragma once

#include <cstdint>

#include "model/config.h"
#include "model/model.h"

namespace octet::test {

inline ModelConfig tiny_model_config() {
  ModelConfig c;
  c.vocab_size = 160;
  c.hidden_size = 64;
  c.intermediate_size = 200;
  c.moe_intermediate_size = 32;
  c.num_hidden_layers = 3;
  c.first_k_dense_replace = 1;
  c.num_attention_heads = 4;
  c.max_position_embeddings = 128;
  c.q_lora_rank = 48;
  c.kv_lora_rank = 32;
  c.qk_nope_head_dim = 32;
  c.qk_rope_head_dim = 16;
  c.v_head_dim = 32;
  c.n_routed_experts = 8;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 2;
  c.n_group = 2;
  c.topk_group = 1;
  c.num_nextn_predict_layers = 1;
  c.initializer_range = 0.02;
  return c;
}

// A deterministic (B, T) batch on the host, the one the model tests share: input i is
// (37 i + 11 + salt) mod vocab, target i (53 i + 5 + salt) mod vocab.
inline ModelBatch patterned_batch(const ModelConfig& c, int64_t B, int64_t T, int64_t salt = 0) {
  ModelBatch b{Tensor::empty({B, T}, DType::kI32), Tensor::empty({B, T}, DType::kI32)};
  for (int64_t i = 0; i < B * T; ++i) {
    b.inputs.data_as<int32_t>()[i] = static_cast<int32_t>((i * 37 + 11 + salt) % c.vocab_size);
    b.targets.data_as<int32_t>()[i] = static_cast<int32_t>((i * 53 + 5 + salt) % c.vocab_size);
  }
  return b;
}

// The trainer tests' model as `--set` assignments (hidden 32, the default 8 layers and experts with
// 16-wide heads and MLA ranks, positions up to 32): each test applies them with train::apply_set.
inline constexpr const char* kTinyTrainModelKeys[] = {"model.hidden_size=32",
                                                      "model.intermediate_size=64",
                                                      "model.moe_intermediate_size=16",
                                                      "model.num_attention_heads=2",
                                                      "model.q_lora_rank=16",
                                                      "model.kv_lora_rank=16",
                                                      "model.qk_nope_head_dim=16",
                                                      "model.qk_rope_head_dim=16",
                                                      "model.v_head_dim=16",
                                                      "model.max_position_embeddings=32"};

// The slightly larger model of the trainer's GPU tests (widths that take the CUDA kernels' fast
// paths), as the same --set keys.
inline constexpr const char* kTinyGpuTrainModelKeys[] = {"model.hidden_size=64",
                                                         "model.intermediate_size=192",
                                                         "model.moe_intermediate_size=64",
                                                         "model.num_attention_heads=4",
                                                         "model.q_lora_rank=48",
                                                         "model.kv_lora_rank=32",
                                                         "model.qk_nope_head_dim=32",
                                                         "model.qk_rope_head_dim=16",
                                                         "model.v_head_dim=32",
                                                         "model.max_position_embeddings=128"};

}  // namespace octet::test
