// ZeRO-1 AdamW for data parallelism: the gradients reduce-scattered across the data-parallel ranks,
// the AdamW moments (BF16) sharded, each rank updating its shard of the FP32 masters, the updated
// masters all-gathered. The same arithmetic per element as AdamWOptimizer (ops/adamw), and the
// same checkpoint state (state_dict), so a checkpoint does not depend on the world size.
//
// Layout. The trainable parameters, in order, are cut into pieces of at most piece_elems elements
// (a parameter never shares a piece). The pieces are dealt to the ranks in contiguous runs of
// about equal element counts: rank r owns pieces [first_r, first_{r+1}). The cut does not depend
// on the world size; only the dealing does.
//
// One step (step(), collective: every rank of `dp` calls it):
//   1. reduce-scatter, bucket by bucket (bucket_elems elements of every rank's shard at a time):
//      rank r receives the sum over ranks of its pieces' gradients. The in-process communicator
//      sums in rank order, so with one micro-batch per rank the sum is the one a single rank
//      accumulating the same micro-batches in that order computes, bit for bit.
//   2. the global gradient norm, independent of the world size: each rank takes the L2 norm of
//      each of its pieces (ops/adamw global_grad_norm, FP32); the piece norms are summed across
//      ranks (every entry is nonzero on one rank only, so the sum is exact) and every rank
//      computes norm = FP32(sqrt(sum over pieces in order of double(n_p)^2)). The clipping
//      coefficient follows from it as in AdamWOptimizer; a non-finite norm skips the update on
//      every rank alike.
//   3. AdamW on the owned pieces (moment shards, master slices in place).
//   4. all-gather of the updated masters, bucket by bucket, into every rank's parameters.
// The step synchronises once (the piece norms to the host), like AdamWOptimizer::finish_step.
// What is not here yet: overlapping the reduce-scatter with the backward (buckets are sent after
// it), gathering FP8 weights in FP8 (the FP32 masters are gathered and every rank prepares its
// GEMM weights), and sharding the masters themselves (each rank keeps them whole as the model's
// weights; ZeRO-1 as DeepSpeed's stage 1 shards the optimizer state).
#pragma once

#include <cstdint>
#include <vector>

#include "dist/comm.h"
#include "io/safetensors.h"
#include "model/parameter.h"
#include "train/optimizer.h"

namespace octet::train {

struct ZeroLayout {
  struct Piece {
    int param = 0;       // index into the parameter list
    int64_t offset = 0;  // first element within the parameter
    int64_t numel = 0;
    int rank = 0;              // owner
    int64_t shard_offset = 0;  // first element within the owner's shard
  };
  std::vector<Piece> pieces;
  std::vector<int64_t> shard_elems;  // per rank
  int64_t max_shard = 0;

  // Pure function of the trainable parameters' sizes, the piece size and the world size.
  static ZeroLayout make(const std::vector<int64_t>& param_elems, int64_t piece_elems,
                         int world_size);
};

struct ZeroConfig {
  int64_t piece_elems = int64_t{1} << 22;   // 4 Mi elements (16 MiB of FP32 gradient)
  int64_t bucket_elems = int64_t{1} << 24;  // per rank and collective: 64 MiB of FP32 gradient
};

class ZeroAdamW {
 public:
  // Collective over `dp` (checks that every rank has the same parameters). The parameters'
  // masters and gradients must stay where they are (updated in place).
  ZeroAdamW(Context& ctx, std::shared_ptr<Comm> dp, const std::vector<Parameter*>& params,
            const AdamWConfig& config, const ZeroConfig& zero = {});

  // The four stages above at rate `lr`; returns the (global) statistics, the same on every rank.
  StepStats step(Context& ctx, float lr);
  // step() in two halves, for a caller that combines several optimizers' norms (expert
  // parallelism: train/ep_optimizer.h): stage 1 and the pieces' norms (the same on every rank of
  // dp, in piece order), then stages 2-4 at the given global norm.
  std::vector<float> reduce_grads(Context& ctx);
  StepStats apply(Context& ctx, float lr, float grad_norm);
  void zero_grad(Context& ctx);

  int64_t steps_taken() const { return steps_taken_; }
  const ZeroLayout& layout() const { return layout_; }
  int64_t shard_elems() const { return layout_.shard_elems[static_cast<size_t>(dp_->rank())]; }
  // Read-only views for the checkpoint snapshot (train/checkpoint_plan.h): the trainable
  // parameters in layout order (ZeroLayout::Piece::param indexes them), and this rank's moment
  // shards (bf16, the pieces at their shard_offset).
  const std::vector<Parameter*>& params() const { return params_; }
  const Tensor& exp_avg_shard() const { return exp_avg_; }
  const Tensor& exp_avg_sq_shard() const { return exp_avg_sq_; }

  // AdamWOptimizer::state_dict's tensors (whole moments), gathered from every rank's shards:
  // collective; every rank returns them (a caller writes them from one rank).
  io::NamedTensors state_dict(Context& ctx);
  // Restores AdamWOptimizer::state_dict's tensors (from a run at any world size): every rank takes
  // its pieces. Not collective.
  void load_state_dict(Context& ctx, const io::NamedTensors& state);

 private:
  // Copies between the parameters' tensors and a rank's packed shard, for the shard's elements
  // [from, from + n): to_shard true packs param -> buf, false unpacks buf -> param.
  void pack(Context& ctx, int rank, int64_t from, int64_t n, bool grads, uint8_t* buf,
            bool to_shard) const;

  std::shared_ptr<Comm> dp_;
  std::vector<Parameter*> params_;  // the trainable ones, in order
  AdamWConfig config_;
  ZeroConfig zero_;
  ZeroLayout layout_;
  int64_t bucket_ = 0;
  Tensor grad_shard_;            // (shard) f32: this rank's reduced gradients
  Tensor exp_avg_, exp_avg_sq_;  // (shard) bf16
  Tensor send_, recv_;           // staging: world * bucket f32 each
  int64_t steps_taken_ = 0;
};

}  // namespace octet::train
