// The routed experts of fp8-flow (FP8-Flow-MoE's casting-free dataflow; moe.h has the math and
// what is saved): forward, then backward in reverse order. Called by MoeLayer::forward / backward
// (moe.cpp) after the router and the permutation map when the recipe's fp8_flow is set; the
// forward's combine adds the shared experts' output (computed first) in its pass.
#include <utility>
#include <vector>

#include "model/linear.h"
#include "model/moe.h"
#include "ops/moe_permute/moe_permute.h"
#include "ops/moe_permute/moe_row_weight.h"
#include "ops/quantize/quantize.h"
#include "ops/swiglu/swiglu.h"

namespace octet {
namespace {

// h = w_row * SwiGLU(gu), quantized in the same kernel for the down projection (the forward; the
// backward makes it again in dSwiGLU's pass, flow_experts_backward). gu_cache (moe_swiglu_input
// fp8) receives gu's copy from the same pass.
QuantTensor weighted_swiglu(Context& ctx, const Precision& p, const Tensor& gu,
                            const Tensor& w_rows, QuantTensor* gu_cache) {
  const GemmRecipe::Quantization hq =
      p.recipe.at(GemmSite::kExpertDown).quantization(GemmOperand::kActivation);
  const SwigluQuantizeArgs qa{.gate_up = gu,
                              .format = hq.format,
                              .rounding = hq.rounding,
                              .epsilon = 0.0f,
                              .row_weight = w_rows,
                              .gate_up_dtype = p.act,
                              .amax = false};  // blockwise: no one reads it
  if (gu_cache == nullptr) return swiglu_quantize(ctx, qa);
  SwigluQuantizeCachedResult both = swiglu_quantize_caching_input(ctx, qa);
  *gu_cache = std::move(both.gate_up);
  return std::move(both.h);
}

}  // namespace

Tensor MoeLayer::flow_forward(Context& ctx, const Precision& p, const Tensor& x2, Saved& s,
                              const std::vector<Tensor>& then_add) {
  const GemmRecipe& up_r = p.recipe.at(GemmSite::kExpertGateUp);
  // Cast 1 of 2: x quantized once (1x128, power-of-2 scales: Recipe::validate) and dispatched in
  // FP8, in one pass that also writes the T quantized rows themselves: those are what gate_up's
  // Wgrad keeps, not a copy of the R dispatched rows; the backward makes its column-wise copy from
  // them (moe_permute_transposed). The same pass moves the routing weights onto the permuted rows
  // (moe_permute_weights).
  PermuteQuantizeResult xq = moe_permute_quantize_keeping_rows(
      ctx, s.map, quantize_args(up_r, GemmOperand::kActivation, x2, QuantizeOutput::kRowwise),
      s.route.topk_weight);
  s.x_fp8 = std::move(xq.rows);
  s.w_rows = std::move(xq.w_rows);
  s.gu = gate_up.forward(
      ctx, p, GroupedInput{.x = Tensor(), .qx = std::move(xq.permuted), .keep_for_wgrad = false},
      s.layout, s.gate_up);  // (R, 2F) bf16
  // With recompute_down the backward makes h again from gu (moe.h): only its row-wise form exists
  // here, for the down projection.
  s.recomputed_down = recompute_down && !p.recipe.at(GemmSite::kExpertDown).is_delayed();
  // moe_swiglu_input fp8: gu's FP8 copy written by the SwiGLU pass, the only gu kept.
  const bool cache_fp8 = s.recomputed_down && p.recipe.moe_swiglu_input == Storage::kFp8;
  const Tensor expert_out = [&] {
    const GroupedInput h{
        .x = Tensor(),
        .qx = weighted_swiglu(ctx, p, s.gu, s.w_rows, cache_fp8 ? &s.gu_fp8 : nullptr),
        .keep_for_wgrad = !s.recomputed_down};
    return down.forward(ctx, p, h, s.layout, s.down);  // (R, D) bf16
  }();
  if (cache_fp8) s.gu = Tensor();
  // The combine: the routing weights are already in, so an unweighted sum of each token's k rows
  // (FP32, slot order, one rounding): the permutation's backward; then_add in the same pass.
  return moe_permute_backward(ctx, s.map, expert_out, x2.dtype(), then_add);
}

std::pair<Tensor, Tensor> MoeLayer::flow_backward(Context& ctx, const Precision& p,
                                                  const Tensor& dy2, const Saved& s) {
  const GemmRecipe& down_r = p.recipe.at(GemmSite::kExpertDown);
  // Cast 2 of 2: dy quantized once and dispatched in FP8, fused as in the forward. The combine's
  // backward is a copy of dy to each of the token's rows (no weight to apply), so the dispatch moves
  // FP8 rows and their scales unchanged.
  const QuantizeArgs qa =
      quantize_args(down_r, GemmOperand::kGradient, dy2, QuantizeOutput::kRowwise);
  GroupedInput dyp{.x = Tensor()};
  if (p.recipe.fp8_transpose == Fp8Transpose::kScalingAware) {
    // down's Wgrad copy of dY: the scaling-aware transpose of the dispatched rows, in the 1x128
    // form of the Wgrad's A operand, made in the dispatch's own pass (each 128x128 tile of the
    // permuted rows quantized and transposed by one block, never read back).
    dyp.qx = moe_permute_quantize_transposed(ctx, s.map, qa, Granularity::k1x128);
  } else {
    dyp.qx = moe_permute_quantize(ctx, s.map, qa);
  }
  auto [dxp, d_row_weight] = flow_experts_backward(ctx, p, std::move(dyp), s);
  // The routing weights' gradient from the rows (a copy). The permutation's backward is the
  // caller's, which adds the router's dx (that needs this gradient) and the shared experts' in its
  // pass.
  Tensor d_topk_weight = moe_permute_weights_backward(ctx, s.map, d_row_weight);
  return {std::move(dxp), std::move(d_topk_weight)};
}

std::pair<Tensor, Tensor> MoeLayer::flow_experts_backward(Context& ctx, const Precision& p,
                                                          GroupedInput dyp, const Saved& s) {
  const GemmRecipe& up_r = p.recipe.at(GemmSite::kExpertGateUp);
  // down's data gradient first, its weight gradient once h exists: with recompute_down the forward
  // kept no h, and dSwiGLU's pass makes it again (want_h: the bits of weighted_swiglu on the same
  // gu, swiglu.h) instead of a SwiGLU pass of its own. dY's row-wise copy goes once dh is made.
  QuantTensor qdy = down.backward_operand(ctx, p, dyp);
  dyp = GroupedInput{};
  Tensor dh = down.backward_data(ctx, qdy, s.layout);  // (R, F) bf16
  qdy.data = Tensor::wrap(nullptr, qdy.data.shape(), qdy.data.dtype(), ctx.device);
  qdy.scale_inv = Tensor();
  // dSwiGLU through the weighted output, fused with the quantization of d_gate_up (and of h).
  const GemmRecipe::Quantization gq = up_r.quantization(GemmOperand::kGradient);
  const GemmRecipe::Quantization hq =
      p.recipe.at(GemmSite::kExpertDown).quantization(GemmOperand::kActivation);
  SwigluBackwardQuantizeResult dg = swiglu_backward_quantize(ctx, {.dh = dh,
                                                                   .gate_up = s.gu,
                                                                   .row_weight = s.w_rows,
                                                                   .format = gq.format,
                                                                   .rounding = gq.rounding,
                                                                   .epsilon = 0.0f,
                                                                   .gate_up_fp8 = s.gu_fp8,
                                                                   .want_h = s.recomputed_down,
                                                                   .h_format = hq.format,
                                                                   .h_rounding = hq.rounding,
                                                                   .amax = false});
  dh = Tensor();
  down.backward_weight(ctx, qdy, s.layout,
                       s.recomputed_down ? down.wgrad_saved(ctx, p, std::move(dg.h)) : s.down);
  qdy = QuantTensor{};
  Tensor dxp = gate_up.backward(ctx, p, GroupedInput{.x = Tensor(), .qx = std::move(dg.d_gate_up)},
                                s.layout, gate_up_saved(ctx, p, s));  // grad +=
  return {dxp, dg.d_row_weight};
}

GroupedLinearLayer::Saved MoeLayer::gate_up_saved(Context& ctx, const Precision& p,
                                                  const Saved& s) const {
  // From the T quantized rows (one rank), or kept by the forward (expert parallelism). The
  // scaling-aware transpose reads the dispatched rows from their tokens' rows
  // (moe_permute_transposed: the dispatch is never stored); the requantize paths dispatch first.
  GroupedLinearLayer::Saved up_saved = s.gate_up;
  if (s.x_fp8.data.defined()) {
    if (p.recipe.fp8_transpose == Fp8Transpose::kScalingAware)
      up_saved.qx = moe_permute_transposed(ctx, s.map, s.x_fp8);
    else
      up_saved = gate_up.wgrad_saved(ctx, p, moe_permute(ctx, s.map, s.x_fp8));
  }
  return up_saved;
}

}  // namespace octet
