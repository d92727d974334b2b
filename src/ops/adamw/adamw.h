// Fused AdamW over a flat parameter group with FP32 master weights and BF16 moments (DeepSeek-V3
// report section 3.3.2), the deterministic global gradient L2 norm, the clipping coefficient and
// the non-finite check. Everything stays on the device: no host synchronisation.
//
// AdamW step (decoupled weight decay, Loshchilov & Hutter; the order of torch.optim.AdamW), per
// element, every operation one FP32 rounding (numerics/fp32_rn.h), so CPU and CUDA agree bit for
// bit:
//   g  = grad                       ; g = g * grad_scale          (when grad_scale is given)
//   m  = float(m_bf16)              ; v = float(v_bf16)           (exact widening)
//   m  = beta1 * m + (1 - beta1) * g                              (two products, then the sum)
//   v  = beta2 * v + (1 - beta2) * (g * g)
//   p  = p * (1 - lr * weight_decay)                              (decay first, as torch does)
//   p  = p - step_size * (m / (sqrt(v) / bc2_sqrt + eps))
//   store p (f32), bf16_rn(m), bf16_rn(v), and bf16_rn(p) into param_bf16 when given
// The update uses the FP32 m and v of this step (before their rounding to BF16). Host-side
// constants, computed once per call in double and rounded to FP32: (1 - beta1), (1 - beta2), (1 -
// lr * wd), step_size = lr / (1 - beta1^step), bc2_sqrt = sqrt(1 - beta2^step). With found_inf
// given and nonzero, the step changes nothing (parameters, moments, bf16 copy).
#pragma once

#include <vector>

#include "core/context.h"
#include "numerics/fp8.h"
#include "numerics/scale.h"

namespace octet {

struct AdamWArgs {
  Tensor param;       // (N) f32 master weights, any shape, updated in place
  Tensor grad;        // (N) f32, same element count
  Tensor exp_avg;     // (N) bf16 first moment m, updated in place
  Tensor exp_avg_sq;  // (N) bf16 second moment v, updated in place
  Tensor param_bf16;  // (N) bf16, optional: receives the updated weights for the forward pass
  Tensor grad_scale;  // (1) f32 on the device, optional: g *= grad_scale (global-norm clipping)
  Tensor found_inf;   // (1) int32 on the device, optional: nonzero skips the step
  // (8) f32 on the device, optional: the step's constants as adamw_device_consts wrote them (lr,
  // step and weight_decay below are then not used; beta1, beta2 and eps must match). What a
  // replayed optimizer graph reads: the step count lives on the device.
  Tensor consts;
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;  // DeepSeek-V3's value
  float eps = 1e-8f;
  float weight_decay = 0.1f;  // DeepSeek-V3's value
  int64_t step = 1;           // 1-based count of steps taken including this one (bias correction)
};

void adamw_step(Context& ctx, const AdamWArgs& args);

// The weights the next forward reads, written by the same pass (the per-step weight preparation of
// the fp8-block recipes, fused into the optimizer): the updated master, seen as a (rows, cols)
// matrix, quantized in 128x128 blocks exactly as ops/quantize does it (granularity k128x128,
// QuantizeOutput::kBoth), so the bytes and scales equal a separate quantize() of the updated
// master. With batch_rows > 0 the matrix is a stack of (batch_rows, cols) matrices (the grouped
// experts' (E Out, In)) and the column-wise copy is each one transposed, stacked. With found_inf
// set the master and moments stay unchanged and the outputs are rewritten from them (the same bytes
// a preparation of the unchanged master gives).
struct BlockQuantOutput {
  Fp8Format format = Fp8Format::kE4M3;
  ScaleRounding rounding = ScaleRounding::kExact;
  int64_t rows = 0, cols = 0;   // rows * cols = the parameter's element count
  int64_t batch_rows = 0;       // 0, or a multiple of 128 that divides rows
  Tensor data;                  // (rows, cols) fp8 (format's dtype): written (=)
  Tensor scale_inv;             // ceil(rows / 128) x ceil(cols / 128) f32: written (=)
  Tensor columnwise_data;       // (cols, rows), or (rows / batch_rows, cols, batch_rows): written
  Tensor columnwise_scale_inv;  // the transpose's block scales, per matrix: written (=)
};

// adamw_step, then the block quantization of the updated weights, in one pass on CUDA (args'
// param_bf16 must be undefined): a thread block per 128x128 tile updates it, stages the new master
// in shared memory and writes both FP8 copies from there (adamw_block_kernels.cuh), 22 bytes per
// parameter plus the scales. The CPU runs the two steps one after the other.
void adamw_step_block_quantize(Context& ctx, const AdamWArgs& args, const BlockQuantOutput& out);

// adamw_step_block_quantize for many parameters at once (the optimizer's FP8-block parameters):
// the same bytes as one call per step, in one launch on CUDA for up to 56 parameters, the largest
// first, a thread block per 128x128 tile of any of them. Most of a model's FP8 weights are small
// (attention projections, shared experts): a launch each would leave the GPU mostly idle for the
// launch's latency and its last partial wave. Every step is checked before any runs; no two steps
// may share a parameter, a moment or an output. The CPU runs the steps in order.
struct BlockQuantStep {
  AdamWArgs args;
  BlockQuantOutput out;
};
void adamw_step_block_quantize_many(Context& ctx, const std::vector<BlockQuantStep>& steps);

// Global L2 norm sqrt(sum_i sum_x x^2) over a list of f32 tensors, returned as (1) f32 on the
// context's device (freshly allocated). Fixed order, hence bitwise deterministic and equal on CPU
// and CUDA: each tensor is cut into chunks of 4096 elements (256 lanes x 16); lane l of a chunk
// sums x*x of its elements l, l + 256, ..., l + 15 * 256 in order in FP32 (from 0.0); the 256 lane
// sums reduce in FP32 by halving (for h = 128, 64, ..., 1: lane[l] += lane[l + h], l < h). The
// chunk partials of all tensors, in list order, are then summed in FP64: thread l of 256 adds
// partials l, l + 256, ... in order, the 256 sums reduce by halving as above; norm =
// FP32(sqrt(total)) (FP64 sqrt, one rounding). A chunk partial that overflows FP32 (elements near
// 1e19) makes the norm inf; a NaN makes it NaN.
Tensor global_grad_norm(Context& ctx, const std::vector<Tensor>& grads);

// Clipping coefficient of torch.nn.utils.clip_grad_norm_: min(1, max_norm / (norm + 1e-6)) as (1)
// f32 on the device (FP32 operations). A NaN norm gives NaN (as torch's clamp does); an infinite
// one 0.
Tensor grad_clip_coefficient(Context& ctx, const Tensor& norm, float max_norm);

// (1) int32 on the device: 1 when any element of any tensor is NaN or +-inf, else 0.
Tensor nonfinite_flag(Context& ctx, const std::vector<Tensor>& grads);

// The step's constants of the AdamW arithmetic above computed on the device from a step count that
// lives there (steps_taken + 1 is this step's), for AdamWArgs::consts: out[0..7] with weight_decay,
// out[8..15] without (the parameters without decay). The same formulas as the host's, in double
// (the device's pow and sqrt), rounded to FP32. Enqueued only; reads nothing back.
inline constexpr int kAdamWConstsFloats = 8;
struct AdamWDeviceConstsArgs {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
  Tensor steps_taken;  // (1) i64 on the device: applied steps before this one
  Tensor out;          // (16) f32 on the device: written
};
void adamw_device_consts(Context& ctx, const AdamWDeviceConstsArgs& args);

// steps += 1 unless skipped (the step's found_inf flag, (1) int32; undefined: never skipped). The
// device-side step count of an optimizer whose skip is decided on the device.
void adamw_advance_steps(Context& ctx, const Tensor& steps, const Tensor& skipped);

}  // namespace octet
