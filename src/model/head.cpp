// Output head: forward and, under it, backward, in one call (head.h explains why).
#include "model/head.h"

#include "ops/cross_entropy/cross_entropy.h"

namespace octet {

OutputHead::Result OutputHead::run(Context& ctx, const Precision& p, const Tensor& x,
                                   const Tensor& targets, const Tensor* dloss) const {
  const int64_t rows = x.rows();
  NormLayer::Saved ns;
  const Tensor xn = norm.forward(ctx, x.reshape({rows, x.cols()}), ns);
  LinearSaved hs;
  Tensor logits = head->forward(ctx, p, xn, hs);  // (rows, V)
  Result r;
  r.loss = Tensor::empty(ctx, {1}, DType::kF32);
  r.count = Tensor::empty(ctx, {1}, DType::kI32);
  Tensor losses = Tensor::empty(ctx, {rows}, DType::kF32);
  Tensor lse = Tensor::empty(ctx, {rows}, DType::kF32);
  cross_entropy_forward(ctx, {.logits = logits,
                              .targets = targets.reshape({rows}),
                              .losses = losses,
                              .lse = lse,
                              .count = r.count,
                              .loss = r.loss});
  if (dloss == nullptr) return r;

  // The logits' gradient overwrites the logits: one buffer of (rows, V).
  cross_entropy_backward(ctx, {.logits = logits,
                               .targets = targets.reshape({rows}),
                               .lse = lse,
                               .count = r.count,
                               .dloss = *dloss,
                               .dlogits = logits});
  // The head's backward adds its weight gradient (+=) into the shared parameter.
  const Tensor dxn = const_cast<LinearLayer*>(head)->backward(ctx, p, logits, hs);
  r.dx = norm.backward(ctx, dxn, ns).reshape(x.shape());
  return r;
}

}  // namespace octet
