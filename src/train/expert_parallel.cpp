#include "train/expert_parallel.h"

#include <cmath>
#include <cstring>

#include "backend/backend.h"
#include "train/optimizer.h"

namespace octet::train {
namespace {

// Every EP rank's `mine` (the same count on each), in EP rank order, through the device.
Tensor gather_host(Context& ctx, Comm& group, const Tensor& mine) {
  const Tensor send = mine.to(ctx, ctx.device);
  Tensor recv = Tensor::empty(ctx, {group.size() * mine.numel()}, mine.dtype());
  group.all_gather(ctx, send.data(), recv.data(), mine.numel(), mine.dtype());
  return recv.to_host(ctx);
}

bool is_moment_of(const std::string& tensor, const std::string& param) {
  return tensor == param + ".exp_avg" || tensor == param + ".exp_avg_sq";
}

}  // namespace

EpGroups make_ep_groups(Context& ctx, const std::shared_ptr<Comm>& world, int64_t ep,
                        int64_t routed_experts) {
  const int w = world ? world->size() : 1;
  OCTET_CHECK(ep >= 1, "parallel.ep must be at least 1, got ", ep);
  OCTET_CHECK(ep == 1 || w > 1, "parallel.ep = ", ep,
              " needs several ranks (the world has 1); launch with --nproc ", ep,
              " or a multiple of it");
  OCTET_CHECK(w % ep == 0, "parallel.ep = ", ep, " does not divide the ", w,
              " ranks: the grid is DP x EP = world, so the world size must be a multiple of ", ep);
  OCTET_CHECK(ep == 1 || (routed_experts > 0 && routed_experts % ep == 0), "parallel.ep = ", ep,
              " does not divide the model's ", routed_experts,
              " routed experts (model.n_routed_experts): each EP rank holds E / ep of them");
  EpGroups g;
  if (ep == 1) return g;
  const int r = world->rank(), e = r % static_cast<int>(ep), d = r / static_cast<int>(ep);
  g.experts = world->split(ctx, d, e);
  g.data = world->split(ctx, e, d);
  return g;
}

EpAdamW::EpAdamW(Context& ctx, std::shared_ptr<Comm> world, EpGroups groups, Model& model,
                 const AdamWConfig& config, const ZeroConfig& zero)
    : groups_(std::move(groups)) {
  OCTET_CHECK(groups_.experts && groups_.data && model.experts_sharded(),
              "EP optimizer: the model's experts are not sharded over an expert group");
  const std::vector<Parameter*> experts = model.expert_parameters();
  for (const Parameter* p : experts) expert_.insert(p->name);
  std::vector<Parameter*> replicated;
  for (Parameter* p : model.parameters()) {
    if (p->trainable) order_.push_back(p->name);
    if (!expert_.count(p->name)) replicated.push_back(p);
  }
  replicated_ = std::make_unique<ZeroAdamW>(ctx, std::move(world), replicated, config, zero);
  experts_ = std::make_unique<ZeroAdamW>(ctx, groups_.data, experts, config, zero);
  const int64_t E = model.config().n_routed_experts;
  count_ = E / groups_.experts->size();
  first_ = count_ * groups_.experts->rank();
}

StepStats EpAdamW::step(Context& ctx, float lr) {
  const std::vector<float> rep = replicated_->reduce_grads(ctx);
  const std::vector<float> mine = experts_->reduce_grads(ctx);
  double total = 0;
  for (const float n : rep) total += static_cast<double>(n) * n;
  if (!mine.empty()) {
    Tensor h = Tensor::empty({static_cast<int64_t>(mine.size())}, DType::kF32);
    std::memcpy(h.data(), mine.data(), mine.size() * sizeof(float));
    const Tensor all = gather_host(ctx, *groups_.experts, h);  // EP rank order
    for (int64_t i = 0; i < all.numel(); ++i) {
      const double v = all.data_as<const float>()[i];
      total += v * v;
    }
  }
  const auto norm = static_cast<float>(std::sqrt(total));
  const StepStats s = replicated_->apply(ctx, lr, norm);
  experts_->apply(ctx, lr, norm);
  return s;
}

void EpAdamW::zero_grad(Context& ctx) {
  replicated_->zero_grad(ctx);
  experts_->zero_grad(ctx);
}

void EpAdamW::set_weight_outputs(Context& ctx, const std::vector<WeightOutput>& outputs) {
  std::vector<WeightOutput> rep, mine;
  for (const WeightOutput& w : outputs)
    (w.param && expert_.count(w.param->name) ? mine : rep).push_back(w);
  replicated_->set_weight_outputs(ctx, rep);  // each collective over its own group
  experts_->set_weight_outputs(ctx, mine);
}

void EpAdamW::gather_masters(Context& ctx) {
  replicated_->gather_masters(ctx);
  experts_->gather_masters(ctx);
}

void EpAdamW::shard_masters(Context& ctx) {
  replicated_->shard_masters(ctx);
  experts_->shard_masters(ctx);
}

int64_t EpAdamW::trainable_elems() const {
  int64_t n = 0;
  for (const int64_t e : replicated_->layout().shard_elems) n += e;
  for (const int64_t e : experts_->layout().shard_elems) n += e * ep_size();
  return n;
}

void EpAdamW::gather_unsharded_masters(Context& ctx) {
  // Every rank of a group alike: the outputs and the sharding are the same on each of them.
  if (!replicated_->masters_sharded()) replicated_->gather_masters(ctx);
  if (!experts_->masters_sharded()) experts_->gather_masters(ctx);
}

void EpAdamW::load_state_dict(Context& ctx, const io::NamedTensors& state) {
  io::NamedTensors rep, mine;
  for (const auto& [n, t] : state) {
    if (n == AdamWOptimizer::kStepTensorName) {
      rep.emplace_back(n, t);
      mine.emplace_back(n, t);
      continue;
    }
    bool expert = false;
    for (const std::string& p : expert_) expert = expert || is_moment_of(n, p);
    if (!expert) {
      rep.emplace_back(n, t);
      continue;
    }
    // This rank's experts: rows [first, first + count) of the whole (E, Out, In) moment.
    OCTET_CHECK(t.rank() == 3 && t.size(0) == count_ * groups_.experts->size(), "optimizer state ",
                n, ": expected ", count_ * groups_.experts->size(), " experts, got shape ",
                shape_str(t.shape()));
    const int64_t per = t.numel() / t.size(0);
    Tensor slice = Tensor::empty({count_, t.size(1), t.size(2)}, t.dtype());
    std::memcpy(slice.data(),
                static_cast<const uint8_t*>(t.data()) + first_ * per * dtype_size(t.dtype()),
                slice.nbytes());
    mine.emplace_back(n, slice);
  }
  replicated_->load_state_dict(ctx, rep);  // each refuses a missing or unknown tensor
  experts_->load_state_dict(ctx, mine);
}

}  // namespace octet::train
