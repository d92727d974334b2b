// Multi-Token Prediction module: forward, then backward in reverse order (mtp.h has the math).
#include "model/mtp.h"

#include "ops/layout/layout.h"

namespace octet {

Tensor MtpModule::forward(Context& ctx, const Precision& p, const RopeTable& rope,
                          const Tensor& emb, const Tensor& h_prev, int64_t B, int64_t T, Saved& s) {
  const int64_t rows = emb.rows(), D = emb.cols();
  const Tensor en = enorm.forward(ctx, emb, s.e);
  const Tensor hn = hnorm.forward(ctx, h_prev, s.h);
  Tensor cat = Tensor::empty(ctx, {rows, 2 * D}, emb.dtype());
  copy_columns(ctx, {.src = en, .dst = cat, .width = D});
  copy_columns(ctx, {.src = hn, .dst = cat, .dst_col = D, .width = D});
  const Tensor x = eh_proj.forward(ctx, p, cat, s.eh);
  return layer.forward(ctx, p, rope, x, B, T, s.layer);
}

MtpModule::Grads MtpModule::backward(Context& ctx, const Precision& p, const RopeTable& rope,
                                     const Tensor& dh, const Saved& s) {
  const Tensor dx = layer.backward(ctx, p, rope, dh, s.layer);
  const Tensor dcat = eh_proj.backward(ctx, p, dx, s.eh);
  const int64_t D = dh.cols();
  Grads g;
  g.d_emb = enorm.backward(ctx, slice_columns(ctx, dcat, 0, D, dcat.dtype()), s.e);
  g.d_h_prev = hnorm.backward(ctx, slice_columns(ctx, dcat, D, D, dcat.dtype()), s.h);
  return g;
}

}  // namespace octet
