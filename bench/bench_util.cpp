#include <algorithm>
#include <cstdio>

#include "backend/backend.h"
#include "bench.h"
#include "numerics/fp8.h"

namespace octet::bench {

Timing time_op(Context& ctx, const std::function<void()>& fn, int warmup, int runs,
               const std::function<void()>& before_each) {
  for (int i = 0; i < warmup; ++i) fn();
  ctx.synchronize();
  std::unique_ptr<Timer> timer = ctx.be().make_timer();
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    if (before_each) before_each();
    timer->start();
    fn();
    ms.push_back(timer->stop_ms());
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), runs};
}

L2Flusher::L2Flusher(Context& ctx) : ctx_(&ctx) {
  if (ctx.device != Device::kCuda) return;
  const int64_t l2 = cuda_device_info(ctx.device_index).l2_bytes;
  buf_ = Tensor::empty(ctx, {2 * std::max<int64_t>(l2, 1 << 20)}, DType::kU8);
}

void L2Flusher::operator()() {
  if (buf_.data()) ctx_->be().memset(buf_.data(), 0x5A, buf_.nbytes());
}

double copy_bandwidth_gbs(Context& ctx, int64_t bytes, int runs) {
  Tensor a = Tensor::empty(ctx, {bytes}, DType::kU8), b = Tensor::empty(ctx, {bytes}, DType::kU8);
  ctx.be().memset(a.data(), 0x3C, bytes);
  const CopyKind kind =
      ctx.device == Device::kCpu ? CopyKind::kHostToHost : CopyKind::kDeviceToDevice;
  const Timing t = time_op(
      ctx, [&] { ctx.be().copy(b.data(), a.data(), bytes, kind); }, 3, runs);
  return 2.0 * static_cast<double>(bytes) / (t.median_ms * 1e-3) / 1e9;
}

Tensor random_bf16(Context& ctx, const Shape& shape, uint64_t seed) {
  Tensor h = Tensor::empty(shape, DType::kBF16);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<int32_t>(s >> 32)) * 0x1p-31f;
  };
  auto* p = h.data_as<uint16_t>();
  for (int64_t i = 0; i < h.numel(); ++i) p[i] = float_to_bf16(next() + next() + next());
  return h.to(ctx, ctx.device);
}

std::string fmt(double v, int precision) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", precision, v);
  return buf;
}

void print_table(const std::vector<std::string>& header,
                 const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> w(header.size());
  for (size_t c = 0; c < header.size(); ++c) w[c] = header[c].size();
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size() && c < w.size(); ++c) w[c] = std::max(w[c], r[c].size());
  auto line = [&](const std::vector<std::string>& r) {
    std::string s = "|";
    for (size_t c = 0; c < w.size(); ++c) {
      const std::string cell = c < r.size() ? r[c] : "";
      s += " " + cell + std::string(w[c] - cell.size(), ' ') + " |";
    }
    std::printf("%s\n", s.c_str());
  };
  line(header);
  std::string sep = "|";
  for (size_t c = 0; c < w.size(); ++c) sep += std::string(w[c] + 2, '-') + "|";
  std::printf("%s\n", sep.c_str());
  for (const auto& r : rows) line(r);
}

}  // namespace octet::bench
