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
// written into step_N.partial/ by every rank in parallel, in the background from a host snapshot
// (train/checkpoint_save.h), and renamed into place by rank 0 (a crash leaves the previous
// checkpoints intact); <run_dir>/checkpoints/latest names the newest; the last keep_checkpoints
// are kept. Any world size resumes any checkpoint.
// A resumed run (resume_from) continues bit-identically: the same batches, the same losses.
#pragma once

#include <atomic>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "train/progress.h"
#include "train/run_dir.h"
#include "train/train_config.h"

namespace octet::train {

struct RunOptions {
  // A run directory (its latest checkpoint) or a checkpoint directory of one. The run continues
  // in that run's directory (config.run_dir must name it) from that checkpoint; `config` may differ
  // from the run's saved config.toml only in keys resume_may_change allows, unless
  // allow_config_change (the changes are then recorded in metrics.jsonl).
  std::string resume_from;
  bool allow_config_change = false;
  // A new run into a run_dir that already holds a run (run_dir.h).
  RunStart start = RunStart::kRefuseExisting;
  ProgressStyle style = ProgressStyle::kLines;
  std::string cache_dir = ".cache/octet";  // prepared text shards
  // Set (to a signal number) by a signal handler: the run finishes the step it is in, writes a
  // checkpoint and returns RunEnd::kInterrupted.
  const std::atomic<int>* stop = nullptr;
  // Data parallelism (train/data_parallel.h): this rank's communicator over every rank of the run
  // (null or one rank: a single process), and the GPU it runs on. Every rank calls run_training
  // with the same config; rank 0 writes the run directory, the others only read it.
  std::shared_ptr<Comm> comm;
  int device_index = 0;
  // A kernel timeline (`octet train --trace`, CUDA; backend/kernel_trace.h) of steps
  // trace_first..trace_last, written by rank 0 to trace_path as CSV with a summary on the
  // progress output: the device's busy and idle time a step and its longest idle gaps. The trace
  // waits for the device when it starts and when it ends, so those steps do not overlap their
  // neighbours as the others do. Empty: none.
  std::string trace_path;
  int64_t trace_first = 0, trace_last = 0;
  // Test hook: called on each rank before it writes each of its checkpoint files (rank, file
  // name); an exception from it fails that rank's write (train/checkpoint_save.h).
  std::function<void(int rank, const std::string& file)> checkpoint_fault;
};

enum class RunEnd : uint8_t {
  kCompleted,    // every step up to config.steps
  kInterrupted,  // stopped by RunOptions::stop, after a checkpoint of the last step
  kDiverged,     // safety.max_skipped_in_a_row skips in a row, or a non-finite last loss
  kAllSkipped,   // every step this process ran was skipped
};

struct RunResult {
  int64_t steps_done = 0;  // the run's step count at the end (a resumed run counts from 0)
  double final_loss = 0;
  double final_val_loss = 0;  // NaN when never evaluated
  int64_t skipped_steps = 0;
  RunEnd end = RunEnd::kCompleted;
  std::string end_reason;       // why, for every end but kCompleted
  int stop_signal = 0;          // kInterrupted: the signal number
  std::string last_checkpoint;  // the newest checkpoint written, "" when none
  // Steps of this process with nothing due that reads the device (no probe, shadow,
  // evaluation, checkpoint or last step), graphed (CUDA), after the graphs' capture;
  // and the times the host waited for the device while launching them (the backend's host_waits:
  // 0 when a step never synchronises; the lagged read of each step's results is not one of them).
  int64_t steady_steps = 0;
  int64_t steady_host_waits = 0;
};

// Validates everything it can before any work (config, resume rules, data, memory, run
// directory, device), then trains. Nothing on disk changes before the run directory is locked
// and, for a resume, the checkpoint has loaded.
RunResult run_training(const TrainConfig& config, const RunOptions& options, std::ostream& out);

// The checkpoint directory a --resume argument names: a checkpoint itself, or a run directory's
// latest. Throws naming the path when there is none.
std::string resolve_resume_dir(const std::string& path);

// What a --resume argument continues: the checkpoint, the run directory holding it and that
// run's saved configuration (its config.toml). Throws when the checkpoint is not inside a run
// directory with a config.toml.
struct ResumeTarget {
  std::string checkpoint;
  std::string run_dir;
  TrainConfig config;
};
ResumeTarget resolve_resume(const std::string& path);

}  // namespace octet::train
