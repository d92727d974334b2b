// Mixture-of-Experts feed-forward of DeepSeek-V3 (DESIGN.md section 3), forward and backward:
//
//   logits = x W_gate^T                         (T, E) FP32 out of a BF16 GEMM (router site)
//   idx, w = router(logits, e_score_correction_bias)   sigmoid, group-limited top-k, normalised,
//                                                x routed_scaling_factor (ops/moe_router)
//   xp     = permute(x) by expert                 FP8 1x128 power-of-2 payload when the recipe's
//                                                moe_dispatch is fp8 (quantized once, before the
//                                                dispatch), else the activation dtype; each
//                                                expert's rows padded to 128 for the FP8 recipes
//   h      = SwiGLU(experts' gate_up(xp))         grouped GEMMs (model/grouped_linear.h); in
//                                                fp8-block the SwiGLU output is quantized to FP8
//                                                with power-of-2 scales by the fused kernel
//   y      = combine(experts' down(h), w)  +  shared_experts(x)     BF16 combine, FP32 sums
//
// Auxiliary-loss-free balancing: the bias is not differentiated; the trainer moves it after each
// step from the per-expert counts of the step (ops/moe_router bias update). The optional
// sequence-wise balance loss (alpha > 0) adds to the loss and its gradient to the router logits.
#pragma once

#include <optional>

#include "model/dense_mlp.h"
#include "model/grouped_linear.h"
#include "ops/moe_permute/moe_permute.h"
#include "ops/moe_router/moe_router.h"

namespace octet {

struct MoeLayer {
  RouterConfig router;
  float seq_aux_alpha = 0.0f;        // 0: no sequence-wise balance loss
  float aux_grad_scale = 1.0f;       // d total / d balance loss (the micro-batch's loss scale)
  Parameter* gate = nullptr;         // (E, D)
  Parameter* bias = nullptr;         // (E) e_score_correction_bias
  GroupedLinearLayer gate_up, down;  // (E, 2F, D), (E, D, F)
  std::optional<SwigluMlp> shared;

  struct Saved {
    int64_t sequences = 1;
    Tensor x, logits;  // the input and the router logits (T, E) f32
    RouterOutput route;
    PermuteMap map;
    GroupLayoutRef layout;
    GroupedLinearLayer::Saved gate_up, down;
    Tensor gu, expert_out;  // (R, 2F), (R, D)
    SwigluMlp::Saved shared;
    Tensor aux_loss;  // (1) f32 on the device when seq_aux_alpha > 0
  };

  void init_state(Context& ctx, const Recipe& recipe);
  void prepare(Context& ctx, const Precision& p, PrepareScope scope = PrepareScope::kAll);
  // x (T, D), T = sequences x sequence length -> (T, D).
  Tensor forward(Context& ctx, const Precision& p, const Tensor& x, int64_t sequences, Saved& s);
  Tensor backward(Context& ctx, const Precision& p, const Tensor& dy, const Saved& s);

 private:
  Tensor gate_w_;  // the router weight in the activation dtype
};

}  // namespace octet
