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

// Eight BF16 logits of one 16-byte word, widened to FP32 (exactly).
__device__ __forceinline__ void unpack_bf16x8(const uint4& w, float (&x)[kChunk]) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i)
    x[2 * i] = bits_float(words[i] << 16), x[2 * i + 1] = bits_float(words[i] & 0xFFFF0000u);
}

// Eight logits starting at column v of a row; columns past V read as -inf (they add exp(-inf) = 0).
template <typename T, bool kVec>
__device__ __forceinline__ void load_chunk(const T* __restrict__ row, int64_t v, int64_t vocab,
                                           float (&x)[kChunk]) {
  if constexpr (kVec && sizeof(T) == 2) {
    unpack_bf16x8(*reinterpret_cast<const uint4*>(row + v), x);
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

// One chunk of 8 logits into a thread's running (max, sum), in column order.
__device__ __forceinline__ MaxSum add_chunk(MaxSum acc, const float (&x)[kChunk]) {
  float cm = acc.m;
#pragma unroll
  for (int i = 0; i < kChunk; ++i) cm = fmaxf(cm, x[i]);
  float s = __fmul_rn(acc.s, expf(acc.m - cm));
#pragma unroll
  for (int i = 0; i < kChunk; ++i) s = __fadd_rn(s, expf(x[i] - cm));  // NaN logits make s NaN
  return {cm, s};
}

// The block's threads' pairs merged in a fixed tree (a butterfly within each warp, then the warps
// in order by thread 0); thread 0 returns the row's lse and writes it and the row's loss (the row
// is read at its target, so before anything overwrites it). Ends with the block synchronised on
// warp_part, which the caller may reuse only after a further __syncthreads().
template <typename T, int kThreads>
__device__ __forceinline__ float finish_row(MaxSum acc, MaxSum* warp_part, const T* row, int32_t t,
                                            int64_t vocab, float* loss_out, float* lse_out) {
  for (int o = 16; o > 0; o >>= 1)
    acc = merge(acc, MaxSum{__shfl_xor_sync(0xFFFFFFFFu, acc.m, o),
                            __shfl_xor_sync(0xFFFFFFFFu, acc.s, o)});
  if (threadIdx.x % 32 == 0) warp_part[threadIdx.x / 32] = acc;
  __syncthreads();
  float lse = 0.0f;
  if (threadIdx.x == 0) {
    MaxSum total = warp_part[0];
    for (int w = 1; w < kThreads / 32; ++w) total = merge(total, warp_part[w]);
    lse = total.m + logf(total.s);
    float loss = 0.0f;
    if (t != kIgnore)
      loss = (t >= 0 && t < vocab) ? lse - load_float(row, t) : __int_as_float(0x7FC00000);
    *lse_out = lse;
    *loss_out = loss;
  }
  return lse;
}

// The gradient of 8 logits at column v: (exp(x - lse) - [v == t]) * scale, as
// cross_entropy_backward_kernel computes it (zero_row: an ignored row, or no row counted).
__device__ __forceinline__ void grad_chunk(float (&g)[kChunk], int64_t v, int32_t t, float l,
                                           float scale, bool zero_row) {
#pragma unroll
  for (int i = 0; i < kChunk; ++i)
    g[i] = zero_row ? 0.0f : __fmul_rn(expf(g[i] - l) - (v + i == t ? 1.0f : 0.0f), scale);
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
      acc = add_chunk(acc, x);
    }
    finish_row<T, kThreads>(acc, warp_part, row, targets[r], vocab, losses + r, lse_out + r);
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
        grad_chunk(g, v, t, l, scale, false);
      }
      store_chunk<T, kVec>(out, v, vocab, g);
    }
  }
}

// cross_entropy_rows then cross_entropy_backward in place, in one pass over BF16 rows of
// V <= kThreads * kChunk * kIt columns, V % 8 == 0, 16-byte aligned: each thread loads its kIt
// chunks of the row (columns threadIdx.x * 8 + k * kThreads * 8, the forward's order) into
// registers at once, adds them to its (max, sum) as the forward kernel does, and once thread 0 has
// the row's lse writes the chunks' gradients over them as the backward kernel does. The same
// operations in the same order, so the same bits as the two kernels; the logits are read once.
// At most 128 registers a thread (kIt = 16 holds 64 of them), so that two blocks share an SM and
// one loads while the other computes.
template <int kThreads, int kIt>
__global__ void __launch_bounds__(kThreads, 65536 / (128 * kThreads))
    cross_entropy_rows_backward_kernel(uint16_t* logits, const int32_t* __restrict__ targets,
                                       int64_t rows, int64_t vocab, float* __restrict__ losses,
                                       float* __restrict__ lse_out,
                                       const int32_t* __restrict__ count,
                                       const float* __restrict__ dloss) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, one block");
  __shared__ MaxSum warp_part[kThreads / 32];
  __shared__ float row_lse;
  const int32_t n = *count;
  const float scale = n > 0 ? __fdiv_rn(*dloss, static_cast<float>(n)) : 0.0f;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    uint16_t* row = logits + r * vocab;
    const int32_t t = targets[r];
    uint4 w[kIt];
#pragma unroll
    for (int k = 0; k < kIt; ++k) {
      const int64_t v = (static_cast<int64_t>(k) * kThreads + threadIdx.x) * kChunk;
      if (v < vocab) w[k] = *reinterpret_cast<const uint4*>(row + v);
    }
    MaxSum acc{-FLT_MAX, 0.0f};
#pragma unroll
    for (int k = 0; k < kIt; ++k) {
      const int64_t v = (static_cast<int64_t>(k) * kThreads + threadIdx.x) * kChunk;
      if (v >= vocab) break;
      float x[kChunk];
      unpack_bf16x8(w[k], x);
      acc = add_chunk(acc, x);
    }
    const float lse =
        finish_row<uint16_t, kThreads>(acc, warp_part, row, t, vocab, losses + r, lse_out + r);
    if (threadIdx.x == 0) row_lse = lse;
    __syncthreads();  // the lse is known and the target's logit read: the row may be overwritten
    const float l = row_lse;
    const bool zero_row = t == kIgnore || n == 0;
#pragma unroll
    for (int k = 0; k < kIt; ++k) {
      const int64_t v = (static_cast<int64_t>(k) * kThreads + threadIdx.x) * kChunk;
      if (v >= vocab) break;
      float g[kChunk];
      unpack_bf16x8(w[k], g);
      grad_chunk(g, v, t, l, scale, zero_row);
      store_chunk<uint16_t, true>(row, v, vocab, g);
    }
    __syncthreads();  // warp_part and row_lse are reused by the next row
  }
}

}  // namespace octet::cuda::cross_entropy_kernels
