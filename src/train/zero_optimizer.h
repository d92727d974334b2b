// ZeRO-1 AdamW for data parallelism: the gradients reduce-scattered across the data-parallel ranks,
// the AdamW moments (BF16) sharded, each rank updating its shard of the FP32 masters, the updated
// masters all-gathered. The same arithmetic per element as AdamWOptimizer (ops/adamw), and the
// same checkpoint state (state_dict), so a checkpoint does not depend on the world size.
//
// Layout. The trainable parameters, in order, are cut into pieces of at most piece_elems elements
// (a parameter never shares a piece); the cut does not depend on the world size nor on the bucket
// size. Consecutive pieces form buckets of at most bucket_elems elements (a piece larger than that
// is a bucket alone). Within a bucket the pieces are dealt to the ranks in contiguous runs of about
// equal element counts; rank r's shard is its part of every bucket, each part padded to the
// bucket's largest part (every rank receives the same count in each collective).
//
// One step (collective: every rank of `dp` calls the same functions in the same order):
//   1. reduce-scatter, bucket by bucket: rank r receives the sum over ranks of its pieces'
//      gradients. A bucket is sent as soon as every gradient in it is final for the step: during
//      the last micro-batch's backward (begin_final_backward(), then grads_ready() from the
//      model's hook, Model::set_grad_ready), on CUDA on a side stream (dist/side_stream.h) so that
//      it overlaps the rest of the backward; step() sends the buckets not sent yet (all of them
//      without the hook). The in-process communicator sums in rank order, so with one micro-batch
//      per rank the sum is the one a single rank accumulating the same micro-batches in that
//      order computes, bit for bit, whatever the buckets.
//   2. the global gradient norm, independent of the world size and the buckets: each rank takes
//      the L2 norm of each of its pieces (ops/adamw global_grad_norm, FP32); the piece norms are
//      summed across ranks (every entry is nonzero on one rank only, so the sum is exact) and every
//      rank computes norm = FP32(sqrt(sum over pieces in order of double(n_p)^2)). The clipping
//      coefficient follows from it as in AdamWOptimizer; a non-finite norm skips the update on
//      every rank alike.
//   3. AdamW on the owned pieces (moment shards, master slices in place).
//   4. all-gather of the updated weights, bucket by bucket. A parameter with a weight output
//      (set_weight_outputs: the GEMM's prepared copy, Model::weight_outputs) travels in that form:
//      FP8 128x128 blocks as the owner quantizes its rows (the bytes plus one FP32 scale per block,
//      1.0002 bytes per element), BF16 copies as 2 bytes; every rank writes them into the layer's
//      prepared copy and derives the column-wise FP8 copy locally by transposing the bytes and
//      the scales (the same 128x128 blocks, so the same bits as quantizing the transpose). Their
//      masters are then current on the owner only until gather_masters(). The other parameters
//      (norms, embedding, router) travel as FP32 masters.
// The step synchronises once (the piece norms to the host), like AdamWOptimizer::finish_step.
// Pieces of a matrix start at a multiple of 128 rows (the FP8 blocks never straddle two owners).
//
// Sharded masters (ZeroConfig::shard_masters; the trainer's data parallelism). Once weight
// outputs are set, each rank keeps the FP32 masters of its own pieces only, in one shard buffer
// laid out like the moments (master_shard(), the pieces at their shard_offset), and the masters of
// the parameters gathered as weight outputs are freed: their Parameter::value keeps its shape but
// has no storage (master_released()). The forward reads only their prepared copies, which stay
// whole on every rank. The parameters gathered as FP32 (norms, embedding, router) are the weights
// the forward reads: they stay whole, and the owner's shard holds the master the update writes
// (the gather then copies it to every rank, the owner included). Whatever needs a whole master
// gathers it: gather_masters() allocates and fills every Parameter::value again (collective; the
// BF16 shadow, a rollback's load), shard_masters() frees them again; the checkpoint writer reads
// each piece from its owner's shard (train/checkpoint_plan.h). Without weight outputs (a tied
// head, optim.fused_prepare off, the per-tensor FP8 recipes) every master is read by the forward
// and nothing is sharded beyond the moments.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "dist/comm.h"
#include "dist/side_stream.h"
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
    int bucket = 0;
  };
  struct Bucket {
    int first = 0, end = 0;    // pieces [first, end)
    int64_t shard_offset = 0;  // where every rank's part starts in its shard
    int64_t part = 0;          // elements per rank (the largest rank's part; the others padded)
  };
  std::vector<Piece> pieces;
  std::vector<Bucket> buckets;
  std::vector<int64_t> shard_elems;  // per rank: the elements it owns
  int64_t max_shard = 0;             // every rank's padded shard: the sum of the buckets' parts
  int64_t max_part = 0;              // the largest bucket part

  // Pure function of the trainable parameters' sizes, the piece size, the world size and the
  // bucket size (by default one bucket: every piece dealt over the whole model).
  // row_block: per parameter, a piece of it holds a multiple of that many elements (128 rows of
  // a matrix), except its last; empty: any cut.
  static ZeroLayout make(const std::vector<int64_t>& param_elems, int64_t piece_elems,
                         int world_size, int64_t bucket_elems = INT64_MAX,
                         const std::vector<int64_t>& row_block = {});
};

struct ZeroConfig {
  int64_t piece_elems = int64_t{1} << 22;   // 4 Mi elements (16 MiB of FP32 gradient)
  int64_t bucket_elems = int64_t{1} << 23;  // 8 Mi elements: 32 MiB of FP32 gradient a bucket
  bool shard_masters = false;  // keep only this rank's pieces of the masters (see the top)
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
  // Zeroes the gradients (after the buckets in flight have read them) and forgets which were final.
  void zero_grad(Context& ctx);

  // The next backward is the step's last micro-batch: from here on grads_ready() sends a bucket as
  // soon as every parameter in it was named. Every rank names the same parameters in the same
  // order (the model's backward is the same code everywhere), so the collectives match.
  void begin_final_backward();
  // These parameters' gradients are final for the step (others, and calls before
  // begin_final_backward, are ignored). Sends the buckets this completes, the highest first.
  void grads_ready(Context& ctx, const std::vector<Parameter*>& params);
  // Buckets sent during the backward in the last step (the rest went in step()).
  int64_t buckets_sent_early() const { return sent_early_; }

  // Where the prepared GEMM weights live (Model::weight_outputs after a full prepare): from the
  // next step on, those parameters are gathered in that form (FP8 blocks or BF16) instead of as
  // FP32 masters. A parameter whose pieces do not fall on its FP8 blocks, or that is not
  // trainable here, is refused. Every rank passes the same list (collective in effect).
  void set_weight_outputs(Context& ctx, const std::vector<WeightOutput>& outputs);
  // Every rank's masters whole and current in Parameter::value again (collective): before reading
  // them (the BF16 shadow, loading weights into them). Without weight outputs they are whole
  // already and this does nothing. With sharded masters it allocates the freed masters again and
  // the update works on Parameter::value (unsharded) until shard_masters().
  void gather_masters(Context& ctx);
  // With ZeroConfig::shard_masters and weight outputs: keeps this rank's pieces of every master in
  // the shard and frees the masters of the parameters with a weight output (their values must be
  // current on every rank: after a full preparation or gather_masters). set_weight_outputs calls
  // it; otherwise a no-op. Not collective.
  void shard_masters(Context& ctx);
  bool masters_sharded() const { return masters_sharded_; }
  // Whether parameter i (params() order) has no whole master here: its pieces are in their
  // owners' master_shard() only.
  bool master_released(size_t i) const { return masters_sharded_ && released_[i]; }
  const Tensor& master_shard() const { return master_shard_; }  // (shard) f32, when sharded
  // What this rank holds of the optimizer's state, in bytes: the FP32 masters of the trainable
  // parameters (the shard plus the whole ones) and the AdamW moments (BF16, shard).
  int64_t master_bytes() const;
  int64_t moment_bytes() const { return exp_avg_.nbytes() + exp_avg_sq_.nbytes(); }
  // Bytes this rank sent in the last step's weight all-gather (padded parts included), and what
  // the same gather of FP32 masters would send.
  int64_t gathered_bytes() const { return gathered_bytes_; }
  int64_t gathered_bytes_f32() const { return layout_.max_shard * 4; }
  // Over every rank: the elements of the parameters gathered as FP8 blocks (index 0) and as BF16
  // copies (1), and their bytes in the gather (FP8: about 1 per element, BF16: 2; FP32: 4).
  int64_t output_elems(int bf16) const { return output_elems_[bf16]; }
  int64_t output_bytes(int bf16) const { return output_bytes_[bf16]; }

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

  // The updated weights of every rank, in their gathered forms (stage 4).
  void gather_weights(Context& ctx);
  bool has_outputs() const;  // some parameter is gathered as a weight output
  // Reduce-scatters bucket b's gradients into grad_shard_ (on the side stream).
  void send_bucket(Context& ctx, int b);
  // Sends every bucket not sent yet, highest first, and orders the compute stream after them.
  void finish_buckets(Context& ctx);

  std::shared_ptr<Comm> dp_;
  std::vector<Parameter*> params_;  // the trainable ones, in order
  AdamWConfig config_;
  ZeroConfig zero_;
  ZeroLayout layout_;
  Tensor grad_shard_;    // (shard) f32: this rank's reduced gradients
  Tensor master_shard_;  // (shard) f32: this rank's masters, while masters_sharded_
  bool masters_sharded_ = false;
  std::vector<bool> released_;   // per parameter: value freed (a weight output's master)
  Tensor exp_avg_, exp_avg_sq_;  // (shard) bf16
  Tensor recv_;                  // staging of the all-gather: world * max_part f32
  // The reduce-scatter's staging: one slot (world * max_part f32) per bucket in flight, each
  // reused once the side stream's collective that read it is done (slot_free_ marks).
  std::vector<Tensor> slots_;
  std::vector<int> slot_free_;
  size_t next_slot_ = 0;
  std::unique_ptr<SideStream> side_;
  // Overlap bookkeeping: the buckets of each parameter, the parameters still to come per bucket.
  std::map<const Parameter*, std::vector<int>> param_buckets_;
  std::vector<int> waiting_;  // per bucket: parameters not yet final
  std::vector<bool> sent_;    // per bucket
  std::set<const Parameter*> ready_;
  bool armed_ = false;
  int64_t sent_early_ = 0;
  // Weight outputs per parameter (index into params_; undefined: the FP32 master), each piece's
  // byte offset within its owner's part of the gather, each bucket's part in bytes.
  std::vector<WeightOutput> outputs_;
  std::vector<int64_t> gather_offset_;
  std::vector<int64_t> gather_part_;
  Tensor gather_send_, gather_recv_;  // u8 staging
  int64_t gathered_bytes_ = 0, output_elems_[2] = {0, 0}, output_bytes_[2] = {0, 0};
  int64_t steps_taken_ = 0;
};

}  // namespace octet::train
