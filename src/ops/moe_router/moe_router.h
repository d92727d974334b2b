// MoE router of DeepSeek-V3: sigmoid scores, group-limited top-k with the auxiliary-loss-free bias,
// normalised and scaled weights; its backward; the bias update; the sequence-wise balance loss.
//
// Reference: the transformers library's DeepseekV3TopkRouter (get_topk_indices / forward) and the
// DeepSeek-V3 technical report (arXiv:2412.19437) section 2.1.2, equations 12-20. The logits
// x W_gate^T come from the caller's GEMM (BF16 input, FP32 output: DESIGN.md section 1).
//
// Forward, per token t (all FP32, every operation one rounding: numerics/fp32_rn.h):
//   s_e      = sigmoid(logit_e)                              unbiased scores
//   b_e      = s_e + bias_e                                  selection scores (bias: selection
//   only) group g  = experts [g G, (g + 1) G), G = E / n_group; its score = sum of its two largest
//   b_e keep the topk_group groups of largest score cand_e   = b_e in kept groups; in dropped
//   groups 0.0 (GroupMaskFill::kZero, the transformers
//              library's masked_fill(~mask, 0.0)) or never chosen (kExclude, DeepSeek-V3's
//              inference/model.py fills -inf). They differ only when a kept expert's b_e < 0.
//   topk_idx = the k experts of largest cand_e, in descending order of cand_e
//   w_j      = s_{idx_j} / (sum_j s_{idx_j} + 1e-20) * routed_scaling_factor   (norm_topk_prob)
//            = s_{idx_j} * routed_scaling_factor                              (otherwise)
//              the sum runs over slots j = 0..k-1 in order; the division comes before the scaling.
// Ties (equal values, in groups and experts) go to the lower index, so selection is deterministic;
// -0.0 counts as +0.0 and NaN as -inf. CPU and CUDA agree bit for bit (indices, weights, counts).
#pragma once

#include "core/context.h"

namespace octet {

enum class GroupMaskFill : uint8_t {
  kZero,     // transformers DeepseekV3TopkRouter: experts of dropped groups compete with 0.0
  kExclude,  // DeepSeek-V3 inference/model.py: experts of dropped groups are never chosen
};

enum class TopkNorm : uint8_t {
  kNone,      // norm_topk_prob = false
  kSumToOne,  // norm_topk_prob = true
};

struct RouterConfig {
  int64_t num_experts = 0;  // E (n_routed_experts), 1..1024
  int64_t top_k = 0;        // k (num_experts_per_tok), 1..32, <= E
  int64_t n_group = 1;      // divides E; 1..32; E / n_group >= 2 when n_group > 1
  int64_t topk_group = 1;   // 1..n_group
  TopkNorm norm = TopkNorm::kSumToOne;
  float routed_scaling_factor = 1.0f;
  GroupMaskFill mask_fill = GroupMaskFill::kZero;

  // Throws naming the field; kExclude also needs k <= topk_group * E / n_group.
  void validate() const;
};

struct RouterForwardArgs {
  Tensor logits;  // (T, E) f32: x W_gate^T (leading dimensions flattened into T)
  Tensor bias;    // (E) f32: e_score_correction_bias
  RouterConfig config;
};

struct RouterOutput {
  Tensor topk_idx;     // (T, k) int32: chosen experts, descending selection score
  Tensor topk_weight;  // (T, k) f32: combine weights
  Tensor counts;       // (E) int32: tokens routed to each expert (the load of this call)
};

// Outputs freshly allocated (`=`). Saved for backward: logits and topk_idx (the scores are
// recomputed).
RouterOutput moe_router_forward(Context& ctx, const RouterForwardArgs& args);

struct RouterBackwardArgs {
  Tensor logits;         // (T, E) f32, as given to the forward
  Tensor topk_idx;       // (T, k) int32 from the forward
  Tensor d_topk_weight;  // (T, k) f32: dL/d topk_weight
  RouterConfig config;
};

// d_logits (T, E) f32, freshly allocated (`=`): the gradient flows through the weights only (the
// bias and the selection are not differentiated); experts not chosen by a token get 0. Per token,
// with c = routed_scaling_factor, g_j = d_topk_weight[t, j], s_j the chosen unbiased scores:
//   kSumToOne: D = sum_j s_j + 1e-20, y_j = s_j / D, dot = sum_j g_j * y_j (slot order),
//              ds_j = c * (g_j - dot) / D
//   kNone:     ds_j = c * g_j
//   d_logit_{idx_j} = ds_j * (s_j * (1 - s_j))
Tensor moe_router_backward(Context& ctx, const RouterBackwardArgs& args);

// Auxiliary-loss-free load balancing (DeepSeek-V3 report section 2.1.2; Wang et al. 2024,
// "Auxiliary-Loss-Free Load Balancing Strategy for Mixture-of-Experts", arXiv:2408.15664): after
// each step the bias of an overloaded expert drops by `rate` (gamma), that of an underloaded one
// rises by it. Exactly, with N = sum_e counts_e and the comparison in integers (mean load N / E):
//   bias_e += rate * sign(N - E * counts_e)        (sign(0) = 0: an expert exactly at the mean
//   stays)
// Updates `bias` in place on the device (no host synchronisation), outside any gradient.
struct RouterBiasUpdateArgs {
  Tensor bias;    // (E) f32, updated in place
  Tensor counts;  // (E) int32: tokens per expert over the step (summed over micro-batches by the
                  // caller)
  float rate = 1e-3f;  // gamma; DeepSeek-V3 used 0.001 for most of training
};
void moe_router_bias_update(Context& ctx, const RouterBiasUpdateArgs& args);

// Sequence-wise balance loss (DeepSeek-V3 report equations 17-20), B sequences of T tokens each:
//   s'_{t,e} = s_{t,e} / sum_{e'} s_{t,e'}       (unbiased sigmoid scores over all E experts)
//   f_{b,e}  = E / (k T) * #{t in sequence b : e in topk_idx[t]}
//   P_{b,e}  = 1/T * sum_{t in b} s'_{t,e}
//   loss     = alpha / B * sum_b sum_e f_{b,e} P_{b,e}      (the mean of the per-sequence losses)
// Arithmetic: S_t = sum_e s_{t,e} in FP32 in expert order; P sums s_{t,e} / S_t (FP32 quotient) in
// FP64 in kBalanceChunks contiguous chunks of ceil(T / kBalanceChunks) tokens, each in token order
// from 0.0, then the chunks' sums in chunk order; f, P, their products and the final sum (b-major,
// then e) in FP64, rounded to FP32 once. The counts are not differentiated (the selection is
// discrete).
inline constexpr int64_t kBalanceChunks = 8;
struct SeqBalanceLossArgs {
  Tensor logits;              // (B * T, E) f32, sequence b owns rows [b T, (b + 1) T)
  Tensor topk_idx;            // (B * T, k) int32 from the router forward
  int64_t num_sequences = 1;  // B, divides the number of rows
  float alpha = 1e-4f;        // DeepSeek-V3 used 0.0001
};

// loss (1) f32 on the context's device, freshly allocated.
Tensor moe_seq_balance_loss_forward(Context& ctx, const SeqBalanceLossArgs& args);

// d_logits (B * T, E) f32 `+=` d_loss * dloss/dlogits (adds, so it composes with
// moe_router_backward):
//   c_{b,e} = FP32(d_loss * alpha * E * count_{b,e} / (k T^2 B))   (FP64, one rounding)
//   dot_t   = sum_e c_{b,e} * (s_{t,e} / S_t)                       (FP32, expert order)
//   d_logit_{t,e} += ((c_{b,e} - dot_t) / S_t) * (s_{t,e} * (1 - s_{t,e}))
void moe_seq_balance_loss_backward(Context& ctx, const SeqBalanceLossArgs& args, float d_loss,
                                   Tensor& d_logits);

}  // namespace octet
