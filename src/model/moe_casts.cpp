// count_moe_casts: a MoE layer's forward and backward with the cast counter attached.
#include "model/moe_casts.h"

#include <cstdio>
#include <memory>
#include <random>

#include "backend/backend.h"
#include "model/init.h"
#include "model/model.h"

namespace octet {
namespace {

// Layer 1 is the MoE layer: hidden and expert widths of one 128-block, 4 experts, top-2, one
// shared expert, no MTP.
ModelConfig counting_config() {
  ModelConfig c;
  c.vocab_size = 128;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.moe_intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.first_k_dense_replace = 1;
  c.num_attention_heads = 2;
  c.max_position_embeddings = 64;
  c.q_lora_rank = 64;
  c.kv_lora_rank = 64;
  c.qk_nope_head_dim = 32;
  c.qk_rope_head_dim = 16;
  c.v_head_dim = 32;
  c.n_routed_experts = 4;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 2;
  c.n_group = 1;
  c.topk_group = 1;
  c.num_nextn_predict_layers = 0;
  c.seq_aux_loss_alpha = 0.0;  // the balance loss is not part of the dataflow measured
  return c;
}

Tensor random_bf16(const Shape& shape, uint32_t seed) {
  Tensor t = Tensor::empty(shape, DType::kBF16);
  std::mt19937 gen(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<uint16_t>()[i] = float_to_bf16(n(gen));
  return t;
}

}  // namespace

MoeCastCounts count_moe_casts(const Recipe& recipe) {
  Context ctx = make_context(Device::kCpu);
  const ModelConfig c = counting_config();
  Model model(ctx, c, {recipe, DType::kBF16});
  model.load(ctx, init_parameters(c, 1));
  model.prepare(ctx);
  MoeLayer& moe = *model.layer(1).moe;
  constexpr int64_t kTokens = 64;
  const Tensor x = random_bf16({kTokens, c.hidden_size}, 2);
  const Tensor dy = random_bf16({kTokens, c.hidden_size}, 3);
  ctx.casts = std::make_shared<CastCounter>();
  MoeLayer::Saved s;
  moe.forward(ctx, model.precision(), x, 1, s);
  moe.backward(ctx, model.precision(), dy, s);
  return {ctx.casts->at("moe.routed"), ctx.casts->at("moe.shared")};
}

std::string format_cast_counts(const CastCounts& c) {
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "explicit casts %lld (quantize %lld, dequantize %lld); fused quantize %lld; "
                "FP8 transposes %lld",
                static_cast<long long>(c.explicit_casts()),
                static_cast<long long>(c[CastKind::kQuantize]),
                static_cast<long long>(c[CastKind::kDequantize]),
                static_cast<long long>(c[CastKind::kFusedQuantize]),
                static_cast<long long>(c[CastKind::kTranspose]));
  return buf;
}

}  // namespace octet
