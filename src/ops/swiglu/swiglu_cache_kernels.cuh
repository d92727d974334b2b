// Device code of swiglu_quantize_caching_input (swiglu.h): the fused SwiGLU + 1x128 quantization of
// h that also writes gate_up's own 1x128 copy, in one pass over gate_up. A warp per row
// (grid-stride): first the row's 2F gate_up columns in 128-column groups along the whole row (a
// group straddles the gate/up halves when F % 128 != 0), then h's F columns in groups, reading the
// row again (from L1/L2: the warp read it just before). Both quantizers are numerics/scale.h's rule
// with the hardware FP8 conversion, as in swiglu_vec_kernels.cuh, so the copies are quantize()'s
// bits and h is swiglu_quantize's.
//
//   kernel         | when                          | a lane holds
//   ---------------|-------------------------------|---------------------------------------------
//   _row_kernel    | F % 8 == 0, 16-byte aligned,  | 8 columns of gate and the same 8 of up per
//                  | F <= 1024                     | step, the whole row in registers, read once
//   _vec_kernel    | F % 8 == 0, 16-byte aligned   | 8 columns; a half-warp per group, two groups
//                  |                               | a half-warp per step (two_scales)
//   _kernel        | otherwise                     | 4 columns; a warp per group
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "ops/swiglu/swiglu_vec_kernels.cuh"

namespace octet::cuda::swiglu_kernels {

// Eight consecutive elements kept in L1 (the h pass reads them again).
template <typename T>
__device__ __forceinline__ void load8_keep(const T* __restrict__ p, float (&v)[kChunk]) {
  Raw8<T> r;
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(T) / 2); ++i)
    r.w[i] = __ldg(reinterpret_cast<const uint4*>(p) + i);
  unpack8(r, v);
}

// Groups q0 + half and q0 + 2 + half of one row: their 8-column values (zeros past the row) in v,
// quantized and stored by the half-warps; returns the larger of the two amaxes. With canonical
// (h from swiglu8_uncanonical, whose NaNs are not) each group's amax is made canonical
// (canonical_amax); gate_up's copy keeps quantize()'s amax of the input as it is. Every lane of the
// warp calls it.
template <bool kE4M3Pow2>
__device__ __forceinline__ uint32_t quantize_two_groups(const float (&v)[2][kChunk],
                                                        const bool (&on)[2], const int64_t (&c)[2],
                                                        int64_t q0, int64_t groups,
                                                        int64_t row_base, int64_t scale_base,
                                                        const QuantOut& o, bool canonical) {
  const int lane = threadIdx.x % 32, half = lane / 16, sub = lane % 16;
  uint32_t a[2] = {0, 0};
#pragma unroll
  for (int k = 0; k < 2; ++k) {
#pragma unroll
    for (int e = 0; e < kChunk; ++e) a[k] = max(a[k], abs_bits(v[k][e]));
    a[k] = half_warp_max(a[k]);
    if (canonical) a[k] = canonical_amax(a[k]);
  }
  const TwoScales sc = two_scales<kE4M3Pow2>(a[0], a[1], o.rule, sub);
  const int64_t own = q0 + (sub < 8 ? 0 : 2) + half;
  if (sub % 8 == 0 && own < groups) o.scale_inv[scale_base + own] = sc.own_inverse;
#pragma unroll
  for (int k = 0; k < 2; ++k)
    if (on[k])
      *reinterpret_cast<uint2*>(o.data + row_base + c[k]) =
          fp8x8(v[k], sc.scale[k], rule_kind<kE4M3Pow2>(o.rule));
  return max(a[0], a[1]);
}

template <typename InT, int kThreads, bool kE4M3Pow2>
__global__ void __launch_bounds__(kThreads)
    swiglu_quantize_cache_1x128_vec_kernel(const InT* __restrict__ gate_up, int64_t rows, int64_t f,
                                           const float* __restrict__ row_weight, QuantOut h_out,
                                           QuantOut gu_out) {
  static_assert(kGroup == 16 * kChunk, "a half-warp of 8-column lanes covers one group");
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x % 32, half = lane / 16, sub = lane % 16;
  const int64_t n = 2 * f, gu_groups = ceil_div(n, kGroup), h_groups = ceil_div(f, kGroup);
  uint32_t gu_running = 0, h_running = 0;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    const InT* row = gate_up + r * n;
    for (int64_t q0 = 0; q0 < gu_groups; q0 += 4) {
      float v[2][kChunk] = {};
      int64_t c[2];
      bool on[2];
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        c[k] = (q0 + 2 * k + half) * kGroup + sub * kChunk;
        on[k] = c[k] < n;
        if (on[k]) load8_keep(row + c[k], v[k]);
      }
      gu_running = max(gu_running, quantize_two_groups<kE4M3Pow2>(v, on, c, q0, gu_groups, r * n,
                                                                  r * gu_groups, gu_out, false));
    }
    const float w = row_weight != nullptr ? row_weight[r] : 1.0f;
    for (int64_t q0 = 0; q0 < h_groups; q0 += 4) {
      float g[2][kChunk] = {}, u[2][kChunk] = {}, h[2][kChunk];
      int64_t c[2];
      bool on[2];
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        c[k] = (q0 + 2 * k + half) * kGroup + sub * kChunk;
        on[k] = c[k] < f;
        if (on[k]) {
          load8(row + c[k], g[k]);
          load8(row + f + c[k], u[k]);
        }
      }
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        swiglu8_uncanonical(g[k], u[k], h[k]);
        if (row_weight != nullptr)
#pragma unroll
          for (int e = 0; e < kChunk; ++e) h[k][e] = rn::mul(h[k][e], w);
      }
      h_running = max(h_running, quantize_two_groups<kE4M3Pow2>(h, on, c, q0, h_groups, r * f,
                                                                r * h_groups, h_out, true));
    }
  }
  block_amax<kThreads>(h_running, h_out.amax);
  __syncthreads();  // block_amax's shared words are reused
  block_amax<kThreads>(gu_running, gu_out.amax);
}

// The fast form of swiglu_quantize_cache_1x128_vec_kernel for rows of at most 32 * kIt chunks of 8
// columns (F <= 256 * kIt): a warp per row holds the whole row in registers, read once with every
// load in flight at once. Lane l, step i owns chunk k = 32 i + l of the gate (columns 8k..8k+7) and
// the same chunk of the up half (F + 8k..), so it computes h's chunk k from what it holds; then
// both quantizations come from those registers:
//   h chunk k          | group k / 16: the lane's half-warp at step i (half_warp_max)
//   gate chunk k       | gate_up group k / 16: the same half-warp
//   up chunk k         | gate_up group (F/8 + k) / 16: a segment of up to 16 lanes that may start
//                      | anywhere in the warp (group_max), and continue at the next step
//   gate/up boundary   | when F % 128 != 0, group gb = F / 128 holds the gate's last chunks (step
//                      | gb / 2, half-warp gb % 2) and the up's first (lanes of step 0)
// h and the gate are stored at their step (the up's share of group gb is known from step 0 on);
// the up half once every step has its maxima. Lanes past the row hold zeros, which leave every
// amax as it is, and store nothing.
// Up to kIt = 3 (F <= 768) at most 128 registers a thread, so that two blocks of 256 share an SM
// (ptxas gave kE4M3Pow2's straight-line code 148 otherwise, one block an SM); longer rows would
// spill under that bound.
template <typename InT, int kThreads, int kIt, bool kE4M3Pow2>
__global__ void __launch_bounds__(kThreads, kIt <= 3 ? 65536 / (128 * kThreads) : 1)
    swiglu_quantize_cache_1x128_row_kernel(const InT* __restrict__ gate_up, int64_t rows, int64_t f,
                                           const float* __restrict__ row_weight, QuantOut h_out,
                                           QuantOut gu_out) {
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x % 32, half = lane / 16, sub = lane % 16;
  const int64_t n = 2 * f, cpr = f / kChunk, gu_groups = ceil_div(n, kGroup);
  const int64_t h_groups = ceil_div(f, kGroup), gb = cpr / 16;
  const bool straddle = cpr % 16 != 0;  // group gb holds gate and up chunks
  const __nv_fp8_interpretation_t h_kind = rule_kind<kE4M3Pow2>(h_out.rule);
  const __nv_fp8_interpretation_t gu_kind = rule_kind<kE4M3Pow2>(gu_out.rule);
  uint32_t gu_running = 0, h_running = 0;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    const InT* row = gate_up + r * n;
    Raw8<InT> rg[kIt] = {}, ru[kIt] = {};
    bool on[kIt];
#pragma unroll
    for (int i = 0; i < kIt; ++i) {
      const int64_t k = 32 * i + lane;
      on[i] = k < cpr;
      if (on[i]) {
        rg[i] = load_raw8(row + k * kChunk);
        ru[i] = load_raw8(row + f + k * kChunk);
      }
    }
    const float w = row_weight != nullptr ? row_weight[r] : 1.0f;
    float u[kIt][kChunk];
    uint32_t au[kIt], up_head = 0, gate_tail = 0;  // group gb's up and gate shares
#pragma unroll
    for (int i = 0; i < kIt; ++i) {
      const int64_t k = 32 * i + lane, q = 2 * i + half;  // q: the h and gate group
      float g[kChunk], h[kChunk];
      unpack8(rg[i], g);
      unpack8(ru[i], u[i]);
      swiglu8_uncanonical(g, u[i], h);  // NaNs: canonical_amax below
      uint32_t a = 0, b = 0, c = 0;
#pragma unroll
      for (int e = 0; e < kChunk; ++e) {
        if (row_weight != nullptr) h[e] = rn::mul(h[e], w);
        a = max(a, abs_bits(h[e]));
        b = max(b, abs_bits(g[e]));
        c = max(c, abs_bits(u[i][e]));
      }
      a = canonical_amax(half_warp_max(a));
      b = half_warp_max(b);
      au[i] = group_max(c, cpr + 32 * i);
      if (i == 0) up_head = __shfl_sync(0xFFFFFFFFu, au[0], 0);  // group (F/8) / 16 = gb
      if (straddle && i == gb / 2) {
        gate_tail = __shfl_sync(0xFFFFFFFFu, b, 16 * static_cast<int>(gb % 2));
        if (q == gb) b = max(b, up_head);
      }
      const TwoScales sc = two_scales<kE4M3Pow2>(a, h_out.rule, b, gu_out.rule, sub);
      if (sub == 0 && q < h_groups) h_out.scale_inv[r * h_groups + q] = sc.own_inverse;
      if (sub == 8 && q < h_groups) gu_out.scale_inv[r * gu_groups + q] = sc.own_inverse;
      if (on[i]) {
        *reinterpret_cast<uint2*>(h_out.data + r * f + k * kChunk) = fp8x8(h, sc.scale[0], h_kind);
        *reinterpret_cast<uint2*>(gu_out.data + r * n + k * kChunk) =
            fp8x8(g, sc.scale[1], gu_kind);
      }
      h_running = max(h_running, a);
      gu_running = max(gu_running, b);
    }
    if (straddle)
      merge_straddling_groups<kIt>(au, cpr, gb, gate_tail, lane);  // gb: the gate's share
#pragma unroll
    for (int i = 0; i < kIt; ++i) {
      const int64_t k = 32 * i + lane;
      const float su = rule_scale<kE4M3Pow2>(au[i], gu_out.rule);
      if (on[i] && (cpr + k) % 16 == 0)  // the group's first chunk (gb's is the gate's)
        gu_out.scale_inv[r * gu_groups + (cpr + k) / 16] = rule_inverse<kE4M3Pow2>(su);
      if (on[i])
        *reinterpret_cast<uint2*>(gu_out.data + r * n + f + k * kChunk) = fp8x8(u[i], su, gu_kind);
      gu_running = max(gu_running, au[i]);
    }
  }
  block_amax<kThreads>(h_running, h_out.amax);
  __syncthreads();  // block_amax's shared words are reused
  block_amax<kThreads>(gu_running, gu_out.amax);
}

// One 1x128 group of 4-element lanes (zeros past the row) quantized and stored by the warp; returns
// its amax. Every lane calls it.
__device__ __forceinline__ uint32_t quantize_group4(const float (&v)[4], int64_t c, int64_t cols,
                                                    uint8_t* row_data, float* scale_slot,
                                                    const ScaleRule& rule) {
  uint32_t a = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) a = max(a, abs_bits(v[i]));
  a = warp_max(a);
  const float scale = compute_scale(bits_float(a), rule);
  if (threadIdx.x % 32 == 0) *scale_slot = scale_inverse(scale);
  const __nv_fp8_interpretation_t kind = fp8_kind(rule.format);
  const uint16_t lo = __nv_cvt_float2_to_fp8x2(
      make_float2(rn::mul(v[0], scale), rn::mul(v[1], scale)), __NV_SATFINITE, kind);
  const uint16_t hi = __nv_cvt_float2_to_fp8x2(
      make_float2(rn::mul(v[2], scale), rn::mul(v[3], scale)), __NV_SATFINITE, kind);
  const uint32_t word = lo | (static_cast<uint32_t>(hi) << 16);
  for (int i = 0; i < 4 && c + i < cols; ++i)
    row_data[c + i] = static_cast<uint8_t>(word >> (8 * i));
  return a;
}

template <typename InT, int kThreads>
__global__ void __launch_bounds__(kThreads)
    swiglu_quantize_cache_1x128_kernel(const InT* __restrict__ gate_up, int64_t rows, int64_t f,
                                       const float* __restrict__ row_weight, QuantOut h_out,
                                       QuantOut gu_out) {
  static_assert(kGroup == 32 * 4, "a warp of 4-element lanes covers one 128-element group");
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x % 32;
  const int64_t n = 2 * f, gu_groups = ceil_div(n, kGroup), h_groups = ceil_div(f, kGroup);
  uint32_t gu_running = 0, h_running = 0;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    const InT* row = gate_up + r * n;
    for (int64_t q = 0; q < gu_groups; ++q) {
      const int64_t c = q * kGroup + lane * 4;
      float v[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) v[i] = c + i < n ? load(row, c + i) : 0.0f;
      gu_running =
          max(gu_running, quantize_group4(v, c, n, gu_out.data + r * n,
                                          gu_out.scale_inv + r * gu_groups + q, gu_out.rule));
    }
    for (int64_t q = 0; q < h_groups; ++q) {
      const int64_t c = q * kGroup + lane * 4;
      float h[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        h[i] = c + i < f ? swiglu_math::swiglu(load(row, c + i), load(row, f + c + i)) : 0.0f;
        if (row_weight != nullptr) h[i] = swiglu_math::canonical_nan(rn::mul(h[i], row_weight[r]));
      }
      h_running = max(h_running, quantize_group4(h, c, f, h_out.data + r * f,
                                                 h_out.scale_inv + r * h_groups + q, h_out.rule));
    }
  }
  block_amax<kThreads>(h_running, h_out.amax);
  __syncthreads();  // block_amax's shared words are reused
  block_amax<kThreads>(gu_running, gu_out.amax);
}

}  // namespace octet::cuda::swiglu_kernels
