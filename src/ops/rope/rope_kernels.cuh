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

}  // namespace octet::cuda::kernels
