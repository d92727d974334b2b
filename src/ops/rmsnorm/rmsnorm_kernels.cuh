// Device code of the rmsnorm family. One block per row (grid-stride over rows); a thread owns the
// columns j == threadIdx.x (mod kThreads), so per-column state (the dw partial) needs no
// synchronisation. Row sums use a fixed-shape tree (warp butterfly, then the warp sums in index
// order), so every run gives the same bits.
#pragma once

#include <cstdint>

#include "numerics/fp8.h"

namespace octet::cuda::rmsnorm_kernels {

// Sum over the block, the same bits in every thread. `smem` holds kThreads / 32 floats.
template <int kThreads>
__device__ __forceinline__ float block_sum(float v, float* smem) {
  static_assert(kThreads % 32 == 0 && kThreads >= 32 && kThreads <= 1024, "whole warps, one block");
  // A butterfly leaves the bitwise same sum in every lane (each step adds the same two operands).
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  if (threadIdx.x % 32 == 0) smem[threadIdx.x / 32] = v;
  __syncthreads();
  float s = 0.0f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) s += smem[w];
  __syncthreads();  // smem is reused by the next call
  return s;
}

template <typename XT, typename YT, int kThreads>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_forward_kernel(const XT* __restrict__ x, const float* __restrict__ w, int64_t rows,
                           int64_t d, float eps, YT* __restrict__ y, float* __restrict__ rstd) {
  __shared__ float smem[kThreads / 32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const XT* xr = x + r * d;
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < d; j += kThreads) {
      const float v = load_float(xr, j);
      ss = fmaf(v, v, ss);
    }
    ss = block_sum<kThreads>(ss, smem);
    // IEEE division and square root (not rsqrtf's approximation), so rstd is within an ulp or two
    // of the FP64 reference.
    const float rs = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
    if (threadIdx.x == 0) rstd[r] = rs;
    for (int64_t j = threadIdx.x; j < d; j += kThreads)
      store_float(y + r * d, j, load_float(xr, j) * rs * w[j]);
  }
}

// Block b owns rows [b * rows_per_part, (b + 1) * rows_per_part): writes their dx and its dw
// partial, partials[b, :] = sum over its rows, in row order, of dy * xhat. Dynamic shared memory: d
// floats.
template <typename XT, typename GT, int kThreads>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_backward_kernel(const GT* __restrict__ dy, const XT* __restrict__ x,
                            const float* __restrict__ w, const float* __restrict__ rstd,
                            int64_t rows, int64_t d, int64_t rows_per_part, GT* __restrict__ dx,
                            float* __restrict__ partials) {
  extern __shared__ float dw_part[];
  __shared__ float smem[kThreads / 32];
  for (int64_t j = threadIdx.x; j < d; j += kThreads) dw_part[j] = 0.0f;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_part;
  const int64_t r1 = min(rows, r0 + rows_per_part);
  for (int64_t r = r0; r < r1; ++r) {
    const float rs = rstd[r];
    const GT* dyr = dy + r * d;
    const XT* xr = x + r * d;
    float dot = 0.0f;
    for (int64_t j = threadIdx.x; j < d; j += kThreads)
      dot = fmaf(load_float(dyr, j) * w[j], load_float(xr, j) * rs, dot);
    const float mean = block_sum<kThreads>(dot, smem) / static_cast<float>(d);
    for (int64_t j = threadIdx.x; j < d; j += kThreads) {
      const float xhat = load_float(xr, j) * rs, g = load_float(dyr, j);
      store_float(dx + r * d, j, rs * (g * w[j] - xhat * mean));
      dw_part[j] = fmaf(g, xhat, dw_part[j]);  // this thread's own column: no race
    }
  }
  for (int64_t j = threadIdx.x; j < d; j += kThreads) partials[blockIdx.x * d + j] = dw_part[j];
}

// dw[j] += sum_p partials[p, j], p in index order: a thread per column, coalesced across the warp.
__global__ void __launch_bounds__(256)
    rmsnorm_dweight_reduce_kernel(const float* __restrict__ partials, int64_t parts, int64_t d,
                                  float* __restrict__ dw) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= d) return;
  float s = 0.0f;
  for (int64_t p = 0; p < parts; ++p) s += partials[p * d + j];
  dw[j] += s;
}

}  // namespace octet::cuda::rmsnorm_kernels
