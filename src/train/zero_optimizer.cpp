#include "train/zero_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

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
                            int world_size, int64_t bucket_elems,
                            const std::vector<int64_t>& row_block) {
  OCTET_CHECK(piece_elems > 0, "zero: piece_elems must be positive, got ", piece_elems);
  OCTET_CHECK(bucket_elems > 0, "zero: bucket_elems must be positive, got ", bucket_elems);
  OCTET_CHECK(world_size >= 1, "zero: world size must be at least 1, got ", world_size);
  ZeroLayout l;
  OCTET_CHECK(row_block.empty() || row_block.size() == param_elems.size(),
              "zero: row_block needs one entry per parameter");
  for (size_t p = 0; p < param_elems.size(); ++p) {
    const int64_t rb = row_block.empty() ? 0 : row_block[p];
    const int64_t step = rb > 0 ? std::max(rb, piece_elems / rb * rb) : piece_elems;
    for (int64_t off = 0; off < param_elems[p]; off += step) {
      Piece c;
      c.param = static_cast<int>(p);
      c.offset = off;
      c.numel = std::min(step, param_elems[p] - off);
      l.pieces.push_back(c);
    }
  }
  // Buckets: consecutive pieces up to bucket_elems (a larger piece alone).
  for (int i = 0; i < static_cast<int>(l.pieces.size());) {
    Bucket b;
    b.first = i;
    int64_t n = 0;
    while (i < static_cast<int>(l.pieces.size()) &&
           (i == b.first || n + l.pieces[static_cast<size_t>(i)].numel <= bucket_elems))
      n += l.pieces[static_cast<size_t>(i++)].numel;
    b.end = i;
    l.buckets.push_back(b);
  }
  l.shard_elems.assign(static_cast<size_t>(world_size), 0);
  for (size_t k = 0; k < l.buckets.size(); ++k) {
    Bucket& b = l.buckets[k];
    int64_t total = 0;
    for (int i = b.first; i < b.end; ++i) total += l.pieces[static_cast<size_t>(i)].numel;
    std::vector<int64_t> part(static_cast<size_t>(world_size), 0);
    int64_t cum = 0;
    for (int i = b.first; i < b.end; ++i) {
      Piece& c = l.pieces[static_cast<size_t>(i)];
      // The piece goes to the rank whose equal share of the bucket holds its middle element.
      const auto mid = static_cast<long double>(cum) + static_cast<long double>(c.numel) / 2;
      c.rank = std::min(world_size - 1,
                        static_cast<int>(mid * world_size / static_cast<long double>(total)));
      c.bucket = static_cast<int>(k);
      c.shard_offset = l.max_shard + part[static_cast<size_t>(c.rank)];
      part[static_cast<size_t>(c.rank)] += c.numel;
      l.shard_elems[static_cast<size_t>(c.rank)] += c.numel;
      cum += c.numel;
    }
    b.shard_offset = l.max_shard;
    b.part = *std::max_element(part.begin(), part.end());
    l.max_shard += b.part;
    l.max_part = std::max(l.max_part, b.part);
  }
  return l;
}

ZeroAdamW::ZeroAdamW(Context& ctx, std::shared_ptr<Comm> dp, const std::vector<Parameter*>& params,
                     const AdamWConfig& config, const ZeroConfig& zero)
    : dp_(std::move(dp)), config_(config), zero_(zero) {
  OCTET_CHECK(dp_, "zero optimizer: no data-parallel communicator");
  config_.validate();
  OCTET_CHECK(zero_.bucket_elems > 0, "zero: bucket_elems must be positive");
  std::vector<int64_t> sizes, row_block;
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
    // A matrix (or a stack of them) is cut at multiples of 128 rows: its FP8 blocks.
    row_block.push_back(p->value.rank() >= 2 ? 128 * p->value.shape().back() : 0);
    h = fnv(h, p->name.data(), p->name.size());
    const int64_t n = p->value.numel();
    h = fnv(h, &n, sizeof n);
  }
  // The bucket size is part of the layout: every rank must cut the same buckets.
  h = fnv(h, &zero_.piece_elems, sizeof zero_.piece_elems);
  h = fnv(h, &zero_.bucket_elems, sizeof zero_.bucket_elems);
  const std::vector<int64_t> hashes = all_gather_values(ctx, *dp_, static_cast<int64_t>(h));
  for (size_t r = 1; r < hashes.size(); ++r)
    OCTET_CHECK(hashes[r] == hashes[0], "zero optimizer: data-parallel rank ", r,
                " holds different parameters (names or sizes) or bucket settings from rank 0");
  layout_ = ZeroLayout::make(sizes, zero_.piece_elems, dp_->size(), zero_.bucket_elems, row_block);
  grad_shard_ = zeros(ctx, layout_.max_shard, DType::kF32);
  exp_avg_ = zeros(ctx, layout_.max_shard, DType::kBF16);
  exp_avg_sq_ = zeros(ctx, layout_.max_shard, DType::kBF16);
  recv_ = zeros(ctx, dp_->size() * layout_.max_part, DType::kF32);
  side_ = std::make_unique<SideStream>(ctx);
  // Two slots let the packing of one bucket run while the previous one is on the wire; inline
  // (the CPU) one is enough.
  const int slots = side_->overlaps() ? 2 : 1;
  for (int i = 0; i < slots; ++i)
    slots_.push_back(zeros(ctx, dp_->size() * layout_.max_part, DType::kF32));
  slot_free_.assign(slots_.size(), -1);
  for (const ZeroLayout::Piece& c : layout_.pieces) {
    std::vector<int>& bs = param_buckets_[params_[static_cast<size_t>(c.param)]];
    if (bs.empty() || bs.back() != c.bucket) bs.push_back(c.bucket);
  }
  waiting_.assign(layout_.buckets.size(), 0);
  sent_.assign(layout_.buckets.size(), false);
  released_.assign(params_.size(), false);
  set_weight_outputs(ctx, {});  // FP32 masters until told otherwise
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

void ZeroAdamW::begin_final_backward() {
  armed_ = true;
  sent_early_ = 0;
  ready_.clear();
  for (const auto& [param, buckets] : param_buckets_)
    for (int b : buckets) ++waiting_[static_cast<size_t>(b)];
}

void ZeroAdamW::grads_ready(Context& ctx, const std::vector<Parameter*>& params) {
  if (!armed_) return;
  std::vector<int> complete;
  for (const Parameter* p : params) {
    const auto it = param_buckets_.find(p);
    if (it == param_buckets_.end() || !ready_.insert(p).second) continue;
    for (int b : it->second)
      if (--waiting_[static_cast<size_t>(b)] == 0) complete.push_back(b);
  }
  std::sort(complete.rbegin(), complete.rend());
  for (int b : complete) {
    send_bucket(ctx, b);
    ++sent_early_;
  }
}

void ZeroAdamW::send_bucket(Context& ctx, int b) {
  const ZeroLayout::Bucket& k = layout_.buckets[static_cast<size_t>(b)];
  const int world = dp_->size();
  const size_t slot = next_slot_;
  next_slot_ = (next_slot_ + 1) % slots_.size();
  auto* send = static_cast<uint8_t*>(slots_[slot].data());
  // The slot's previous collective must have read it before the compute stream refills it.
  side_->compute_waits_for(slot_free_[slot]);
  const int64_t n = k.part;
  ctx.be().memset(send, 0, world * n * 4);
  for (int r = 0; r < world; ++r) pack(ctx, r, k.shard_offset, n, true, send + r * n * 4, true);
  side_->side_waits_for_compute();
  dp_->reduce_scatter(side_->side_ctx(), send,
                      static_cast<uint8_t*>(grad_shard_.data()) + k.shard_offset * 4, n,
                      DType::kF32, ReduceOp::kSum);
  slot_free_[slot] = side_->mark_side();
  sent_[static_cast<size_t>(b)] = true;
}

void ZeroAdamW::finish_buckets(Context& ctx) {
  for (int b = static_cast<int>(layout_.buckets.size()); b-- > 0;)
    if (!sent_[static_cast<size_t>(b)]) send_bucket(ctx, b);
  side_->compute_waits_for_side();
  armed_ = false;
  std::fill(waiting_.begin(), waiting_.end(), 0);
  std::fill(sent_.begin(), sent_.end(), false);
  ready_.clear();
}

StepStats ZeroAdamW::step(Context& ctx, float lr) {
  double total = 0;
  for (const float n : reduce_grads(ctx)) total += static_cast<double>(n) * n;
  return apply(ctx, lr, static_cast<float>(std::sqrt(total)));
}

std::vector<float> ZeroAdamW::reduce_grads(Context& ctx) {
  const int me = dp_->rank();
  // 1. The buckets the backward did not send yet, into this rank's shard.
  finish_buckets(ctx);
  // 2. The pieces' norms (the global norm is their root sum of squares, in piece order).
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
  const int me = dp_->rank();
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
    a.param = masters_sharded_ ? view(master_shard_, c.shard_offset, c.numel)
                               : view(p.value, c.offset, c.numel);
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
  // 4. All-gather the updated weights (on the compute stream: the next forward reads them).
  gather_weights(ctx);
  steps_taken_ = s.step;
  return s;
}

void ZeroAdamW::zero_grad(Context& ctx) {
  side_->compute_waits_for_side();  // a bucket in flight (a skipped step) has read its gradients
  armed_ = false;
  std::fill(waiting_.begin(), waiting_.end(), 0);
  std::fill(sent_.begin(), sent_.end(), false);
  ready_.clear();
  sent_early_ = 0;
  std::vector<MemsetRange> grads;
  for (Parameter* p : params_)
    if (p->grad.nbytes()) grads.push_back({p->grad.data(), p->grad.nbytes()});
  ctx.be().memset_ranges(grads, 0);
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
  const int64_t part = std::max<int64_t>(layout_.max_part, 1);
  Tensor send = Tensor::empty(ctx, {part}, DType::kBF16);
  Tensor recv = Tensor::empty(ctx, {world * part}, DType::kBF16);
  for (int which = 0; which < 2; ++which) {
    const Tensor& mine = which == 0 ? exp_avg_ : exp_avg_sq_;
    std::vector<Tensor>& full = which == 0 ? m : v;
    for (const ZeroLayout::Bucket& k : layout_.buckets) {
      const int64_t n = k.part;
      ctx.be().copy(send.data(), static_cast<uint8_t*>(mine.data()) + k.shard_offset * 2, n * 2,
                    same_device(ctx));
      dp_->all_gather(ctx, send.data(), recv.data(), n, DType::kBF16);
      for (int i = k.first; i < k.end; ++i) {
        const ZeroLayout::Piece& c = layout_.pieces[static_cast<size_t>(i)];
        ctx.be().copy(
            static_cast<uint8_t*>(full[static_cast<size_t>(c.param)].data()) + c.offset * 2,
            static_cast<uint8_t*>(recv.data()) + (c.rank * n + c.shard_offset - k.shard_offset) * 2,
            c.numel * 2, same_device(ctx));
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
