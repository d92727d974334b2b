// The model's trainable state, as the optimizer and the checkpoint code see it, and the two layer
// holders every block uses: a Linear site (model/linear.h) and an RMSNorm.
//
// Tensors are named as the model holds them. That is the checkpoint name (model/checkpoint.h) except
// for fused weights, which keep the fused names of recent transformers versions:
//   ...mlp.gate_up_proj.weight               (2I, D)  gate_proj rows [0, I), up_proj rows [I, 2I)
//   ...mlp.shared_experts.gate_up_proj.weight  likewise
//   ...mlp.experts.gate_up_proj              (E, 2F, D)  expert j's gate_proj and up_proj
//   ...mlp.experts.down_proj                 (E, D, F)
// Which checkpoint tensors a fused parameter holds, and where, is the module tree's
// (model/module_tree.h); model/model.cpp converts to and from the unfused checkpoint names by it.
#pragma once

#include <string>
#include <vector>

#include "core/context.h"
#include "model/linear.h"
#include "model/site_probe.h"
#include "numerics/recipe.h"
#include "ops/adamw/adamw.h"

namespace octet {

// Whether AdamW's decoupled weight decay applies to a parameter (not to norms and biases).
enum class WeightDecay : uint8_t { kNo, kYes };
// Whether the optimizer moves a parameter (kNo: e_score_correction_bias, moved by the
// balancing rule only).
enum class Trainable : uint8_t { kNo, kYes };

struct Parameter {
  std::string name;
  Tensor value;  // f32 master, on the model's device
  Tensor grad;   // f32, value's shape; accumulated (+=) by backward, zeroed by the trainer
                 // (or overwritten by its first writer: first_writer below)
  bool weight_decay = true;  // false for norms, biases and embeddings-free vectors
  bool trainable = true;     // false: e_score_correction_bias moves by the balancing rule only
  // The first writer of the step's gradient overwrites it (the trainer's one-micro-batch steps, for
  // the routed experts' stacks: train/run_state.h): zero_grad leaves such a gradient as it is, and
  // grad_fresh says it holds nothing of this step yet. The layer's backward then writes it with =
  // where its Wgrad can (else zeroes it first) and clears grad_fresh; the trainer clears it after a
  // replayed micro-batch graph too (whose capture already chose =).
  bool first_writer = false;
  bool grad_fresh = false;
};

// Whether a backward writes `param`'s gradient with = (else +=), through a GEMM that can
// overwrite it (`can_overwrite`): yes when the gradient is fresh (Parameter::first_writer), once:
// grad_fresh is cleared. A fresh gradient the GEMM cannot overwrite is zeroed here first.
bool first_write(Context& ctx, Parameter& param, bool can_overwrite);

// Everything a forward/backward needs to know about the numbers it runs in.
struct Precision {
  Recipe recipe;
  DType act = DType::kBF16;    // activations; kF32 is the CPU's FP32 checking mode (bf16 recipe)
  SiteProbe* probe = nullptr;  // when set, every Linear records its inputs' numerics
};

// The weights the next forward reads, written by the optimizer in its update pass
// (optim.fused_prepare; ops/adamw adamw_step_block_quantize): where a layer's prepared copy of a
// parameter lives, so the update writes it and the per-step preparation skips it. Valid until the
// next full preparation (which allocates the prepared copies anew).
struct WeightOutput {
  Parameter* param = nullptr;
  Tensor bf16;           // the BF16 copy, the parameter's element count; or undefined
  BlockQuantOutput fp8;  // the 128x128 FP8 blocks (fp8.data defined); or undefined
};

// Which prepared copies the optimizer may write (Model::weight_outputs): the BF16 ones only, or the
// FP8 128x128 blocks too (optim.fused_prepare_fp8).
enum class OutputCopies : uint8_t { kBf16Only, kBf16AndFp8 };

// What a preparation covers: everything, or what no WeightOutput handed to the optimizer covers.
enum class PrepareScope : uint8_t { kAll, kNotFused };

// A Linear site of one layer: the master weight (a Parameter) and its per-step prepared copy and
// delayed-scaling state.
struct LinearLayer {
  GemmSite site = GemmSite::kAttnQDown;
  Parameter* param = nullptr;
  PreparedWeight prepared;
  LinearScalingState state;  // used by fp8-tensor delayed scaling only

  bool fused = false;  // the optimizer writes `prepared` (weight_output() was handed out)

  void init_state(Context& ctx, const Recipe& recipe);
  // Once per optimizer step (model/linear.h prepare_weight); kNotFused skips a fused layer.
  void prepare(Context& ctx, const Precision& p, PrepareScope scope = PrepareScope::kAll);
  // Where the optimizer can write this layer's prepared weight (BF16, or FP8 128x128 blocks);
  // false for the per-tensor FP8 recipes, whose preparation also records scaling state.
  bool weight_output(WeightOutput& out) const;
  // shared_x: LinearArgs::shared_x (x quantized once for several Linears), or null.
  Tensor forward(Context& ctx, const Precision& p, const Tensor& x, LinearSaved& saved,
                 Storage storage = Storage::kFp8, QuantTensor* shared_x = nullptr);
  // dx (=); param->grad += dy^T x.
  Tensor backward(Context& ctx, const Precision& p, const Tensor& dy, const LinearSaved& saved);
};

// RMSNorm with FP32 arithmetic (ops/rmsnorm); the input is what the caller keeps for backward.
struct NormLayer {
  Parameter* param = nullptr;
  float eps = 1e-6f;

  struct Saved {
    Tensor x;     // the input
    Tensor rstd;  // (rows) f32
  };
  // With `residual`: x += residual first, in place (the residual stream), and the norm of the sum.
  Tensor forward(Context& ctx, const Tensor& x, Saved& saved, const Tensor& residual = {}) const;
  // dx (=), plus `residual_grad` when given (the residual stream's gradient); param->grad += ...
  Tensor backward(Context& ctx, const Tensor& dy, const Saved& saved,
                  const Tensor& residual_grad = {}) const;
};

}  // namespace octet
