// Decoder layer: forward, then backward in reverse order (block.h has the math).
#include "model/block.h"

#include "ops/cast/cast.h"

namespace octet {

void DecoderLayer::init_state(Context& ctx, const Recipe& recipe) {
  for (LinearLayer* l : {&attn.q_a, &attn.q_b, &attn.q, &attn.kv_a, &attn.kv_b, &attn.o})
    if (l->param != nullptr) l->init_state(ctx, recipe);
  if (mlp) {
    mlp->gate_up.init_state(ctx, recipe);
    mlp->down.init_state(ctx, recipe);
  }
  if (moe) moe->init_state(ctx, recipe);
}

void DecoderLayer::prepare(Context& ctx, const Precision& p, PrepareScope scope) {
  for (LinearLayer* l : {&attn.q_a, &attn.q_b, &attn.q, &attn.kv_a, &attn.kv_b, &attn.o})
    if (l->param != nullptr) l->prepare(ctx, p, scope);
  if (mlp) {
    mlp->gate_up.prepare(ctx, p, scope);
    mlp->down.prepare(ctx, p, scope);
  }
  if (moe) moe->prepare(ctx, p, scope);
}

Tensor DecoderLayer::forward(Context& ctx, const Precision& p, const RopeTable& rope,
                             const Tensor& x, int64_t B, int64_t T, Saved& s) {
  Tensor h = attn.forward(ctx, p, rope, input_norm.forward(ctx, x, s.input_norm), B, T, s.attn);
  const Tensor hn = post_norm.forward(ctx, h, s.post_norm, x);  // h += x (residual), then the norm
  if (mlp) {
    Tensor y = mlp->forward(ctx, p, hn, s.mlp);
    add_into(ctx, y, h);  // residual
    return y;
  }
  // The residual is added in the MoE's combine pass (the same bits as add_into after it).
  Tensor y = moe->forward(ctx, p, hn, B, s.moe, h);
  // The MoE keeps its input for the router's (BF16) Wgrad; the backward recomputes it from the
  // post-norm's saved input instead (the same op on the same bits: rmsnorm.h), so that no BF16
  // copy of it lives across the step.
  s.moe.x = Tensor();
  return y;
}

Tensor DecoderLayer::backward(Context& ctx, const Precision& p, const RopeTable& rope,
                              const Tensor& dy, const Saved& s) {
  Tensor dhn;
  if (mlp) {
    dhn = mlp->backward(ctx, p, dy, s.mlp);
  } else {
    MoeLayer::Saved ms = s.moe;  // handles: no copy of the tensors
    NormLayer::Saved again;
    ms.x = post_norm.forward(ctx, s.post_norm.x, again);
    dhn = moe->backward(ctx, p, dy, ms);
  }
  const Tensor dh = post_norm.backward(ctx, dhn, s.post_norm, dy);  // + dy (residual)
  const Tensor dxn = attn.backward(ctx, p, rope, dh, s.attn);
  return input_norm.backward(ctx, dxn, s.input_norm, dh);  // + dh (residual)
}

}  // namespace octet
