#include "train/data_parallel.h"

#include <cstring>

namespace octet::train {

double DataParallel::global_mean(Context& ctx, const std::vector<double>& mine) const {
  const auto g = static_cast<int64_t>(mine.size());
  const int w = size();
  std::vector<double> all(mine);
  if (active()) {
    Tensor h = Tensor::empty({std::max<int64_t>(g, 1)}, DType::kI64);
    std::memcpy(h.data(), mine.data(), mine.size() * sizeof(double));
    const Tensor send = h.to(ctx, ctx.device);
    Tensor recv = Tensor::empty(ctx, {std::max<int64_t>(g, 1) * w}, DType::kI64);
    comm_->all_gather(ctx, send.data(), recv.data(), std::max<int64_t>(g, 1), DType::kI64);
    const Tensor back = recv.to_host(ctx);
    all.assign(static_cast<size_t>(g * w), 0.0);
    // Rank r's micro-batch m is global micro-batch m * W + r.
    for (int r = 0; r < w; ++r)
      for (int64_t m = 0; m < g; ++m)
        std::memcpy(
            &all[static_cast<size_t>(m * w + r)],
            static_cast<const uint8_t*>(back.data()) + (r * std::max<int64_t>(g, 1) + m) * 8, 8);
  }
  double sum = 0;
  for (double v : all) sum += v / static_cast<double>(all.size());
  return sum;
}

void DataParallel::sum_expert_loads(Context& ctx, std::vector<ModelLosses>& micro) const {
  if (!active()) return;
  for (ModelLosses& l : micro)
    for (Tensor& t : l.expert_load) all_reduce(ctx, *comm_, t, ReduceOp::kSum);
}

double DataParallel::mean_over_ranks(Context& ctx, double v) const {
  if (!active()) return v;
  double sum = 0;
  for (double x : all_gather_values(ctx, *comm_, v)) sum += x;
  return sum / size();
}

}  // namespace octet::train
