// Learning-rate schedule: linear warmup, then cosine decay to a floor (or a constant rate).
//
// Steps are 0-based optimizer steps (step 0 is the first update). Warmup follows llm.c: step s <
// warmup_steps gets lr * (w + (1 - w) * (s + 1) / warmup_steps) with w = warmup_init, so the first
// update already moves (a zero rate would waste a step) and step warmup_steps - 1 reaches the peak.
// Cosine: from step warmup_steps (the peak) down to min_lr at the last step, total_steps - 1
// (Loshchilov & Hutter's SGDR without restarts, the decay of DeepSeek-V3's and llm.c's runs); steps
// past the end stay at min_lr. Constant: the peak after warmup.
#pragma once

#include <cstdint>

namespace octet::train {

enum class LrScheduleKind : uint8_t { kCosine, kConstant };

const char* lr_schedule_name(LrScheduleKind k);  // "cosine", "constant"

struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::kCosine;
  double lr = 3e-3;          // peak rate
  double min_lr = 3e-4;      // floor of the cosine decay
  int64_t warmup_steps = 0;  // 0: start at the peak
  double warmup_init = 0.0;  // first warmup rate as a fraction of lr, in [0, 1)
  int64_t total_steps = 1;   // optimizer steps in the run

  // Names the field: lr > 0 and finite, 0 <= min_lr <= lr, warmup_steps >= 0, ...
  void validate() const;
};

// The rate of optimizer step `step` (0-based; negative steps are an error).
double lr_at(const LrSchedule& s, int64_t step);

}  // namespace octet::train
