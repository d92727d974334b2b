// SwiGLU MLP: forward, then backward in reverse order (dense_mlp.h has the math).
#include "model/dense_mlp.h"

#include "ops/swiglu/swiglu.h"

namespace octet {
namespace {

// Whether the SwiGLU (or its backward) runs fused with the quantization of its output: the next
// Linear quantizes that operand in 1x128 groups (fp8-block, never delayed) and no probe reads the
// unquantized tensor. The fused ops give that Linear's own quantization of the stored tensor.
bool fused_quantize(const Precision& p, const GemmRecipe& r, GemmOperand operand) {
  return p.probe == nullptr && r.precision == GemmPrecision::kFp8Block && !r.is_delayed() &&
         r.quantization(operand).granularity == Granularity::k1x128;
}

}  // namespace

Tensor SwigluMlp::forward(Context& ctx, const Precision& p, const Tensor& x, Saved& s) {
  s.gu = gate_up.forward(ctx, p, x, s.gate_up);
  const int64_t rows = s.gu.rows(), width = s.gu.cols() / 2;
  const GemmRecipe& down_r = p.recipe.at(down.site);
  if (fused_quantize(p, down_r, GemmOperand::kActivation)) {
    // h exists only as down's two FP8 copies (row-wise for Fprop, column-wise kept for Wgrad).
    const GemmRecipe::Quantization q = down_r.quantization(GemmOperand::kActivation);
    QuantTensor hq = swiglu_quantize_stored(ctx, {.gate_up = s.gu,
                                                  .format = q.format,
                                                  .rounding = q.rounding,
                                                  .output = QuantizeOutput::kBoth});
    const Tensor h = Tensor::wrap(nullptr, {rows, width}, s.gu.dtype(), ctx.device);
    return down.forward(ctx, p, h, s.down, Storage::kFp8, &hq).reshape(x.shape());
  }
  Tensor h = Tensor::empty(ctx, {rows, width}, s.gu.dtype());
  swiglu_forward(ctx, {.gate_up = s.gu, .h = h});
  return down.forward(ctx, p, h, s.down).reshape(x.shape());
}

Tensor SwigluMlp::backward(Context& ctx, const Precision& p, const Tensor& dy, const Saved& s) {
  const Tensor dh = down.backward(ctx, p, dy.reshape({dy.rows(), dy.cols()}), s.down);
  const GemmRecipe& up_r = p.recipe.at(gate_up.site);
  if (fused_quantize(p, up_r, GemmOperand::kGradient) && dh.dtype() == s.gu.dtype()) {
    // dgu exists only as gate_up's two FP8 copies of its gradient (Dgrad's and Wgrad's).
    const GemmRecipe::Quantization q = up_r.quantization(GemmOperand::kGradient);
    const QuantTensor dq = swiglu_backward_quantize_stored(ctx, {.gate_up = s.gu,
                                                                 .dh = dh,
                                                                 .format = q.format,
                                                                 .rounding = q.rounding,
                                                                 .output = QuantizeOutput::kBoth});
    const Tensor dgu = Tensor::wrap(nullptr, s.gu.shape(), dh.dtype(), ctx.device);
    return gate_up.backward(ctx, p, dgu, s.gate_up, &dq);
  }
  Tensor dgu = Tensor::empty(ctx, s.gu.shape(), dh.dtype());
  swiglu_backward(ctx, {.dh = dh, .gate_up = s.gu, .d_gate_up = dgu});
  return gate_up.backward(ctx, p, dgu, s.gate_up);
}

}  // namespace octet
