// SiteProbe (site_probe.h): quantization statistics on a host sample.
#include "model/site_probe.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "numerics/fp8.h"
#include "numerics/scale.h"
#include "ops/cast/cast.h"

namespace octet {

void SiteProbe::record(Context& ctx, GemmSite site, GemmOperand operand, const Tensor& t,
                       const GemmRecipe& r, const Tensor* delayed_scale) {
  const char* role = operand == GemmOperand::kGradient ? "dy" : "x";
  const int64_t cols = t.cols();
  if (cols == 0 || t.rows() == 0) return;
  const int64_t rows = std::min<int64_t>(t.rows(), std::max<int64_t>(1, kSampleElements / cols));
  // The first rows, widened to F32 on the host.
  const Tensor head = Tensor::wrap(t.data(), {rows, cols}, t.dtype(), t.device());
  const Tensor host = cast(ctx, head, DType::kF32).to_host(ctx);
  const float* v = host.data_as<const float>();
  const int64_t n = rows * cols;
  SiteNumerics& s = sites_[std::string(gemm_site_name(site)) + "." + role];
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(v[i]));
  s.amax = std::max<double>(s.amax, amax);
  s.elements += n;
  for (int64_t i = 0; i < n; ++i) s.nonzero += v[i] != 0.0f;
  if (!r.is_fp8()) return;
  const GemmRecipe::Quantization q = r.quantization(operand);
  const Fp8Format format = q.format;
  const ScaleRule rule{.format = format, .rounding = q.rounding, .epsilon = 0.0f, .margin = 0};
  // Clamped rather than rounded: beyond the largest value by more than half its ulp (E4M3 464,
  // E5M2 61440). Group maxima with exact scales land a rounding error above fmax and round to it.
  const int man_bits = format == Fp8Format::kE4M3 ? 3 : 2;
  const float clamp_above = fp8_max(format) * (1.0f + std::ldexp(1.0f, -man_bits - 1) / 1.75f);
  auto count = [&](const float* x, int64_t len, float scale) {
    for (int64_t i = 0; i < len; ++i) {
      if (x[i] == 0.0f) continue;
      const float y = std::fabs(rn::mul(x[i], scale));
      if (y > clamp_above) ++s.saturated;
      if (fp8_to_float(quantize_value(x[i], scale, format), format) == 0.0f) ++s.flushed;
    }
  };
  if (q.granularity == Granularity::k1x128) {
    for (int64_t row = 0; row < rows; ++row)
      for (int64_t c0 = 0; c0 < cols; c0 += kGroup) {
        const int64_t len = std::min(kGroup, cols - c0);
        const float* x = v + row * cols + c0;
        float g = 0.0f;
        for (int64_t i = 0; i < len; ++i) g = std::max(g, std::fabs(x[i]));
        count(x, len, compute_scale(g, rule));
      }
    return;
  }
  float scale = 0.0f;
  if (delayed_scale != nullptr) {
    scale = delayed_scale->to_host(ctx).data_as<const float>()[0];
  } else {  // current scaling: the whole tensor's amax
    const Tensor full = cast(ctx, t.reshape({t.rows(), cols}), DType::kF32).to_host(ctx);
    float a = 0.0f;
    for (int64_t i = 0; i < full.numel(); ++i) a = std::max(a, std::fabs(full.data_as<float>()[i]));
    scale = compute_scale(a, rule);
  }
  count(v, n, scale);
}

}  // namespace octet
