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
// The shared experts run first; their output (and the decoder layer's residual, forward's
// `residual`) is added in the combine's own pass, with add_into's bits in that order
// (moe_permute.h then_add). In the backward (one rank) the router's and the shared experts' dx
// likewise go into the permutation backward's pass, which therefore runs last.
//
// Saved across the step: gu (the SwiGLU input, BF16) and the column-wise FP8 copies of the experts'
// inputs; with the FP8 dispatch and the scaling-aware transpose on one rank, x's T quantized rows
// instead of gate_up's copy of the R dispatched ones, which the backward makes again from them
// (moe_permute_transposed, the same bits). With recompute_down (the default, for every recipe
// without delayed scaling at the down site) the SwiGLU output h (FP8 in fp8-block) and the experts'
// outputs (R, D) are not kept: the backward computes h and down(h) again from gu (the same ops on
// the same inputs, so the same bits) just before the combine's backward, which needs the outputs
// for the routing weights' gradient. That costs one more down-projection Fprop per layer and saves
// (R, F) FP8 + (R, D) BF16 per layer. Delayed scaling would record a second amax, so it keeps them.
// With the recipe's moe_swiglu_input = fp8 (the default of deepseek and fp8-flow: DeepSeek-V3
// caches the SwiGLU input in FP8), gu itself is kept as 1x128 E4M3 with power-of-2 scales (half the
// bytes), written by the fused SwiGLU + quantize kernel in the pass that reads gu (ops/swiglu
// swiglu_quantize_caching_input); the backward's SwiGLU recomputation and dSwiGLU read the FP8 copy
// directly, dequantized in registers (no BF16 gu is made again): h, down(h) and dgu then come from
// the FP8 gu, no longer bitwise the forward's, and bitwise what dequantizing gu to the activation
// dtype first would give.
//
// fp8-flow (Recipe::fp8_flow, FP8-Flow-MoE, reference/fp8-facts.md section 5; moe_flow.cpp): the
// same layer with every tensor between the dispatch and the combine in FP8, in both directions:
//
//   forward   x -quantize-> FP8 -dispatch-> gate_up -> SwiGLU x w_row + quantize (fused) -> down
//             -> combine: an unweighted BF16 sum (FP32 accumulation) of a token's k expert rows
//   backward  dy -quantize-> FP8 -dispatch (the combine's backward, a copy)-> down Dgrad -> dSwiGLU
//             + quantize (fused; also d w_row) -> gate_up Dgrad -> permute backward (BF16 sum)
//
// The routing weight moves from the combine into the expert (h = w * SwiGLU(gu), exact by
// linearity of the down projection) so that the combine's backward multiplies nothing and the
// quantized dy rows are dispatched unchanged. Two explicit casts per layer (x and dy); the Wgrad
// operands (column-wise x, dy, h and dgu) come from the scaling-aware transpose of the row-wise
// FP8 tensors. Casts are counted under the scopes "moe.routed" and "moe.shared"
// (core/cast_counter.h).
//
// fp8-flow's saved state (one rank): gu (FP8 as above with moe_swiglu_input = fp8, else BF16: what
// the recomputation and dSwiGLU read), the routing weight per row, and
// the quantized x before the dispatch (T x D FP8, a quarter of the dispatched rows at k = 4), not
// the dispatched column-wise copy: the backward makes gate_up's Wgrad copy from it with one
// scaling-aware transpose that reads each dispatched row from its token's row
// (moe_permute_transposed: the dispatch is not stored), the same bytes. down's Wgrad copy of dy is
// made by the backward dispatch itself (moe_permute_quantize_transposed: each tile of dispatched
// rows transposed by the block that quantized it), the same bytes as transposing the dispatched
// rows. The routing weights move onto the rows in the forward dispatch's pass, and
// their gradient back in the final permutation backward's. With recompute_down, h is
// not kept either: the backward's dSwiGLU pass makes it again from gu (swiglu_backward_quantize
// want_h: the forward's SwiGLU + quantize, the same bits on the same gu) and transposes it for
// down's Wgrad, which therefore runs after dSwiGLU, not beside down's Dgrad. Per MoE layer this
// keeps less than deepseek (saved_bytes.h; tests/model/moe_flow_memory_test.cpp).
//
// Auxiliary-loss-free balancing: the bias is not differentiated; the trainer moves it after each
// step from the per-expert counts of the step (ops/moe_router bias update). The optional
// sequence-wise balance loss (alpha > 0) adds to the loss and its gradient to the router logits.
#pragma once

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "model/dense_mlp.h"
#include "model/grouped_linear.h"
#include "model/moe_ep.h"
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
  // Expert parallelism (moe_ep.h): the EP group when it has more than one rank, else null (the
  // single-rank path, which never synchronises). gate_up / down then hold this rank's experts.
  Comm* ep = nullptr;
  bool recompute_down = true;  // h and the experts' outputs recomputed in backward (see above)

  struct Saved {
    int64_t sequences = 1;
    Tensor x, logits;  // the input and the router logits (T, E) f32
    RouterOutput route;
    PermuteMap map;
    GroupLayoutRef layout;
    GroupedLinearLayer::Saved gate_up, down;
    Tensor gu, expert_out;  // (R, 2F), (R, D); expert_out and down undefined when recomputed
    bool recomputed_down = false;
    QuantTensor gu_fp8;  // Recipe::moe_swiglu_input fp8: gu (1x128 E4M3 pow2), gu undefined
    SwigluMlp::Saved shared;
    Tensor aux_loss;  // (1) f32 on the device when seq_aux_alpha > 0
    Tensor w_rows;    // fp8-flow: (R) f32 routing weight of each permuted row (0 on padding)
    // One rank, FP8 dispatch with the scaling-aware transpose (deepseek, fp8-flow): x's 1x128 FP8
    // row-wise copy before the dispatch (T rows, 1/k of the dispatched R), from which the backward
    // makes gate_up's Wgrad copy again (gate_up undefined).
    QuantTensor x_fp8;
    // Expert parallelism: the exchange's counts and the local layout (map is then the source's
    // map by global expert, layout / gu / w_rows / the GEMMs' saved tensors the local experts',
    // expert_out the outputs returned to this rank in map's layout).
    std::shared_ptr<const EpRoute> ep;
  };

  void init_state(Context& ctx, const Recipe& recipe);
  void prepare(Context& ctx, const Precision& p, PrepareScope scope = PrepareScope::kAll);
  // x (T, D), T = sequences x sequence length -> (T, D). With residual (x's shape and dtype) the
  // result is the layer's output + residual, added as add_into would (in the combine's pass).
  Tensor forward(Context& ctx, const Precision& p, const Tensor& x, int64_t sequences, Saved& s,
                 const Tensor& residual = Tensor());
  Tensor backward(Context& ctx, const Precision& p, const Tensor& dy, const Saved& s);

 private:
  // The routed experts after the router (moe_flow.cpp): fp8-flow's dataflow. forward returns the
  // combined routed output (T, D) with then_add added in the combine's pass; backward returns the
  // routed path's dx in the permuted layout (R, D), before the permutation's backward (the
  // caller's), and the routing weights' gradient (T, k) f32.
  Tensor flow_forward(Context& ctx, const Precision& p, const Tensor& x2, Saved& s,
                      const std::vector<Tensor>& then_add);
  std::pair<Tensor, Tensor> flow_backward(Context& ctx, const Precision& p, const Tensor& dy2,
                                          const Saved& s);
  // fp8-flow's experts backward from the dispatched FP8 dy (R rows of s.layout): the down
  // projection, dSwiGLU fused with d_gate_up's quantization, gate/up. Returns the permuted rows'
  // dx (R, D) and the routing weights' gradient per row (R) f32. Shared with the EP path.
  std::pair<Tensor, Tensor> flow_experts_backward(Context& ctx, const Precision& p,
                                                  GroupedInput dyp, const Saved& s);
  // What gate_up's Wgrad reads of its input: the forward's Saved, or, where the forward kept x's T
  // quantized rows (s.x_fp8), their dispatched column-wise copy made now (moe_flow.cpp).
  GroupedLinearLayer::Saved gate_up_saved(Context& ctx, const Precision& p, const Saved& s) const;
  // The routed experts across the EP group (moe_ep.cpp), same contracts as the flow pair.
  Tensor ep_forward(Context& ctx, const Precision& p, const Tensor& x2, Saved& s);
  std::pair<Tensor, Tensor> ep_backward(Context& ctx, const Precision& p, const Tensor& dy2,
                                        const Saved& s);
  // h = SwiGLU(gu) in down's input form, then down(h) (R, D); fills `saved` (forward and the
  // backward's recomputation). gu is a tensor or (the backward with moe_swiglu_input fp8, gu
  // undefined) its FP8 copy gu_fp8, read as the dtype `as`; gu_cache (the forward with
  // moe_swiglu_input fp8) receives gu's 1x128 E4M3 power-of-2 copy, from the fused pass when down
  // takes FP8 input. keep_for_wgrad false (the forward when the backward recomputes h): h's FP8
  // rows make no column-wise copy for down's Wgrad (a BF16 h's quantization makes both in one
  // pass either way).
  Tensor expert_down(Context& ctx, const Precision& p, const Tensor& gu, const QuantTensor& gu_fp8,
                     DType as, const GroupLayoutRef& layout, GroupedLinearLayer::Saved& saved,
                     bool keep_for_wgrad, QuantTensor* gu_cache = nullptr);
  Tensor gate_w_;  // the router weight in the activation dtype
};

}  // namespace octet
