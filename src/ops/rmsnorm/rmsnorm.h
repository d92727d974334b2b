// RMSNorm (Zhang & Sennrich 2019) as DeepSeek-V3 uses it: FP32 arithmetic, BF16 in and out in the
// model (DESIGN.md section 1), F32 in and out for the all-FP32 gradient-check mode.
//
//   rstd[r]   = 1 / sqrt(mean_j x[r, j]^2 + epsilon)                      saved for backward
//   y[r, j]   = x[r, j] * rstd[r] * w[j]                                  one rounding to y's dtype
//
// The transformers library's DeepseekV3RMSNorm rounds x * rstd to the input dtype before
// multiplying by the weight; octet keeps the whole product in FP32 and rounds once (at most one
// BF16 ulp apart).
//
// Backward, with xhat = x * rstd and g = dy * w:
//   dx[r, j]  = rstd[r] * (g[r, j] - xhat[r, j] * mean_k(g[r, k] * xhat[r, k]))      written (=)
//   dw[j]    += sum_r dy[r, j] * xhat[r, j]                                          accumulated
//   (+=)
//
// Fused residual adds (the decoder layer's pre-norm residual stream), each element exactly
// add_into's (ops/cast/cast.h: one FP32 add, one rounding), so the fused call gives the bits of
// add_into followed by the plain call:
//   forward with `residual`:        x += residual (in place), then the norm of the sum
//   backward with `residual_grad`:  dx = round(dx) + residual_grad (rounded again)
//
// All tensors live on the context's device; leading dimensions of x are flattened into rows.
// Determinism: the CUDA backward sums dw over a fixed partition of the rows (a function of the row
// count and width only, not of the GPU) in a fixed order, so it is bitwise reproducible run to run
// and across GPUs. The CPU reference sums in FP64, rounds the sum to FP32 and adds it to dw in
// FP32 (one rounding each, so accumulation over calls is an FP32 sum of per-call results, as a
// reduction over ranks is); CPU and CUDA agree to FP32 rounding, not bit for bit (different
// summation order).
#pragma once

#include "core/context.h"

namespace octet {

struct RmsNormForwardArgs {
  Tensor x;               // (rows, D) bf16 or f32; with `residual`: updated in place (+=)
  Tensor weight;          // (D) f32
  float epsilon = 1e-6f;  // > 0 (DeepseekV3Config.rms_norm_eps)
  Tensor y;               // (rows, D) bf16 or f32, x's shape: written (=)
  Tensor rstd;            // (rows) f32: written (=), saved for backward
  Tensor residual;        // optional (rows, D), x's dtype and shape: added into x first
};

void rmsnorm_forward(Context& ctx, const RmsNormForwardArgs& args);

struct RmsNormBackwardArgs {
  Tensor dy;             // (rows, D) bf16 or f32
  Tensor x;              // (rows, D) bf16 or f32: the forward's input
  Tensor weight;         // (D) f32
  Tensor rstd;           // (rows) f32: saved by rmsnorm_forward
  Tensor dx;             // (rows, D), dy's dtype: written (=)
  Tensor dweight;        // (D) f32: accumulated (+=)
  Tensor residual_grad;  // optional (rows, D), dy's dtype and shape: added to dx
};

void rmsnorm_backward(Context& ctx, const RmsNormBackwardArgs& args);

}  // namespace octet
