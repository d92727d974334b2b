// The routed experts of fp8-flow (FP8-Flow-MoE's casting-free dataflow; moe.h has the math):
// forward, then backward in reverse order. Called by MoeLayer::forward / backward (moe.cpp) after
// the router and the permutation map, before the shared experts, when the recipe's fp8_flow is set.
#include "model/linear.h"
#include "model/moe.h"
#include "ops/moe_permute/moe_row_weight.h"
#include "ops/quantize/quantize.h"
#include "ops/swiglu/swiglu.h"

namespace octet {

Tensor MoeLayer::flow_forward(Context& ctx, const Precision& p, const Tensor& x2, Saved& s) {
  const GemmRecipe& up_r = p.recipe.at(GemmSite::kExpertGateUp);
  const GemmRecipe& down_r = p.recipe.at(GemmSite::kExpertDown);
  // Cast 1 of 2: x quantized once (1x128, power-of-2 scales: Recipe::validate) and dispatched in
  // FP8, fused (each token's row read once, written to its k rows).
  const GroupedInput xp{
      .x = Tensor(),
      .qx = moe_permute_quantize(
          ctx, s.map, quantize_args(up_r, GemmOperand::kActivation, x2, QuantizeOutput::kRowwise))};
  s.gu = gate_up.forward(ctx, p, xp, s.layout, s.gate_up);  // (R, 2F) bf16
  // h = w_row * SwiGLU(gu), quantized in the same kernel for the down projection.
  s.w_rows = moe_permute_weights(ctx, s.map, s.route.topk_weight);
  const GemmRecipe::Quantization hq = down_r.quantization(GemmOperand::kActivation);
  const GroupedInput h{.x = Tensor(),
                       .qx = swiglu_quantize(ctx, {.gate_up = s.gu,
                                                   .format = hq.format,
                                                   .rounding = hq.rounding,
                                                   .epsilon = 0.0f,
                                                   .row_weight = s.w_rows})};
  const Tensor expert_out = down.forward(ctx, p, h, s.layout, s.down);  // (R, D) bf16
  // The combine: the routing weights are already in, so an unweighted sum of each token's k rows
  // (FP32, slot order, one rounding): the permutation's backward.
  return moe_permute_backward(ctx, s.map, expert_out, x2.dtype());
}

std::pair<Tensor, Tensor> MoeLayer::flow_backward(Context& ctx, const Precision& p,
                                                  const Tensor& dy2, const Saved& s) {
  const GemmRecipe& down_r = p.recipe.at(GemmSite::kExpertDown);
  // Cast 2 of 2: dy quantized once and dispatched in FP8, fused as in the forward. The combine's
  // backward is a copy of dy to each of the token's rows (no weight to apply), so the dispatch moves
  // FP8 rows and their scales unchanged.
  const GroupedInput dyp{.x = Tensor(),
                         .qx = moe_permute_quantize(ctx, s.map,
                                                    quantize_args(down_r, GemmOperand::kGradient,
                                                                  dy2, QuantizeOutput::kRowwise))};
  const auto [dxp, d_row_weight] = flow_experts_backward(ctx, p, dyp, s);
  return {moe_permute_backward(ctx, s.map, dxp, dy2.dtype()),
          moe_permute_weights_backward(ctx, s.map, d_row_weight)};
}

std::pair<Tensor, Tensor> MoeLayer::flow_experts_backward(Context& ctx, const Precision& p,
                                                          const GroupedInput& dyp, const Saved& s) {
  const GemmRecipe& up_r = p.recipe.at(GemmSite::kExpertGateUp);
  const Tensor dh = down.backward(ctx, p, dyp, s.layout, s.down);  // (R, F) bf16; grad +=
  // dSwiGLU through the weighted output, fused with the quantization of d_gate_up.
  const GemmRecipe::Quantization gq = up_r.quantization(GemmOperand::kGradient);
  const SwigluBackwardQuantizeResult dg = swiglu_backward_quantize(ctx, {.dh = dh,
                                                                         .gate_up = s.gu,
                                                                         .row_weight = s.w_rows,
                                                                         .format = gq.format,
                                                                         .rounding = gq.rounding,
                                                                         .epsilon = 0.0f});
  Tensor dxp = gate_up.backward(ctx, p, GroupedInput{.x = Tensor(), .qx = dg.d_gate_up}, s.layout,
                                s.gate_up);  // grad +=
  return {dxp, dg.d_row_weight};
}

}  // namespace octet
