#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/check.h"

namespace octet::train {

const char* lr_schedule_name(LrScheduleKind k) {
  return k == LrScheduleKind::kConstant ? "constant" : "cosine";
}

void LrSchedule::validate() const {
  OCTET_CHECK(std::isfinite(lr) && lr > 0, "lr schedule: lr must be finite and > 0, got ", lr);
  OCTET_CHECK(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= lr,
              "lr schedule: min_lr must be in [0, lr = ", lr, "], got ", min_lr);
  OCTET_CHECK(warmup_steps >= 0, "lr schedule: warmup_steps must be >= 0, got ", warmup_steps);
  OCTET_CHECK(warmup_init >= 0 && warmup_init < 1,
              "lr schedule: warmup_init must be in [0, 1), got ", warmup_init);
  OCTET_CHECK(total_steps >= 1, "lr schedule: total_steps must be >= 1, got ", total_steps);
}

double lr_at(const LrSchedule& s, int64_t step) {
  OCTET_CHECK(step >= 0, "lr_at: step must be >= 0, got ", step);
  if (step < s.warmup_steps) {
    const double frac = static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
    return s.lr * (s.warmup_init + (1.0 - s.warmup_init) * frac);
  }
  if (s.kind == LrScheduleKind::kConstant) return s.lr;
  // The decay spans steps warmup_steps .. total_steps - 1; max(1, .) keeps a run whose last step is
  // its first post-warmup step at the peak instead of dividing by zero.
  const int64_t span = std::max<int64_t>(1, s.total_steps - 1 - s.warmup_steps);
  const double ratio = std::min(1.0, static_cast<double>(step - s.warmup_steps) / span);
  return s.min_lr + 0.5 * (1.0 + std::cos(std::numbers::pi * ratio)) * (s.lr - s.min_lr);
}

}  // namespace octet::train
