// Device code of swiglu_backward_quantize (swiglu.h): dSwiGLU fused with the 1x128 quantization of
// its output and, with routing weights, the weight's gradient. The element math is swiglu_math.h's
// and the quantizer numerics/scale.h's with the hardware FP8 conversion, as in swiglu_kernels.cuh;
// the dot product runs in the order swiglu.h states, so the CPU reference gives the same bits.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "ops/swiglu/swiglu_kernels.cuh"

namespace octet::cuda::swiglu_kernels {

// A warp per row of d_gate_up (grid-stride over rows): first the routing weight's gradient (lane l
// sums columns l, l + 32, ...; then a fixed tree), then the 2F columns in 1x128 groups, 4
// consecutive columns a lane. Column c < F is dg of column c, c >= F is du of column c - F.
template <typename InT, typename GradT, int kThreads>
__global__ void __launch_bounds__(kThreads)
    swiglu_backward_quantize_1x128_kernel(const GradT* __restrict__ dh,
                                          const InT* __restrict__ gate_up,
                                          const float* __restrict__ row_weight, int64_t rows,
                                          int64_t f, ScaleRule rule, uint8_t* __restrict__ data,
                                          float* __restrict__ scale_inv,
                                          uint32_t* __restrict__ amax_out,
                                          float* __restrict__ d_row_weight) {
  static_assert(kGroup == 32 * 4, "a warp of 4-element lanes covers one 128-element group");
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps");
  constexpr int kWarps = kThreads / 32;
  __shared__ uint32_t warp_amax[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t n = 2 * f, groups = ceil_div(n, kGroup);
  const __nv_fp8_interpretation_t kind = rule.format == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2;
  const bool vec = n % 4 == 0;
  uint32_t running = 0;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + warp; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    const InT* g = gate_up + r * n;
    const GradT* d = dh + r * f;
    float w = 1.0f;
    if (row_weight != nullptr) {
      w = row_weight[r];
      float partial = 0.0f;
      for (int64_t j = lane; j < f; j += 32)
        partial =
            rn::add(partial, rn::mul(load(d, j), swiglu_math::swiglu(load(g, j), load(g, f + j))));
      for (int s = 16; s >= 1; s /= 2) {
        const float other = __shfl_down_sync(0xFFFFFFFFu, partial, s);
        if (lane < s) partial = rn::add(partial, other);
      }
      if (lane == 0) d_row_weight[r] = swiglu_math::canonical_nan(partial);
    }
    for (int64_t grp = 0; grp < groups; ++grp) {
      const int64_t c = grp * kGroup + lane * 4;
      float v[4];
      uint32_t a = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        v[i] = 0.0f;
        if (c + i < n) {
          const int64_t j = c + i < f ? c + i : c + i - f;
          const float dj = row_weight != nullptr ? rn::mul(load(d, j), w) : load(d, j);
          const auto gr = swiglu_math::swiglu_grad(load(g, j), load(g, f + j), dj);
          v[i] = c + i < f ? gr.dg : gr.du;
        }
        a = max(a, abs_bits(v[i]));
      }
      a = warp_max(a);
      running = max(running, a);
      const float scale = compute_scale(bits_float(a), rule);
      if (lane == 0) scale_inv[r * groups + grp] = scale_inverse(scale);
      const uint16_t lo = __nv_cvt_float2_to_fp8x2(
          make_float2(rn::mul(v[0], scale), rn::mul(v[1], scale)), __NV_SATFINITE, kind);
      const uint16_t hi = __nv_cvt_float2_to_fp8x2(
          make_float2(rn::mul(v[2], scale), rn::mul(v[3], scale)), __NV_SATFINITE, kind);
      const uint32_t word = lo | (static_cast<uint32_t>(hi) << 16);
      uint8_t* out = data + r * n + c;
      if (vec && c < n) {
        *reinterpret_cast<uint32_t*>(out) = word;
      } else {
        for (int i = 0; i < 4 && c + i < n; ++i) out[i] = static_cast<uint8_t>(word >> (8 * i));
      }
    }
  }
  if (lane == 0) warp_amax[warp] = running;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t m = 0;
    for (int i = 0; i < kWarps; ++i) m = max(m, warp_amax[i]);
    if (m) atomicMax(amax_out, m);
  }
}

}  // namespace octet::cuda::swiglu_kernels
