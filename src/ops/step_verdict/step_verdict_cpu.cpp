// CPU reference of step_verdict.h (the arithmetic is step_verdict_math.h's).
#include <cmath>
#include <cstring>
#include <limits>

#include "ops/step_verdict/step_verdict_backends.h"
#include "ops/step_verdict/step_verdict_math.h"

namespace octet::cpu {

void step_loss_verdict(Context&, const StepVerdictArgs& a) {
  const int64_t n = a.main.numel(), k = n / a.ranks;
  auto* means = a.means.data_as<double>();
  means[0] = verdict::global_mean(a.main.data_as<const float>(), a.ranks, k);
  for (int64_t d = 0; d < a.depths; ++d)
    means[1 + d] = verdict::global_mean(a.mtp.data_as<const float>() + d * n, a.ranks, k);
  const auto* st = a.window.state.data_as<const int64_t>();
  const bool nonfinite = !verdict::finite(means[0]);
  const bool spike = !nonfinite && verdict::is_spike(a.window.values.data_as<const double>(),
                                                     a.window.values.numel(), st[0], st[1],
                                                     a.spike_threshold, means[0]);
  const bool skip = nonfinite || (spike && a.spike_skips);
  a.flags.data_as<int32_t>()[0] =
      (nonfinite ? kVerdictNonFinite : 0) | (spike ? kVerdictSpike : 0) | (skip ? kVerdictSkip : 0);
  a.skip.data_as<float>()[0] = skip ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
}

void step_remember_loss(Context&, const RememberLossArgs& a) {
  if (a.skipped.data() && a.skipped.data_as<const int32_t>()[0] != 0) return;
  verdict::remember(a.window.values.data_as<double>(), a.window.state.data_as<int64_t>(),
                    a.window.values.numel(), a.means.data_as<const double>()[0]);
}

void sum_counts_unless_skipped(Context&, const SumCountsArgs& a) {
  const int64_t e = a.out.numel();
  auto* out = a.out.data_as<int32_t>();
  std::memset(out, 0, static_cast<size_t>(e) * sizeof(int32_t));
  if (a.skipped.data() && a.skipped.data_as<const int32_t>()[0] != 0) return;
  for (const Tensor& c : a.counts)
    for (int64_t i = 0; i < e; ++i) out[i] += c.data_as<const int32_t>()[i];
}

}  // namespace octet::cpu
