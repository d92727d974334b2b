// The training step's verdict on the device (issue 11: no host synchronisation inside a step):
// the step's mean losses, whether the update is applied, and the loss-spike window, all decided
// by kernels on the context's stream, capturable in a CUDA graph, read by the host later.
//
//   step_loss_verdict  (before the optimizer)
//     means[0]     = mean of the main losses in global micro-batch order (R ranks of K each:
//                    global micro-batch m * R + r is rank r's m-th), sum_j x_j / N term by term
//     means[1 + d] = the same over MTP depth d's losses
//     nonfinite    = !isfinite(means[0])
//     spike        = !nonfinite && the window is full && means[0] > mean + threshold * sd
//                    (mean and population sd of the window, oldest first)
//     flags        = nonfinite | spike << 1 (bit 2: spike and spike_skips)
//     skip         = NaN when nonfinite or (spike and spike_skips), else 0: an optimizer's
//                    `also_check` tensor, so the update's found_inf flag carries the verdict
//   step_remember_loss (after the optimizer)
//     unless skipped (the optimizer's found_inf): the window takes means[0], dropping its oldest
//   sum_counts_unless_skipped (the router bias update's input)
//     out = sum of the micro-batches' expert counts, or all zeros when skipped (the update's
//     sign(N - E * c_e) is 0 for every expert then: the bias stays)
// The arithmetic is in double in the host's order without fused multiply-adds
// (step_verdict_math.h): the verdicts are bit for bit those of the host formula.
#pragma once

#include <cstdint>
#include <vector>

#include "core/context.h"

namespace octet {

// The last `capacity` applied losses: a ring read oldest first from state[1], state[0] held.
struct LossWindow {
  Tensor
      values;  // (capacity) doubles in i64 storage (the tensors have no f64 type); capacity 0: no spike detection
  Tensor state;  // (2) i64: count, head
};

// A window on the context's device, empty (zeroed).
LossWindow make_loss_window(Context& ctx, int64_t capacity);

inline constexpr int32_t kVerdictNonFinite = 1;
inline constexpr int32_t kVerdictSpike = 2;
inline constexpr int32_t kVerdictSkip =
    4;  // the update is skipped (non-finite, or a skipping spike)

struct StepVerdictArgs {
  Tensor main;         // (R * K) f32: rank r's micro-batch m at r * K + m
  Tensor mtp;          // (D * R * K) f32, depth d's at d * R * K + ...; undefined when D == 0
  int64_t ranks = 1;   // R
  int64_t depths = 0;  // D
  LossWindow window;   // read only
  double spike_threshold = 6.0;
  bool spike_skips = false;  // a spike skips the update (spike_action skip or rollback)
  Tensor means;              // out (1 + D) doubles in i64 storage
  Tensor flags;              // out (1) i32
  Tensor skip;               // out (1) f32
};
void step_loss_verdict(Context& ctx, const StepVerdictArgs& args);

struct RememberLossArgs {
  LossWindow window;  // updated in place
  Tensor means;       // (>= 1) doubles (i64 storage): means[0] is remembered
  Tensor skipped;     // (1) i32, nonzero: nothing is remembered; undefined: always remembered
};
void step_remember_loss(Context& ctx, const RememberLossArgs& args);

struct SumCountsArgs {
  std::vector<Tensor> counts;  // (E) i32 each, one per micro-batch
  Tensor skipped;              // (1) i32; undefined: never skipped
  Tensor out;                  // (E) i32
};
void sum_counts_unless_skipped(Context& ctx, const SumCountsArgs& args);

}  // namespace octet
