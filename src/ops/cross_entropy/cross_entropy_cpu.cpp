// CPU reference for cross_entropy.h: plain loops, every sum in FP64, one rounding per stored value.
#include <cmath>
#include <limits>

#include "numerics/fp8.h"
#include "ops/cpu_elements.h"
#include "ops/cross_entropy/cross_entropy_backends.h"

namespace octet::cpu {
namespace {

// The row's target, or -1 for an ignored row; throws for one outside [0, V).
int64_t checked_target(const Tensor& targets, int64_t r, int64_t vocab) {
  const int32_t t = targets.data_as<const int32_t>()[r];
  if (t == kIgnoreIndex) return -1;
  OCTET_CHECK(t >= 0 && t < vocab, "cross_entropy targets: row ", r, " holds ", t, ", outside [0, ",
              vocab, ") and not the ignore index ", kIgnoreIndex);
  return t;
}

}  // namespace

void cross_entropy_rows(Context&, const CrossEntropyRowsArgs& a) {
  const int64_t rows = a.logits.rows(), vocab = a.logits.cols();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = checked_target(a.targets, r, vocab);
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t v = 0; v < vocab; ++v) m = std::max(m, load_f64(a.logits, r * vocab + v));
    double s = 0.0;
    for (int64_t v = 0; v < vocab; ++v) s += std::exp(load_f64(a.logits, r * vocab + v) - m);
    const double lse = m + std::log(s);
    const double loss = t < 0 ? 0.0 : lse - load_f64(a.logits, r * vocab + t);
    a.lse.data_as<float>()[r] = static_cast<float>(lse);
    a.losses.data_as<float>()[r] = static_cast<float>(loss);
  }
}

// The stored (FP32) row losses summed in FP64, as the CUDA mean kernel sums them.
void cross_entropy_mean(Context&, const CrossEntropyMeanArgs& a) {
  const int64_t rows = a.targets.size(0);
  const int32_t* targets = a.targets.data_as<const int32_t>();
  const float* losses = a.losses.defined() ? a.losses.data_as<const float>() : nullptr;
  double sum = 0.0;
  int32_t count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] == kIgnoreIndex) continue;
    ++count;
    if (losses != nullptr) sum += losses[r];
  }
  a.count.data_as<int32_t>()[0] = count;
  if (losses != nullptr)
    a.loss.data_as<float>()[0] = count ? static_cast<float>(sum / count) : 0.0f;
}

void cross_entropy_backward(Context&, const CrossEntropyBackwardArgs& a) {
  const int64_t rows = a.logits.rows(), vocab = a.logits.cols();
  const int32_t count = a.count.data_as<const int32_t>()[0];
  const double scale =
      count > 0 ? static_cast<double>(a.dloss.data_as<const float>()[0]) / count : 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = checked_target(a.targets, r, vocab);
    const double lse = a.lse.data_as<const float>()[r];
    for (int64_t v = 0; v < vocab; ++v) {
      const int64_t i = r * vocab + v;
      const double g =
          t < 0 ? 0.0 : (std::exp(load_f64(a.logits, i) - lse) - (v == t ? 1.0 : 0.0)) * scale;
      store(a.dlogits, i, g);  // after the read of the same element: in place is safe
    }
  }
}

}  // namespace octet::cpu
