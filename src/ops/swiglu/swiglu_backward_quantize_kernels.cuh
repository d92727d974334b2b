// Device code of swiglu_backward_quantize (swiglu.h): dSwiGLU fused with the 1x128 quantization of
// its output and, with routing weights, the weight's gradient. The element math is swiglu_math.h's
// and the quantizer numerics/scale.h's with the hardware FP8 conversion, as in swiglu_kernels.cuh;
// the dot product runs in the order swiglu.h states, so the CPU reference gives the same bits.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "ops/swiglu/swiglu_vec_kernels.cuh"

namespace octet::cuda::swiglu_kernels {

// A warp per row of d_gate_up (grid-stride over rows): first the routing weight's gradient (lane l
// sums columns l, l + 32, ...; then a fixed tree), then the 2F columns in 1x128 groups, 4
// consecutive columns a lane. Column c < F is dg of column c, c >= F is du of column c - F.
template <typename Src, typename GradT, int kThreads>
__global__ void __launch_bounds__(kThreads)
    swiglu_backward_quantize_1x128_kernel(const GradT* __restrict__ dh, Src gate_up,
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
    const GradT* d = dh + r * f;
    float w = 1.0f;
    if (row_weight != nullptr) {
      w = row_weight[r];
      float partial = 0.0f;
      for (int64_t j = lane; j < f; j += 32)
        partial = rn::add(
            partial,
            rn::mul(load(d, j), swiglu_math::swiglu(gate_up.load(r, j), gate_up.load(r, f + j))));
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
          const auto gr = swiglu_math::swiglu_grad(gate_up.load(r, j), gate_up.load(r, f + j), dj);
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
    if (m && amax_out != nullptr) atomicMax(amax_out, m);  // null: not wanted
  }
}

// The vectorised kernel (F % 8 == 0, 16-byte aligned buffers): a warp per row, the row in windows of
// 256 input columns (8 a lane), each column's dg, du (and h for the weight's gradient) computed once.
//   weight gradient: the window's products dh * h go through a 256-float scratch so that lane l adds
//     columns l, l + 32, ..., l + 224 of the window, in order, to its partial sum: the order
//     swiglu.h states.
//   kAligned (F % 128 == 0): the window's dg columns are two whole output groups and so are its du
//     columns (F / 128 groups further on): each half-warp quantizes from registers.
//   otherwise a group may straddle windows and the dg/du boundary: the row's 2F FP32 values are
//     staged in shared memory and quantized from there (a half-warp per group) once the row is done.
//     Chunk q of the row (8 values; dg's chunks, then du's) is staged as two float4s, elements 0-3
//     at 4q and 4-7 at F + 4q, so that consecutive lanes write and read consecutive 16 bytes (no
//     bank conflicts).
//   NaNs: dg, du and h are quantized as swiglu_grad_h leaves them (the GPU's NaN), with each
//     group's amax made canonical (canonical_amax): the codes and scales of canonical values.
//   h (want_h, h_out.data set): the window's h columns are two whole 1x128 groups of h (windows start
//     at multiples of 256 of h's F columns), so each half-warp quantizes its group from registers,
//     as swiglu_quantize_1x128_vec_kernel does, whatever F.
// kE4M3Pow2: the outputs' rule fixed at compile time (rule_scale, swiglu_vec_kernels.cuh).
// Dynamic shared memory: per warp 256 floats of scratch, plus 2F floats of staging unless kAligned.
template <typename Src, typename GradT, int kThreads, bool kAligned, bool kE4M3Pow2>
__global__ void __launch_bounds__(kThreads)
    swiglu_backward_quantize_1x128_vec_kernel(const GradT* __restrict__ dh, Src gate_up,
                                              const float* __restrict__ row_weight, int64_t rows,
                                              int64_t f, ScaleRule rule, uint8_t* __restrict__ data,
                                              float* __restrict__ scale_inv,
                                              uint32_t* __restrict__ amax_out,
                                              float* __restrict__ d_row_weight, QuantOut h_out) {
  static_assert(kGroup == 16 * kChunk, "a half-warp of 8-column lanes covers one group");
  constexpr int kWarps = kThreads / 32;
  extern __shared__ float4 smem4[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, half = lane / 16, sub = lane % 16;
  const int64_t n = 2 * f, groups = ceil_div(n, kGroup), cpr = f / kChunk;
  const int64_t per_warp = 256 + (kAligned ? 0 : n);
  float* scratch = reinterpret_cast<float*>(smem4) + warp * per_warp;
  float* stage = scratch + 256;
  const __nv_fp8_interpretation_t kind = rule_kind<kE4M3Pow2>(rule);
  const bool weighted = row_weight != nullptr, with_h = h_out.data != nullptr;
  const int64_t h_groups = ceil_div(f, kGroup);
  uint32_t running = 0, h_running = 0;
  // The warp's (row, window) steps in order, the next step's loads issued before this step's math.
  const int64_t row_step = static_cast<int64_t>(gridDim.x) * kWarps;
  typename Src::Raw next_g{}, next_u{};
  Raw8<GradT> next_d{};
  float next_w = 1.0f;
  auto fetch = [&](int64_t row, int64_t k0) {
    const int64_t k = k0 + lane;
    if (k < cpr) {
      next_g = gate_up.fetch(row, k * kChunk);
      next_u = gate_up.fetch(row, f + k * kChunk);
      next_d = load_raw8(dh + row * f + k * kChunk);
    } else {  // zeros: dg = du = h = 0 past F, computed without a branch
      next_g = Src::zero(), next_u = Src::zero(), next_d = {};
    }
    if (k0 == 0 && weighted) next_w = row_weight[row];
  };
  int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + warp, k0 = 0;
  if (r < rows) fetch(r, 0);
  float w = 1.0f, partial = 0.0f;
  while (r < rows) {
    const typename Src::Raw cur_g = next_g, cur_u = next_u;
    const Raw8<GradT> cur_d = next_d;
    if (k0 == 0) w = next_w, partial = 0.0f;
    int64_t next_r = r, next_k0 = k0 + 32;
    if (next_k0 >= cpr) next_r = r + row_step, next_k0 = 0;
    if (next_r < rows) fetch(next_r, next_k0);
    {
      const int64_t k = k0 + lane, c = k * kChunk;
      const bool on = k < cpr;
      float gv[kChunk], uv[kChunk], dv[kChunk], dg[kChunk], du[kChunk], p[kChunk];
      gate_up.template unpack<kE4M3Pow2>(cur_g, gv);
      gate_up.template unpack<kE4M3Pow2>(cur_u, uv);
      unpack8(cur_d, dv);
      float sv[kChunk];
      sigmoid8(gv, sv);
#pragma unroll
      for (int e = 0; e < kChunk; ++e) {
        const GradH gr = swiglu_grad_h(gv[e], uv[e], weighted ? rn::mul(dv[e], w) : dv[e], sv[e]);
        dg[e] = gr.dg;
        du[e] = gr.du;
        p[e] = rn::mul(dv[e], gr.h);
        // h as swiglu_quantize has it: swiglu8's value (g s u), times the weight.
        uv[e] = weighted ? rn::mul(gr.h, w) : gr.h;
      }
      if (with_h) {  // uv now holds h: the half-warp's group k0 / 16 + half of h's row
        uint32_t a = 0;
#pragma unroll
        for (int e = 0; e < kChunk; ++e) a = max(a, abs_bits(uv[e]));
        a = canonical_amax(half_warp_max(a));
        h_running = max(h_running, a);
        const float hs = rule_scale<kE4M3Pow2>(a, h_out.rule);
        if (on) {
          if (sub == 0)
            h_out.scale_inv[r * h_groups + k0 / 16 + half] = rule_inverse<kE4M3Pow2>(hs);
          *reinterpret_cast<uint2*>(h_out.data + r * f + c) =
              fp8x8(uv, hs, rule_kind<kE4M3Pow2>(h_out.rule));
        }
      }
      if (weighted) {
        reinterpret_cast<float4*>(scratch)[2 * lane] = make_float4(p[0], p[1], p[2], p[3]);
        reinterpret_cast<float4*>(scratch)[2 * lane + 1] = make_float4(p[4], p[5], p[6], p[7]);
        __syncwarp();
        if ((k0 + 32) * kChunk <= f) {  // a whole window: no bound per column
#pragma unroll
          for (int m = 0; m < 8; ++m) partial = rn::add(partial, scratch[lane + 32 * m]);
        } else {
          const int64_t left = f - k0 * kChunk - lane;
#pragma unroll
          for (int m = 0; m < 8; ++m)
            if (32 * m < left) partial = rn::add(partial, scratch[lane + 32 * m]);
        }
        __syncwarp();
      }
      if constexpr (kAligned) {
        // dg chunk k is in group k / 16, du chunk k in group (cpr + k) / 16 (cpr % 16 == 0): the
        // half-warp's chunks are one group, all on or all off.
        uint32_t a_dg = 0, a_du = 0;
#pragma unroll
        for (int e = 0; e < kChunk; ++e) {
          a_dg = max(a_dg, abs_bits(dg[e]));
          a_du = max(a_du, abs_bits(du[e]));
        }
        a_dg = canonical_amax(half_warp_max(a_dg));
        a_du = canonical_amax(half_warp_max(a_du));
        running = max(running, max(a_dg, a_du));
        const TwoScales sc = two_scales<kE4M3Pow2>(a_dg, a_du, rule, sub);
        if (on && sub % 8 == 0)
          scale_inv[r * groups + (sub < 8 ? c : f + c) / kGroup] = sc.own_inverse;
        if (on) {
          *reinterpret_cast<uint2*>(data + r * n + c) = fp8x8(dg, sc.scale[0], kind);
          *reinterpret_cast<uint2*>(data + r * n + f + c) = fp8x8(du, sc.scale[1], kind);
        }
      } else if (on) {  // chunks k (dg) and cpr + k (du) of the row
        float4* lo = reinterpret_cast<float4*>(stage);
        float4* hi = reinterpret_cast<float4*>(stage + f);
        lo[k] = make_float4(dg[0], dg[1], dg[2], dg[3]);
        hi[k] = make_float4(dg[4], dg[5], dg[6], dg[7]);
        lo[cpr + k] = make_float4(du[0], du[1], du[2], du[3]);
        hi[cpr + k] = make_float4(du[4], du[5], du[6], du[7]);
      }
    }
    if (next_k0 == 0) {  // the row's last window: its weight gradient, and the staged groups
      if (weighted) {
        for (int s = 16; s >= 1; s /= 2) {
          const float other = __shfl_down_sync(0xFFFFFFFFu, partial, s);
          if (lane < s) partial = rn::add(partial, other);
        }
        if (lane == 0) d_row_weight[r] = swiglu_math::canonical_nan(partial);
      }
      if constexpr (!kAligned) {
        __syncwarp();
        // Groups q0 + 2 j + half for j < 4: eight groups a warp a step, whose amax reductions and
        // scales are independent, so their shuffle and scale chains overlap (a step of two groups
        // a half-warp left each chain's latency exposed: this loop was most of the kernel's
        // stalls). Pairs (j = 0, 1) and (2, 3) take their scales from one two_scales each.
        for (int64_t q0 = 0; q0 < groups; q0 += 8) {
          constexpr int kQ = 4;
          float v[kQ][kChunk] = {};
          uint32_t a[kQ] = {0, 0, 0, 0};
          int64_t c[kQ];
          bool on[kQ];
#pragma unroll
          for (int k = 0; k < kQ; ++k) {
            c[k] = (q0 + 2 * k + half) * kGroup + sub * kChunk;
            on[k] = c[k] < n;
            if (!on[k]) continue;
            const float4 x = reinterpret_cast<const float4*>(stage)[c[k] / kChunk];
            const float4 y = reinterpret_cast<const float4*>(stage + f)[c[k] / kChunk];
            v[k][0] = x.x, v[k][1] = x.y, v[k][2] = x.z, v[k][3] = x.w;
            v[k][4] = y.x, v[k][5] = y.y, v[k][6] = y.z, v[k][7] = y.w;
#pragma unroll
            for (int e = 0; e < kChunk; ++e) a[k] = max(a[k], abs_bits(v[k][e]));
          }
#pragma unroll
          for (int o = 8; o > 0; o >>= 1)
#pragma unroll
            for (int k = 0; k < kQ; ++k) a[k] = max(a[k], __shfl_xor_sync(0xFFFFFFFFu, a[k], o));
#pragma unroll
          for (int k = 0; k < kQ; ++k) {
            a[k] = canonical_amax(a[k]);
            running = max(running, a[k]);
          }
          const TwoScales sc[2] = {two_scales<kE4M3Pow2>(a[0], a[1], rule, sub),
                                   two_scales<kE4M3Pow2>(a[2], a[3], rule, sub)};
#pragma unroll
          for (int p = 0; p < 2; ++p) {
            const int64_t own = q0 + 4 * p + (sub < 8 ? 0 : 2) + half;
            if (sub % 8 == 0 && own < groups) scale_inv[r * groups + own] = sc[p].own_inverse;
          }
#pragma unroll
          for (int k = 0; k < kQ; ++k)
            if (on[k])
              *reinterpret_cast<uint2*>(data + r * n + c[k]) =
                  fp8x8(v[k], sc[k / 2].scale[k % 2], kind);
        }
        __syncwarp();  // the staging is rewritten by the next row
      }
    }
    r = next_r, k0 = next_k0;
  }
  block_amax<kThreads>(running, amax_out);
  if (with_h) {
    __syncthreads();  // block_amax's shared words are reused
    block_amax<kThreads>(h_running, h_out.amax);
  }
}

// The register-resident form of the vectorised kernel for rows of at most 32 * kIt chunks of 8
// columns (F <= 256 * kIt), the layout of swiglu_quantize_cache_1x128_row_kernel
// (swiglu_cache_kernels.cuh) with d_gate_up in gate_up's place: a warp per row (grid-stride)
// issues every load of the row at once (lane l, step i: chunk k = 32 i + l of gate, up and dh);
// each step computes its chunk's dg, du and h; then
//   h chunk k, dg chunk k  | groups k / 16: the lane's half-warp at step i, stored at the step
//   du chunk k             | d_gate_up group (F/8 + k) / 16 (group_max), stored after the last
//                          | step; its 8 values stay in registers until then
//   dg/du boundary         | when F % 128 != 0, group gb = F / 128 takes dg's last chunks and du's
//                          | first, as gate_up's copy does there
// so nothing is staged in shared memory but the weight gradient's window of products, which goes
// through the vectorised kernel's 256-float scratch in the same order (step i is its window i).
// The values, amaxes (canonical_amax of each whole group), scales and the dot product's order are
// the vectorised kernel's, so the same bits.
template <typename Src, typename GradT, int kThreads, int kIt, bool kE4M3Pow2>
__global__ void __launch_bounds__(kThreads, 65536 / (128 * kThreads))
    swiglu_backward_quantize_1x128_row_kernel(const GradT* __restrict__ dh, Src gate_up,
                                              const float* __restrict__ row_weight, int64_t rows,
                                              int64_t f, ScaleRule rule, uint8_t* __restrict__ data,
                                              float* __restrict__ scale_inv,
                                              uint32_t* __restrict__ amax_out,
                                              float* __restrict__ d_row_weight, QuantOut h_out) {
  constexpr int kWarps = kThreads / 32;
  __shared__ float4 scratch4[kWarps][64];  // the weight gradient's window: 256 products
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, half = lane / 16, sub = lane % 16;
  float* scratch = reinterpret_cast<float*>(scratch4[warp]);
  const int64_t n = 2 * f, cpr = f / kChunk, groups = ceil_div(n, kGroup);
  const int64_t h_groups = ceil_div(f, kGroup), gb = cpr / 16;
  const bool straddle = cpr % 16 != 0;  // group gb holds dg and du chunks
  const __nv_fp8_interpretation_t kind = rule_kind<kE4M3Pow2>(rule);
  const bool weighted = row_weight != nullptr, with_h = h_out.data != nullptr;
  uint32_t running = 0, h_running = 0;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + warp; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    typename Src::Raw rg[kIt], ru[kIt];
    Raw8<GradT> rd[kIt];
    bool on[kIt];
#pragma unroll
    for (int i = 0; i < kIt; ++i) {
      const int64_t k = 32 * i + lane;
      on[i] = k < cpr;
      if (on[i]) {
        rg[i] = gate_up.fetch(r, k * kChunk);
        ru[i] = gate_up.fetch(r, f + k * kChunk);
        rd[i] = load_raw8(dh + r * f + k * kChunk);
      } else {  // zeros: dg = du = h = 0 past F, computed without a branch
        rg[i] = Src::zero(), ru[i] = Src::zero(), rd[i] = {};
      }
    }
    const float w = weighted ? row_weight[r] : 1.0f;
    float partial = 0.0f;
    float du[kIt][kChunk];
    uint32_t adu[kIt], du_head = 0, dg_tail = 0;  // group gb's du and dg shares
#pragma unroll
    for (int i = 0; i < kIt; ++i) {
      const int64_t k = 32 * i + lane, q = 2 * i + half;  // q: the h and dg group
      float gv[kChunk], uv[kChunk], dv[kChunk], sv[kChunk], dg[kChunk], p[kChunk];
      gate_up.template unpack<kE4M3Pow2>(rg[i], gv);
      gate_up.template unpack<kE4M3Pow2>(ru[i], uv);
      unpack8(rd[i], dv);
      sigmoid8(gv, sv);
#pragma unroll
      for (int e = 0; e < kChunk; ++e) {
        const GradH gr = swiglu_grad_h(gv[e], uv[e], weighted ? rn::mul(dv[e], w) : dv[e], sv[e]);
        dg[e] = gr.dg;
        du[i][e] = gr.du;
        p[e] = rn::mul(dv[e], gr.h);
        uv[e] = weighted ? rn::mul(gr.h, w) : gr.h;  // h, as swiglu_quantize has it
      }
      if (weighted) {  // lane l adds the window's columns l, l + 32, ..., in order
        reinterpret_cast<float4*>(scratch)[2 * lane] = make_float4(p[0], p[1], p[2], p[3]);
        reinterpret_cast<float4*>(scratch)[2 * lane + 1] = make_float4(p[4], p[5], p[6], p[7]);
        __syncwarp();
        if ((32 * i + 32) * kChunk <= f) {  // a whole window: no bound per column
#pragma unroll
          for (int m = 0; m < 8; ++m) partial = rn::add(partial, scratch[lane + 32 * m]);
        } else {
          const int64_t left = f - 32 * i * kChunk - lane;
#pragma unroll
          for (int m = 0; m < 8; ++m)
            if (32 * m < left) partial = rn::add(partial, scratch[lane + 32 * m]);
        }
        __syncwarp();
      }
      uint32_t a = abs_max_bits8(uv), b = abs_max_bits8(dg), c = abs_max_bits8(du[i]);
      a = canonical_amax(half_warp_max(a));
      b = half_warp_max(b);
      adu[i] = group_max(c, cpr + 32 * i);
      if (i == 0) du_head = __shfl_sync(0xFFFFFFFFu, adu[0], 0);  // group (F/8) / 16 = gb
      if (straddle && i == gb / 2) {
        dg_tail = __shfl_sync(0xFFFFFFFFu, b, 16 * static_cast<int>(gb % 2));
        if (q == gb) b = max(b, du_head);
      }
      b = canonical_amax(b);
      const TwoScales sc = two_scales<kE4M3Pow2>(a, h_out.rule, b, rule, sub);
      if (with_h) {
        if (sub == 0 && q < h_groups) h_out.scale_inv[r * h_groups + q] = sc.own_inverse;
        if (on[i])
          *reinterpret_cast<uint2*>(h_out.data + r * f + k * kChunk) =
              fp8x8(uv, sc.scale[0], rule_kind<kE4M3Pow2>(h_out.rule));
        h_running = max(h_running, a);
      }
      if (sub == 8 && q < h_groups) scale_inv[r * groups + q] = sc.own_inverse;
      if (on[i])
        *reinterpret_cast<uint2*>(data + r * n + k * kChunk) = fp8x8(dg, sc.scale[1], kind);
      running = max(running, b);
    }
    if (weighted) {
      for (int s = 16; s >= 1; s /= 2) {
        const float other = __shfl_down_sync(0xFFFFFFFFu, partial, s);
        if (lane < s) partial = rn::add(partial, other);
      }
      if (lane == 0) d_row_weight[r] = swiglu_math::canonical_nan(partial);
    }
    if (straddle) merge_straddling_groups<kIt>(adu, cpr, gb, dg_tail, lane);  // gb: dg's share
#pragma unroll
    for (int i = 0; i < kIt; ++i) {
      const int64_t k = 32 * i + lane;
      const uint32_t a = canonical_amax(adu[i]);
      const float su = rule_scale<kE4M3Pow2>(a, rule);
      if (on[i] && (cpr + k) % 16 == 0)  // the group's first chunk (gb's is dg's)
        scale_inv[r * groups + (cpr + k) / 16] = rule_inverse<kE4M3Pow2>(su);
      if (on[i]) *reinterpret_cast<uint2*>(data + r * n + f + k * kChunk) = fp8x8(du[i], su, kind);
      running = max(running, a);
    }
  }
  block_amax<kThreads>(running, amax_out);
  if (with_h) {
    __syncthreads();  // block_amax's shared words are reused
    block_amax<kThreads>(h_running, h_out.amax);
  }
}

}  // namespace octet::cuda::swiglu_kernels
