// Expert parallelism in training: the DP x EP grid of ranks and the optimizer over it.
//
// Grid. W ranks, parallel.ep = P (W % P == 0): world rank w is EP rank w % P of the expert group
// of ranks {d P, ..., d P + P - 1} (d = w / P), and DP rank d of the data group of ranks
// {e, e + P, e + 2P, ...} (e = w % P), which hold the same experts. Every rank draws its own
// share of the global batch (data_parallel.h); attention, dense layers, the router and the shared
// experts are replicated on all W ranks, the routed experts sharded over each expert group
// (model/moe_ep.h).
//
// Optimizer (EpAdamW): ZeRO-1 over the right group for each parameter: the replicated ones over all
// W ranks, the routed experts (this rank's E / P) over the data group. The FP32 masters are sharded
// as the moments are (ZeroConfig::shard_masters, the data-parallel path's design): a replicated
// parameter's gradient is summed over all W ranks, so its reduce-scatter over the world leaves each
// rank 1 / W of it, and its master and moments sit next to that shard (over the data group only,
// each of the P expert-group ranks would keep the same 1 / (W / P) for nothing); an expert's
// gradient is summed over its data group only, so its master is sharded over that group. The
// updated weights are all-gathered over the same groups into the prepared copies the forward reads
// (FP8 128x128 blocks with their scales, or BF16: set_weight_outputs), as ZeroAdamW does with data
// parallelism; what needs whole masters (the BF16 shadow, a rollback's load) gathers them
// (gather_masters), and the checkpoint writer reads each piece from its owner's shard. The gradient norm is global
// and the same on every rank: the replicated pieces' norms (reduced over the world) and every
// expert group rank's expert pieces' norms (reduced over the data group, gathered over the expert
// group), squared and summed in FP64 in that fixed order; clipping and the non-finite skip follow.
// The loss means, the router's expert loads (summed over the world), the spike and rollback
// decisions are the data-parallel ones (data_parallel.h), over all W ranks.
//
// Checkpoints are the single-rank form, written by every rank in parallel (train/checkpoint_plan.h):
// each expert's weights by its data group, its moments by their ZeRO-1 owners in that group, so
// nothing is gathered; at load each rank reads its experts' rows only, so a run saved at any grid
// resumes at any other.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "model/model.h"
#include "train/zero_optimizer.h"

namespace octet::train {

struct EpGroups {
  std::shared_ptr<Comm> experts;  // the expert group (P ranks): this rank's EP rank and peers
  std::shared_ptr<Comm> data;     // the data group (W / P ranks) holding the same experts
};

// Splits `world` into the grid above (collective over world). Refuses, with one message naming
// parallel.ep: P < 1, P not dividing the world size, P > 1 without several ranks, and P not
// dividing the routed experts.
EpGroups make_ep_groups(Context& ctx, const std::shared_ptr<Comm>& world, int64_t ep,
                        int64_t routed_experts);

class EpAdamW {
 public:
  // Collective over the world. model's experts must be sharded over groups.experts.
  // zero: both ZeRO-1 optimizers' settings (buckets, shard_masters).
  EpAdamW(Context& ctx, std::shared_ptr<Comm> world, EpGroups groups, Model& model,
          const AdamWConfig& config, const ZeroConfig& zero = {});

  StepStats step(Context& ctx, float lr);
  void zero_grad(Context& ctx);
  // From AdamWOptimizer::state_dict's tensors (the single-rank form, any grid): each rank takes its
  // experts' rows (the rest may be unread: train/checkpoint_plan.h, ep_resume_ranges).
  void load_state_dict(Context& ctx, const io::NamedTensors& state);
  // ZeroAdamW's, over both optimizers: the prepared weights the update writes (Model::weight_outputs
  // after a full prepare; each optimizer takes its own parameters'), which shards the masters with
  // ZeroConfig::shard_masters; every master whole again (collective) and sharded again.
  void set_weight_outputs(Context& ctx, const std::vector<WeightOutput>& outputs);
  void gather_masters(Context& ctx);
  void shard_masters(Context& ctx);
  bool masters_sharded() const {
    return replicated_->masters_sharded() || experts_->masters_sharded();
  }
  // Before a checkpoint reads the masters (collective): the optimizers whose masters are not
  // sharded make them whole and current (the sharded ones are read from their owners' shards).
  void gather_unsharded_masters(Context& ctx);
  // What this rank holds of the optimizer state, both optimizers (ZeroAdamW's).
  int64_t master_bytes() const { return replicated_->master_bytes() + experts_->master_bytes(); }
  int64_t moment_bytes() const { return replicated_->moment_bytes() + experts_->moment_bytes(); }
  // The trainable elements of the whole model (every expert group rank's experts included).
  int64_t trainable_elems() const;

  // For the checkpoint writer and reader (train/checkpoint_plan.h): the replicated parameters'
  // optimizer (over the world), the experts' (over the data group), this rank's place in the grid
  // and its experts [first_expert, first_expert + expert_count).
  const ZeroAdamW& replicated() const { return *replicated_; }
  const ZeroAdamW& experts() const { return *experts_; }
  int ep_size() const { return groups_.experts->size(); }
  int ep_rank() const { return groups_.experts->rank(); }
  int64_t first_expert() const { return first_; }
  int64_t expert_count() const { return count_; }
  int64_t steps_taken() const { return replicated_->steps_taken(); }

 private:
  EpGroups groups_;
  std::unique_ptr<ZeroAdamW> replicated_, experts_;
  std::vector<std::string> order_;  // the trainable parameters' names, model order
  std::set<std::string> expert_;    // the sharded ones
  int64_t first_ = 0, count_ = 0;   // this rank's experts
};

}  // namespace octet::train
