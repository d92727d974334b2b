// Grouped Linear: the routed experts' projections, E Linear layers applied to the contiguous
// permuted layout of ops/moe_permute (expert e's rows are [o_e, o_e + M_e)), forward and backward.
//
//   Fprop  Y_e  = X_e W_e^T     Dgrad  dX_e = dY_e W_e     Wgrad  dW_e += dY_e^T X_e   (+= FP32)
//
// W is one stacked master parameter (E, Out, In). Per precision:
//   bf16        ops/grouped_gemm BF16 (F32 in the CPU's FP32 checking mode); W and each expert's
//               W_e^T as BF16 copies; saved: X.
//   fp8-block   DeepSeek-V3: X and dY in 1x128 tiles, W_e in 128x128 blocks quantized per expert
//               (both copies, stacked with rank-3 scales so no block straddles two experts);
//               ops/grouped_gemm FP8. X may arrive already quantized (the FP8 dispatch payload,
//               power-of-2 scales): its column-wise copy for Wgrad then comes from the
//               scaling-aware transpose instead of a second quantization. Saved: X's column-wise
//               FP8 copy. The column-wise copy of a pre-quantized tensor follows the recipe's
//               fp8_transpose (the scaling-aware transpose, or dequantize + requantize to measure
//               the double quantization it avoids). Wgrad needs every expert to start at a multiple of 128 rows
//               (PermutePadding::kTo128).
//   fp8-tensor  each expert with its own per-tensor scales and delayed-scaling state (one
//               model/linear.h LinearLayer per expert holds them), as TransformerEngine's
//               GroupedLinear quantizes each GEMM's inputs separately: x in forward_format, dy in
//               backward_format (E5M2), W per expert. CPU: one Linear per expert on its rows (the
//               reference). CUDA: the same numbers without reading the counts on the host: X and
//               dY quantized per expert in one pass (ops/quantize/quantize_grouped.h, counts on the
//               device), W stacked, and the per-tensor scales handed to the blockwise grouped GEMMs
//               as constant 1x128 / 128x128 blocks (the GEMMs differ from the per-expert ones only
//               in FP32 rounding: the scale is applied every 128 of K instead of once). Every
//               expert records an amax each pass, 0 when it has no rows (as TransformerEngine's
//               GroupedLinear does for an empty split), on both devices. Wgrad needs the experts'
//               rows padded to 128 (PermutePadding::kTo128).
//
// Delayed scaling with several ranks (fp8-tensor's per-expert histories): an expert's amax is the
// maximum over the ranks that hold the same expert (model/linear.h reduce_amax_over_ranks): every
// rank with data parallelism alone (ctx.comm), the expert's data group with expert parallelism
// (amax_group, which stands in for ctx.comm while this layer prepares, runs forward and backward).
// The per-expert states are named by the expert's index in the whole model (first_expert + e), so
// that a checkpoint's recipe state does not depend on the grid.
#pragma once

#include <memory>
#include <vector>

#include "model/parameter.h"
#include "ops/gemm/gemm.h"

namespace octet {

struct GroupedInput {
  Tensor x;        // (R, In) in the activation dtype, or
  QuantTensor qx;  // (R, In) FP8 1x128 row-wise (fp8-block only)
  // forward with qx: false keeps nothing for Wgrad (no column-wise copy is made); the caller
  // makes the input again for the backward and hands it wgrad_saved() of it (fp8-flow).
  bool keep_for_wgrad = true;
};

// The contiguous layout of the permuted rows. Only on the device: no recipe reads the counts on the
// host on CUDA (the MoE layer never synchronises).
struct GroupLayoutRef {
  Tensor sizes;  // (E) int32 on the context's device: rows per expert, padding included
};

class Comm;

struct GroupedLinearLayer {
  GemmSite site = GemmSite::kExpertGateUp;
  Parameter* param = nullptr;  // (E, Out, In)
  // Expert parallelism: this rank's first expert in the whole model (param holds E of them from
  // there), and the ranks holding the same experts (null: ctx.comm's ranks all do). Set before
  // init_state.
  int64_t first_expert = 0;
  std::shared_ptr<Comm> amax_group;

  struct Saved {
    Tensor x;                             // bf16 path
    QuantTensor qx;                       // FP8 on CUDA: column-wise copy (In, R), 128x128
    std::vector<LinearSaved> per_expert;  // fp8-tensor on the CPU
  };

  void init_state(Context& ctx, const Recipe& recipe);
  bool fused = false;  // the optimizer writes the prepared weights (weight_output() handed out)

  // Once per optimizer step; kNotFused, for a fused layer, only what derives from the weights the
  // optimizer wrote (the BF16 recipe's transposed copy).
  void prepare(Context& ctx, const Precision& p, PrepareScope scope = PrepareScope::kAll);
  // Where the optimizer can write the prepared weights: the BF16 copy, or the stacked 128x128
  // blocks with each expert's transpose (Out a multiple of 128); false otherwise.
  bool weight_output(WeightOutput& out) const;
  Tensor forward(Context& ctx, const Precision& p, const GroupedInput& in,
                 const GroupLayoutRef& layout, Saved& s);
  // What forward keeps for a pre-quantized input qx (fp8-block, 1x128 power-of-2 row-wise): its
  // column-wise copy by the recipe's fp8_transpose (or the one qx already holds, the scaling-aware
  // transpose in 128x128 tiles made by the dispatch's pass), the row-wise data released.
  Saved wgrad_saved(Context& ctx, const Precision& p, QuantTensor qx) const;
  // fp8-tensor: the per-expert Linear layers (their delayed-scaling state); empty otherwise.
  std::vector<LinearLayer>& per_expert() { return per_expert_; }
  // dX (=); param->grad (+=).
  Tensor backward(Context& ctx, const Precision& p, const Tensor& dy, const GroupLayoutRef& layout,
                  const Saved& s);
  // The same with dY given as a GroupedInput: dy.qx, a row-wise 1x128 power-of-2 FP8 dY (the
  // fp8-flow backward dispatch or the fused dSwiGLU + quantize, fp8-block only), whose column-wise
  // copy for Wgrad then comes from the recipe's fp8_transpose instead of a quantization of BF16;
  // or dy.x, the overload above.
  Tensor backward(Context& ctx, const Precision& p, const GroupedInput& dy,
                  const GroupLayoutRef& layout, const Saved& s);
  // That backward in its three steps, for a caller whose Wgrad input exists only after the data
  // gradient (fp8-flow makes h in dSwiGLU's pass, model/moe_flow.cpp): dY's column-wise copy
  // beside its row-wise one (backward_operand; kept when dy.qx already has one in the 1x128 form,
  // fp8-flow's dispatch), dX = dY W (backward_data, =), then dW += dY^T X (backward_weight, s from
  // wgrad_saved). The same GEMMs on the same operands as backward.
  QuantTensor backward_operand(Context& ctx, const Precision& p, const GroupedInput& dy) const;
  Tensor backward_data(Context& ctx, const QuantTensor& qdy, const GroupLayoutRef& layout);
  void backward_weight(Context& ctx, const QuantTensor& qdy, const GroupLayoutRef& layout,
                       const Saved& s);

 private:
  Tensor fp8_block_backward(Context& ctx, const QuantTensor& qdy, const GroupLayoutRef& layout,
                            const Saved& s);
  int64_t experts() const { return param->value.size(0); }
  int64_t out() const { return param->value.size(1); }
  int64_t in() const { return param->value.size(2); }
  Tensor w_, w_t_;  // bf16: (E, Out, In), (E, In, Out)
  // fp8-block, and fp8-tensor on CUDA (constant 128x128 scales per expert): (E Out, In),
  // (E In, Out), rank-3 scales.
  Fp8Operand fp8_, fp8_t_;
  GemmPrecision prepared_ = GemmPrecision::kBf16;  // the precision of the last preparation
  std::vector<Parameter> views_;                   // fp8-tensor: expert slices of param
  std::vector<LinearLayer> per_expert_;            // fp8-tensor

  void stack_tensorwise_weights(Context& ctx, const GemmRecipe& r);
  Tensor forward_tensorwise(Context& ctx, const GemmRecipe& r, const Tensor& x,
                            const GroupLayoutRef& layout, Saved& s);
  Tensor backward_tensorwise(Context& ctx, const GemmRecipe& r, const Tensor& dy,
                             const GroupLayoutRef& layout, const Saved& s);
  // Each expert's current delayed-scaling scale of one operand (x or dy), as an (E) f32 tensor.
  Tensor expert_scales(Context& ctx, DelayedScaling LinearScalingState::*operand) const;
};

}  // namespace octet
