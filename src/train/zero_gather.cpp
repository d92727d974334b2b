// ZeroAdamW's weight all-gather (stage 4, zero_optimizer.h): each piece in the form the next
// forward reads it. Per bucket, rank r's part of the gather holds its pieces one after the other:
//   FP32 master   4 bytes per element
//   BF16 copy     2 bytes per element (the rounding of the update pass: ops/cast)
//   FP8 blocks    1 byte per element, then the FP32 scale of each 128x128 block of its rows
// each padded to 4 bytes; the parts are padded to the bucket's largest. The FP8 row-wise blocks
// are quantized by the owner (ops/quantize, as adamw_step_block_quantize defines them) and the
// column-wise copy is the transpose of the gathered bytes and scales, per stacked matrix (the
// same 128x128 blocks quantize the transpose to the same bits).
#include <algorithm>

#include "backend/backend.h"
#include "ops/cast/cast.h"
#include "ops/quantize/quantize.h"
#include "train/zero_optimizer.h"

namespace octet::train {
namespace {

constexpr int64_t kBlock = 128;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

int64_t pad4(int64_t n) {
  return (n + 3) / 4 * 4;
}

CopyKind same_device(const Context& ctx) {
  return ctx.device == Device::kCpu ? CopyKind::kHostToHost : CopyKind::kDeviceToDevice;
}

bool is_fp8(const WeightOutput& w) {
  return w.fp8.data.data() != nullptr;
}

bool is_bf16(const WeightOutput& w) {
  return w.bf16.data() != nullptr;
}

// The bytes a piece of `numel` elements takes in the gather.
int64_t piece_bytes(const WeightOutput& w, int64_t numel) {
  if (is_fp8(w))
    return pad4(numel + ceil_div(numel / w.fp8.cols, kBlock) * ceil_div(w.fp8.cols, kBlock) * 4);
  return is_bf16(w) ? pad4(numel * 2) : numel * 4;
}

Tensor f32_view(const Tensor& t, int64_t offset, int64_t numel) {
  return Tensor::wrap(static_cast<uint8_t*>(t.data()) + offset * 4, {numel}, DType::kF32,
                      t.device());
}

}  // namespace

void ZeroAdamW::set_weight_outputs(Context& ctx, const std::vector<WeightOutput>& outputs) {
  if (masters_sharded_) gather_masters(ctx);  // whole again before the new outputs
  outputs_.assign(params_.size(), WeightOutput{});
  for (const WeightOutput& w : outputs) {
    const auto it = std::find(params_.begin(), params_.end(), w.param);
    OCTET_CHECK(it != params_.end(), "zero optimizer: weight output for ",
                w.param ? w.param->name : "(null)", ", which is not a trainable parameter here");
    const auto i = static_cast<size_t>(it - params_.begin());
    if (is_fp8(w)) {
      const BlockQuantOutput& o = w.fp8;
      OCTET_CHECK(o.rows * o.cols == w.param->value.numel() &&
                      o.cols == w.param->value.shape().back() && o.data.nbytes() == o.rows * o.cols,
                  "zero optimizer: the FP8 output of ", w.param->name, " is ", o.rows, " x ",
                  o.cols, ", not the parameter's rows of its last dimension");
      for (const ZeroLayout::Piece& c : layout_.pieces)
        OCTET_CHECK(c.param != static_cast<int>(i) || (c.offset % (kBlock * o.cols) == 0 &&
                                                       (c.numel % (kBlock * o.cols) == 0 ||
                                                        c.offset + c.numel == o.rows * o.cols)),
                    "zero optimizer: a piece of ", w.param->name,
                    " does not start on its 128-row FP8 blocks");
    } else {
      OCTET_CHECK(
          is_bf16(w) && w.bf16.dtype() == DType::kBF16 && w.bf16.numel() == w.param->value.numel(),
          "zero optimizer: the output of ", w.param->name,
          " is neither FP8 blocks nor a BF16 copy of its elements");
    }
    outputs_[i] = w;
  }
  // Byte offsets within each rank's part of each bucket.
  const int world = dp_->size();
  gather_offset_.assign(layout_.pieces.size(), 0);
  gather_part_.assign(layout_.buckets.size(), 0);
  int64_t max_part = 1;
  output_elems_[0] = output_elems_[1] = output_bytes_[0] = output_bytes_[1] = 0;
  for (size_t k = 0; k < layout_.buckets.size(); ++k) {
    const ZeroLayout::Bucket& b = layout_.buckets[k];
    std::vector<int64_t> used(static_cast<size_t>(world), 0);
    for (int i = b.first; i < b.end; ++i) {
      const ZeroLayout::Piece& c = layout_.pieces[static_cast<size_t>(i)];
      int64_t& u = used[static_cast<size_t>(c.rank)];
      gather_offset_[static_cast<size_t>(i)] = u;
      const WeightOutput& w = outputs_[static_cast<size_t>(c.param)];
      u += piece_bytes(w, c.numel);
      if (is_fp8(w) || is_bf16(w)) {
        output_elems_[is_fp8(w) ? 0 : 1] += c.numel;
        output_bytes_[is_fp8(w) ? 0 : 1] += piece_bytes(w, c.numel);
      }
    }
    gather_part_[k] = *std::max_element(used.begin(), used.end());
    max_part = std::max(max_part, gather_part_[k]);
  }
  gather_send_ = Tensor::empty(ctx, {max_part}, DType::kU8);
  gather_recv_ = Tensor::empty(ctx, {world * max_part}, DType::kU8);
  shard_masters(ctx);
}

void ZeroAdamW::gather_weights(Context& ctx) {
  const int me = dp_->rank();
  auto* send = static_cast<uint8_t*>(gather_send_.data());
  auto* recv = static_cast<uint8_t*>(gather_recv_.data());
  const CopyKind dd = same_device(ctx);
  gathered_bytes_ = 0;
  for (size_t k = 0; k < layout_.buckets.size(); ++k) {
    const ZeroLayout::Bucket& b = layout_.buckets[k];
    const int64_t part = gather_part_[k];
    // This rank's pieces in their gathered forms.
    for (int i = b.first; i < b.end; ++i) {
      const ZeroLayout::Piece& c = layout_.pieces[static_cast<size_t>(i)];
      if (c.rank != me) continue;
      const WeightOutput& w = outputs_[static_cast<size_t>(c.param)];
      const Tensor master =
          masters_sharded_
              ? f32_view(master_shard_, c.shard_offset, c.numel)
              : f32_view(params_[static_cast<size_t>(c.param)]->value, c.offset, c.numel);
      uint8_t* dst = send + gather_offset_[static_cast<size_t>(i)];
      if (is_fp8(w)) {
        QuantizeArgs qa;
        qa.input = master.reshape({c.numel / w.fp8.cols, w.fp8.cols});
        qa.format = w.fp8.format;
        qa.granularity = Granularity::k128x128;
        qa.rounding = w.fp8.rounding;
        qa.output = QuantizeOutput::kRowwise;
        const QuantTensor q = quantize(ctx, qa);
        ctx.be().copy(dst, q.data.data(), q.data.nbytes(), dd);
        ctx.be().copy(dst + c.numel, q.scale_inv.data(), q.scale_inv.nbytes(), dd);
      } else if (is_bf16(w)) {
        const Tensor h = cast(ctx, master, DType::kBF16);
        ctx.be().copy(dst, h.data(), h.nbytes(), dd);
      } else {
        ctx.be().copy(dst, master.data(), master.nbytes(), dd);
      }
    }
    dp_->all_gather(ctx, send, recv, part, DType::kU8);
    gathered_bytes_ += part;
    // Every rank's pieces into the prepared copies (the other ranks' masters for the rest).
    for (int i = b.first; i < b.end; ++i) {
      const ZeroLayout::Piece& c = layout_.pieces[static_cast<size_t>(i)];
      const WeightOutput& w = outputs_[static_cast<size_t>(c.param)];
      const uint8_t* src = recv + c.rank * part + gather_offset_[static_cast<size_t>(i)];
      if (is_fp8(w)) {
        const int64_t sc = ceil_div(w.fp8.cols, kBlock);
        const int64_t block_row = c.offset / w.fp8.cols / kBlock;
        const int64_t scales = ceil_div(c.numel / w.fp8.cols, kBlock) * sc;
        ctx.be().copy(static_cast<uint8_t*>(w.fp8.data.data()) + c.offset, src, c.numel, dd);
        ctx.be().copy(static_cast<uint8_t*>(w.fp8.scale_inv.data()) + block_row * sc * 4,
                      src + c.numel, scales * 4, dd);
      } else if (is_bf16(w)) {
        ctx.be().copy(static_cast<uint8_t*>(w.bf16.data()) + c.offset * 2, src, c.numel * 2, dd);
      } else if (c.rank != me || masters_sharded_) {  // sharded: the owner's too
        ctx.be().copy(static_cast<uint8_t*>(params_[static_cast<size_t>(c.param)]->value.data()) +
                          c.offset * 4,
                      src, c.numel * 4, dd);
      }
    }
  }
  // The column-wise FP8 copies: each stacked matrix's transpose, bytes and scales.
  for (const WeightOutput& w : outputs_) {
    if (!is_fp8(w)) continue;
    const BlockQuantOutput& o = w.fp8;
    const int64_t br = o.batch_rows > 0 ? o.batch_rows : o.rows;
    const int64_t nb = o.rows / br;
    const Tensor data = Tensor::wrap(o.data.data(), {nb, br, o.cols}, DType::kU8, ctx.device);
    const Tensor t = transpose_batched(ctx, data);
    ctx.be().copy(o.columnwise_data.data(), t.data(), t.nbytes(), dd);
    const Tensor scales =
        Tensor::wrap(o.scale_inv.data(), {nb, ceil_div(br, kBlock), ceil_div(o.cols, kBlock)},
                     DType::kF32, ctx.device);
    const Tensor ts = transpose_batched(ctx, scales);
    ctx.be().copy(o.columnwise_scale_inv.data(), ts.data(), ts.nbytes(), dd);
  }
}

bool ZeroAdamW::has_outputs() const {
  return std::any_of(outputs_.begin(), outputs_.end(),
                     [](const WeightOutput& w) { return is_fp8(w) || is_bf16(w); });
}

void ZeroAdamW::gather_masters(Context& ctx) {
  // Every rank, alike: the outputs and the sharding are the same everywhere.
  if (!has_outputs() && !masters_sharded_) return;
  side_->compute_waits_for_side();  // a bucket in flight may still read the staging slot
  const int world = dp_->size(), me = dp_->rank();
  const bool sharded = masters_sharded_;
  if (sharded)  // the freed masters get storage again; every piece comes from its owner's shard
    for (size_t i = 0; i < params_.size(); ++i)
      if (released_[i])
        params_[i]->value = Tensor::empty(ctx, params_[i]->value.shape(), DType::kF32);
  auto* send = static_cast<uint8_t*>(slots_[0].data());
  auto* recv = static_cast<uint8_t*>(recv_.data());
  for (const ZeroLayout::Bucket& k : layout_.buckets) {
    const int64_t n = k.part;
    if (sharded)
      ctx.be().copy(send, static_cast<const uint8_t*>(master_shard_.data()) + k.shard_offset * 4,
                    n * 4, same_device(ctx));
    else
      pack(ctx, me, k.shard_offset, n, false, send, true);
    dp_->all_gather(ctx, send, recv, n, DType::kF32);
    for (int r = 0; r < world; ++r)
      if (r != me || sharded) pack(ctx, r, k.shard_offset, n, false, recv + r * n * 4, false);
  }
  if (sharded) {
    masters_sharded_ = false;
    std::fill(released_.begin(), released_.end(), false);
    master_shard_ = Tensor();  // the update works on the whole masters again
  }
}

void ZeroAdamW::shard_masters(Context& ctx) {
  if (!zero_.shard_masters || masters_sharded_ || !has_outputs()) return;
  const int64_t n = std::max<int64_t>(layout_.max_shard, 1);
  master_shard_ = Tensor::empty(ctx, {n}, DType::kF32);
  ctx.be().memset(master_shard_.data(), 0, master_shard_.nbytes());
  pack(ctx, dp_->rank(), 0, layout_.max_shard, false, static_cast<uint8_t*>(master_shard_.data()),
       true);
  for (size_t i = 0; i < params_.size(); ++i) {
    released_[i] = is_fp8(outputs_[i]) || is_bf16(outputs_[i]);
    if (!released_[i]) continue;
    Parameter& p = *params_[i];
    // The shape stays (the model and the plans read it); the storage goes once nothing holds it.
    p.value = Tensor::wrap(nullptr, p.value.shape(), DType::kF32, p.value.device());
  }
  masters_sharded_ = true;
}

int64_t ZeroAdamW::master_bytes() const {
  int64_t n = masters_sharded_ ? master_shard_.nbytes() : 0;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!master_released(i)) n += params_[i]->value.nbytes();
  return n;
}

}  // namespace octet::train
