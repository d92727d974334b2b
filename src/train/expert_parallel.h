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
// W ranks, the routed experts (this rank's E / P) over the data group. The gradient norm is global
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
  EpAdamW(Context& ctx, std::shared_ptr<Comm> world, EpGroups groups, Model& model,
          const AdamWConfig& config);

  StepStats step(Context& ctx, float lr);
  void zero_grad(Context& ctx);
  // From AdamWOptimizer::state_dict's tensors (the single-rank form, any grid): each rank takes its
  // experts' rows (the rest may be unread: train/checkpoint_plan.h, ep_resume_ranges).
  void load_state_dict(Context& ctx, const io::NamedTensors& state);
  // Every master whole on its holders (collective): before a checkpoint reads them.
  void gather_masters(Context& ctx);

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
