// Per-site numerics of a training step: for the input of every Linear site (x in forward, dy in
// backward), the largest magnitude, the share of elements the site's FP8 quantization saturates
// (|x * scale| beyond the format's max by more than half an ulp, so clamped: possible under delayed
// scaling, never with current or 1x128 scales) and the share of non-zero
// elements it flushes to zero. The trainer attaches a probe every `sites_every` steps
// (Precision::probe) and writes the summary into metrics.jsonl.
//
// The shares are computed on the host, on a sample: the first kSampleElements elements of each
// tensor (whole rows), quantized as the site's recipe quantizes them (1x128 tiles, or one
// per-tensor scale: the tensor's amax for current scaling, the state's scale for delayed). The copy
// to the host synchronises, which is why probing is sparse. BF16 sites report amax only.
#pragma once

#include <map>
#include <string>

#include "core/context.h"
#include "numerics/recipe.h"

namespace octet {

struct SiteNumerics {
  double amax = 0;
  int64_t elements = 0;   // sampled
  int64_t nonzero = 0;    // sampled and non-zero
  int64_t saturated = 0;  // clamped to the format's max
  int64_t flushed = 0;    // non-zero, quantized to zero
  double saturated_share() const { return elements ? double(saturated) / double(elements) : 0.0; }
  double flushed_share() const { return nonzero ? double(flushed) / double(nonzero) : 0.0; }
};

class SiteProbe {
 public:
  static constexpr int64_t kSampleElements = 1 << 16;

  // Records tensor t (rows, cols) entering site `site` as `operand` (kActivation "x" or kGradient
  // "dy"), quantized as the recipe quantizes that operand (GemmRecipe::quantization);
  // `delayed_scale` is the (1) f32 scale of delayed scaling, or null.
  void record(Context& ctx, GemmSite site, GemmOperand operand, const Tensor& t,
              const GemmRecipe& r, const Tensor* delayed_scale);

  // Keyed "<site>.<role>", e.g. "attn.q_down.x"; aggregated over layers and micro-batches.
  const std::map<std::string, SiteNumerics>& sites() const { return sites_; }
  void clear() { sites_.clear(); }

 private:
  std::map<std::string, SiteNumerics> sites_;
};

}  // namespace octet
