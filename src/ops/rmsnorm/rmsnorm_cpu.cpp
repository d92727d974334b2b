// CPU reference for rmsnorm.h: plain loops, sums in FP64, one rounding per stored value.
#include <cmath>
#include <vector>

#include "numerics/fp8.h"
#include "ops/cast/cast_backends.h"
#include "ops/cpu_elements.h"
#include "ops/rmsnorm/rmsnorm_backends.h"

namespace octet::cpu {
namespace {

// t[i] = round(t[i] + r[i]) over the whole tensor: add_into's element (ops/cast).
void add_residual(const Tensor& t, const Tensor& r) {
  for (int64_t i = 0; i < t.numel(); ++i) store(t, i, add_element(load(t, i), load(r, i)));
}

}  // namespace

void rmsnorm_forward(Context&, const RmsNormForwardArgs& a) {
  const int64_t rows = a.x.rows(), d = a.x.cols();
  if (a.residual.defined()) add_residual(a.x, a.residual);
  const float* w = a.weight.data_as<const float>();
  float* rstd = a.rstd.data_as<float>();
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int64_t j = 0; j < d; ++j) ss += load_f64(a.x, r * d + j) * load_f64(a.x, r * d + j);
    const float rs = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + a.epsilon));
    rstd[r] = rs;
    for (int64_t j = 0; j < d; ++j) store(a.y, r * d + j, load_f64(a.x, r * d + j) * rs * w[j]);
  }
}

void rmsnorm_backward(Context&, const RmsNormBackwardArgs& a) {
  const int64_t rows = a.x.rows(), d = a.x.cols();
  const float* w = a.weight.data_as<const float>();
  const float* rstd = a.rstd.data_as<const float>();
  std::vector<double> dw(static_cast<size_t>(d), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double rs = rstd[r];
    double dot = 0.0;  // sum_k g_k * xhat_k
    for (int64_t j = 0; j < d; ++j)
      dot += load_f64(a.dy, r * d + j) * w[j] * (load_f64(a.x, r * d + j) * rs);
    const double mean = dot / static_cast<double>(d);
    for (int64_t j = 0; j < d; ++j) {
      const double xhat = load_f64(a.x, r * d + j) * rs, dy = load_f64(a.dy, r * d + j);
      store(a.dx, r * d + j, rs * (dy * w[j] - xhat * mean));
      dw[static_cast<size_t>(j)] += dy * xhat;
    }
  }
  float* dweight = a.dweight.data_as<float>();
  for (int64_t j = 0; j < d; ++j)
    // This call's sum rounded to FP32 once, then one FP32 addition: accumulating micro-batches in
    // one process gives the bits of summing their results over data-parallel ranks.
    dweight[j] += static_cast<float>(dw[static_cast<size_t>(j)]);
  if (a.residual_grad.defined()) add_residual(a.dx, a.residual_grad);
}

}  // namespace octet::cpu
