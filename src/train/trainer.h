// The training loop behind `octet train`: data, model, optimizer, schedule, recipe state,
// checkpoints and resume, metrics, validation and the safety nets, on one device.
//
// One step: prepare the weights' GEMM copies (once per optimizer step), grad_accum micro-batches of
// forward + backward (losses scaled by 1 / grad_accum), a host read of the losses (the one planned
// synchronisation of a step, for the safety nets and the metrics), then AdamW (global-norm
// clipping, the update skipped on the device when the gradient is not finite) and the router bias
// update of the auxiliary-loss-free balancing.
//
// Checkpoints (every checkpoint_every steps and at the end) go to <run_dir>/checkpoints/step_N/:
//   config.json, model*.safetensors   the weights in the model checkpoint format (F32 masters, so a
//                                     resume is exact; loadable by the transformers library)
//   optimizer.safetensors             AdamW moments (BF16) and step count
//   recipe_state.safetensors          delayed scaling: every Linear's amax histories and scales
//   trainer_state.json                step, sampler position, the spike window, tokens seen
// written into step_N.partial/ and renamed into place (a crash leaves the previous checkpoints
// intact); <run_dir>/checkpoints/latest names the newest; the last keep_checkpoints are kept.
// A resumed run (resume_from) continues bit-identically: the same batches, the same losses.
#pragma once

#include <iosfwd>
#include <string>

#include "train/progress.h"
#include "train/train_config.h"

namespace octet::train {

struct RunOptions {
  std::string resume_from;  // a run directory (its latest checkpoint) or a checkpoint directory
  ProgressStyle style = ProgressStyle::kLines;
  std::string cache_dir = ".cache/octet";  // prepared text shards
};

struct RunResult {
  int64_t steps_done = 0;
  double final_loss = 0;
  double final_val_loss = 0;  // NaN when never evaluated
  int64_t skipped_steps = 0;
};

// Validates everything it can before any work (config, data, run directory, device), then trains.
RunResult run_training(const TrainConfig& config, const RunOptions& options, std::ostream& out);

// The checkpoint directory a --resume argument names: a checkpoint itself, or a run directory's
// latest. Throws naming the path when there is none.
std::string resolve_resume_dir(const std::string& path);

}  // namespace octet::train
