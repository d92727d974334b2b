// Multi-head Latent Attention (DeepSeek-V2/V3), forward and backward, exactly as the transformers
// library's DeepseekV3Attention computes it:
//
//   q      = q_b_proj(q_a_layernorm(q_a_proj(x)))            (or q_proj(x) without q_lora_rank)
//            viewed (B, T, H, dn + dr); RoPE on its last dr channels
//   c, kr  = split(kv_a_proj_with_mqa(x), [kv_lora_rank, dr])
//   kv     = kv_b_proj(kv_a_layernorm(c))                    viewed (B, T, H, dn + dv)
//   k      = [kv[..., :dn] ; RoPE(kr) broadcast to every head]    (B, T, H, dn + dr), one pass
//                                                                  (ops/rope/rope_key.h)
//   v      = kv[..., dn:]        read in place (a HeadView of kv)   (B, T, H, dv)
//   o      = causal softmax(q k^T / sqrt(dn + dr)) v               (ops/attention, FP32 softmax)
//   out    = o_proj(o viewed (B, T, H dv))
//
// dn = qk_nope_head_dim, dr = qk_rope_head_dim, dv = v_head_dim. RoPE pairs channels as the
// config's rope_interleave says (ops/rope). The five projections are Linear sites (model/linear.h)
// in the recipe's precision; the o_proj input is kept in Recipe::attn_out_input storage (E5M6 in
// deepseek). The latent path (c, its norm, the rope key) stays in the activation dtype (BF16).
//
// Saved for backward: each Linear's input in its site's storage, the norms' inputs and rstd, the
// attention's q, v (kv itself, v being its columns), o and lse (BF16), and k, or with recompute_k
// kv_a's output, from which the backward rebuilds k in one pass (kv is kept anyway). Backward runs
// the forward in reverse (below, in mla.cpp); the attention backward writes dv straight into dkv's
// v columns. When dn is not a multiple of 8 (cuDNN's alignment for a column window), v is a compact
// copy, dv is copied into dkv and k is kept: same values either way.
#pragma once

#include <optional>

#include "model/config.h"
#include "model/parameter.h"
#include "ops/attention/attention.h"
#include "ops/rope/rope.h"

namespace octet {

struct MlaLayer {
  int64_t heads = 0, nope = 0, rope = 0, v_dim = 0, kv_lora = 0;
  bool has_q_lora = false;
  bool deterministic = true;  // attention backward: ops/attention/attention.h
  // The attention backward's cuDNN workspace cap (AttentionBackwardArgs::max_workspace_bytes):
  // 0 the op's default, INT64_MAX one unchunked call.
  int64_t backward_workspace_cap = 0;
  // Rebuild k in backward (one rope_key_forward pass) rather than keep it: N H (dn + dr) BF16 less
  // per layer for N (kv_lora + dr) more (kv_a's output). Only with v_in_place() (kv is kept then).
  bool recompute_k = true;
  RopePairing pairing = RopePairing::kInterleave;
  LinearLayer q_a, q_b, q;  // q_a + q_b with q_lora_rank, q without
  NormLayer q_a_norm;
  LinearLayer kv_a, kv_b, o;
  NormLayer kv_a_norm;

  struct Saved {
    int64_t B = 0, T = 0;
    LinearSaved q_a, q_b, q, kv_a, kv_b, o;
    NormLayer::Saved q_a_norm, kv_a_norm;
    Tensor q_rot, out, lse;  // attention operands (B, T, H, *) and lse (B, H, T)
    HeadView v;              // columns [dn, dn + dv) of kv (B, T, H, dn + dv), or a copy
    Tensor k;                // (B, T, H, dn + dr), or empty when recomputed from kva
    Tensor kva;              // kv_a's output (B T, kv_lora + dr) when k is recomputed
  };

  // Whether v is read (and dv written) in place in kv: cuDNN needs the window's first column dn
  // to be a multiple of 8 (dn + dv then is too, dv being one).
  bool v_in_place() const { return nope % 8 == 0; }

  // x (B * T, D) -> (B * T, D) in the activation dtype.
  Tensor forward(Context& ctx, const Precision& p, const RopeTable& rope_table, const Tensor& x,
                 int64_t B, int64_t T, Saved& s);
  // dx (=); the weights' grads (+=).
  Tensor backward(Context& ctx, const Precision& p, const RopeTable& rope_table, const Tensor& dy,
                  const Saved& s);
};

}  // namespace octet
