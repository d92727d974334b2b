// Device code of the rope family: one thread per output element of the (rows, W) view. Every rope
// output is rope_math.h's scalar rotation, bit-identical to rope_cpu.cpp; channels outside the rope
// part are copied. Memory-bound: each thread reads its two pair inputs (the pair's other output's
// thread reads the same two, served by L1) and the table entry.
#pragma once

#include <cstdint>

#include "ops/rope/rope_math.h"

namespace octet::cuda::kernels {

template <typename T>
__device__ __forceinline__ float rope_load(const T* p, int64_t i) {
  if constexpr (sizeof(T) == 2)
    return bf16_to_float(p[i]);
  else
    return p[i];
}
template <typename T>
__device__ __forceinline__ void rope_store(T* p, int64_t i, float v) {
  if constexpr (sizeof(T) == 2)
    p[i] = float_to_bf16(v);
  else
    p[i] = v;
}

struct RopeParams {
  int64_t rows, width, heads, seq, offset;
  int rope_dim;
  bool forward, interleave;
  const float* cos;  // (positions, rope_dim / 2)
  const float* sin;
};

template <typename T>
__global__ void rope_kernel(const T* __restrict__ x, T* __restrict__ y, const RopeParams p) {
  const int64_t n = p.rows * p.width;
  const int half = p.rope_dim / 2;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / p.width, c = e - r * p.width;
    const int64_t i = c - p.offset;
    if (i < 0 || i >= p.rope_dim) {
      y[e] = x[e];
      continue;
    }
    const rope_math::RopePick pk =
        rope_math::rope_pick(static_cast<int>(i), half, p.interleave, p.forward);
    const int64_t t = (r / p.heads) % p.seq;
    const float cs = p.cos[t * half + pk.j], sn = p.sin[t * half + pk.j];
    const float s = p.forward ? sn : -sn;
    const T* xr = x + r * p.width + p.offset;
    const float a = rope_load(xr, pk.p), b = rope_load(xr, pk.q);
    rope_store(
        y, e,
        pk.first ? rope_math::rotate_first(a, b, cs, s) : rope_math::rotate_second(a, b, cs, s));
  }
}

// Vectorised form for W, offset and d multiples of 8 with x, y and the tables 16-byte aligned (the
// model's q (B, T, H, dn + dr) and k_pe (B, T, kv_lora + dr)). A row is cut into items: (W - d) / 8
// chunks of 8 channels outside the rope part, copied as raw bits, and d / 8 quads of 4 pairs
// j .. j + 3 of the rope part. A quad reads its inputs as two 4-element vectors (p at j, q at j +
// h) or one 8-element vector (interleaved pairs 2j, 2j + 1: forward kInterleave), computes each
// output with the same rope_math rotation as rope_kernel, and writes two 4-element vectors (first
// at j, second at j + h) or one 8-element vector (backward kInterleave: 2j, 2j + 1). Index
// arithmetic is per item, in 32 bits when the item count allows.
template <typename T>
__device__ __forceinline__ void rope_load4(const T* p, float (&v)[4]) {
  if constexpr (sizeof(T) == 2) {
    const uint2 w = *reinterpret_cast<const uint2*>(p);
    v[0] = bits_float(w.x << 16), v[1] = bits_float(w.x & 0xFFFF0000u);
    v[2] = bits_float(w.y << 16), v[3] = bits_float(w.y & 0xFFFF0000u);
  } else {
    const float4 f = *reinterpret_cast<const float4*>(p);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  }
}
template <typename T>
__device__ __forceinline__ void rope_store4(T* p, const float (&v)[4]) {
  if constexpr (sizeof(T) == 2) {
    *reinterpret_cast<uint2*>(p) =
        make_uint2(float_to_bf16(v[0]) | (static_cast<uint32_t>(float_to_bf16(v[1])) << 16),
                   float_to_bf16(v[2]) | (static_cast<uint32_t>(float_to_bf16(v[3])) << 16));
  } else {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  }
}

template <typename T, typename Index>
__device__ __forceinline__ void rope_vec_item(const T* __restrict__ x, T* __restrict__ y,
                                              const RopeParams& p, Index e, Index items_per_row,
                                              Index copies_per_row) {
  const Index r = e / items_per_row, k = e - r * items_per_row;
  const int64_t row = static_cast<int64_t>(r) * p.width;
  if (k < copies_per_row) {
    // 16 bytes per 8 BF16 channels, 32 per 8 FP32: raw bits, as y[e] = x[e].
    const Index ch8 = k * 8;
    const int64_t ch = ch8 < static_cast<Index>(p.offset) ? ch8 : ch8 + p.rope_dim;
    const auto* src = reinterpret_cast<const uint4*>(x + row + ch);
    auto* dst = reinterpret_cast<uint4*>(y + row + ch);
    dst[0] = src[0];
    if constexpr (sizeof(T) == 4) dst[1] = src[1];
    return;
  }
  const int half = p.rope_dim / 2;
  const int j = static_cast<int>(k - copies_per_row) * 4;
  const int64_t t =
      static_cast<int64_t>((r / static_cast<Index>(p.heads)) % static_cast<Index>(p.seq));
  const float4 c4 = *reinterpret_cast<const float4*>(p.cos + t * half + j);
  const float4 s4 = *reinterpret_cast<const float4*>(p.sin + t * half + j);
  const float cs[4] = {c4.x, c4.y, c4.z, c4.w};
  const float sn[4] = {p.forward ? s4.x : -s4.x, p.forward ? s4.y : -s4.y, p.forward ? s4.z : -s4.z,
                       p.forward ? s4.w : -s4.w};
  const T* xr = x + row + p.offset;
  T* yr = y + row + p.offset;
  float a[4], b[4];
  if (p.forward && p.interleave) {
    float lo[4], hi[4];  // channels 2j .. 2j + 3, 2j + 4 .. 2j + 7: pairs (p, q) interleaved
    rope_load4(xr + 2 * j, lo);
    rope_load4(xr + 2 * j + 4, hi);
    a[0] = lo[0], b[0] = lo[1], a[1] = lo[2], b[1] = lo[3];
    a[2] = hi[0], b[2] = hi[1], a[3] = hi[2], b[3] = hi[3];
  } else {
    rope_load4(xr + j, a);
    rope_load4(xr + j + half, b);
  }
  float first[4], second[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    first[i] = rope_math::rotate_first(a[i], b[i], cs[i], sn[i]);
    second[i] = rope_math::rotate_second(a[i], b[i], cs[i], sn[i]);
  }
  if (!p.forward && p.interleave) {
    const float lo[4] = {first[0], second[0], first[1], second[1]};
    const float hi[4] = {first[2], second[2], first[3], second[3]};
    rope_store4(yr + 2 * j, lo);
    rope_store4(yr + 2 * j + 4, hi);
  } else {
    rope_store4(yr + j, first);
    rope_store4(yr + j + half, second);
  }
}

template <typename T, typename Index>
__global__ void __launch_bounds__(256)
    rope_vec_kernel(const T* __restrict__ x, T* __restrict__ y, const RopeParams p) {
  const Index copies_per_row = static_cast<Index>((p.width - p.rope_dim) / 8);
  const Index items_per_row = copies_per_row + static_cast<Index>(p.rope_dim / 8);
  const Index n = static_cast<Index>(p.rows) * items_per_row;
  for (Index e = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<Index>(gridDim.x) * blockDim.x)
    rope_vec_item<T, Index>(x, y, p, e, items_per_row, copies_per_row);
}

}  // namespace octet::cuda::kernels
