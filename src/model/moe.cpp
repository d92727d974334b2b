// MoE feed-forward: forward, then backward in reverse order (moe.h has the dataflow).
#include "model/moe.h"

#include <utility>
#include <vector>

#include "core/cast_counter.h"
#include "model/linear.h"
#include "ops/cast/cast.h"
#include "ops/gemm/gemm.h"
#include "ops/grouped_gemm/grouped_gemm.h"
#include "ops/quantize/quantize.h"
#include "ops/swiglu/swiglu.h"

namespace octet {
namespace {

bool fp8_experts(const Recipe& r) {
  return r.at(GemmSite::kExpertGateUp).is_fp8() || r.at(GemmSite::kExpertDown).is_fp8();
}

// The shared experts, their casts counted apart from the routed path's.
Tensor shared_forward(Context& ctx, const Precision& p, SwigluMlp& mlp, const Tensor& x,
                      SwigluMlp::Saved& s) {
  CastScope scope(ctx, "moe.shared");
  return mlp.forward(ctx, p, x, s);
}

}  // namespace

void MoeLayer::init_state(Context& ctx, const Recipe& recipe) {
  gate_up.init_state(ctx, recipe);
  down.init_state(ctx, recipe);
  if (shared) {
    shared->gate_up.init_state(ctx, recipe);
    shared->down.init_state(ctx, recipe);
  }
}

void MoeLayer::prepare(Context& ctx, const Precision& p, PrepareScope scope) {
  gate_w_ = cast(ctx, gate->value, p.act);
  gate_up.prepare(ctx, p, scope);
  down.prepare(ctx, p, scope);
  if (shared) {
    shared->gate_up.prepare(ctx, p, scope);
    shared->down.prepare(ctx, p, scope);
  }
}

Tensor MoeLayer::forward(Context& ctx, const Precision& p, const Tensor& x, int64_t sequences,
                         Saved& s, const Tensor& residual) {
  const Recipe& r = p.recipe;
  const GemmRecipe& up_r = r.at(GemmSite::kExpertGateUp);
  const GemmRecipe& down_r = r.at(GemmSite::kExpertDown);
  const int64_t T = x.rows(), D = x.cols(), E = router.num_experts;
  CastScope scope(ctx, "moe.routed");
  s = Saved{};
  s.sequences = sequences;
  s.x = x;
  // Router: BF16 operands, FP32 scores.
  s.logits = Tensor::empty(ctx, {T, E}, DType::kF32);
  gemm_bf16(
      ctx,
      {.a = x.reshape({T, D}), .b = gate_w_, .d = s.logits, .accumulate = Accumulate::kOverwrite});
  s.route = moe_router_forward(ctx, {.logits = s.logits, .bias = bias->value, .config = router});
  if (seq_aux_alpha > 0.0f)
    s.aux_loss = moe_seq_balance_loss_forward(ctx, {.logits = s.logits,
                                                    .topk_idx = s.route.topk_idx,
                                                    .num_sequences = sequences,
                                                    .alpha = seq_aux_alpha});

  // Dispatch. FP8 Wgrad of the experts needs each expert's rows to start at a multiple of 128
  // (with EP the receiving rank pads its local layout; the source map is unpadded).
  const bool ep_on = ep != nullptr && ep->size() > 1;
  s.map = moe_permute_map(
      ctx, {.topk_idx = s.route.topk_idx,
            .num_experts = E,
            .padding = fp8_experts(r) && !ep_on ? PermutePadding::kTo128 : PermutePadding::kNone});
  if (ep_on) {  // moe_ep.cpp: one device-to-host read of the counts per layer and pass
    Tensor y = ep_forward(ctx, p, x.reshape({T, D}), s);
    if (shared) add_into(ctx, y, shared_forward(ctx, p, *shared, x.reshape({T, D}), s.shared));
    if (residual.defined()) add_into(ctx, y, residual.reshape({T, D}));
    return y.reshape(x.shape());
  }
  // The shared experts' output and the residual go into the combine's pass (then_add: the bits of
  // add_into after it, in that order), so the shared experts run first.
  std::vector<Tensor> then_add;
  if (shared) then_add.push_back(shared_forward(ctx, p, *shared, x.reshape({T, D}), s.shared));
  if (residual.defined()) then_add.push_back(residual.reshape({T, D}));
  // The counts stay on the device in every recipe: the grouped GEMMs (and the per-tensor recipes'
  // grouped quantization) read them there, so the layer never synchronises.
  s.layout.sizes = s.map.group_sizes;
  if (r.fp8_flow)  // moe_flow.cpp
    return flow_forward(ctx, p, x.reshape({T, D}), s, then_add).reshape(x.shape());
  GroupedInput xp;
  if (r.moe_dispatch == Storage::kFp8) {
    // Quantized once, before the dispatch (DeepSeek-V3), as gate_up quantizes its input (1x128,
    // power-of-2 scales: Recipe::validate), fused with the permute: each token's row is read and
    // quantized once and written to its k rows.
    const QuantizeArgs qa =
        quantize_args(up_r, GemmOperand::kActivation, x.reshape({T, D}), QuantizeOutput::kRowwise);
    if (up_r.precision == GemmPrecision::kFp8Block &&
        p.recipe.fp8_transpose == Fp8Transpose::kScalingAware) {
      // gate_up's Wgrad copy (the scaling-aware transpose of the dispatched rows, 128x128 tiles)
      // is made in the backward from x's T quantized rows, which this pass also writes
      // (moe_permute_transposed, as fp8-flow does): a quarter of the dispatched rows' bytes at
      // k = 4 stays across the step instead of their column-wise copy, and the same bits.
      PermuteQuantizeResult xq = moe_permute_quantize_keeping_rows(ctx, s.map, qa);
      s.x_fp8 = std::move(xq.rows);
      xp.qx = std::move(xq.permuted);
      xp.keep_for_wgrad = false;
    } else {
      xp.qx = moe_permute_quantize(ctx, s.map, qa);
    }
  } else {
    xp.x = moe_permute(ctx, s.map, x.reshape({T, D}));
  }
  s.gu = gate_up.forward(ctx, p, xp, s.layout, s.gate_up);  // (R, 2F)
  // Recomputed in backward from gu (moe.h): only gu stays across the step, in FP8 with
  // moe_swiglu_input fp8 (its copy written by the SwiGLU pass).
  s.recomputed_down = recompute_down && !down_r.is_delayed();
  const bool cache_fp8 = s.recomputed_down && r.moe_swiglu_input == Storage::kFp8;
  s.expert_out = expert_down(ctx, p, s.gu, QuantTensor{}, s.gu.dtype(), s.layout, s.down,
                             !s.recomputed_down, cache_fp8 ? &s.gu_fp8 : nullptr);  // (R, D)
  if (cache_fp8) s.gu = Tensor();
  Tensor y = moe_combine(ctx, s.map,
                         {.expert_out = s.expert_out,
                          .topk_weight = s.route.topk_weight,
                          .out_dtype = x.dtype(),
                          .then_add = std::move(then_add)});
  if (s.recomputed_down) {
    s.expert_out = Tensor();
    s.down = GroupedLinearLayer::Saved{};
  }
  return y.reshape(x.shape());
}

Tensor MoeLayer::expert_down(Context& ctx, const Precision& p, const Tensor& gu,
                             const QuantTensor& gu_fp8, DType as, const GroupLayoutRef& layout,
                             GroupedLinearLayer::Saved& saved, bool keep_for_wgrad,
                             QuantTensor* gu_cache) {
  const GemmRecipe& down_r = p.recipe.at(GemmSite::kExpertDown);
  GroupedInput h;
  h.keep_for_wgrad = keep_for_wgrad;
  const GemmRecipe::Quantization hq = down_r.quantization(GemmOperand::kActivation);
  if (down_r.precision == GemmPrecision::kFp8Block && hq.rounding == ScaleRounding::kPow2) {
    // SwiGLU fused with down's input quantization; the scaling-aware transpose makes its Wgrad
    // copy, so only with power-of-2 scales (else down quantizes the BF16 output itself).
    const SwigluQuantizeArgs qa{.gate_up = gu,
                                .format = hq.format,
                                .rounding = hq.rounding,
                                .gate_up_fp8 = gu_fp8,
                                .gate_up_dtype = as,
                                .amax = false};  // blockwise: no one reads it
    if (gu_cache != nullptr) {
      SwigluQuantizeCachedResult both = swiglu_quantize_caching_input(ctx, qa);
      h.qx = std::move(both.h);
      *gu_cache = std::move(both.gate_up);
    } else {
      h.qx = swiglu_quantize(ctx, qa);
    }
  } else {
    // Down takes BF16 input: the plain SwiGLU, from gu dequantized once when it is FP8, and gu's
    // FP8 copy by quantize() (the same bits as the fused kernel's).
    const Tensor x = gu.defined() ? gu : dequantize(ctx, gu_fp8, as);
    h.x = Tensor::empty(ctx, {x.rows(), x.cols() / 2}, x.dtype());
    swiglu_forward(ctx, {.gate_up = x, .h = h.x});
    if (gu_cache != nullptr)
      *gu_cache = quantize(ctx, {.input = x,
                                 .format = Fp8Format::kE4M3,
                                 .granularity = Granularity::k1x128,
                                 .rounding = ScaleRounding::kPow2,
                                 .output = QuantizeOutput::kRowwise});
  }
  return down.forward(ctx, p, h, layout, saved);
}

Tensor MoeLayer::backward(Context& ctx, const Precision& p, const Tensor& dy, const Saved& s) {
  const int64_t T = dy.rows(), D = dy.cols();
  const Tensor dy2 = dy.reshape({T, D});
  CastScope scope(ctx, "moe.routed");
  Tensor dx, d_topk_weight;
  // One rank: the routed path's permuted dx, gathered last, with the router's and the shared
  // experts' dx added in that gather's pass (then_add: add_into's bits, in the same order).
  Tensor dxp, dx_shared;
  // The shared experts first: they read dy alone, and their dx then waits beside the routed path.
  if (!s.ep && shared) {
    CastScope shared_scope(ctx, "moe.shared");
    dx_shared = shared->backward(ctx, p, dy2, s.shared);
  }
  if (s.ep) {
    std::tie(dx, d_topk_weight) = ep_backward(ctx, p, dy2, s);  // moe_ep.cpp
  } else if (p.recipe.fp8_flow) {
    std::tie(dxp, d_topk_weight) = flow_backward(ctx, p, dy2, s);  // moe_flow.cpp
  } else {
    // The SwiGLU output and the down projection again, as the forward computed them (the same
    // ops on the same gu: the same bits), unprobed (the forward recorded them). Each (R, *)
    // temporary is released as soon as its last reader is done, so that gate_up's backward runs
    // with dgu alone beside the saved tensors.
    // With moe_swiglu_input fp8 both read gu's FP8 copy as dy's dtype (ops/swiglu: bitwise the
    // dequantized tensor's results, without making it).
    Tensor dgu;
    {
      GroupedLinearLayer::Saved down_saved;
      Tensor expert_out = s.expert_out;
      if (s.recomputed_down) {
        Precision again = p;
        again.probe = nullptr;
        expert_out =
            expert_down(ctx, again, s.gu, s.gu_fp8, dy.dtype(), s.layout, down_saved, true);
      }
      CombineGrads cg = moe_combine_backward(ctx, s.map,
                                             {.d_out = dy2,
                                              .expert_out = expert_out,
                                              .topk_weight = s.route.topk_weight,
                                              .d_expert_out_dtype = dy.dtype()});
      expert_out = Tensor();  // (R, D): freed before down's backward allocates
      Tensor dh =
          down.backward(ctx, p, cg.d_expert_out, s.layout, s.recomputed_down ? down_saved : s.down);
      cg.d_expert_out = Tensor();
      down_saved = GroupedLinearLayer::Saved{};
      d_topk_weight = cg.d_topk_weight;
      dgu = Tensor::empty(ctx, {dh.rows(), 2 * dh.cols()}, dh.dtype());
      swiglu_backward(ctx, {.dh = dh, .gate_up = s.gu, .d_gate_up = dgu, .gate_up_fp8 = s.gu_fp8});
    }
    dxp = gate_up.backward(ctx, p, dgu, s.layout, gate_up_saved(ctx, p, s));
    dgu = Tensor();
  }

  // Router: through the combine weights (and the balance loss), not the selection or the bias.
  Tensor d_logits = moe_router_backward(ctx, {.logits = s.logits,
                                              .topk_idx = s.route.topk_idx,
                                              .d_topk_weight = d_topk_weight,
                                              .config = router});
  if (seq_aux_alpha > 0.0f)
    moe_seq_balance_loss_backward(ctx,
                                  {.logits = s.logits,
                                   .topk_idx = s.route.topk_idx,
                                   .num_sequences = s.sequences,
                                   .alpha = seq_aux_alpha},
                                  aux_grad_scale, d_logits);  // d_logits +=
  const Tensor dl = cast(ctx, d_logits, dy.dtype());
  Tensor dx_router = Tensor::empty(ctx, {T, D}, dy.dtype());
  gemm_bf16(ctx, {.a = dl,
                  .b = gate_w_,
                  .d = dx_router,
                  .accumulate = Accumulate::kOverwrite,
                  .a_layout = OperandLayout::kKMajor,
                  .b_layout = OperandLayout::kMNMajor});  // d_logits W_gate
  gemm_bf16(ctx, {.a = dl,
                  .b = s.x.reshape({T, D}),
                  .d = gate->grad,
                  .accumulate = Accumulate::kAdd,
                  .a_layout = OperandLayout::kMNMajor,
                  .b_layout = OperandLayout::kMNMajor});  // dW_gate += d_logits^T x
  if (dxp.defined()) {
    std::vector<Tensor> then_add{dx_router};
    if (dx_shared.defined()) then_add.push_back(dx_shared);
    return moe_permute_backward(ctx, s.map, dxp, dy.dtype(), then_add).reshape(dy.shape());
  }
  add_into(ctx, dx, dx_router);
  if (shared) {
    CastScope shared_scope(ctx, "moe.shared");
    add_into(ctx, dx, shared->backward(ctx, p, dy2, s.shared));
  }
  return dx.reshape(dy.shape());
}

}  // namespace octet
