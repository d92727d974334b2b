// Device code of the cross_entropy family. A block per row (grid-stride over rows), each thread a
// chunk of 8 consecutive logits at a time (one 16-byte load for BF16, two for F32 when kVec).
// The forward is one pass: an online (max, sum) pair per thread (Milakov & Gimelshein 2018), merged
// in a fixed tree with explicitly rounded operations (no FMA contraction), so every run gives the
// same bits. The mean over rows is a single-block kernel with a fixed shape, likewise
// deterministic.
#pragma once

#include <cfloat>
#include <cstdint>

#include "numerics/fp8.h"

namespace octet::cuda::cross_entropy_kernels {

inline constexpr int kChunk = 8;
inline constexpr int32_t kIgnore = -100;  // cross_entropy.h kIgnoreIndex (that header is host-only)

// Eight logits starting at column v of a row; columns past V read as -inf (they add exp(-inf) = 0).
template <typename T, bool kVec>
__device__ __forceinline__ void load_chunk(const T* __restrict__ row, int64_t v, int64_t vocab,
                                           float (&x)[kChunk]) {
  if constexpr (kVec && sizeof(T) == 2) {
    const uint4 w = *reinterpret_cast<const uint4*>(row + v);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i)
      x[2 * i] = bits_float(words[i] << 16), x[2 * i + 1] = bits_float(words[i] & 0xFFFF0000u);
  } else if constexpr (kVec) {
    const float4 lo = *reinterpret_cast<const float4*>(row + v),
                 hi = *reinterpret_cast<const float4*>(row + v + 4);
    x[0] = lo.x, x[1] = lo.y, x[2] = lo.z, x[3] = lo.w, x[4] = hi.x, x[5] = hi.y, x[6] = hi.z,
    x[7] = hi.w;
  } else {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      x[i] = v + i < vocab ? load_float(row, v + i) : -INFINITY;
    }
  }
}

template <typename T, bool kVec>
__device__ __forceinline__ void store_chunk(T* __restrict__ row, int64_t v, int64_t vocab,
                                            const float (&g)[kChunk]) {
  if constexpr (kVec && sizeof(T) == 2) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      w[i] = float_to_bf16(g[2 * i]) | (static_cast<uint32_t>(float_to_bf16(g[2 * i + 1])) << 16);
    *reinterpret_cast<uint4*>(row + v) = make_uint4(w[0], w[1], w[2], w[3]);
  } else if constexpr (kVec) {
    *reinterpret_cast<float4*>(row + v) = make_float4(g[0], g[1], g[2], g[3]);
    *reinterpret_cast<float4*>(row + v + 4) = make_float4(g[4], g[5], g[6], g[7]);
  } else {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      if (v + i >= vocab) break;
      if constexpr (sizeof(T) == 4)
        row[v + i] = g[i];
      else
        row[v + i] = float_to_bf16(g[i]);
    }
  }
}

// Running max m and sum s of exp(x - m). m starts at -FLT_MAX (not -inf) so that exp(m_old - m_new)
// is never exp(-inf - -inf).
struct MaxSum {
  float m, s;
};

// Commutative bit for bit (the two products are added with one rounded add), so the butterfly
// leaves the same pair in every lane.
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  return {m, __fadd_rn(__fmul_rn(a.s, expf(a.m - m)), __fmul_rn(b.s, expf(b.m - m)))};
}

template <typename T, bool kVec, int kThreads>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_forward_kernel(const T* __restrict__ logits, const int32_t* __restrict__ targets,
                                 int64_t rows, int64_t vocab, float* __restrict__ losses,
                                 float* __restrict__ lse_out) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, one block");
  __shared__ MaxSum warp_part[kThreads / 32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = logits + r * vocab;
    MaxSum acc{-FLT_MAX, 0.0f};
    for (int64_t v = static_cast<int64_t>(threadIdx.x) * kChunk; v < vocab;
         v += int64_t{kThreads} * kChunk) {
      float x[kChunk];
      load_chunk<T, kVec>(row, v, vocab, x);
      float cm = acc.m;
#pragma unroll
      for (int i = 0; i < kChunk; ++i) cm = fmaxf(cm, x[i]);
      float s = __fmul_rn(acc.s, expf(acc.m - cm));
#pragma unroll
      for (int i = 0; i < kChunk; ++i) s = __fadd_rn(s, expf(x[i] - cm));  // NaN logits make s NaN
      acc = {cm, s};
    }
    for (int o = 16; o > 0; o >>= 1)
      acc = merge(acc, MaxSum{__shfl_xor_sync(0xFFFFFFFFu, acc.m, o),
                              __shfl_xor_sync(0xFFFFFFFFu, acc.s, o)});
    if (threadIdx.x % 32 == 0) warp_part[threadIdx.x / 32] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
      MaxSum total = warp_part[0];
      for (int w = 1; w < kThreads / 32; ++w) total = merge(total, warp_part[w]);
      const float lse = total.m + logf(total.s);
      const int32_t t = targets[r];
      float loss = 0.0f;
      if (t != kIgnore)
        loss = (t >= 0 && t < vocab) ? lse - load_float(row, t) : __int_as_float(0x7FC00000);
      lse_out[r] = lse;
      losses[r] = loss;
    }
    __syncthreads();  // warp_part is reused by the next row
  }
}

// Single block: count = rows not ignored; loss = sum of their losses (FP64, fixed tree) / count.
// losses and loss null: the count only.
template <int kThreads>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_mean_kernel(const float* __restrict__ losses, const int32_t* __restrict__ targets,
                              int64_t rows, int32_t* __restrict__ count, float* __restrict__ loss) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, one block");
  __shared__ double warp_sum[kThreads / 32];
  __shared__ int64_t warp_count[kThreads / 32];
  double s = 0.0;
  int64_t c = 0;
  for (int64_t r = threadIdx.x; r < rows; r += kThreads) {
    if (targets[r] == kIgnore) continue;
    if (losses != nullptr) s += losses[r];
    ++c;
  }
  for (int o = 16; o > 0; o >>= 1) {
    s += __shfl_down_sync(0xFFFFFFFFu, s, o);
    c += __shfl_down_sync(0xFFFFFFFFu, c, o);
  }
  if (threadIdx.x % 32 == 0) warp_sum[threadIdx.x / 32] = s, warp_count[threadIdx.x / 32] = c;
  __syncthreads();
  if (threadIdx.x != 0) return;
  s = 0.0, c = 0;
  for (int w = 0; w < kThreads / 32; ++w) s += warp_sum[w], c += warp_count[w];
  *count = static_cast<int32_t>(c);
  if (loss != nullptr) *loss = c > 0 ? static_cast<float>(s / static_cast<double>(c)) : 0.0f;
}

// dlogits = (exp(x - lse) - [v == t]) * dloss / count, 0 for ignored rows. Each thread reads a
// chunk before it writes the same chunk, so dlogits may alias logits.
template <typename T, bool kVec, int kThreads>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_backward_kernel(const T* logits, const int32_t* __restrict__ targets,
                                  const float* __restrict__ lse, const int32_t* __restrict__ count,
                                  const float* __restrict__ dloss, int64_t rows, int64_t vocab,
                                  T* dlogits) {
  static_assert(kThreads % 32 == 0, "whole warps");
  const int32_t n = *count;
  const float scale = n > 0 ? __fdiv_rn(*dloss, static_cast<float>(n)) : 0.0f;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int32_t t = targets[r];
    const float l = lse[r];
    const T* row = logits + r * vocab;
    T* out = dlogits + r * vocab;
    for (int64_t v = static_cast<int64_t>(threadIdx.x) * kChunk; v < vocab;
         v += int64_t{kThreads} * kChunk) {
      float g[kChunk];
      if (t == kIgnore || n == 0) {
#pragma unroll
        for (int i = 0; i < kChunk; ++i) g[i] = 0.0f;
      } else {
        load_chunk<T, kVec>(row, v, vocab, g);
#pragma unroll
        for (int i = 0; i < kChunk; ++i)
          g[i] = __fmul_rn(expf(g[i] - l) - (v + i == t ? 1.0f : 0.0f), scale);
      }
      store_chunk<T, kVec>(out, v, vocab, g);
    }
  }
}

}  // namespace octet::cuda::cross_entropy_kernels
