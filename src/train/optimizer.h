// AdamW over the model's parameters: FP32 master weights, BF16 moments (DeepSeek-V3 report section
// 3.3.2), global-norm gradient clipping and skipping of non-finite steps, on top of
// ops/adamw/adamw.h.
//
// One step, all on the context's stream with no host synchronisation before the updates:
//   norm  = global_grad_norm(grads of the trainable parameters)        (before clipping)
//   coef  = min(1, grad_clip / (norm + 1e-6))                          (torch's clip_grad_norm_)
//   flag  = nonfinite_flag(norm)
//   adamw_step per trainable parameter, grad_scale = coef, found_inf = flag, weight decay only
//   where Parameter::weight_decay
// The flag is taken from the norm, not from a second pass over the gradients: any NaN or inf
// element makes the sum of squares NaN or inf, and so does a sum that overflows FP32; either way
// the step changes nothing (parameters, moments).
//
// The step count (AdamW's bias correction) advances on the device over applied steps only; the
// host's copy is read by finish_step() (norm, flag and count together, a synchronisation). A step()
// left unfinished is finished by the next eager step() (unless set_lagged_reads: the trainer reads
// each step's results itself, a step late, train/train_step.h), state_dict() or
// load_state_dict(), so the count is right however the caller logs.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/context.h"
#include "io/safetensors.h"
#include "model/parameter.h"
#include "ops/adamw/adamw.h"
#include "train/step_graph.h"

namespace octet::train {

struct AdamWConfig {
  float lr = 1e-3f;  // the default rate; step() takes the scheduled one
  float beta1 = 0.9f;
  float beta2 = 0.95f;  // DeepSeek-V3's value
  float eps = 1e-8f;
  float weight_decay = 0.1f;  // DeepSeek-V3's value; decoupled (p *= 1 - lr * wd)
  float grad_clip = 1.0f;     // max global gradient norm; 0 disables clipping

  void validate() const;  // names the field
};

// Device tensors of one step, valid until the next step().
struct StepResult {
  Tensor grad_norm;  // (1) f32: global L2 norm of the trainable gradients, before clipping
  Tensor clip_coef;  // (1) f32: the factor the gradients were scaled by (undefined: no clipping)
  Tensor skipped;    // (1) int32: 1 when the norm was not finite and nothing was updated
  int64_t step = 0;  // 1-based step number this update used for bias correction (when the
                     // previous step was finished; finish_step() says it always)
};

// The same, read to the host.
struct StepStats {
  float grad_norm = 0.0f;
  float clip_coef = 1.0f;
  bool skipped = false;
  int64_t step = 0;  // the step number the update used; a skipped one is reused by the next
};

// A saved optimizer state read by name, for load_state_dict: each tensor taken once with its
// dtype and shape checked (one error naming the tensor), then what is left over refused.
class SavedState {
 public:
  explicit SavedState(const io::NamedTensors& state);  // refuses duplicates and device tensors
  const Tensor& take(const std::string& name, DType dtype, const Shape& shape);
  int64_t take_step();  // the kStepTensorName counter, >= 0
  void check_all_taken() const;

 private:
  std::map<std::string, const Tensor*> by_name_;
};

class AdamWOptimizer {
 public:
  // The model's parameters (model/parameter.h), as they are: the name names the optimizer state,
  // `value` (f32 master, on the context's device) is updated in place, `grad` (value's shape, f32)
  // is read by step() and zeroed by zero_grad(); weight decay only where `weight_decay`; a
  // parameter that is not `trainable` is skipped. The optimizer keeps the pointers: the
  // parameters must outlive it and their tensors keep their buffers.
  // Allocates zeroed BF16 moments on the context's device for every trainable parameter. Checks
  // the parameters (names unique and non-empty, dtypes, shapes, devices), naming the parameter.
  AdamWOptimizer(Context& ctx, std::vector<Parameter*> params, const AdamWConfig& config);

  // Where the following updates also write the weights for the next forward (optim.fused_prepare,
  // model.h weight_outputs()): each output's BF16 copy (the parameter's element count) and/or its
  // 128x128 FP8 blocks (fp8.data defined). Replaces the previous outputs; parameters without one
  // get none. Checks that each output's parameter is one of the optimizer's and the copy's
  // dtype, device and size.
  void set_weight_outputs(Context& ctx, const std::vector<WeightOutput>& outputs);

  // One update at rate `lr` (the schedule's; config.lr is not used here). Enqueued only. The step
  // count lives on the device (AdamW's bias correction reads it there and the update advances it
  // unless skipped), so nothing here waits for the device. `also_check`: more f32 tensors whose
  // non-finite elements skip the step (the trainer's losses), read on the device.
  StepResult step(Context& ctx, float lr, const std::vector<Tensor>& also_check = {});
  // Whether step() replays a captured graph of the update (step_graph.h; CUDA only): captured on
  // the second step with the same weight outputs and checked tensors, replayed after.
  void set_graphs(bool on) { graphs_ = on; }
  // Whether an eager step() leaves the previous step unread too (the trainer reads each step's
  // stats itself, a step late; finish_step() or the checkpoint's state_dict() still reads the
  // device's count).
  void set_lagged_reads(bool on) { lagged_ = on; }
  int64_t graph_replays() const { return graph_.replays(); }
  const std::string& graph_failure() const { return graph_.failure(); }
  // Reads the last step's norm, coefficient and flag to the host (synchronises) and advances the
  // step count when the update was applied. Idempotent; a no-op before the first step.
  StepStats finish_step(Context& ctx);
  // grad = 0 for every parameter that has a gradient (trainable or not), but a first writer's
  // (Parameter::first_writer: its backward overwrites it; the caller marks it grad_fresh).
  void zero_grad(Context& ctx);

  // Applied steps so far (AdamW's t after the last applied update).
  int64_t steps_taken() const { return steps_taken_; }
  const AdamWConfig& config() const { return config_; }
  const std::vector<Parameter*>& params() const { return params_; }
  // Parameter i's moments (bf16, on the device; undefined for a frozen parameter), read by the
  // checkpoint snapshot (train/checkpoint_plan.h).
  const Tensor& exp_avg(size_t i) const { return moments_[i].exp_avg; }
  const Tensor& exp_avg_sq(size_t i) const { return moments_[i].exp_avg_sq; }

  // Optimizer state as host tensors for a safetensors file: "<name>.exp_avg" and
  // "<name>.exp_avg_sq" (bf16, the parameter's shape) for each trainable parameter, in parameter
  // order, then kStepTensorName (i64, shape [1]). With the master weights (the checkpoint's) this
  // is everything a resumed run needs to continue bit-identically.
  io::NamedTensors state_dict(Context& ctx);
  // Restores state_dict()'s output (any order): every tensor must be present with its dtype and
  // shape, and no other; errors name the tensor.
  void load_state_dict(Context& ctx, const io::NamedTensors& state);

  static constexpr const char* kStepTensorName = "optimizer.step";

 private:
  struct Moments {
    Tensor exp_avg;     // bf16, the parameter's shape
    Tensor exp_avg_sq;  // bf16
  };

  // The updated weights' other copies (set_weight_outputs), undefined where there is none.
  struct Outputs {
    Tensor bf16;
    BlockQuantOutput fp8;
  };

  std::vector<Parameter*> params_;
  std::vector<Moments> moments_;  // parallel to params_; undefined for frozen parameters
  std::vector<Outputs> outputs_;  // parallel to params_
  // The update after the constants: norm, clipping, skip flag, AdamW per parameter, step count.
  StepResult update(Context& ctx, const std::vector<Tensor>& also_check);

  AdamWConfig config_;
  int64_t steps_taken_ = 0;  // the host's copy, advanced by finish_step()
  Tensor steps_dev_;         // (1) i64 on the device: applied steps, advanced by the update
  Tensor consts_;  // (16) f32 on the device: this step's AdamW constants (with, without decay)
  bool graphs_ = false;
  bool lagged_ = false;
  int64_t outputs_generation_ = 0;  // set_weight_outputs() calls: part of the graph's key
  GraphedSection graph_{"the optimizer update"};
  StepResult captured_;  // the graph's outputs
  StepResult last_;
  StepStats last_stats_;
  bool pending_ = false;  // last_ not yet read by finish_step()
};

}  // namespace octet::train
