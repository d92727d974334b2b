// LinearLayer and NormLayer (parameter.h): thin holders over model/linear.h and ops/rmsnorm; the
// first writer's rule (first_write).
#include "model/parameter.h"

#include <utility>

#include "backend/backend.h"
#include "ops/rmsnorm/rmsnorm.h"

namespace octet {

void LinearLayer::init_state(Context& ctx, const Recipe& recipe) {
  const GemmRecipe& r = recipe.at(site);
  if (r.is_delayed()) state = make_linear_scaling_state(ctx, recipe);
}

void LinearLayer::prepare(Context& ctx, const Precision& p, PrepareScope scope) {
  if (scope == PrepareScope::kNotFused && fused) return;
  fused = false;
  PrepareWeightArgs a;
  a.site = site;
  a.weight = param->value;
  a.recipe = p.recipe.at(site);
  a.state = &state;
  a.activation_dtype = p.act;
  prepared = prepare_weight(ctx, a);
}

bool LinearLayer::weight_output(WeightOutput& out) const {
  const PreparedWeight& w = prepared;
  out = WeightOutput{param, Tensor(), BlockQuantOutput{}};
  if (w.precision == GemmPrecision::kBf16 && w.bf16.dtype() == DType::kBF16 &&
      w.bf16.data() != nullptr) {
    out.bf16 = w.bf16;
    return true;
  }
  if (w.precision != GemmPrecision::kFp8Block || w.fp8.granularity != Granularity::k128x128 ||
      !w.fp8.has_columnwise())
    return false;
  out.fp8 = BlockQuantOutput{w.fp8.format,
                             w.fp8.rounding,
                             w.out_features,
                             w.in_features,
                             0,
                             w.fp8.data,
                             w.fp8.scale_inv,
                             w.fp8.columnwise_data,
                             w.fp8.columnwise_scale_inv};
  return true;
}

Tensor LinearLayer::forward(Context& ctx, const Precision& p, const Tensor& x, LinearSaved& saved,
                            Storage storage, QuantTensor* shared_x) {
  LinearArgs a;
  a.site = site;
  a.x = x;
  a.weight = prepared;
  a.recipe = p.recipe.at(site);
  a.state = &state;
  a.saved_storage = storage;
  a.shared_x = shared_x;
  if (p.probe != nullptr)
    p.probe->record(ctx, site, GemmOperand::kActivation, x, a.recipe,
                    a.recipe.is_delayed() ? &state.x.scale : nullptr);
  return linear_forward(ctx, a, saved);
}

bool first_write(Context& ctx, Parameter& param, bool can_overwrite) {
  if (!std::exchange(param.grad_fresh, false)) return false;
  if (can_overwrite) return true;
  ctx.be().memset(param.grad.data(), 0, param.grad.nbytes());
  return false;
}

Tensor LinearLayer::backward(Context& ctx, const Precision& p, const Tensor& dy,
                             const LinearSaved& saved) {
  LinearBackwardArgs a;
  a.site = site;
  a.dy = dy;
  a.saved = saved;
  a.weight = prepared;
  a.recipe = p.recipe.at(site);
  a.state = &state;
  if (p.probe != nullptr)
    p.probe->record(ctx, site, GemmOperand::kGradient, dy, a.recipe,
                    a.recipe.is_delayed() ? &state.dy.scale : nullptr);
  LinearGrads g{param->grad, first_write(ctx, *param, true)};
  return linear_backward(ctx, a, g);  // param->grad += dy^T x (= for its first writer)
}

Tensor NormLayer::forward(Context& ctx, const Tensor& x, Saved& saved,
                          const Tensor& residual) const {
  Tensor y = Tensor::empty(ctx, x.shape(), x.dtype());
  Tensor rstd = Tensor::empty(ctx, {x.rows()}, DType::kF32);
  rmsnorm_forward(
      ctx,
      {.x = x, .weight = param->value, .epsilon = eps, .y = y, .rstd = rstd, .residual = residual});
  saved = {x, rstd};
  return y;
}

Tensor NormLayer::backward(Context& ctx, const Tensor& dy, const Saved& saved,
                           const Tensor& residual_grad) const {
  Tensor dx = Tensor::empty(ctx, dy.shape(), dy.dtype());
  rmsnorm_backward(ctx, {.dy = dy,
                         .x = saved.x,
                         .weight = param->value,
                         .rstd = saved.rstd,
                         .dx = dx,
                         .dweight = param->grad,  // +=
                         .residual_grad = residual_grad});
  return dx;
}

}  // namespace octet
