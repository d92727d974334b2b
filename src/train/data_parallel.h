// What a training step does differently on several data-parallel ranks, so that every decision is
// the same on every rank (trainer.h):
//   - each rank draws its own share of the global batch (BatchSampler's rank and world size): rank
//     r's micro-batch m is the global batch's micro-batch m * W + r, as a single rank with
//     grad_accum * W micro-batches would draw them;
//   - losses are averaged over every rank's micro-batches in that global order (bit for bit the
//     single rank's average), so the skip, spike and rollback decisions agree;
//   - the router's expert loads are summed over ranks before the bias update;
//   - the gradient norm and the non-finite check are global (ZeroAdamW);
//   - rank 0 alone writes the run directory and metrics; every rank writes its part of each
//     checkpoint (train/checkpoint_save.h).
#pragma once

#include <memory>
#include <vector>

#include "dist/comm.h"
#include "model/model.h"

namespace octet::train {

class DataParallel {
 public:
  DataParallel() = default;
  explicit DataParallel(std::shared_ptr<Comm> comm) : comm_(std::move(comm)) {}

  bool active() const { return comm_ && comm_->size() > 1; }
  int rank() const { return comm_ ? comm_->rank() : 0; }
  int size() const { return comm_ ? comm_->size() : 1; }
  bool writer() const { return rank() == 0; }
  const std::shared_ptr<Comm>& comm() const { return comm_; }

  // The mean of every rank's per-micro-batch values (each rank passes the same count), summed in
  // global micro-batch order: sum_k v_k / K as a single rank sums its K micro-batches.
  double global_mean(Context& ctx, const std::vector<double>& mine) const;
  // Sums every micro-batch's expert loads over the ranks, in place.
  void sum_expert_loads(Context& ctx, std::vector<ModelLosses>& micro) const;
  // Mean over ranks of one value per rank (rank order).
  double mean_over_ranks(Context& ctx, double v) const;
  void barrier(Context& ctx) const {
    if (active()) comm_->barrier(ctx);
  }

 private:
  std::shared_ptr<Comm> comm_;
};

}  // namespace octet::train
