// Device code of the rmsnorm family. One block per row (grid-stride over rows); a thread owns the
// columns j == threadIdx.x (mod kThreads), so per-column state (the dw partial) needs no
// synchronisation. Row sums use a fixed-shape tree (warp butterfly, then the warp sums in index
// order), so every run gives the same bits.
#pragma once

#include <cstdint>

#include "numerics/fp8.h"
#include "ops/cast/cast_backends.h"

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

// ---- BF16 rows whose width is a multiple of 8 (every model width): 16-byte vectors -------------
//
// A warp owns a row; lane l reads the 8 columns [c, c + 8) for c = 8 l, 8 l + 256, ... in order, so
// its partial sums have a fixed order, and the warp's butterfly leaves the same bits in every lane.
// The row is read twice (the sum, then the output); the second read hits the cache.

constexpr int kVec = 8;                 // BF16 elements per 16-byte vector
constexpr int kRowWarps = 8;            // rows (warps) per block
constexpr int kVecColumns = 32 * kVec;  // columns a warp covers per step

__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[kVec]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = bf16_to_float(static_cast<uint16_t>(w[i] & 0xFFFFu));
    f[2 * i + 1] = bf16_to_float(static_cast<uint16_t>(w[i] >> 16));
  }
}

__device__ __forceinline__ uint4 pack8(const float (&f)[kVec]) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    w[i] = static_cast<uint32_t>(float_to_bf16(f[2 * i])) |
           (static_cast<uint32_t>(float_to_bf16(f[2 * i + 1])) << 16);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}

// y = x * rstd * w; with `res`: x += res first (add_into's element, rounded to BF16, stored back).
__global__ void __launch_bounds__(kRowWarps * 32)
    rmsnorm_forward_bf16x8_kernel(uint16_t* __restrict__ x, const uint16_t* __restrict__ res,
                                  const float* __restrict__ w, int64_t rows, int64_t d, float eps,
                                  uint16_t* __restrict__ y, float* __restrict__ rstd) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (r >= rows) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  uint16_t* xr = x + r * d;
  float ss = 0.0f;
  for (int64_t c = lane * kVec; c < d; c += kVecColumns) {
    float v[kVec];
    unpack8(*reinterpret_cast<const uint4*>(xr + c), v);
    if (res != nullptr) {
      float q[kVec];
      unpack8(*reinterpret_cast<const uint4*>(res + r * d + c), q);
#pragma unroll
      for (int i = 0; i < kVec; ++i) v[i] = bf16_to_float(float_to_bf16(add_element(v[i], q[i])));
      *reinterpret_cast<uint4*>(xr + c) = pack8(v);
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) ss = fmaf(v[i], v[i], ss);
  }
  ss = warp_sum(ss);
  const float rs = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
  if (lane == 0) rstd[r] = rs;
  for (int64_t c = lane * kVec; c < d; c += kVecColumns) {
    float v[kVec];
    unpack8(*reinterpret_cast<const uint4*>(xr + c), v);
    const float4 w0 = *reinterpret_cast<const float4*>(w + c);
    const float4 w1 = *reinterpret_cast<const float4*>(w + c + 4);
    const float wv[kVec] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = v[i] * rs * wv[i];
    *reinterpret_cast<uint4*>(y + r * d + c) = pack8(v);
  }
}

// dx = rstd (dy w - xhat mean(dy w xhat)); with `res`: dx = round(round(dx) + res). No dw here
// (rmsnorm_dweight_bf16x8_kernel).
__global__ void __launch_bounds__(kRowWarps * 32)
    rmsnorm_backward_bf16x8_kernel(const uint16_t* __restrict__ dy, const uint16_t* __restrict__ x,
                                   const float* __restrict__ w, const float* __restrict__ rstd,
                                   const uint16_t* __restrict__ res, int64_t rows, int64_t d,
                                   uint16_t* __restrict__ dx) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (r >= rows) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const float rs = rstd[r];
  float dot = 0.0f;
  for (int64_t c = lane * kVec; c < d; c += kVecColumns) {
    float g[kVec], v[kVec];
    unpack8(*reinterpret_cast<const uint4*>(dy + r * d + c), g);
    unpack8(*reinterpret_cast<const uint4*>(x + r * d + c), v);
    const float4 w0 = *reinterpret_cast<const float4*>(w + c);
    const float4 w1 = *reinterpret_cast<const float4*>(w + c + 4);
    const float wv[kVec] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
    for (int i = 0; i < kVec; ++i) dot = fmaf(g[i] * wv[i], v[i] * rs, dot);
  }
  const float mean = warp_sum(dot) / static_cast<float>(d);
  for (int64_t c = lane * kVec; c < d; c += kVecColumns) {
    float g[kVec], v[kVec];
    unpack8(*reinterpret_cast<const uint4*>(dy + r * d + c), g);
    unpack8(*reinterpret_cast<const uint4*>(x + r * d + c), v);
    const float4 w0 = *reinterpret_cast<const float4*>(w + c);
    const float4 w1 = *reinterpret_cast<const float4*>(w + c + 4);
    const float wv[kVec] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = rs * (g[i] * wv[i] - (v[i] * rs) * mean);
    if (res != nullptr) {
      float q[kVec];
      unpack8(*reinterpret_cast<const uint4*>(res + r * d + c), q);
#pragma unroll
      for (int i = 0; i < kVec; ++i) v[i] = add_element(bf16_to_float(float_to_bf16(v[i])), q[i]);
    }
    *reinterpret_cast<uint4*>(dx + r * d + c) = pack8(v);
  }
}

// dw partials: block (column chunk of kVecColumns, part p) sums dy * x * rstd over the part's rows
// [p rows_per_part, ...): warp k takes the rows k, k + kRowWarps, ... of the part in order (lane l
// its 8 columns), then the warps' sums are added in warp order. partials[p, j] = that sum.
__global__ void __launch_bounds__(kRowWarps * 32)
    rmsnorm_dweight_bf16x8_kernel(const uint16_t* __restrict__ dy, const uint16_t* __restrict__ x,
                                  const float* __restrict__ rstd, int64_t rows, int64_t d,
                                  int64_t rows_per_part, float* __restrict__ partials) {
  __shared__ float sums[kRowWarps][kVecColumns];
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kVecColumns + lane * kVec;
  const int64_t p = blockIdx.y;
  const int64_t r0 = p * rows_per_part, r1 = min(rows, r0 + rows_per_part);
  float acc[kVec] = {};
  if (c < d) {
    for (int64_t r = r0 + warp; r < r1; r += kRowWarps) {
      float g[kVec], v[kVec];
      unpack8(*reinterpret_cast<const uint4*>(dy + r * d + c), g);
      unpack8(*reinterpret_cast<const uint4*>(x + r * d + c), v);
      const float rs = rstd[r];
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[i] = fmaf(g[i], v[i] * rs, acc[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) sums[warp][lane * kVec + i] = acc[i];
  __syncthreads();
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kVecColumns + threadIdx.x;
  if (threadIdx.x < kVecColumns && j < d) {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < kRowWarps; ++k) s += sums[k][threadIdx.x];
    partials[p * d + j] = s;
  }
}

// dw[j] += sum_p partials[p, j] for the vectorised path: block (32 columns) x (8 part lanes);
// part lane k sums the parts k, k + 8, ... in order, then the 8 lane sums are added in lane order.
__global__ void __launch_bounds__(256)
    rmsnorm_dweight_reduce_x8_kernel(const float* __restrict__ partials, int64_t parts, int64_t d,
                                     float* __restrict__ dw) {
  __shared__ float sums[8][32];
  const int col = static_cast<int>(threadIdx.x % 32), k = static_cast<int>(threadIdx.x / 32);
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 + col;
  float s = 0.0f;
  if (j < d)
    for (int64_t p = k; p < parts; p += 8) s += partials[p * d + j];
  sums[k][col] = s;
  __syncthreads();
  if (k == 0 && j < d) {
    float t = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) t += sums[i][col];
    dw[j] += t;
  }
}

}  // namespace octet::cuda::rmsnorm_kernels
