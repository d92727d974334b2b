// Device code of the swiglu family. The element math is swiglu_math.h's (bitwise the CPU's); the
// fused quantizer applies numerics/scale.h per 1x128 group exactly as ops/quantize does, with the
// hardware FP8 conversion (cvt.rn.satfinite, proven equal to numerics/fp8.h's rounding by
// tests/numerics).
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "ops/swiglu/swiglu_gate_up.cuh"

namespace octet::cuda::swiglu_kernels {

template <typename T>
__device__ __forceinline__ float load(const T* p, int64_t i) {
  if constexpr (sizeof(T) == 4)
    return p[i];
  else
    return bf16_to_float(p[i]);
}

template <typename T>
__device__ __forceinline__ void store(T* p, int64_t i, float v) {
  if constexpr (sizeof(T) == 4)
    p[i] = v;
  else
    p[i] = float_to_bf16(v);
}

// Element-wise kernels: blockIdx.x covers kThreads * kPerThread columns of F, blockIdx.y strides
// over rows, so no element index is ever divided.
template <typename InT, typename OutT, int kThreads, int kPerThread>
__global__ void __launch_bounds__(kThreads)
    swiglu_forward_kernel(const InT* __restrict__ gate_up, int64_t rows, int64_t f,
                          OutT* __restrict__ h) {
  static_assert(kThreads % 32 == 0 && kPerThread >= 1, "whole warps");
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const InT* g = gate_up + r * 2 * f;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int64_t j =
          (static_cast<int64_t>(blockIdx.x) * kPerThread + k) * kThreads + threadIdx.x;
      if (j < f) store(h + r * f, j, swiglu_math::swiglu(load(g, j), load(g, f + j)));
    }
  }
}

template <typename Src, typename GradT, int kThreads, int kPerThread>
__global__ void __launch_bounds__(kThreads)
    swiglu_backward_kernel(const GradT* __restrict__ dh, Src gate_up, int64_t rows, int64_t f,
                           GradT* __restrict__ d_gate_up) {
  static_assert(kThreads % 32 == 0 && kPerThread >= 1, "whole warps");
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    GradT* dg = d_gate_up + r * 2 * f;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int64_t j =
          (static_cast<int64_t>(blockIdx.x) * kPerThread + k) * kThreads + threadIdx.x;
      if (j >= f) continue;
      const auto d =
          swiglu_math::swiglu_grad(gate_up.load(r, j), gate_up.load(r, f + j), load(dh + r * f, j));
      store(dg, j, d.dg);
      store(dg, f + j, d.du);
    }
  }
}

__device__ __forceinline__ uint32_t warp_max(uint32_t v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

// A warp per 1x128 group of h (4 consecutive elements a lane), grid-stride over the rows * groups
// groups. The global amax is a max of |h| bit patterns (numerics/scale.h abs_bits): atomicMax of
// unsigned words gives the same result in any order.
template <typename Src, int kThreads>
__global__ void __launch_bounds__(kThreads)
    swiglu_quantize_1x128_kernel(Src gate_up, int64_t rows, int64_t f,
                                 const float* __restrict__ row_weight, ScaleRule rule,
                                 uint8_t* __restrict__ data, float* __restrict__ scale_inv,
                                 uint32_t* __restrict__ amax_out) {
  static_assert(kGroup == 32 * 4, "a warp of 4-element lanes covers one 128-element group");
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps");
  constexpr int kWarps = kThreads / 32;
  __shared__ uint32_t warp_amax[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t groups_per_row = ceil_div(f, kGroup), groups = rows * groups_per_row;
  const __nv_fp8_interpretation_t kind = rule.format == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2;
  const bool vec = f % 4 == 0;  // then a lane's 4 codes are one aligned word
  uint32_t running = 0;
  for (int64_t grp = static_cast<int64_t>(blockIdx.x) * kWarps + warp; grp < groups;
       grp += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t r = grp / groups_per_row, c = (grp % groups_per_row) * kGroup + lane * 4;
    float h[4];
    uint32_t a = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      h[i] = c + i < f ? swiglu_math::swiglu(gate_up.load(r, c + i), gate_up.load(r, f + c + i))
                       : 0.0f;
      if (row_weight != nullptr) h[i] = swiglu_math::canonical_nan(rn::mul(h[i], row_weight[r]));
      a = max(a, abs_bits(h[i]));
    }
    a = warp_max(a);
    running = max(running, a);
    const float scale = compute_scale(bits_float(a), rule);
    if (lane == 0) scale_inv[grp] = scale_inverse(scale);
    const uint16_t lo = __nv_cvt_float2_to_fp8x2(
        make_float2(rn::mul(h[0], scale), rn::mul(h[1], scale)), __NV_SATFINITE, kind);
    const uint16_t hi = __nv_cvt_float2_to_fp8x2(
        make_float2(rn::mul(h[2], scale), rn::mul(h[3], scale)), __NV_SATFINITE, kind);
    const uint32_t word = lo | (static_cast<uint32_t>(hi) << 16);
    uint8_t* out = data + r * f + c;
    if (vec && c < f) {
      *reinterpret_cast<uint32_t*>(out) = word;
    } else {
      for (int i = 0; i < 4 && c + i < f; ++i) out[i] = static_cast<uint8_t>(word >> (8 * i));
    }
  }
  if (lane == 0) warp_amax[warp] = running;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t m = 0;
    for (int w = 0; w < kWarps; ++w) m = max(m, warp_amax[w]);
    if (m && amax_out != nullptr) atomicMax(amax_out, m);  // null: not wanted
  }
}

}  // namespace octet::cuda::swiglu_kernels
