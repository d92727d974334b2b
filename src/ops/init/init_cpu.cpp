// CPU implementation of init_normal.h: the host loop, over threads for large tensors.
#include <algorithm>
#include <thread>
#include <vector>

#include "core/rng.h"
#include "ops/init/init_backends.h"

namespace octet::cpu {
namespace {

constexpr int64_t kBlocksPerThreadMin = int64_t{1} << 16;  // 256 Ki elements: below, one thread

// Elements [4 * b0, 4 * b1) of the tensor (clipped to n).
void fill_blocks(float* out, int64_t n, const Rng& rng, double std, int64_t b0, int64_t b1) {
  double z[4];
  for (int64_t b = b0; b < b1; ++b) {
    rng.normal4(static_cast<uint64_t>(b), z);
    const int64_t base = 4 * b;
    const int64_t m = std::min<int64_t>(4, n - base);
    for (int64_t j = 0; j < m; ++j) out[base + j] = static_cast<float>(std * z[j]);
  }
}

int threads_for(int64_t blocks) {
  const auto hw = static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  return static_cast<int>(std::clamp<int64_t>(blocks / kBlocksPerThreadMin, 1, hw));
}

}  // namespace

float init_normal_value(uint64_t seed, uint64_t stream, double std, int64_t k) {
  double z[4];
  Rng(seed, stream).normal4(static_cast<uint64_t>(k) / 4, z);
  return static_cast<float>(std * z[k & 3]);
}

InitNormalStats init_normal(Context& /*ctx*/, const InitNormalArgs& a) {
  float* out = static_cast<float*>(a.out.data());
  const int64_t n = a.out.numel();
  const int64_t blocks = (n + 3) / 4;
  const Rng rng(a.seed, a.stream);
  const int t = threads_for(blocks);
  if (t == 1) {
    fill_blocks(out, n, rng, a.std, 0, blocks);
  } else {
    std::vector<std::thread> pool;
    pool.reserve(static_cast<size_t>(t));
    for (int i = 0; i < t; ++i)
      pool.emplace_back(fill_blocks, out, n, rng, a.std, blocks * i / t, blocks * (i + 1) / t);
    for (std::thread& th : pool) th.join();
  }
  return {n};
}

void init_fill(Context& /*ctx*/, Tensor& out, float value) {
  std::fill_n(static_cast<float*>(out.data()), out.numel(), value);
}

}  // namespace octet::cpu
