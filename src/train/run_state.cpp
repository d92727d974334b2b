// Run's step-verdict buffers and the helpers of run_state.h.
#include "train/run_state.h"

#include <cstdio>
#include <cstring>

namespace octet::train::detail {

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

double max_over_mean(const Tensor& counts_host) {
  const auto* c = counts_host.data_as<const int32_t>();
  double sum = 0, mx = 0;
  for (int64_t e = 0; e < counts_host.numel(); ++e) {
    sum += c[e];
    mx = std::max<double>(mx, c[e]);
  }
  return sum > 0 ? mx / (sum / static_cast<double>(counts_host.numel())) : 1.0;
}

void Run::make_verdict_buffers() {
  const int64_t k = cfg.grad_accum, r = dp.size(), d = cfg.model.num_nextn_predict_layers;
  Verdict& v = verdict;
  v.window = make_loss_window(ctx, cfg.safety.spike_window);
  v.main = Tensor::empty(ctx, {k}, DType::kF32);
  if (d > 0) v.mtp = Tensor::empty(ctx, {d * k}, DType::kF32);
  if (dp.active()) {
    v.all_main = Tensor::empty(ctx, {r * k}, DType::kF32);
    if (d > 0) v.all_mtp = Tensor::empty(ctx, {d * r * k}, DType::kF32);
  }
  v.means = Tensor::empty(ctx, {1 + d}, DType::kI64);
  v.flags = Tensor::empty(ctx, {1}, DType::kI32);
  v.skip = Tensor::empty(ctx, {1}, DType::kF32);
  v.opt_skipped = Tensor::empty(ctx, {1}, DType::kI32);
  v.grad_norm = Tensor::empty(ctx, {1}, DType::kF32);
  for (Tensor* t : {&v.means, &v.flags, &v.skip, &v.opt_skipped, &v.grad_norm})
    ctx.be().memset(t->data(), 0, t->nbytes());
  readback = std::make_unique<PinnedReadback>(ctx, 2);
}

void Run::upload_window() {
  const int64_t cap = cfg.safety.spike_window;
  // The newest `cap` losses, oldest first from slot 0.
  const auto n = std::min<int64_t>(cap, static_cast<int64_t>(spike_window.size()));
  Tensor values = Tensor::empty({cap}, DType::kI64), state = Tensor::empty({2}, DType::kI64);
  if (cap) std::memset(values.data(), 0, values.nbytes());
  auto* vals = values.data_as<double>();
  for (int64_t i = 0; i < n; ++i)
    vals[i] = spike_window[spike_window.size() - static_cast<size_t>(n - i)];
  state.data_as<int64_t>()[0] = n;
  state.data_as<int64_t>()[1] = 0;
  const CopyKind kind =
      ctx.device == Device::kCpu ? CopyKind::kHostToHost : CopyKind::kHostToDevice;
  if (cap) ctx.be().copy(verdict.window.values.data(), values.data(), values.nbytes(), kind);
  ctx.be().copy(verdict.window.state.data(), state.data(), state.nbytes(), kind);
  // The host tensors must outlive the asynchronous copies.
  ctx.be().synchronize();
}

void Run::window_from_bytes(const uint8_t* values, const uint8_t* state) {
  const int64_t cap = cfg.safety.spike_window;
  int64_t st[2];
  std::memcpy(st, state, sizeof st);
  spike_window.clear();
  for (int64_t i = 0; i < st[0]; ++i) {
    double v;
    std::memcpy(&v, values + ((st[1] + i) % cap) * 8, 8);
    spike_window.push_back(v);
  }
}

}  // namespace octet::train::detail
