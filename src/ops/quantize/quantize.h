// Quantization ops: quantize, dequantize, amax, the scaling-aware transpose, and the
// delayed-scaling amax-history update. Scale arithmetic is numerics/scale.h's; this header says
// what each op reads, writes and saves.
//
// All ops run on the device of the context; tensors must live there. Outputs are freshly allocated
// (`=`, never `+=`). The CPU reference (quantize_cpu.cpp) and the CUDA kernels agree bit for bit.
#pragma once

#include "core/context.h"
#include "core/quant_tensor.h"
#include "core/scale_layout.h"
#include "numerics/scale.h"

namespace octet {

enum class QuantizeOutput : uint8_t {
  kRowwise,     // data, scale_inv
  kColumnwise,  // columnwise_data, columnwise_scale_inv only
  kBoth,        // both copies, from one read of the input
};

struct QuantizeArgs {
  Tensor input;  // (rows, cols) f32 or bf16, leading dimensions flattened into rows
  Fp8Format format = Fp8Format::kE4M3;
  Granularity granularity = Granularity::k1x128;
  ScaleRounding rounding = ScaleRounding::kExact;
  float epsilon = 0.0f;  // amax floor, >= 0
  QuantizeOutput output = QuantizeOutput::kRowwise;
  // Delayed scaling (granularity kTensor only): use this (1) fp32 scale instead of the current
  // amax. Undefined: current scaling.
  Tensor scale;
  // Granularity k1x128 only: the layout of both copies' scales (core/scale_layout.h). kMNMajor for
  // operands of the dense cuBLASLt GEMMs (read in place), kKMajor for the MoE paths.
  ScaleLayout scale_layout = ScaleLayout::kKMajor;
  // Whether the result carries amax (below). false (any granularity but kTensor, whose current
  // scaling needs it): amax stays undefined, for callers that never read it (every group-scaled
  // quantization outside delayed scaling), and on CUDA no word is zeroed for it before the kernel:
  // such a memset is a node of its own in a CUDA graph, after which the next kernel starts about
  // 3 us late (docs/benchmarks.md, "Where the time goes").
  bool amax = true;
};

// q = cvt_rn_satfinite(x * scale) per group of `granularity`.
// Row-wise copy:    data (rows, cols), scale_inv scale_shape(granularity, rows, cols, layout).
// Column-wise copy: quantize(X^T) with the same granularity applied to the (cols, rows) transpose:
//                   columnwise_data (cols, rows), columnwise_scale_inv
//                   scale_shape(g, cols, rows, layout).
// The scale values and codes do not depend on the layout, only where the scales are stored.
// amax (1): max |x| over the whole input (NaN if the input holds a NaN), unless args.amax is false.
QuantTensor quantize(Context& ctx, const QuantizeArgs& args);

// x = q * scale_inv (FP32 product; BF16 output rounds it to nearest even). Reads the row-wise copy,
// or the column-wise one with Copy::kColumnwise (then the output is (cols, rows)); either scale
// layout.
enum class Copy : uint8_t { kRowwise, kColumnwise };
Tensor dequantize(Context& ctx, const QuantTensor& q, DType out_dtype, Copy copy = Copy::kRowwise);

// max |x| over all elements of an f32 or bf16 tensor, as a (1) fp32 tensor on the context's device.
Tensor amax(Context& ctx, const Tensor& x);

// Scaling-aware transpose (FP8-Flow-MoE): from a row-wise 1x128 copy with power-of-2 scales, writes
// the column-wise copy without dequantizing: per 128x128 tile, S = max of the scale_invs of its rows
// that hold a non-zero code there (1.0 when none does), and every element moves to scale S by an
// exact power-of-2 shift, q' = q * min(s_row / S, 1). Rows whose group is all zero (quantize's
// scale_inv 1.0, the padding rows of a padded permute) do not set S: counting them would shift the
// tile's small values (gradients) towards zero. Values that stay
// normal are exact; values that become subnormal or underflow are rounded to nearest even (not
// flushed). Reads K-major scales only (an MN-major input is an error). Sets q.columnwise_data
// (cols, rows) and q.columnwise_scale_inv [ceil(cols/128), ceil(rows/128)],
// columnwise_granularity = k128x128. With columnwise = k1x128 the same scales are written in the
// 1x128 form instead: [cols, ceil(rows/128)], each tile's S repeated for its 128 rows (the grouped
// Wgrad reads its A operand per row; fp8-flow's dY and d_gate_up), columnwise_granularity = k1x128.
void scaling_aware_transpose(Context& ctx, QuantTensor& q,
                             Granularity columnwise = Granularity::k128x128);

// Delayed scaling state of one per-tensor site (TransformerEngine's DelayedScaling). Lives on the
// device of the context so that the training step never reads it back to the host.
struct DelayedScaling {
  Tensor amax_history;  // (history_len) fp32, ring buffer; slot step % history_len is the newest
  Tensor scale;         // (1) fp32: the scale the next quantize uses
  Tensor scale_inv;     // (1) fp32
};

DelayedScaling make_delayed_scaling(Context& ctx, int64_t history_len);

// Records `amax` (1) fp32 as step `step`'s entry, then sets scale from the history:
//   reduced = max(history) or the newest entry; if reduced is finite and > 0,
//   scale = compute_scale(reduced, {format, rounding, epsilon = 0, margin}); otherwise the previous
//   scale is kept. scale_inv = 1 / scale.
void delayed_scaling_update(Context& ctx, DelayedScaling& state, const Tensor& amax, int64_t step,
                            AmaxReduction reduce, const ScaleRule& rule);

}  // namespace octet
