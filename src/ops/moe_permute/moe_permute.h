// MoE dispatch and combine on one device: permute tokens into the contiguous expert-grouped layout,
// unpermute-and-combine the expert outputs, and the backward of both.
//
// Layout (what ops/grouped_gemm reads): rows of expert 0, then expert 1, ...; within an expert the
// tokens in ascending order (a stable counting sort by expert id: deterministic). Expert e owns
// rows [offsets[e], offsets[e] + counts[e]). With PermutePadding::kTo128 every expert's block is
// padded with zero rows to a multiple of 128 (DeepGEMM's contiguous layout; needed by the FP8
// Wgrad, see grouped_gemm.h); the number of rows in use, offsets[E], is then known only on the
// device, so the permuted tensors have the static upper bound R = floor((T k + 127 E) / 128) * 128
// rows, and every row from offsets[E] on is padding too. Without padding R = T k and there is none.
//
// Padding rows: payload 0 (FP8 code 0x00), FP8 scale_inv 1.0 (what quantize writes for an all-zero
// group), token_of -1, and they receive no gradient. All outputs are freshly allocated (`=`).
// CPU and CUDA agree bit for bit: the maps are integers, the payload moves are copies, and every
// reduction runs in the fixed order stated here with one rounding per FP32 operation.
#pragma once

#include <vector>

#include "core/context.h"
#include "core/quant_tensor.h"
#include "ops/quantize/quantize.h"

namespace octet {

enum class PermutePadding : uint8_t {
  kNone,   // R = T k rows, no padding
  kTo128,  // each expert's rows padded to a multiple of 128 (DeepGEMM contiguous layout)
};

struct PermuteMapArgs {
  Tensor topk_idx;  // (T, k) int32: expert ids in [0, E), distinct within a token (router output)
  int64_t num_experts = 0;  // E
  PermutePadding padding = PermutePadding::kNone;
};

struct PermuteMap {
  Tensor row_of;       // (T, k) int32: permuted row of token t's j-th choice
  Tensor token_of;     // (R) int32: source token of each permuted row, -1 for padding rows
  Tensor counts;       // (E) int32: tokens routed to each expert
  Tensor group_sizes;  // (E) int32: rows of each expert including padding (== counts with kNone)
  Tensor offsets;      // (E + 1) int32: first row of each expert; offsets[E] = rows in use
  int64_t num_tokens = 0;  // T
  int64_t top_k = 0;       // k
  int64_t num_experts = 0;
  int64_t num_rows = 0;  // R
  PermutePadding padding = PermutePadding::kNone;
};

// Builds the map on the context's device (CUDA: CUB's stable radix sort by expert id; no host
// sync). The CPU throws for an id outside [0, E) or repeated within a token; CUDA treats such a
// choice as dropped (row_of -1, not counted) so that a bad id cannot write out of bounds.
PermuteMap moe_permute_map(Context& ctx, const PermuteMapArgs& args);

// out[r] = x[token_of[r]] (a copy), padding rows 0. x: (T, D) bf16 | f32 -> (R, D) of the same
// dtype.
Tensor moe_permute(Context& ctx, const PermuteMap& map, const Tensor& x);

// The FP8 dispatch of DESIGN.md section 3 (quantize once before dispatch): data rows and their
// 1x128 scale_inv rows move together. x: row-wise copy (T, D) fp8 with 1x128 scale_inv (T,
// ceil(D/128)) -> (R, D), (R, ceil(D/128)); format, rounding and amax (shared, unchanged) carried
// over; no column-wise copy.
QuantTensor moe_permute(Context& ctx, const PermuteMap& map, const QuantTensor& x);

// The column-wise copy of the FP8 dispatch without the dispatch: scaling_aware_transpose
// (quantize.h) of moe_permute(map, x), bit for bit (the CPU's reference), with the (R, D) row-wise
// gather never stored. x: row-wise (T, D) fp8 with 1x128 power-of-2 scale_inv. Returns a QuantTensor
// whose columnwise_data (D, R) and columnwise_scale_inv are set, in `columnwise` granularity as
// scaling_aware_transpose writes them (128x128 tiles, or their 1x128 form: each tile's scale for
// each of its rows), and whose row-wise data is a shape without storage; format, rounding and amax
// carried over. Counts one FP8 transpose.
QuantTensor moe_permute_transposed(Context& ctx, const PermuteMap& map, const QuantTensor& x,
                                   Granularity columnwise = Granularity::k128x128);

// The fused FP8 dispatch: quantize x (T, D) bf16 | f32 in 1x128 groups (args: format, rounding,
// epsilon; granularity k1x128, output kRowwise, no given scale) and permute the payload and its
// scales in one pass: each token's row is read once and quantized once, and written to each of its
// k destination rows (no (T, D) FP8 intermediate, no BF16 permuted copy). Bit for bit
// moe_permute(map, quantize(args)), which is the CPU's reference: (R, D) fp8 with 1x128 scale_inv
// (R, ceil(D/128)), padding rows as above, amax (1) over the whole of x.
QuantTensor moe_permute_quantize(Context& ctx, const PermuteMap& map, const QuantizeArgs& args);

// The same dispatch, also returning x's quantized rows themselves, from the same pass: `rows` is
// (T, D) fp8 with 1x128 scale_inv (T, ceil(D/128)), bit for bit quantize(args) (fp8-flow keeps them
// for gate_up's Wgrad copy, moe_permute_transposed). Both share one amax tensor. Counts one
// quantization, as moe_permute_quantize. Given the routing weights topk_weight (T, k) f32, the
// same pass also moves them onto the permuted rows: w_rows is bit for bit
// moe_permute_weights(map, topk_weight) (moe_row_weight.h; fp8-flow's weight per row).
struct PermuteQuantizeResult {
  QuantTensor permuted;  // moe_permute_quantize's result
  QuantTensor rows;      // quantize(args)
  Tensor w_rows;         // (R) f32 when topk_weight was given, else undefined
};
PermuteQuantizeResult moe_permute_quantize_keeping_rows(Context& ctx, const PermuteMap& map,
                                                        const QuantizeArgs& args,
                                                        const Tensor& topk_weight = Tensor());

// The fused FP8 dispatch with its column-wise copy: moe_permute_quantize(map, args) whose result
// also holds columnwise_data (D, R) and columnwise_scale_inv in `columnwise` granularity, bit for
// bit moe_permute_transposed(map, quantize(args), columnwise) (the CPU's reference is those two
// ops). args as moe_permute_quantize's, with power-of-2 scales. On CUDA (BF16 x, D % 16 == 0, R %
// 16 == 0) one pass: a block per 128x128 tile of the permuted rows quantizes them and transposes
// its own codes, so neither the token rows nor the permuted rows are read back. fp8-flow's
// backward dispatch of dY, which down's Wgrad reads column-wise. Counts one quantization and one
// FP8 transpose, as the two ops it replaces.
QuantTensor moe_permute_quantize_transposed(Context& ctx, const PermuteMap& map,
                                            const QuantizeArgs& args, Granularity columnwise);

// Backward of moe_permute (gather back): d_x[t] = sum_{j = 0..k-1} d_permuted[row_of[t, j]],
// accumulated in FP32 in slot order j (from 0.0), rounded once to out_dtype (nearest even for
// bf16). d_permuted: (R, D) bf16 | f32 -> (T, D) out_dtype (bf16 | f32).
//
// then_add (here and in CombineArgs): at most two (T, D) tensors of out_dtype, added to the result
// in order in the same pass, each as add_into (ops/cast/cast.h) adds: out = round(round(out) + a0),
// then round(out + a1). Bit for bit the op followed by add_into(out, a0) and add_into(out, a1),
// without their passes over the (T, D) result (the MoE layer's shared experts and residual).
Tensor moe_permute_backward(Context& ctx, const PermuteMap& map, const Tensor& d_permuted,
                            DType out_dtype, const std::vector<Tensor>& then_add = {});

// moe_permute_backward and moe_permute_weights_backward(map, d_rows) (moe_row_weight.h) in one
// pass, bit for bit both: fp8-flow's combine backward, which also takes the routing weights'
// gradient from the permuted rows. d_rows: (R) f32.
struct PermuteBackwardResult {
  Tensor d_x;            // (T, D) out_dtype
  Tensor d_topk_weight;  // (T, k) f32
};
PermuteBackwardResult moe_permute_backward_with_weights(Context& ctx, const PermuteMap& map,
                                                        const Tensor& d_permuted, DType out_dtype,
                                                        const Tensor& d_rows);

struct CombineArgs {
  Tensor expert_out;   // (R, D) bf16 | f32: outputs of the expert FFNs in the permuted layout
  Tensor topk_weight;  // (T, k) f32: router weights
  DType out_dtype = DType::kBF16;     // bf16 | f32
  std::vector<Tensor> then_add = {};  // added after the rounding (moe_permute_backward's)
};

// Unpermute and combine: out[t] = sum_{j = 0..k-1} w[t, j] * expert_out[row_of[t, j]]:
// acc = 0.0f; for j in order: acc = acc + (w * x) (each FP32 operation rounded); out = round(acc).
Tensor moe_combine(Context& ctx, const PermuteMap& map, const CombineArgs& args);

struct CombineBackwardArgs {
  Tensor d_out;                             // (T, D) bf16 | f32: gradient of the combine output
  Tensor expert_out;                        // (R, D) bf16 | f32, as given to the forward (saved)
  Tensor topk_weight;                       // (T, k) f32, as given to the forward (saved)
  DType d_expert_out_dtype = DType::kBF16;  // bf16 | f32
};

struct CombineGrads {
  Tensor d_expert_out;   // (R, D): row row_of[t, j] = round(w[t, j] * d_out[t]); padding rows 0
  Tensor d_topk_weight;  // (T, k) f32: <d_out[t], expert_out[row_of[t, j]]>, order below
};

// d_topk_weight's dot product over D in a fixed order (the CUDA warp's): 32 partial sums, partial l
// adds the products d * x of columns l, l + 32, l + 64, ... in order (from 0.0); then
// for h = 16, 8, 4, 2, 1: partial[l] += partial[l + h] for l < h; the result is partial[0].
CombineGrads moe_combine_backward(Context& ctx, const PermuteMap& map,
                                  const CombineBackwardArgs& args);

}  // namespace octet
