// SwiGLU, the gated activation of DeepSeek-V3's dense and expert MLPs (Shazeer 2020; the
// transformers library's DeepseekV3MLP computes down_proj(act_fn(gate_proj(x)) * up_proj(x)) with
// act_fn = SiLU):
//
//   gate_up (rows, 2F): the output of one fused GEMM against [gate_proj; up_proj] stacked along the
//   output dimension, so columns [0, F) are the gate g and columns [F, 2F) are the up projection u.
//   h[r, j] = silu(g[r, j]) * u[r, j],   silu(g) = g * sigmoid(g)
//
// Arithmetic is FP32 (DESIGN.md section 1) with inputs widened exactly and one rounding to the
// output dtype. The element math is swiglu_math.h's, the same correctly rounded operations on host
// and device, so the CPU reference and the CUDA kernels agree bit for bit in every op of this
// header (a NaN result is always the canonical quiet NaN 0x7FC00000, whatever made it).
//
// Backward (saved: gate_up; nothing else):
//   du = dh * silu(g),   dg = dh * u * s * (1 + g * (1 - s)),  s = sigmoid(g)       written (=)
//
// Every op writes every element of its outputs (`=`, never `+=`); rows may be 0 (an expert that
// received no tokens).
#pragma once

#include "core/context.h"
#include "core/quant_tensor.h"

namespace octet {

struct SwigluForwardArgs {
  Tensor gate_up;  // (rows, 2F) bf16 or f32: gate = columns [0, F), up = columns [F, 2F)
  Tensor h;        // (rows, F) bf16 or f32: written (=)
};

void swiglu_forward(Context& ctx, const SwigluForwardArgs& args);

struct SwigluBackwardArgs {
  Tensor dh;         // (rows, F) bf16 or f32
  Tensor gate_up;    // (rows, 2F) bf16 or f32: the forward's input
  Tensor d_gate_up;  // (rows, 2F), dh's dtype: written (=), same column halves as gate_up
};

void swiglu_backward(Context& ctx, const SwigluBackwardArgs& args);

// Fused SwiGLU + 1x128 row-wise quantization (the FP8 path of DESIGN.md section 3): h is never
// stored in BF16 or FP32. Defined as quantize() (ops/quantize/quantize.h) of the FP32 h, bit for
// bit:
//   QuantizeArgs{h_f32, format, Granularity::k1x128, rounding, epsilon, QuantizeOutput::kRowwise}
// Returns data (rows, F) fp8, scale_inv (rows, ceil(F / 128)) f32, amax (1) f32 (max |h|; NaN if h
// holds a NaN), rowwise only (scaling_aware_transpose makes the column-wise copy from it).
struct SwigluQuantizeArgs {
  Tensor gate_up;  // (rows, 2F) bf16 or f32
  Fp8Format format = Fp8Format::kE4M3;
  ScaleRounding rounding = ScaleRounding::kPow2;  // DESIGN.md: SwiGLU output with power-of-2 scales
  float epsilon = 0.0f;                           // amax floor, >= 0 (numerics/scale.h)
};

QuantTensor swiglu_quantize(Context& ctx, const SwigluQuantizeArgs& args);

}  // namespace octet
