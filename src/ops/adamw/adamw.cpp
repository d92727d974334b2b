// Dispatcher for adamw.h: validates once, computes the step's constants, routes to cpu:: or cuda::.
#include "ops/adamw/adamw.h"

#include <cmath>

#include "backend/dispatch.h"
#include "ops/adamw/adamw_backends.h"

namespace octet {
namespace {

bool finite(float x) {
  return std::isfinite(x);
}

void check_same_numel(const Tensor& t, const char* name, DType dtype, int64_t n, Device device) {
  check_dtype(t, name, {dtype});
  check_device(t, name, device);
  OCTET_CHECK(t.numel() == n, name, ": expected ", n, " elements (as the parameter), got shape ",
              shape_str(t.shape()));
}

void check_scalar(const Tensor& t, const char* name, DType dtype, Device device) {
  check_dtype(t, name, {dtype});
  check_device(t, name, device);
  OCTET_CHECK(t.numel() == 1, name, ": expected shape [1], got ", shape_str(t.shape()));
}

void check_grad_list(Context& ctx, const std::vector<Tensor>& grads, const char* op) {
  for (size_t i = 0; i < grads.size(); ++i) {
    const std::string name = std::string(op) + " grads[" + std::to_string(i) + "]";
    check_dtype(grads[i], name.c_str(), {DType::kF32});
    check_device(grads[i], name.c_str(), ctx.device);
    OCTET_CHECK(grads[i].data() != nullptr || grads[i].numel() == 0, name,
                ": tensor has no storage");
  }
}

}  // namespace

void adamw_step(Context& ctx, const AdamWArgs& a) {
  check_dtype(a.param, "adamw param", {DType::kF32});
  check_device(a.param, "adamw param", ctx.device);
  const int64_t n = a.param.numel();
  check_same_numel(a.grad, "adamw grad", DType::kF32, n, ctx.device);
  check_same_numel(a.exp_avg, "adamw exp_avg", DType::kBF16, n, ctx.device);
  check_same_numel(a.exp_avg_sq, "adamw exp_avg_sq", DType::kBF16, n, ctx.device);
  if (a.param_bf16.data())
    check_same_numel(a.param_bf16, "adamw param_bf16", DType::kBF16, n, ctx.device);
  if (a.grad_scale.data()) check_scalar(a.grad_scale, "adamw grad_scale", DType::kF32, ctx.device);
  if (a.found_inf.data()) check_scalar(a.found_inf, "adamw found_inf", DType::kI32, ctx.device);
  OCTET_CHECK(finite(a.lr) && a.lr >= 0.0f, "adamw: lr must be finite and >= 0, got ", a.lr);
  OCTET_CHECK(a.beta1 >= 0.0f && a.beta1 < 1.0f, "adamw: beta1 must be in [0, 1), got ", a.beta1);
  OCTET_CHECK(a.beta2 >= 0.0f && a.beta2 < 1.0f, "adamw: beta2 must be in [0, 1), got ", a.beta2);
  OCTET_CHECK(finite(a.eps) && a.eps > 0.0f, "adamw: eps must be finite and > 0, got ", a.eps);
  OCTET_CHECK(finite(a.weight_decay) && a.weight_decay >= 0.0f,
              "adamw: weight_decay must be finite and >= 0, got ", a.weight_decay);
  OCTET_CHECK(a.step >= 1, "adamw: step must be >= 1 (count including this step), got ", a.step);
  AdamWConsts k;
  const double step = static_cast<double>(a.step);
  k.beta1 = a.beta1;
  k.beta2 = a.beta2;
  k.one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(a.beta1));
  k.one_minus_beta2 = static_cast<float>(1.0 - static_cast<double>(a.beta2));
  k.decay =
      static_cast<float>(1.0 - static_cast<double>(a.lr) * static_cast<double>(a.weight_decay));
  k.step_size = static_cast<float>(static_cast<double>(a.lr) /
                                   (1.0 - std::pow(static_cast<double>(a.beta1), step)));
  k.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(a.beta2), step)));
  k.eps = a.eps;
  if (n == 0) return;
  OCTET_DISPATCH(ctx, adamw_step, ctx, a, k);
}

Tensor global_grad_norm(Context& ctx, const std::vector<Tensor>& grads) {
  check_grad_list(ctx, grads, "global_grad_norm");
  Tensor norm = Tensor::empty(ctx, {1}, DType::kF32);
  OCTET_DISPATCH(ctx, global_grad_norm, ctx, grads, norm);
  return norm;
}

Tensor grad_clip_coefficient(Context& ctx, const Tensor& norm, float max_norm) {
  check_scalar(norm, "grad_clip_coefficient norm", DType::kF32, ctx.device);
  OCTET_CHECK(finite(max_norm) && max_norm > 0.0f,
              "grad_clip_coefficient: max_norm must be finite and > 0, got ", max_norm);
  Tensor out = Tensor::empty(ctx, {1}, DType::kF32);
  OCTET_DISPATCH(ctx, grad_clip_coefficient, ctx, norm, max_norm, out);
  return out;
}

Tensor nonfinite_flag(Context& ctx, const std::vector<Tensor>& grads) {
  check_grad_list(ctx, grads, "nonfinite_flag");
  Tensor flag = Tensor::empty(ctx, {1}, DType::kI32);
  OCTET_DISPATCH(ctx, nonfinite_flag, ctx, grads, flag);
  return flag;
}

}  // namespace octet
