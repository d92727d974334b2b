// SwiGLU MLP: the dense MLP of the first first_k_dense_replace layers and the MoE's shared experts.
//
//   gu  = gate_up_proj(x)           (rows, 2I): gate_proj rows [0, I), up_proj rows [I, 2I) of the
//                                   fused weight, so one GEMM computes both
//   h   = silu(gu[:, :I]) * gu[:, I:]   (ops/swiglu, FP32 math)
//   out = down_proj(h)
//
// Both projections are Linear sites in the recipe's precision (dense or shared-expert sites).
// Saved: each Linear's input in its site's storage and gu (for the SwiGLU backward).
//
// When the next Linear quantizes in 1x128 groups (fp8-block: deepseek, fp8-flow), the SwiGLU and
// its backward run fused with that quantization (ops/swiglu swiglu_quantize_stored and
// swiglu_backward_quantize_stored): one kernel reads gu (and dh) and writes down's FP8 input, or
// gate_up's FP8 gradient, both copies, bit for bit what the unfused op followed by the Linear's
// own quantization gives (h and dgu rounded to BF16 as they were stored, then quantized with the
// site's exact or power-of-2 scales). h and dgu are then never written in BF16: two launches and
// a BF16 round trip of (rows, I) and (rows, 2I) fewer per pass. Other recipes, and runs with a
// site probe (which reads the unquantized tensors), run the unfused pair.
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
