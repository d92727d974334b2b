// One decoder layer (transformers' DeepseekV3DecoderLayer), forward and backward:
//
//   h = x + self_attn(input_layernorm(x))                    MLA (model/mla.h)
//   y = h + mlp(post_attention_layernorm(h))                 dense SwiGLU or MoE (model/moe.h)
//
// The residual stream stays in the activation dtype (BF16); the norms compute in FP32. An MoE
// layer's input (the post-attention norm's output) is not kept: the backward computes it again
// from the norm's saved input.
#pragma once

#include <optional>

#include "model/dense_mlp.h"
#include "model/mla.h"
#include "model/moe.h"

namespace octet {

struct DecoderLayer {
  NormLayer input_norm, post_norm;
  MlaLayer attn;
  std::optional<SwigluMlp> mlp;  // dense layers
  std::optional<MoeLayer> moe;   // MoE layers

  struct Saved {
    NormLayer::Saved input_norm, post_norm;
    MlaLayer::Saved attn;
    SwigluMlp::Saved mlp;
    MoeLayer::Saved moe;
  };

  void init_state(Context& ctx, const Recipe& recipe);
  void prepare(Context& ctx, const Precision& p, PrepareScope scope = PrepareScope::kAll);
  // x (B * T, D) -> (B * T, D).
  Tensor forward(Context& ctx, const Precision& p, const RopeTable& rope, const Tensor& x,
                 int64_t B, int64_t T, Saved& s);
  Tensor backward(Context& ctx, const Precision& p, const RopeTable& rope, const Tensor& dy,
                  const Saved& s);
};

}  // namespace octet
