// The step verdict's host formulas (as the trainer computed them before issue 11 moved them to the
// device: DataParallel::global_mean, Run::is_spike, Run::remember_loss, check_loss) and a driver
// of ops/step_verdict on any device, for step_verdict_test.cpp and its GPU twin.
#pragma once

#include <cmath>
#include <cstring>
#include <deque>
#include <vector>

#include "backend/backend.h"
#include "ops/step_verdict/step_verdict.h"

namespace octet::test {

struct VerdictResult {
  std::vector<double> means;
  int32_t flags = 0;
  float skip = 0;
};

struct HostVerdict {
  int64_t capacity;
  double threshold;
  bool spike_skips;
  std::deque<double> window;

  HostVerdict(int64_t c, double t, bool s) : capacity(c), threshold(t), spike_skips(s) {}

  // DataParallel::global_mean over values laid out rank-major (rank r's m-th at r * K + m).
  static double global_mean(const float* x, int64_t ranks, int64_t per_rank) {
    std::vector<double> all(static_cast<size_t>(ranks * per_rank));
    for (int64_t r = 0; r < ranks; ++r)
      for (int64_t m = 0; m < per_rank; ++m)
        all[static_cast<size_t>(m * ranks + r)] = x[r * per_rank + m];
    double sum = 0;
    for (double v : all) sum += v / static_cast<double>(all.size());
    return sum;
  }
  bool is_spike(double loss) const {
    const auto n = static_cast<int64_t>(window.size());
    if (capacity == 0 || n < capacity) return false;
    double mean = 0, var = 0;
    for (double v : window) mean += v;
    mean /= static_cast<double>(n);
    for (double v : window) var += (v - mean) * (v - mean);
    const double sd = std::sqrt(var / static_cast<double>(n));
    return loss > mean + threshold * sd;
  }
  void remember(double loss) {
    if (capacity == 0) return;
    window.push_back(loss);
    while (static_cast<int64_t>(window.size()) > capacity) window.pop_front();
  }
  VerdictResult judge(const std::vector<float>& main, const std::vector<float>& mtp,
                      int64_t ranks) const {
    VerdictResult r;
    const auto n = static_cast<int64_t>(main.size());
    r.means.push_back(global_mean(main.data(), ranks, n / ranks));
    for (size_t d = 0; d * static_cast<size_t>(n) < mtp.size(); ++d)
      r.means.push_back(global_mean(mtp.data() + d * static_cast<size_t>(n), ranks, n / ranks));
    const bool nonfinite = !std::isfinite(r.means[0]);
    const bool spike = !nonfinite && is_spike(r.means[0]);
    const bool skip = nonfinite || (spike && spike_skips);
    r.flags = (nonfinite ? kVerdictNonFinite : 0) | (spike ? kVerdictSpike : 0) |
              (skip ? kVerdictSkip : 0);
    return r;
  }
};

// The op's buffers on ctx's device, fed from and read back to the host.
struct DeviceVerdict {
  LossWindow w;
  Tensor main, mtp, means, flags, skip, skipped;
  int64_t ranks, depths;

  DeviceVerdict(Context& ctx, int64_t capacity, int64_t r, int64_t per_rank, int64_t d)
      : w(make_loss_window(ctx, capacity)), ranks(r), depths(d) {
    main = Tensor::empty(ctx, {r * per_rank}, DType::kF32);
    if (d > 0) mtp = Tensor::empty(ctx, {d * r * per_rank}, DType::kF32);
    means = Tensor::empty(ctx, {1 + d}, DType::kI64);
    flags = Tensor::empty(ctx, {1}, DType::kI32);
    skip = Tensor::empty(ctx, {1}, DType::kF32);
    skipped = Tensor::empty(ctx, {1}, DType::kI32);
  }
  static void put(Context& ctx, Tensor& dst, const void* src, size_t bytes) {
    Tensor h = Tensor::empty({static_cast<int64_t>(bytes)}, DType::kU8);
    std::memcpy(h.data(), src, bytes);
    ctx.be().copy(dst.data(), h.data(), static_cast<int64_t>(bytes),
                  ctx.device == Device::kCpu ? CopyKind::kHostToHost : CopyKind::kHostToDevice);
    ctx.synchronize();
  }
  void set_window(Context& ctx, const std::deque<double>& values) {
    std::vector<double> v(static_cast<size_t>(w.values.numel()), 0.0);
    for (size_t i = 0; i < values.size(); ++i) v[i] = values[i];
    if (!v.empty()) put(ctx, w.values, v.data(), v.size() * 8);
    const int64_t st[2] = {static_cast<int64_t>(values.size()), 0};
    put(ctx, w.state, st, sizeof st);
  }
  VerdictResult run(Context& ctx, const std::vector<float>& m, const std::vector<float>& t,
                    double threshold, bool skips) {
    put(ctx, main, m.data(), m.size() * 4);
    if (depths > 0) put(ctx, mtp, t.data(), t.size() * 4);
    step_loss_verdict(ctx, {.main = main,
                            .mtp = mtp,
                            .ranks = ranks,
                            .depths = depths,
                            .window = w,
                            .spike_threshold = threshold,
                            .spike_skips = skips,
                            .means = means,
                            .flags = flags,
                            .skip = skip});
    VerdictResult r;
    const Tensor h = means.to_host(ctx);
    r.means.assign(h.data_as<const double>(), h.data_as<const double>() + h.numel());
    r.flags = flags.to_host(ctx).data_as<const int32_t>()[0];
    r.skip = skip.to_host(ctx).data_as<const float>()[0];
    return r;
  }
  void remember(Context& ctx, bool was_skipped) {
    const int32_t s = was_skipped ? 1 : 0;
    put(ctx, skipped, &s, 4);
    step_remember_loss(ctx, {.window = w, .means = means, .skipped = skipped});
  }
  // The window's losses, oldest first.
  std::vector<double> window(Context& ctx) const {
    const Tensor v = w.values.to_host(ctx), st = w.state.to_host(ctx);
    const int64_t n = st.data_as<const int64_t>()[0], head = st.data_as<const int64_t>()[1];
    std::vector<double> out;
    for (int64_t i = 0; i < n; ++i)
      out.push_back(v.data_as<const double>()[(head + i) % w.values.numel()]);
    return out;
  }
};

}  // namespace octet::test
