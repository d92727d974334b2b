// Linear: y = x W^T, the layer behind every GEMM site of the model (numerics/recipe.h GemmSite),
// forward and backward in the precision its GemmRecipe assigns (DESIGN.md sections 1 and 5).
//
//   Fprop  y  = x W^T        (T, Out) bf16   written (=)
//   Dgrad  dx = dy W         (T, In)  bf16   written (=)
//   Wgrad  dW += dy^T x      (Out, In) f32   accumulated (+=) into the caller's FP32 gradient, so
//                                            gradient-accumulation micro-steps simply add up
//
// The three GEMMs run as the TN GEMMs of ops/gemm/gemm.h, each in the site's precision:
//
//   bf16        Fprop  gemm_bf16(x, W_bf16)                    FP32 accumulation, BF16 out
//               Dgrad  gemm_bf16(dy, W_bf16^T)                 W^T: a BF16 copy from prepare_weight
//               Wgrad  gemm_bf16(dy^T, x^T), +=                transposed copies (ops/cast)
//               Saved: x itself (bf16).
//   fp8-block   DeepSeek-V3: x and dy in 1x128 tiles (E4M3), W in 128x128 blocks (E4M3), FP32
//               promotion every 128 of K.
//               Fprop  rowwise(x) 1x128   x rowwise(W) 128x128
//               Dgrad  rowwise(dy) 1x128  x columnwise(W) 128x128   (W^T, the same blocks)
//               Wgrad  columnwise(dy) 1x128 along T x columnwise(x) 1x128 along T, +=
//               Saved: the column-wise copy of x's QuantTensor (In, T), 1x128 tiles along tokens.
//               x's and dy's 1x128 scales (both copies) are MN-major (core/scale_layout.h), the
//               layout cuBLASLt reads in place.
//   fp8-tensor  one scale per tensor; x and W in forward_format (E4M3), dy in backward_format (E5M2
//               in the HYBRID presets); the same operand copies as fp8-block.
//               Saved: the column-wise copy of x's per-tensor QuantTensor.
// In the FP8 recipes x and dy are quantized once, with QuantizeOutput::kBoth (both copies from one
// read). Only the column-wise copy of x is kept for backward (Wgrad is its only consumer), so the
// saved activation costs one byte per element. Scales of x use the recipe's activation_rounding,
// of dy its gradient_rounding (power-of-2 where DeepSeek-V3 requires it); weight scales are exact
// (the recipe has no weight rounding and DeepSeek-V3 asks for none).
//
// Weights: the FP32 master stays with the optimizer; prepare_weight() makes the per-step copy the
// GEMMs read (BF16 and its transpose, or FP8 with both copies) once per optimizer step, so every
// gradient-accumulation micro-step reuses it. Call it again after each optimizer update.
//
// Delayed scaling (fp8-tensor with ScalingMode::kDelayed, TransformerEngine's DelayedScaling): a
// LinearScalingState holds one amax history each for x, W and dy. Every quantization uses the
// state's current scale, and after the GEMM that consumed it records this quantization's amax with
// delayed_scaling_update(), which recomputes the scale from the history. So a step quantizes with
// the scale made from the amaxes of the previous steps (the very first step uses scale 1), and its
// own amax first affects the next step. W's history advances once per prepare_weight, x's once per
// forward and dy's once per backward. Current scaling and fp8-block need no state (pass null).
//
// CUDA shape rules (cuBLASLt 13.0 on Hopper, gemm.h), checked by prepare_weight, linear_forward and
// linear_backward before any work, naming the site and the rule:
//   FP8 recipes: In, Out and T (tokens) multiples of 16. Each is the K of one of the three GEMMs
//   (Fprop K = In, Dgrad K = Out, Wgrad K = T), and FP8 rows are read in 16-byte vectors. This also
//   covers the block-scaled output rule (N % 8 for BF16 y and dx, N % 4 for the FP32 dW). T need
//   not be a multiple of 128: the last 1x128 group along tokens is partial, which gemm handles.
//   bf16 recipe: no rule beyond gemm_bf16's.
// The CPU backend takes any shape.
//
// FP32 checking mode (CPU, bf16 recipe only): x, dy and the prepared weight in F32, every GEMM in
// FP32; the model's finite-difference tests run in it.
// The FP8 MoE dispatch payload is the MoE block's business (model/grouped_linear.h).
#pragma once

#include <cstdint>

#include "core/context.h"
#include "core/quant_tensor.h"
#include "numerics/recipe.h"
#include "ops/quantize/quantize.h"

namespace octet {

struct LinearGrads {
  Tensor weight;           // (Out, In) f32: accumulated (+=) by linear_backward
  bool overwrite = false;  // written (=) instead: its first writer's (Parameter::first_writer)
};

// Delayed-scaling state of one Linear (fp8-tensor, ScalingMode::kDelayed only).
struct LinearScalingState {
  DelayedScaling x, w, dy;  // amax histories and scales, on the context's device
  // Amaxes recorded so far per tensor: the history slot the next one goes to.
  int64_t x_steps = 0, w_steps = 0, dy_steps = 0;
  AmaxReduction reduce = AmaxReduction::kMax;
  int margin = 0;
};

// QuantizeArgs for one operand of a site (GemmRecipe::quantization: format, groups, rounding),
// with the input and the copies to make; the caller adds a delayed-scaling scale.
QuantizeArgs quantize_args(const GemmRecipe& recipe, GemmOperand operand, const Tensor& input,
                           QuantizeOutput output);

// Histories of Recipe::amax_history_len zeros and scales 1, reduced and margined as the recipe
// says.
LinearScalingState make_linear_scaling_state(Context& ctx, const Recipe& recipe);

// Delayed scaling with several ranks (ctx.comm, data parallelism): an amax (f32, any count) is
// replaced, in place, by its maximum over the ranks before it enters a history, so that every
// rank keeps the same histories and scales, those of one rank seeing every rank's tensors. Every
// rank records the same sites in the same order (the same model code; an empty expert records 0),
// so the collectives match. Alone (no communicator, or one rank) nothing happens.
void reduce_amax_over_ranks(Context& ctx, const Tensor& amax);

// The per-step copy of the weight that the GEMMs read.
struct PreparedWeight {
  GemmPrecision precision = GemmPrecision::kBf16;
  int64_t out_features = 0, in_features = 0;
  Tensor bf16;      // (Out, In) bf16: bf16 recipe, Fprop's B
  QuantTensor fp8;  // FP8 recipes: data (Out, In), columnwise_data (In, Out), forward_format;
                    // 128x128 blocks (fp8-block) or one scale (fp8-tensor)
};

struct PrepareWeightArgs {
  GemmSite site = GemmSite::kAttnQDown;  // names the site in errors
  Tensor weight;                         // (Out, In) f32 master
  GemmRecipe recipe;
  LinearScalingState* state = nullptr;  // required for delayed scaling (W's history advances)
  // bf16 recipe: the dtype of the activations the GEMMs will read (kF32: the CPU's FP32 checking
  // mode, where the copy is the FP32 master itself). FP8 recipes ignore it.
  DType activation_dtype = DType::kBF16;
};

// Once per optimizer step: W in the recipe's GEMM precision (=).
PreparedWeight prepare_weight(Context& ctx, const PrepareWeightArgs& args);

// What the forward keeps for the backward, in the site's storage precision.
struct LinearSaved {
  GemmPrecision precision = GemmPrecision::kBf16;
  Tensor x;  // (T, In) bf16 (f32 in the FP32 checking mode): bf16 recipe, or an FP8 recipe
             // whose saved_storage is kE5M6 / kBf16 (x itself, shared with the caller)
  Storage storage = Storage::kFp8;  // kE5M6: x is rounded to E5M6 in backward, before Wgrad
  QuantTensor qx;  // FP8 recipes: columnwise_data (In, T) with its scales; `data` keeps only the
                   // logical shape (T, In), the row-wise copy is released after Fprop
};

struct LinearArgs {
  GemmSite site = GemmSite::kAttnQDown;  // names the site in errors
  Tensor x;                              // (T, In) bf16; leading dimensions flattened into T
  PreparedWeight weight;                 // from prepare_weight, for this optimizer step
  GemmRecipe recipe;                     // the one prepare_weight used
  LinearScalingState* state = nullptr;   // delayed scaling only (x's history advances)
  // FP8 recipes: how x is kept for Wgrad. kFp8: the column-wise copy the forward's quantization
  // made (one read, one byte per element). kE5M6: x rounded to DeepSeek-V3's E5M6 with power-of-2
  // 1x128 scales (ops/cast round_to_storage, held in BF16), quantized column-wise in backward; the
  // rounding is deterministic, so it is done in backward from x itself, which the caller keeps
  // (the attention output): no second (T, In) BF16 tensor lives across the step.
  // kBf16: x itself, quantized in backward. Delayed scaling uses x's current scale for that second
  // quantization and records no amax for it. The bf16 recipe always keeps x.
  Storage saved_storage = Storage::kFp8;
  // FP8 recipes, saved_storage kFp8, no delayed scaling: x's quantization (both copies) shared
  // with other Linears that read the same x and quantize it alike (same_input_quantization), as
  // MLA's q_a and kv_a read the normed layer input. Empty: filled by this call; filled: used as
  // it is (no second quantization, and the saved column-wise copy is the same buffer).
  QuantTensor* shared_x = nullptr;
};

// Whether two sites quantize their input identically (so one quantization of a shared x serves
// both through LinearArgs::shared_x): FP8, no delayed scaling, the same format, groups, rounding.
bool same_input_quantization(const GemmRecipe& a, const GemmRecipe& b);

// y (x's leading dims, Out) bf16 = x W^T, written (=); fills `saved` (=).
Tensor linear_forward(Context& ctx, const LinearArgs& args, LinearSaved& saved);

struct LinearBackwardArgs {
  GemmSite site = GemmSite::kAttnQDown;  // names the site in errors
  Tensor dy;                             // (T, Out) bf16; leading dimensions flattened into T
  LinearSaved saved;                     // from linear_forward
  PreparedWeight weight;                 // the one the forward used
  GemmRecipe recipe;
  LinearScalingState* state = nullptr;  // delayed scaling only (dy's history advances)
};

// dx (dy's leading dims, In) bf16 = dy W, written (=); grads.weight (Out, In) f32 += dy^T x (or
// = with grads.overwrite).
Tensor linear_backward(Context& ctx, const LinearBackwardArgs& args, LinearGrads& grads);

}  // namespace octet
