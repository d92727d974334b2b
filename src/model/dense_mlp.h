// SwiGLU MLP: the dense MLP of the first first_k_dense_replace layers and the MoE's shared experts.
//
//   gu  = gate_up_proj(x)           (rows, 2I): gate_proj rows [0, I), up_proj rows [I, 2I) of the
//                                   fused weight, so one GEMM computes both
//   h   = silu(gu[:, :I]) * gu[:, I:]   (ops/swiglu, FP32 math)
//   out = down_proj(h)
//
// Both projections are Linear sites in the recipe's precision (dense or shared-expert sites).
// Saved: each Linear's input in its site's storage and gu (for the SwiGLU backward).
#pragma once

#include "model/parameter.h"

namespace octet {

struct SwigluMlp {
  LinearLayer gate_up, down;

  struct Saved {
    LinearSaved gate_up, down;
    Tensor gu;  // (rows, 2I)
  };
  Tensor forward(Context& ctx, const Precision& p, const Tensor& x, Saved& s);
  // dx (=); the weights' grads (+=).
  Tensor backward(Context& ctx, const Precision& p, const Tensor& dy, const Saved& s);
};

}  // namespace octet
