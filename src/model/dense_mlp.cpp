// SwiGLU MLP: forward, then backward in reverse order (dense_mlp.h has the math).
#include "model/dense_mlp.h"

#include "ops/swiglu/swiglu.h"

namespace octet {

Tensor SwigluMlp::forward(Context& ctx, const Precision& p, const Tensor& x, Saved& s) {
  s.gu = gate_up.forward(ctx, p, x, s.gate_up);
  Tensor h = Tensor::empty(ctx, {s.gu.rows(), s.gu.cols() / 2}, s.gu.dtype());
  swiglu_forward(ctx, {.gate_up = s.gu, .h = h});
  return down.forward(ctx, p, h, s.down).reshape(x.shape());
}

Tensor SwigluMlp::backward(Context& ctx, const Precision& p, const Tensor& dy, const Saved& s) {
  const Tensor dh = down.backward(ctx, p, dy.reshape({dy.rows(), dy.cols()}), s.down);
  Tensor dgu = Tensor::empty(ctx, s.gu.shape(), dh.dtype());
  swiglu_backward(ctx, {.dh = dh, .gate_up = s.gu, .d_gate_up = dgu});
  return gate_up.backward(ctx, p, dgu, s.gate_up);
}

}  // namespace octet
