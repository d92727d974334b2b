// Output head and loss: final RMSNorm, the output projection (BF16 GEMM, FP32 accumulation) and
// the cross-entropy (FP32 log-softmax), forward and backward in one call so that the logits, the
// largest activation of a small model, exist once and only inside it: the cross-entropy backward
// overwrites them with their gradient (ops/cross_entropy), which the projection's backward reads,
// and they are freed on return. The main head and every MTP depth's shared_head run through this.
//
//   loss = mean over targets != ignore of  -log softmax(head(norm(x)))[target]
//   dx   = d loss / dx * dloss      (with a dloss tensor; without one the call is forward only)
#pragma once

#include "model/parameter.h"

namespace octet {

struct OutputHead {
  NormLayer norm;
  LinearLayer* head = nullptr;  // shared: lm_head (or the embedding when tied)

  struct Result {
    Tensor loss;   // (1) f32 on the device: the mean cross-entropy
    Tensor count;  // (1) i32: targets counted
    Tensor dx;     // (rows, D) gradient for the input; undefined without dloss
  };
  // x (rows, D), targets (rows) i32, dloss (1) f32 (or null: forward only), all on the device.
  Result run(Context& ctx, const Precision& p, const Tensor& x, const Tensor& targets,
             const Tensor* dloss) const;
};

}  // namespace octet
