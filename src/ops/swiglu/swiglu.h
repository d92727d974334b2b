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
//
// gate_up kept in FP8 (Recipe::moe_swiglu_input fp8, DeepSeek-V3's "SwiGLU input cached in FP8"):
// swiglu_quantize_caching_input writes gate_up's own 1x128 row-wise copy in the pass that reads it,
// and swiglu_backward, swiglu_quantize and swiglu_backward_quantize read such a copy in place of the
// BF16 tensor (args.gate_up_fp8, args.gate_up left undefined). The copy is dequantized in registers
// to dh's dtype (swiglu_quantize: gate_up_dtype), exactly as dequantize(gate_up_fp8, dtype) would
// (code * scale_inv as one FP32 product, then rounded to BF16 for bf16): every output is bit for
// bit the op's output on the dequantized tensor. The copy's groups run along the whole 2F row (a
// group straddles the gate/up halves when F % 128 != 0); its scales are K-major (core/scale_layout.h).
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
  Tensor dh;                  // (rows, F) bf16 or f32
  Tensor gate_up;             // (rows, 2F) bf16 or f32: the forward's input, or undefined when
  Tensor d_gate_up;           // (rows, 2F), dh's dtype: written (=), same column halves as gate_up
  QuantTensor gate_up_fp8{};  // ... gate_up is given as its 1x128 FP8 copy (read as dh's dtype)
};

void swiglu_backward(Context& ctx, const SwigluBackwardArgs& args);

// Fused SwiGLU + 1x128 row-wise quantization (the FP8 path of DESIGN.md section 3): h is never
// stored in BF16 or FP32. Defined as quantize() (ops/quantize/quantize.h) of the FP32 h, bit for
// bit:
//   QuantizeArgs{h_f32, format, Granularity::k1x128, rounding, epsilon, QuantizeOutput::kRowwise}
// Returns data (rows, F) fp8, scale_inv (rows, ceil(F / 128)) f32, amax (1) f32 (max |h|; NaN if h
// holds a NaN), rowwise only (scaling_aware_transpose makes the column-wise copy from it).
//
// With row_weight (FP8-Flow-MoE's dataflow: the routing weight moves from the combine into the
// expert, so the combine and its backward carry no per-row factor and the backward dispatch can move
// FP8 rows unchanged), the quantized value is h[r, j] * row_weight[r], one more FP32 rounding.
struct SwigluQuantizeArgs {
  Tensor gate_up;  // (rows, 2F) bf16 or f32, or undefined when gate_up_fp8 is given
  Fp8Format format = Fp8Format::kE4M3;
  ScaleRounding rounding = ScaleRounding::kPow2;  // DESIGN.md: SwiGLU output with power-of-2 scales
  float epsilon = 0.0f;                           // amax floor, >= 0 (numerics/scale.h)
  Tensor row_weight{};                            // (rows) f32, or undefined (weight 1)
  QuantTensor gate_up_fp8{};                      // gate_up's 1x128 FP8 copy, read as ...
  DType gate_up_dtype = DType::kBF16;             // ... this dtype (bf16 or f32)
  // Whether the results carry amax (QuantizeArgs::amax: false leaves it undefined and, on CUDA,
  // saves the memset before the kernel).
  bool amax = true;
};

QuantTensor swiglu_quantize(Context& ctx, const SwigluQuantizeArgs& args);

// swiglu_quantize (args.gate_up a BF16 or FP32 tensor) and, in the same pass over gate_up, its own
// 1x128 row-wise FP8 copy: bit for bit
//   quantize(QuantizeArgs{gate_up, format, Granularity::k1x128, rounding, 0, kRowwise, {}, kKMajor})
// data (rows, 2F) fp8, scale_inv (rows, ceil(2F / 128)) f32, amax (1) f32 (max |gate_up|).
struct SwigluInputCache {
  Fp8Format format = Fp8Format::kE4M3;
  ScaleRounding rounding = ScaleRounding::kPow2;
};
struct SwigluQuantizeCachedResult {
  QuantTensor h;        // swiglu_quantize's result
  QuantTensor gate_up;  // gate_up's copy
};
SwigluQuantizeCachedResult swiglu_quantize_caching_input(Context& ctx,
                                                         const SwigluQuantizeArgs& args,
                                                         const SwigluInputCache& cache = {});

// Backward of swiglu_quantize fused with the 1x128 row-wise quantization of its output (FP8-Flow:
// the gate/up Dgrad and Wgrad read d_gate_up in FP8, so it is never stored in BF16). With
// w = row_weight[r] (1 when undefined) and hw = h * w the forward's weighted output:
//   dh'  = dh * w                                      (FP32, skipped without row_weight)
//   dg, du = swiglu_backward's element math on (g, u, dh')
//   d_gate_up = quantize(dg | du) in 1x128 groups along the 2F columns (a group may straddle the
//               gate/up boundary when F is not a multiple of 128), as quantize() would bit for bit
//   d_row_weight[r] = sum_j dh[r, j] * h[r, j]   (h = silu(g) * u recomputed in FP32), in the
//               CUDA warp's fixed order: 32 partial sums, partial l adds the products of columns
//               l, l + 32, l + 64, ... in order (from 0.0), then for s = 16, 8, 4, 2, 1:
//               partial[l] += partial[l + s]; the result is partial[0]. One rounding per operation.
// CPU and CUDA agree bit for bit (data, scale_inv, amax, d_row_weight).
//
// With want_h, the same pass also returns the forward's output again, quantized: bit for bit
//   swiglu_quantize({gate_up (or gate_up_fp8 read as dh's dtype), h_format, h_rounding, epsilon 0,
//                    row_weight})
// (fp8-flow's backward: down's Wgrad reads h, which the forward did not keep; computing it here
// saves the pass of its own over gate_up that swiglu_quantize would take).
struct SwigluBackwardQuantizeArgs {
  Tensor dh;            // (rows, F) bf16 or f32: gradient of the forward's (weighted) output
  Tensor gate_up;       // (rows, 2F) bf16 or f32: the forward's input (saved), or undefined when
  Tensor row_weight{};  // (rows) f32, or undefined: as given to swiglu_quantize
  Fp8Format format = Fp8Format::kE4M3;
  ScaleRounding rounding =
      ScaleRounding::kPow2;   // pow2: the Wgrad copy is a scaling-aware transpose
  float epsilon = 0.0f;       // amax floor, >= 0
  QuantTensor gate_up_fp8{};  // ... gate_up is given as its 1x128 FP8 copy (read as dh's dtype)
  bool want_h = false;        // also h, quantized with:
  Fp8Format h_format = Fp8Format::kE4M3;
  ScaleRounding h_rounding = ScaleRounding::kPow2;
  bool amax = true;  // whether the results carry amax (QuantizeArgs::amax)
};

struct SwigluBackwardQuantizeResult {
  QuantTensor d_gate_up;  // data (rows, 2F) fp8, scale_inv (rows, ceil(2F / 128)), amax (1)
  Tensor d_row_weight;    // (rows) f32 when row_weight was given, else undefined
  QuantTensor h;          // with want_h: swiglu_quantize's result (rows, F), else empty
};

SwigluBackwardQuantizeResult swiglu_backward_quantize(Context& ctx,
                                                      const SwigluBackwardQuantizeArgs& args);

}  // namespace octet
