#include "train/zero_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "backend/backend.h"
#include "ops/adamw/adamw.h"

namespace octet::train {
namespace {

CopyKind same_device(const Context& ctx) {
  return ctx.device == Device::kCpu ? CopyKind::kHostToHost : CopyKind::kDeviceToDevice;
}

Tensor view(const Tensor& t, int64_t offset, int64_t numel) {
  return Tensor::wrap(static_cast<uint8_t*>(t.data()) + offset * dtype_size(t.dtype()), {numel},
                      t.dtype(), t.device());
}

Tensor zeros(Context& ctx, int64_t n, DType dtype) {
  Tensor t = Tensor::empty(ctx, {std::max<int64_t>(n, 1)}, dtype);
  ctx.be().memset(t.data(), 0, t.nbytes());
  return t;
}

uint64_t fnv(uint64_t h, const void* p, size_t n) {
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 1099511628211ull;
  return h;
}

}  // namespace

ZeroLayout ZeroLayout::make(const std::vector<int64_t>& param_elems, int64_t piece_elems,
                            int world_size) {
  OCTET_CHECK(piece_elems > 0, "zero: piece_elems must be positive, got ", piece_elems);
  OCTET_CHECK(world_size >= 1, "zero: world size must be at least 1, got ", world_size);
  ZeroLayout l;
  int64_t total = 0;
  for (int64_t n : param_elems) total += n;
  int64_t cum = 0;
  for (size_t p = 0; p < param_elems.size(); ++p) {
    for (int64_t off = 0; off < param_elems[p]; off += piece_elems) {
      Piece c;
      c.param = static_cast<int>(p);
      c.offset = off;
      c.numel = std::min(piece_elems, param_elems[p] - off);
      // The piece goes to the rank whose equal share holds its middle element.
      const auto mid = static_cast<long double>(cum) + static_cast<long double>(c.numel) / 2;
      c.rank = std::min(world_size - 1,
                        static_cast<int>(mid * world_size / static_cast<long double>(total)));
      cum += c.numel;
      l.pieces.push_back(c);
    }
  }
  l.shard_elems.assign(static_cast<size_t>(world_size), 0);
  for (Piece& c : l.pieces) {
    c.shard_offset = l.shard_elems[static_cast<size_t>(c.rank)];
    l.shard_elems[static_cast<size_t>(c.rank)] += c.numel;
  }
  l.max_shard = *std::max_element(l.shard_elems.begin(), l.shard_elems.end());
  return l;
}

ZeroAdamW::ZeroAdamW(Context& ctx, std::shared_ptr<Comm> dp, const std::vector<Parameter*>& params,
                     const AdamWConfig& config, const ZeroConfig& zero)
    : dp_(std::move(dp)), config_(config), zero_(zero) {
  OCTET_CHECK(dp_, "zero optimizer: no data-parallel communicator");
  config_.validate();
  OCTET_CHECK(zero_.bucket_elems > 0, "zero: bucket_elems must be positive");
  std::vector<int64_t> sizes;
  uint64_t h = 1469598103934665603ull;
  for (Parameter* p : params) {
    OCTET_CHECK(p && p->value.dtype() == DType::kF32 && p->value.device() == ctx.device,
                "zero optimizer: parameter ", p ? p->name : "(null)",
                ": the master must be f32 on ", device_name(ctx.device));
    if (!p->trainable) continue;
    OCTET_CHECK(
        p->grad.data() && p->grad.numel() == p->value.numel() && p->grad.dtype() == DType::kF32,
        "zero optimizer: parameter ", p->name, ": the gradient must be f32 like the master");
    params_.push_back(p);
    sizes.push_back(p->value.numel());
    h = fnv(h, p->name.data(), p->name.size());
    const int64_t n = p->value.numel();
    h = fnv(h, &n, sizeof n);
  }
  const std::vector<int64_t> hashes = all_gather_values(ctx, *dp_, static_cast<int64_t>(h));
  for (size_t r = 1; r < hashes.size(); ++r)
    OCTET_CHECK(hashes[r] == hashes[0], "zero optimizer: data-parallel rank ", r,
                " holds different parameters (names or sizes) from rank 0");
  layout_ = ZeroLayout::make(sizes, zero_.piece_elems, dp_->size());
  bucket_ = std::min(zero_.bucket_elems, std::max<int64_t>(layout_.max_shard, 1));
  // Padded to the largest shard: every rank receives the same count in each collective.
  grad_shard_ = zeros(ctx, layout_.max_shard, DType::kF32);
  exp_avg_ = zeros(ctx, layout_.max_shard, DType::kBF16);
  exp_avg_sq_ = zeros(ctx, layout_.max_shard, DType::kBF16);
  send_ = zeros(ctx, dp_->size() * bucket_, DType::kF32);
  recv_ = zeros(ctx, dp_->size() * bucket_, DType::kF32);
}

void ZeroAdamW::pack(Context& ctx, int rank, int64_t from, int64_t n, bool grads, uint8_t* buf,
                     bool to_shard) const {
  for (const ZeroLayout::Piece& c : layout_.pieces) {
    if (c.rank != rank) continue;
    const int64_t lo = std::max(from, c.shard_offset);
    const int64_t hi = std::min(from + n, c.shard_offset + c.numel);
    if (lo >= hi) continue;
    const Parameter& p = *params_[static_cast<size_t>(c.param)];
    auto* t = static_cast<uint8_t*>(grads ? p.grad.data() : p.value.data()) +
              (c.offset + (lo - c.shard_offset)) * 4;
    uint8_t* b = buf + (lo - from) * 4;
    if (to_shard)
      ctx.be().copy(b, t, (hi - lo) * 4, same_device(ctx));
    else
      ctx.be().copy(t, b, (hi - lo) * 4, same_device(ctx));
  }
}

StepStats ZeroAdamW::step(Context& ctx, float lr) {
  double total = 0;
  for (const float n : reduce_grads(ctx)) total += static_cast<double>(n) * n;
  return apply(ctx, lr, static_cast<float>(std::sqrt(total)));
}

std::vector<float> ZeroAdamW::reduce_grads(Context& ctx) {
  const int world = dp_->size(), me = dp_->rank();
  auto* send = static_cast<uint8_t*>(send_.data());
  // 1. Reduce-scatter the gradients into this rank's shard.
  for (int64_t from = 0; from < layout_.max_shard; from += bucket_) {
    const int64_t n = std::min(bucket_, layout_.max_shard - from);
    ctx.be().memset(send, 0, world * n * 4);
    for (int r = 0; r < world; ++r) pack(ctx, r, from, n, true, send + r * n * 4, true);
    dp_->reduce_scatter(ctx, send, static_cast<uint8_t*>(grad_shard_.data()) + from * 4, n,
                        DType::kF32, ReduceOp::kSum);
  }
  // 2. The global norm from the pieces' norms.
  const auto pieces = static_cast<int64_t>(layout_.pieces.size());
  Tensor norms = zeros(ctx, pieces, DType::kF32);
  for (int64_t i = 0; i < pieces; ++i) {
    const ZeroLayout::Piece& c = layout_.pieces[static_cast<size_t>(i)];
    if (c.rank != me) continue;
    const Tensor n = global_grad_norm(ctx, {view(grad_shard_, c.shard_offset, c.numel)});
    ctx.be().copy(static_cast<uint8_t*>(norms.data()) + i * 4, n.data(), 4, same_device(ctx));
  }
  if (pieces > 0)
    dp_->all_reduce(ctx, norms.data(), norms.data(), pieces, DType::kF32, ReduceOp::kSum);
  const Tensor host = norms.to_host(ctx);
  return {host.data_as<const float>(), host.data_as<const float>() + pieces};
}

StepStats ZeroAdamW::apply(Context& ctx, float lr, float grad_norm) {
  const int world = dp_->size(), me = dp_->rank();
  auto* send = static_cast<uint8_t*>(send_.data());
  auto* recv = static_cast<uint8_t*>(recv_.data());
  StepStats s;
  s.grad_norm = grad_norm;
  s.step = steps_taken_ + 1;
  s.skipped = !std::isfinite(s.grad_norm);
  if (s.skipped) return s;  // every rank sees the same norm: nothing changes anywhere
  Tensor coef;
  if (config_.grad_clip > 0) {
    Tensor nh = Tensor::empty({1}, DType::kF32);
    nh.data_as<float>()[0] = s.grad_norm;
    coef = grad_clip_coefficient(ctx, nh.to(ctx, ctx.device), config_.grad_clip);
    s.clip_coef = coef.to_host(ctx).data_as<const float>()[0];
  }
  // 3. AdamW on the owned pieces.
  for (const ZeroLayout::Piece& c : layout_.pieces) {
    if (c.rank != me) continue;
    const Parameter& p = *params_[static_cast<size_t>(c.param)];
    AdamWArgs a;
    a.param = view(p.value, c.offset, c.numel);
    a.grad = view(grad_shard_, c.shard_offset, c.numel);
    a.exp_avg = view(exp_avg_, c.shard_offset, c.numel);
    a.exp_avg_sq = view(exp_avg_sq_, c.shard_offset, c.numel);
    a.grad_scale = coef;
    a.lr = lr;
    a.beta1 = config_.beta1;
    a.beta2 = config_.beta2;
    a.eps = config_.eps;
    a.weight_decay = p.weight_decay ? config_.weight_decay : 0.0f;
    a.step = s.step;
    adamw_step(ctx, a);
  }
  // 4. All-gather the updated masters.
  for (int64_t from = 0; from < layout_.max_shard; from += bucket_) {
    const int64_t n = std::min(bucket_, layout_.max_shard - from);
    pack(ctx, me, from, n, false, send, true);
    dp_->all_gather(ctx, send, recv, n, DType::kF32);
    for (int r = 0; r < world; ++r)
      if (r != me) pack(ctx, r, from, n, false, recv + r * n * 4, false);
  }
  steps_taken_ = s.step;
  return s;
}

void ZeroAdamW::zero_grad(Context& ctx) {
  for (Parameter* p : params_)
    if (p->grad.nbytes()) ctx.be().memset(p->grad.data(), 0, p->grad.nbytes());
}

io::NamedTensors ZeroAdamW::state_dict(Context& ctx) {
  const int world = dp_->size();
  io::NamedTensors out;
  // Whole moments per parameter on the device, filled from every rank's shard.
  std::vector<Tensor> m(params_.size()), v(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    m[i] = Tensor::empty(ctx, params_[i]->value.shape(), DType::kBF16);
    v[i] = Tensor::empty(ctx, params_[i]->value.shape(), DType::kBF16);
  }
  Tensor send = Tensor::empty(ctx, {std::max<int64_t>(bucket_, 1)}, DType::kBF16);
  Tensor recv = Tensor::empty(ctx, {world * std::max<int64_t>(bucket_, 1)}, DType::kBF16);
  for (int which = 0; which < 2; ++which) {
    const Tensor& mine = which == 0 ? exp_avg_ : exp_avg_sq_;
    std::vector<Tensor>& full = which == 0 ? m : v;
    for (int64_t from = 0; from < layout_.max_shard; from += bucket_) {
      const int64_t n = std::min(bucket_, layout_.max_shard - from);
      ctx.be().copy(send.data(), static_cast<uint8_t*>(mine.data()) + from * 2, n * 2,
                    same_device(ctx));
      dp_->all_gather(ctx, send.data(), recv.data(), n, DType::kBF16);
      for (const ZeroLayout::Piece& c : layout_.pieces) {
        const int64_t lo = std::max(from, c.shard_offset);
        const int64_t hi = std::min(from + n, c.shard_offset + c.numel);
        if (lo >= hi) continue;
        ctx.be().copy(static_cast<uint8_t*>(full[static_cast<size_t>(c.param)].data()) +
                          (c.offset + lo - c.shard_offset) * 2,
                      static_cast<uint8_t*>(recv.data()) + (c.rank * n + lo - from) * 2,
                      (hi - lo) * 2, same_device(ctx));
      }
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back(params_[i]->name + ".exp_avg", m[i].to_host(ctx));
    out.emplace_back(params_[i]->name + ".exp_avg_sq", v[i].to_host(ctx));
  }
  Tensor step = Tensor::empty({1}, DType::kI64);
  step.data_as<int64_t>()[0] = steps_taken_;
  out.emplace_back(AdamWOptimizer::kStepTensorName, step);
  return out;
}

void ZeroAdamW::load_state_dict(Context& ctx, const io::NamedTensors& state) {
  SavedState saved(state);
  std::vector<std::pair<const Tensor*, const Tensor*>> moments;
  for (const Parameter* p : params_)
    moments.emplace_back(&saved.take(p->name + ".exp_avg", DType::kBF16, p->value.shape()),
                         &saved.take(p->name + ".exp_avg_sq", DType::kBF16, p->value.shape()));
  const int64_t steps = saved.take_step();
  saved.check_all_taken();
  const CopyKind up = ctx.device == Device::kCpu ? CopyKind::kHostToHost : CopyKind::kHostToDevice;
  for (const ZeroLayout::Piece& c : layout_.pieces) {
    if (c.rank != dp_->rank()) continue;
    const auto& [m, v] = moments[static_cast<size_t>(c.param)];
    ctx.be().copy(static_cast<uint8_t*>(exp_avg_.data()) + c.shard_offset * 2,
                  static_cast<const uint8_t*>(m->data()) + c.offset * 2, c.numel * 2, up);
    ctx.be().copy(static_cast<uint8_t*>(exp_avg_sq_.data()) + c.shard_offset * 2,
                  static_cast<const uint8_t*>(v->data()) + c.offset * 2, c.numel * 2, up);
  }
  steps_taken_ = steps;
}

}  // namespace octet::train
