#include "train/optimizer.h"

#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "ops/adamw/adamw.h"

namespace octet::train {
namespace {

void check_param_tensor(const Tensor& t, const Parameter& p, const char* what, DType dtype,
                        Device device, int64_t numel) {
  OCTET_CHECK(t.data() != nullptr || t.numel() == 0, "optimizer: parameter ", p.name, ": ", what,
              " has no storage");
  OCTET_CHECK(t.dtype() == dtype, "optimizer: parameter ", p.name, ": ", what, " must be ",
              dtype_name(dtype), ", got ", dtype_name(t.dtype()));
  OCTET_CHECK(t.device() == device, "optimizer: parameter ", p.name, ": ", what, " must be on ",
              device_name(device), ", got ", device_name(t.device()));
  OCTET_CHECK(t.numel() == numel, "optimizer: parameter ", p.name, ": ", what, " must have ", numel,
              " elements (as master), got shape ", shape_str(t.shape()));
}

Tensor zeros(Context& ctx, const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(ctx, shape, dtype);
  if (t.nbytes()) ctx.be().memset(t.data(), 0, t.nbytes());
  return t;
}

// Copies a host tensor into a same-sized tensor on the context's device.
void copy_from_host(Context& ctx, Tensor& dst, const Tensor& src) {
  if (!dst.nbytes()) return;
  ctx.be().copy(dst.data(), src.data(), dst.nbytes(),
                ctx.device == Device::kCpu ? CopyKind::kHostToHost : CopyKind::kHostToDevice);
}

}  // namespace

void AdamWConfig::validate() const {
  OCTET_CHECK(std::isfinite(lr) && lr >= 0, "adamw config: lr must be finite and >= 0, got ", lr);
  OCTET_CHECK(beta1 >= 0 && beta1 < 1, "adamw config: beta1 must be in [0, 1), got ", beta1);
  OCTET_CHECK(beta2 >= 0 && beta2 < 1, "adamw config: beta2 must be in [0, 1), got ", beta2);
  OCTET_CHECK(std::isfinite(eps) && eps > 0, "adamw config: eps must be finite and > 0, got ", eps);
  OCTET_CHECK(std::isfinite(weight_decay) && weight_decay >= 0,
              "adamw config: weight_decay must be finite and >= 0, got ", weight_decay);
  OCTET_CHECK(std::isfinite(grad_clip) && grad_clip >= 0,
              "adamw config: grad_clip must be finite and >= 0 (0 disables clipping), got ",
              grad_clip);
}

AdamWOptimizer::AdamWOptimizer(Context& ctx, std::vector<Parameter*> params,
                               const AdamWConfig& config)
    : params_(std::move(params)), config_(config) {
  config_.validate();
  std::set<std::string> names;
  moments_.resize(params_.size());
  outputs_.resize(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    OCTET_CHECK(params_[i] != nullptr, "optimizer: params[", i, "] is null");
    const Parameter& p = *params_[i];
    OCTET_CHECK(!p.name.empty(), "optimizer: params[", i, "] has an empty name");
    OCTET_CHECK(names.insert(p.name).second, "optimizer: parameter name ", p.name,
                " appears twice");
    const int64_t n = p.value.numel();
    check_param_tensor(p.value, p, "master", DType::kF32, ctx.device, n);
    if (!p.trainable) continue;
    check_param_tensor(p.grad, p, "grad", DType::kF32, ctx.device, n);
    OCTET_CHECK(p.grad.shape() == p.value.shape(), "optimizer: parameter ", p.name, ": grad shape ",
                shape_str(p.grad.shape()), " differs from master shape ",
                shape_str(p.value.shape()));
    moments_[i].exp_avg = zeros(ctx, p.value.shape(), DType::kBF16);
    moments_[i].exp_avg_sq = zeros(ctx, p.value.shape(), DType::kBF16);
  }
  steps_dev_ = zeros(ctx, {1}, DType::kI64);
  consts_ = zeros(ctx, {2 * kAdamWConstsFloats}, DType::kF32);
}

void AdamWOptimizer::set_weight_outputs(Context& ctx, const std::vector<WeightOutput>& outputs) {
  std::map<const Parameter*, size_t> index;
  for (size_t i = 0; i < params_.size(); ++i) index[params_[i]] = i;
  std::vector<Outputs> next(params_.size());
  for (const WeightOutput& w : outputs) {
    const auto it = index.find(w.param);
    OCTET_CHECK(it != index.end(), "optimizer: a weight output's parameter ",
                w.param ? w.param->name : std::string("(null)"), " is not one of the optimizer's");
    const Parameter& p = *w.param;
    if (w.bf16.data())
      check_param_tensor(w.bf16, p, "bf16 copy", DType::kBF16, ctx.device, p.value.numel());
    next[it->second] = {w.bf16, w.fp8};
  }
  outputs_ = std::move(next);
  ++outputs_generation_;
}

StepResult AdamWOptimizer::step(Context& ctx, float lr, const std::vector<Tensor>& also_check) {
  // Eager, the previous step is read here (its stats and the host's count); graphed, nothing here
  // waits: an unread step's stats are dropped and the next finish_step() takes the count from the
  // device.
  if (pending_ && !graphs_ && !lagged_) finish_step(ctx);
  // The constants from the device's step count, outside the graph: lr is this call's argument.
  adamw_device_consts(ctx, {.lr = lr,
                            .beta1 = config_.beta1,
                            .beta2 = config_.beta2,
                            .eps = config_.eps,
                            .weight_decay = config_.weight_decay,
                            .steps_taken = steps_dev_,
                            .out = consts_});
  // The graph reads the weight outputs and the checked tensors where they are now.
  std::ostringstream key;
  key << "outputs " << outputs_generation_;
  for (const Tensor& t : also_check) key << " " << t.data() << ":" << t.numel();
  StepResult r;
  const GraphedSection::Ran ran =
      graph_.run(ctx, graphs_, key.str(), [&] { r = update(ctx, also_check); });
  if (ran == GraphedSection::Ran::kCaptured) captured_ = r;
  if (ran == GraphedSection::Ran::kReplayed) r = captured_;
  r.step = steps_taken_ + 1;
  last_ = r;
  pending_ = true;
  return r;
}

StepResult AdamWOptimizer::update(Context& ctx, const std::vector<Tensor>& also_check) {
  std::vector<Tensor> grads;
  for (const Parameter* p : params_)
    if (p->trainable) grads.push_back(p->grad);
  StepResult r;
  r.grad_norm = global_grad_norm(ctx, grads);
  if (config_.grad_clip > 0)
    r.clip_coef = grad_clip_coefficient(ctx, r.grad_norm, config_.grad_clip);
  std::vector<Tensor> checked = {r.grad_norm};
  checked.insert(checked.end(), also_check.begin(), also_check.end());
  r.skipped = nonfinite_flag(ctx, checked);
  auto* k = static_cast<char*>(consts_.data());
  const Tensor with_decay = Tensor::wrap(k, {kAdamWConstsFloats}, DType::kF32, ctx.device);
  const Tensor no_decay = Tensor::wrap(k + kAdamWConstsFloats * sizeof(float), {kAdamWConstsFloats},
                                       DType::kF32, ctx.device);
  // The FP8-block parameters in one batched pass (adamw_step_block_quantize_many), the others one
  // adamw_step each.
  std::vector<BlockQuantStep> fp8_steps;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Parameter& p = *params_[i];
    if (!p.trainable) continue;
    AdamWArgs a;
    a.param = p.value;
    a.grad = p.grad;
    a.exp_avg = moments_[i].exp_avg;
    a.exp_avg_sq = moments_[i].exp_avg_sq;
    a.param_bf16 = outputs_[i].bf16;
    a.grad_scale = r.clip_coef;
    a.found_inf = r.skipped;
    a.consts = p.weight_decay && config_.weight_decay != 0.0f ? with_decay : no_decay;
    a.beta1 = config_.beta1;
    a.beta2 = config_.beta2;
    a.eps = config_.eps;
    if (outputs_[i].fp8.data.data() != nullptr)
      fp8_steps.push_back({a, outputs_[i].fp8});
    else
      adamw_step(ctx, a);
  }
  adamw_step_block_quantize_many(ctx, fp8_steps);
  adamw_advance_steps(ctx, steps_dev_, r.skipped);
  return r;
}

StepStats AdamWOptimizer::finish_step(Context& ctx) {
  if (!pending_) return last_stats_;
  // The first copy waits for the step; the others find their values ready.
  StepStats s;
  s.skipped = last_.skipped.to_host(ctx).data_as<int32_t>()[0] != 0;
  s.grad_norm = last_.grad_norm.to_host(ctx).data_as<float>()[0];
  if (last_.clip_coef.data()) s.clip_coef = last_.clip_coef.to_host(ctx).data_as<float>()[0];
  // The device's count is the truth (a graphed step() may have left earlier steps unread).
  steps_taken_ = steps_dev_.to_host(ctx).data_as<const int64_t>()[0];
  s.step = s.skipped ? steps_taken_ + 1 : steps_taken_;
  pending_ = false;
  last_stats_ = s;
  return s;
}

void AdamWOptimizer::zero_grad(Context& ctx) {
  std::vector<MemsetRange> grads;
  for (const Parameter* p : params_)  // a first writer's gradient is overwritten (parameter.h)
    if (p->grad.data() && p->grad.nbytes() && !p->first_writer)
      grads.push_back({p->grad.data(), p->grad.nbytes()});
  ctx.be().memset_ranges(grads, 0);
}

io::NamedTensors AdamWOptimizer::state_dict(Context& ctx) {
  if (pending_) finish_step(ctx);
  io::NamedTensors out;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i]->trainable) continue;
    out.emplace_back(params_[i]->name + ".exp_avg", moments_[i].exp_avg.to_host(ctx));
    out.emplace_back(params_[i]->name + ".exp_avg_sq", moments_[i].exp_avg_sq.to_host(ctx));
  }
  Tensor step = Tensor::empty({1}, DType::kI64);
  step.data_as<int64_t>()[0] = steps_taken_;
  out.emplace_back(kStepTensorName, step);
  return out;
}

SavedState::SavedState(const io::NamedTensors& state) {
  for (const auto& [name, t] : state) {
    OCTET_CHECK(by_name_.emplace(name, &t).second, "optimizer state: tensor ", name,
                " appears twice");
    OCTET_CHECK(t.device() == Device::kCpu, "optimizer state: tensor ", name,
                " must be a host tensor");
  }
}

const Tensor& SavedState::take(const std::string& name, DType dtype, const Shape& shape) {
  auto it = by_name_.find(name);
  OCTET_CHECK(it != by_name_.end(), "optimizer state: tensor ", name, " is missing");
  const Tensor& t = *it->second;
  OCTET_CHECK(t.dtype() == dtype, "optimizer state: tensor ", name, " must be ", dtype_name(dtype),
              ", got ", dtype_name(t.dtype()));
  OCTET_CHECK(t.shape() == shape, "optimizer state: tensor ", name, " must have shape ",
              shape_str(shape), ", got ", shape_str(t.shape()));
  by_name_.erase(it);
  return t;
}

int64_t SavedState::take_step() {
  const std::string name = AdamWOptimizer::kStepTensorName;
  const int64_t steps = take(name, DType::kI64, {1}).data_as<int64_t>()[0];
  OCTET_CHECK(steps >= 0, "optimizer state: tensor ", name, " must be >= 0, got ", steps);
  return steps;
}

void SavedState::check_all_taken() const {
  if (!by_name_.empty())
    OCTET_THROW("optimizer state: unexpected tensor ", by_name_.begin()->first,
                " (no trainable parameter of that name)");
}

void AdamWOptimizer::load_state_dict(Context& ctx, const io::NamedTensors& state) {
  if (pending_) finish_step(ctx);
  SavedState saved(state);
  // Check everything before changing anything, so a bad file leaves the optimizer as it was.
  std::vector<std::pair<Tensor*, const Tensor*>> copies;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Parameter& p = *params_[i];
    if (!p.trainable) continue;
    copies.emplace_back(&moments_[i].exp_avg,
                        &saved.take(p.name + ".exp_avg", DType::kBF16, p.value.shape()));
    copies.emplace_back(&moments_[i].exp_avg_sq,
                        &saved.take(p.name + ".exp_avg_sq", DType::kBF16, p.value.shape()));
  }
  const int64_t steps = saved.take_step();
  saved.check_all_taken();
  for (auto& [dst, src] : copies) copy_from_host(ctx, *dst, *src);
  steps_taken_ = steps;
  Tensor st = Tensor::empty({1}, DType::kI64);
  st.data_as<int64_t>()[0] = steps;
  copy_from_host(ctx, steps_dev_, st);
  last_stats_ = StepStats{};
}

}  // namespace octet::train
