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
//   fp8-tensor  one model/linear.h Linear per expert on its rows, each with its own per-tensor
//               scales and delayed-scaling state, as TransformerEngine's GroupedLinear quantizes
//               each GEMM's inputs separately. Needs the row counts on the host.
#pragma once

#include <vector>

#include "model/parameter.h"
#include "ops/gemm/gemm.h"

namespace octet {

struct GroupedInput {
  Tensor x;        // (R, In) in the activation dtype, or
  QuantTensor qx;  // (R, In) FP8 1x128 row-wise (fp8-block only)
};

struct GroupLayoutRef {
  Tensor sizes;                     // (E) int32 on the device: rows per expert, padding included
  std::vector<int64_t> host_sizes;  // the same on the host (required by fp8-tensor; when given,
                                    // the grouped GEMMs skip their own device reads)
};

struct GroupedLinearLayer {
  GemmSite site = GemmSite::kExpertGateUp;
  Parameter* param = nullptr;  // (E, Out, In)

  struct Saved {
    Tensor x;                             // bf16 path
    QuantTensor qx;                       // fp8-block: column-wise copy (In, R)
    std::vector<LinearSaved> per_expert;  // fp8-tensor
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

 private:
  Tensor fp8_block_backward(Context& ctx, const QuantTensor& qdy, const GroupLayoutRef& layout,
                            const Saved& s);
  int64_t experts() const { return param->value.size(0); }
  int64_t out() const { return param->value.size(1); }
  int64_t in() const { return param->value.size(2); }
  Tensor w_, w_t_;          // bf16: (E, Out, In), (E, In, Out)
  Fp8Operand fp8_, fp8_t_;  // fp8-block: (E Out, In), (E In, Out), rank-3 scales
  GemmPrecision prepared_ = GemmPrecision::kBf16;  // the precision of the last preparation
  std::vector<Parameter> views_;                   // fp8-tensor: expert slices of param
  std::vector<LinearLayer> per_expert_;            // fp8-tensor
};

}  // namespace octet
