// `octet train --trace FILE --trace-steps A:B`: the kernel timeline of a window of training steps
// (RunOptions::trace_path; backend/kernel_trace.h), for finding where the trainer's step loses
// time against `octet bench train-step`'s: the device's idle gaps between the step's graphs and
// its eager work.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "backend/kernel_trace.h"
#include "core/context.h"

namespace octet::train {

class Progress;

class StepTrace {
 public:
  // Off when path is empty or this rank does not write (data parallelism: rank 0 traces).
  StepTrace(std::string path, int64_t first, int64_t last, bool writer);
  // Checked before the run writes anything: a CUDA device, a window inside (from, to].
  static void validate(const std::string& path, int64_t first, int64_t last, Device device,
                       int64_t from, int64_t to);
  // The loop's two hooks: before step `number` is launched, after it is completed (read back).
  void before_launch(Context& ctx, int64_t number);
  void after_complete(int64_t number, Progress& progress);

 private:
  std::string path_;
  int64_t first_ = 0, last_ = 0, launched_ = 0;
  bool on_ = false;
  std::optional<KernelTrace> trace_;
};

}  // namespace octet::train
