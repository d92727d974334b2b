// One training step without a host synchronisation (issue 11), for the loop in trainer.cpp:
//
//   launch_step    prepares the weights, runs the micro-batches' passes, and enqueues the step's
//                  verdict (ops/step_verdict.h: the mean losses in global micro-batch order, the
//                  non-finite and spike flags from the device's spike window), the optimizer
//                  update with the verdict folded into its found_inf flag, the router bias update
//                  and the window's update, both conditional on the update being applied; then the
//                  copies of the step's results into a pinned slot (PinnedReadback). Reads nothing.
//   complete_step  waits for that slot (by then the next step is usually enqueued behind it),
//                  and makes the host's side of the verdict from the values read: the messages, the
//                  record (metrics.jsonl, progress), the diverged check, and a spike's rollback.
//
// The host's work and the device's overlap: step N is completed after step N + 1 was launched.
// A step that checkpoints, evaluates, or ends the run is completed before the next is launched,
// so what those read is the state after it. Steps that must read the device anyway do so at
// launch, only on their steps: the BF16 shadow (safety.shadow_bf16) and the site probe
// (sites_every). The router imbalance of logging steps comes with the lagged read.
//
// A rollback learns of the spike one step late: the spike step's update was skipped on the device,
// the step after it is already enqueued. undo_launch() drops that step (the sampler goes back to
// before its batches; its update is undone by the checkpoint's load), so the run continues as the
// synchronous loop did (docs/safety.md).
//
// ZeRO-1 and expert parallelism (several ranks) decide on the host as before: their optimizers
// read their statistics at once, so their steps are completed at launch.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "train/lr_schedule.h"
#include "train/metrics.h"
#include "train/progress.h"
#include "train/run_state.h"

namespace octet::train::detail {

// What the run reports: the progress lines, metrics.jsonl and the result.
struct Records {
  Progress progress;
  std::unique_ptr<MetricsWriter> metrics;
  RunResult result = {};
  std::vector<std::string> pending_changes = {};  // recorded with the first step after the resume
  int64_t steps_run = 0;                          // by this process
};

struct SafetyNets {
  int64_t rollbacks_in_a_row = 0;
  int64_t skipped_in_a_row = 0;
};

// A launched step, until it is completed.
struct LaunchedStep {
  StepMetrics sm;               // what the launch measured (step, lr, casts, sites, shadow, ...)
  int slot = 0;                 // its PinnedReadback slot
  SamplerState sampler_before;  // the sampler before the step drew its batches (undo_launch)
  bool complete_now = false;    // checkpoint, evaluation or the last step: no step enqueued behind
  bool steady = false;          // nothing due that reads the device (RunResult::steady_host_waits)
  int64_t host_waits = 0;       // the backend's host waits during the launch
  std::vector<int64_t> expert_loads;  // logging steps: the read expert loads' sizes, per layer
  std::chrono::steady_clock::time_point start;     // when the launch began
  std::chrono::steady_clock::time_point launched;  // when it returned (on the CPU: the step ran)
};

// Launches step `number` (1-based) at rate `lr`.
LaunchedStep launch_step(Run& run, int64_t number, double lr);

enum class StepEnd : uint8_t { kRecorded, kRolledBack, kDiverged };
// Waits for the step's results, decides, records. `last_end`: when the previous step completed.
StepEnd complete_step(Run& run, SafetyNets& nets, Records& rec, LaunchedStep& launched,
                      std::chrono::steady_clock::time_point& last_end);

// Drops a launched step after a rollback (see above).
void undo_launch(Run& run, const LaunchedStep& launched);

}  // namespace octet::train::detail
