// CPU reference for adamw.h: one loop over the elements with the shared update (adamw_math.h), and
// the global norm in the fixed chunk / lane / halving order that adamw.h states.
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/adamw/adamw_backends.h"
#include "ops/adamw/adamw_math.h"

namespace octet::cpu {

void adamw_step(Context&, const AdamWArgs& a, const AdamWConsts& host_k) {
  if (a.found_inf.data() && a.found_inf.data_as<const int32_t>()[0] != 0) return;
  const AdamWConsts k = a.consts.data() ? *a.consts.data_as<const AdamWConsts>() : host_k;
  const int64_t n = a.param.numel();
  float* p = a.param.data_as<float>();
  const float* g = a.grad.data_as<const float>();
  uint16_t* m = a.exp_avg.data_as<uint16_t>();
  uint16_t* v = a.exp_avg_sq.data_as<uint16_t>();
  uint16_t* pb = a.param_bf16.data() ? a.param_bf16.data_as<uint16_t>() : nullptr;
  const bool scaled = a.grad_scale.data() != nullptr;
  const float scale = scaled ? a.grad_scale.data_as<const float>()[0] : 1.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float gi = scaled ? rn::mul(g[i], scale) : g[i];
    adamw_math::Element x{p[i], bf16_to_float(m[i]), bf16_to_float(v[i])};
    adamw_math::update(x, gi, k);
    p[i] = x.p;
    m[i] = float_to_bf16(x.m);
    v[i] = float_to_bf16(x.v);
    if (pb) pb[i] = float_to_bf16(x.p);
  }
}

void global_grad_norm(Context&, const std::vector<Tensor>& grads, Tensor& norm) {
  std::vector<float> partials;
  for (const Tensor& t : grads) {
    const float* x = t.data_as<const float>();
    const int64_t n = t.numel();
    for (int64_t c0 = 0; c0 < n; c0 += kNormChunk) {
      float lane[kNormLanes] = {};
      for (int l = 0; l < kNormLanes; ++l) {
        for (int r = 0; r < kNormRounds; ++r) {
          const int64_t i = c0 + int64_t{r} * kNormLanes + l;
          if (i < n) lane[l] = rn::add(lane[l], rn::mul(x[i], x[i]));
        }
      }
      for (int h = kNormLanes / 2; h > 0; h /= 2)
        for (int l = 0; l < h; ++l) lane[l] = rn::add(lane[l], lane[l + h]);
      partials.push_back(lane[0]);
    }
  }
  double sums[kNormLanes] = {};
  for (int l = 0; l < kNormLanes; ++l)
    for (size_t q = static_cast<size_t>(l); q < partials.size(); q += kNormLanes)
      sums[l] = rn::add(sums[l], static_cast<double>(partials[q]));
  for (int h = kNormLanes / 2; h > 0; h /= 2)
    for (int l = 0; l < h; ++l) sums[l] = rn::add(sums[l], sums[l + h]);
  norm.data_as<float>()[0] = static_cast<float>(rn::sqrt(sums[0]));
}

void grad_clip_coefficient(Context&, const Tensor& norm, float max_norm, Tensor& out) {
  out.data_as<float>()[0] = adamw_math::clip_coefficient(norm.data_as<const float>()[0], max_norm);
}

void nonfinite_flag(Context&, const std::vector<Tensor>& grads, Tensor& flag) {
  int32_t found = 0;
  for (const Tensor& t : grads) {
    const float* x = t.data_as<const float>();
    for (int64_t i = 0; i < t.numel() && !found; ++i)
      if ((float_bits(x[i]) & 0x7FFFFFFFu) >= 0x7F800000u) found = 1;
  }
  flag.data_as<int32_t>()[0] = found;
}

void adamw_device_consts(Context&, const AdamWDeviceConstsArgs& a) {
  const double step = static_cast<double>(a.steps_taken.data_as<const int64_t>()[0] + 1);
  const auto lr = static_cast<double>(a.lr);
  auto* out = a.out.data_as<AdamWConsts>();
  for (int i = 0; i < 2; ++i) {
    const double wd = i == 0 ? static_cast<double>(a.weight_decay) : 0.0;
    AdamWConsts k;
    k.beta1 = a.beta1;
    k.beta2 = a.beta2;
    k.one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(a.beta1));
    k.one_minus_beta2 = static_cast<float>(1.0 - static_cast<double>(a.beta2));
    k.decay = static_cast<float>(1.0 - lr * wd);
    k.step_size = static_cast<float>(lr / (1.0 - std::pow(static_cast<double>(a.beta1), step)));
    k.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(a.beta2), step)));
    k.eps = a.eps;
    out[i] = k;
  }
}

void adamw_advance_steps(Context&, const Tensor& steps, const Tensor& skipped) {
  if (!skipped.data() || skipped.data_as<const int32_t>()[0] == 0) steps.data_as<int64_t>()[0] += 1;
}

}  // namespace octet::cpu
