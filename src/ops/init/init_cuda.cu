// CUDA implementation of init_normal.h: one thread per block of 4 elements (one Philox call), each
// element certified against the host's rounding or listed for the host (init_normal.h).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda_check.h"
#include "core/rng.h"
#include "ops/init/init_backends.h"

namespace octet::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGrid = int64_t{1} << 16;

cudaStream_t stream_of(Context& ctx) {
  return static_cast<cudaStream_t>(ctx.be().stream());
}

int grid_for(int64_t n) {
  return static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kMaxGrid));
}

// The same expression as the host (cpu::init_normal_value): Rng::normal4 in FP64, std * z, one
// rounding to FP32. `margin` = 2^-margin_log2.
__global__ void init_normal_kernel(float* __restrict__ out, int64_t n, uint64_t seed,
                                   uint64_t stream, double std, double margin,
                                   int64_t* __restrict__ uncertain,
                                   unsigned long long* __restrict__ count, int64_t capacity) {
  const Rng rng(seed, stream);
  const int64_t blocks = (n + 3) / 4;
  for (int64_t b = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; b < blocks;
       b += int64_t{gridDim.x} * blockDim.x) {
    double z[4];
    rng.normal4(static_cast<uint64_t>(b), z);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t k = 4 * b + j;
      if (k >= n) break;
      const double p = std * z[j];
      const double d = fabs(p) * margin;
      if (__double2float_rn(p - d) != __double2float_rn(p + d)) {
        const unsigned long long at = atomicAdd(count, 1ull);
        if (static_cast<int64_t>(at) < capacity) uncertain[at] = k;
      }
      out[k] = __double2float_rn(p);
    }
  }
}

__global__ void scatter_kernel(float* __restrict__ out, const int64_t* __restrict__ index,
                               const float* __restrict__ value, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[index[i]] = value[i];
}

__global__ void fill_kernel(float* __restrict__ out, int64_t n, float value) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = value;
}

}  // namespace

InitNormalStats init_normal(Context& ctx, const InitNormalArgs& a) {
  auto* out = static_cast<float*>(a.out.data());
  const int64_t n = a.out.numel();
  const cudaStream_t s = stream_of(ctx);
  // Room for 8x the expected share of uncertified elements (2^-15 at the default margin).
  const int64_t capacity = n / 4096 + 1024;
  Tensor list = Tensor::empty(ctx, {capacity + 1}, DType::kI64);  // [0]: the count
  auto* count = static_cast<unsigned long long*>(list.data());
  auto* uncertain = static_cast<int64_t*>(list.data()) + 1;
  ctx.be().memset(count, 0, sizeof(unsigned long long));
  init_normal_kernel<<<grid_for((n + 3) / 4), kThreads, 0, s>>>(
      out, n, a.seed, a.stream, a.std, std::ldexp(1.0, -a.margin_log2), uncertain, count, capacity);
  OCTET_CUDA_CHECK_LAUNCH();
  int64_t listed = 0;
  ctx.be().copy(&listed, count, sizeof listed, CopyKind::kDeviceToHost);  // waits
  InitNormalStats stats{listed};
  if (listed == 0) return stats;
  if (listed > capacity) {
    // Far more than expected (a tiny margin): the whole tensor from the host.
    std::vector<float> host(static_cast<size_t>(n));
    for (int64_t k = 0; k < n; ++k)
      host[static_cast<size_t>(k)] = cpu::init_normal_value(a.seed, a.stream, a.std, k);
    ctx.be().copy(out, host.data(), n * 4, CopyKind::kHostToDevice);
    return {n};
  }
  std::vector<int64_t> index(static_cast<size_t>(listed));
  ctx.be().copy(index.data(), uncertain, listed * 8, CopyKind::kDeviceToHost);
  std::vector<float> value(index.size());
  for (size_t i = 0; i < index.size(); ++i)
    value[i] = cpu::init_normal_value(a.seed, a.stream, a.std, index[i]);
  Tensor di = Tensor::empty(ctx, {listed}, DType::kI64);
  Tensor dv = Tensor::empty(ctx, {listed}, DType::kF32);
  ctx.be().copy(di.data(), index.data(), listed * 8, CopyKind::kHostToDevice);
  ctx.be().copy(dv.data(), value.data(), listed * 4, CopyKind::kHostToDevice);
  scatter_kernel<<<grid_for(listed), kThreads, 0, s>>>(
      out, static_cast<const int64_t*>(di.data()), static_cast<const float*>(dv.data()), listed);
  OCTET_CUDA_CHECK_LAUNCH();
  return stats;
}

void init_fill(Context& ctx, Tensor& out, float value) {
  fill_kernel<<<grid_for(out.numel()), kThreads, 0, stream_of(ctx)>>>(
      static_cast<float*>(out.data()), out.numel(), value);
  OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace octet::cuda
