// Dispatcher for adamw.h: validates once, computes the step's constants, routes to cpu:: or cuda::.
#include "ops/adamw/adamw.h"

#include <cmath>

#include "backend/backend.h"
#include "backend/dispatch.h"
#include "ops/adamw/adamw_backends.h"
#include "ops/cast/cast.h"
#include "ops/quantize/quantize.h"

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

namespace {

// Validates the arguments and computes the step's FP32 constants (adamw.h).
AdamWConsts adamw_consts(Context& ctx, const AdamWArgs& a) {
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
  if (a.consts.data()) {
    check_same_numel(a.consts, "adamw consts", DType::kF32, kAdamWConstsFloats, ctx.device);
    return AdamWConsts{};  // read on the device
  }
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
  return k;
}

void check_block_output(Context& ctx, const AdamWArgs& a, const BlockQuantOutput& o) {
  const char* op = "adamw_step_block_quantize";
  OCTET_CHECK(!a.param_bf16.data(), op, ": param_bf16 must be undefined (the outputs are FP8)");
  OCTET_CHECK(o.rows >= 0 && o.cols >= 0 && o.rows * o.cols == a.param.numel(), op, ": rows ",
              o.rows, " x cols ", o.cols, " is not the parameter's ", a.param.numel(), " elements");
  OCTET_CHECK(o.batch_rows == 0 || (o.batch_rows % kGroup == 0 && o.rows % o.batch_rows == 0), op,
              ": batch_rows ", o.batch_rows, " must be 0 or a multiple of 128 that divides rows ",
              o.rows);
  const DType d8 = fp8_dtype(o.format);
  const int64_t sr = ceil_div(o.rows, kGroup), sc = ceil_div(o.cols, kGroup);
  const int64_t b = o.batch_rows > 0 ? o.rows / o.batch_rows : 1;
  const int64_t br = o.batch_rows > 0 ? o.batch_rows : o.rows;
  check_same_numel(o.data, "adamw_step_block_quantize data", d8, o.rows * o.cols, ctx.device);
  check_same_numel(o.columnwise_data, "adamw_step_block_quantize columnwise_data", d8,
                   o.rows * o.cols, ctx.device);
  check_same_numel(o.scale_inv, "adamw_step_block_quantize scale_inv", DType::kF32, sr * sc,
                   ctx.device);
  check_same_numel(o.columnwise_scale_inv, "adamw_step_block_quantize columnwise_scale_inv",
                   DType::kF32, b * sc * ceil_div(br, kGroup), ctx.device);
}

void copy_bytes(Context& ctx, const Tensor& dst, const Tensor& src) {
  ctx.be().copy(dst.data(), src.data(), src.nbytes(),
                ctx.device == Device::kCpu ? CopyKind::kHostToHost : CopyKind::kDeviceToDevice);
}

// The CPU's fused step: the update, then ops/quantize on the updated master (the definition).
void cpu_step_block_quantize(Context& ctx, const AdamWArgs& a, const AdamWConsts& k,
                             const BlockQuantOutput& o) {
  cpu::adamw_step(ctx, a, k);
  QuantizeArgs qa;
  qa.input = a.param.reshape({o.rows, o.cols});
  qa.format = o.format;
  qa.granularity = Granularity::k128x128;
  qa.rounding = o.rounding;
  qa.output = QuantizeOutput::kBoth;
  const QuantTensor q = quantize(ctx, qa);
  copy_bytes(ctx, o.data, q.data);
  copy_bytes(ctx, o.scale_inv, q.scale_inv);
  if (o.batch_rows == 0) {
    copy_bytes(ctx, o.columnwise_data, q.columnwise_data);
    copy_bytes(ctx, o.columnwise_scale_inv, q.columnwise_scale_inv);
    return;
  }
  // Each stacked matrix's own transpose: its bytes and its scales (the same 128x128 blocks).
  const int64_t b = o.rows / o.batch_rows, sb = o.batch_rows / kGroup,
                sc = ceil_div(o.cols, kGroup);
  copy_bytes(ctx, o.columnwise_data,
             transpose_batched(ctx, Tensor::wrap(q.data.data(), {b, o.batch_rows, o.cols},
                                                 DType::kU8, ctx.device)));
  copy_bytes(ctx, o.columnwise_scale_inv, transpose_batched(ctx, q.scale_inv.reshape({b, sb, sc})));
}

}  // namespace

void adamw_step(Context& ctx, const AdamWArgs& a) {
  const AdamWConsts k = adamw_consts(ctx, a);
  if (a.param.numel() == 0) return;
  OCTET_DISPATCH(ctx, adamw_step, ctx, a, k);
}

void adamw_step_block_quantize(Context& ctx, const AdamWArgs& a, const BlockQuantOutput& o) {
  adamw_step_block_quantize_many(ctx, {BlockQuantStep{a, o}});
}

void adamw_step_block_quantize_many(Context& ctx, const std::vector<BlockQuantStep>& steps) {
  std::vector<AdamWConsts> ks;
  for (const BlockQuantStep& s : steps) {
    ks.push_back(adamw_consts(ctx, s.args));
    check_block_output(ctx, s.args, s.out);
  }
  if (ctx.device == Device::kCuda) {
    std::vector<BlockQuantStep> live;
    std::vector<AdamWConsts> live_k;
    for (size_t i = 0; i < steps.size(); ++i) {
      if (steps[i].args.param.numel() == 0) continue;
      live.push_back(steps[i]);
      live_k.push_back(ks[i]);
    }
#if OCTET_WITH_CUDA
    if (!live.empty()) cuda::adamw_step_block_quantize_many(ctx, live, live_k);
#else
    detail::no_cuda("adamw_step_block_quantize_many");
#endif
    return;
  }
  for (size_t i = 0; i < steps.size(); ++i)
    if (steps[i].args.param.numel() > 0)
      cpu_step_block_quantize(ctx, steps[i].args, ks[i], steps[i].out);
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

void adamw_device_consts(Context& ctx, const AdamWDeviceConstsArgs& a) {
  check_scalar(a.steps_taken, "adamw_device_consts steps_taken", DType::kI64, ctx.device);
  check_same_numel(a.out, "adamw_device_consts out", DType::kF32, 2 * kAdamWConstsFloats,
                   ctx.device);
  OCTET_CHECK(finite(a.lr) && a.lr >= 0.0f, "adamw: lr must be finite and >= 0, got ", a.lr);
  OCTET_CHECK(a.beta1 >= 0.0f && a.beta1 < 1.0f, "adamw: beta1 must be in [0, 1), got ", a.beta1);
  OCTET_CHECK(a.beta2 >= 0.0f && a.beta2 < 1.0f, "adamw: beta2 must be in [0, 1), got ", a.beta2);
  OCTET_CHECK(finite(a.eps) && a.eps > 0.0f, "adamw: eps must be finite and > 0, got ", a.eps);
  OCTET_CHECK(finite(a.weight_decay) && a.weight_decay >= 0.0f,
              "adamw: weight_decay must be finite and >= 0, got ", a.weight_decay);
  OCTET_DISPATCH(ctx, adamw_device_consts, ctx, a);
}

void adamw_advance_steps(Context& ctx, const Tensor& steps, const Tensor& skipped) {
  check_scalar(steps, "adamw_advance_steps steps", DType::kI64, ctx.device);
  if (skipped.data()) check_scalar(skipped, "adamw_advance_steps skipped", DType::kI32, ctx.device);
  OCTET_DISPATCH(ctx, adamw_advance_steps, ctx, steps, skipped);
}

Tensor nonfinite_flag(Context& ctx, const std::vector<Tensor>& grads) {
  check_grad_list(ctx, grads, "nonfinite_flag");
  Tensor flag = Tensor::empty(ctx, {1}, DType::kI32);
  OCTET_DISPATCH(ctx, nonfinite_flag, ctx, grads, flag);
  return flag;
}

}  // namespace octet
