// Vectorised device code of the swiglu family, for F a multiple of 8 and 16-byte aligned buffers
// (the launchers check; other shapes take swiglu_kernels.cuh's scalar kernels). A lane owns a
// "chunk" of 8 consecutive columns: one 16-byte load per BF16 operand (two for FP32), one 16-byte
// BF16 store, one 8-byte FP8 store. Every value kept is swiglu_math.h's sequence of correctly
// rounded operations, so these kernels give the scalar kernels' (and the CPU's) bits; what changes
// is how many instructions the SM issues for them (the fused quantizers are bound by that, not by
// memory):
//
//   what                      | scalar kernel                    | here
//   --------------------------|----------------------------------|-----------------------------------
//   loads                     | 2-byte, one element at a time    | 16-byte, 8 elements
//   1x128 quantize (forward)  | a warp per group, 4 per lane     | a half-warp per group, 8 per lane
//   scale of a group          | compute_scale on every lane      | half the lanes, two groups at once
//   sigmoid's exp             | branches, float -> int (F2I)     | no branches, n from the sum's bits
//   sigmoid's 1 / (1 + e)     | div.rn, a branch per element     | div.rn's fast path (see rcp_small)
//   dSwiGLU + quantize        | dg and du each computed twice    | once (values staged per row)
//   row index of a chunk      | 2-D grid                         | 32-bit division when it fits
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "ops/swiglu/swiglu_kernels.cuh"

namespace octet::cuda::swiglu_kernels {

// Eight FP32 values stored as T. BF16 by the hardware's cvt.rn.bf16x2.f32, which rounds as
// float_to_bf16 does (nearest even, no flush, overflow to inf) and gives its 0x7FFF for the
// canonical NaN 0x7FC00000, the only NaN these kernels store (swiglu_math::canonical_nan).
template <typename T>
__device__ __forceinline__ void store8(T* __restrict__ p, const float (&v)[kChunk]) {
  if constexpr (sizeof(T) == 4) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    uint32_t x[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)  // a goes to the upper half: the odd element
      asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(x[i]) : "f"(v[2 * i + 1]), "f"(v[2 * i]));
    *reinterpret_cast<uint4*>(p) = make_uint4(x[0], x[1], x[2], x[3]);
  }
}

// exp_rn's reduction and polynomial for x (both callers below): t = x log2(e) + 1.5 * 2^23 rounded,
// whose low mantissa bits are n + 2^22, and p = exp(r) for r = x - n ln 2.
struct ExpParts {
  float t, p;
};
__device__ __forceinline__ ExpParts exp_parts(float x) {
  constexpr float kLog2e = 1.44269502162933349609375f;
  constexpr float kLn2Hi = 0.693147182464599609375f;
  constexpr float kLn2Lo = -1.904654323148236e-09f;
  constexpr float kRound = 12582912.0f;
  const float t = rn::add(rn::mul(x, kLog2e), kRound);
  const float n = rn::sub(t, kRound);
  float r = rn::fma(-n, kLn2Hi, x);
  r = rn::fma(-n, kLn2Lo, r);
  float p = 1.0f / 5040.0f;
  p = rn::fma(p, r, 1.0f / 720.0f);
  p = rn::fma(p, r, 1.0f / 120.0f);
  p = rn::fma(p, r, 1.0f / 24.0f);
  p = rn::fma(p, r, 1.0f / 6.0f);
  p = rn::fma(p, r, 0.5f);
  p = rn::fma(p, r, 1.0f);
  p = rn::fma(p, r, 1.0f);
  return {t, p};
}

// swiglu_math::sigmoid(g) = 1 / (1 + exp_rn(-g)) without branches, for the callers below, which
// the compiler can then interleave over a lane's 8 elements. exp_rn's operations, unchanged, on
// x = -g clamped to [-104, 89], except:
//   - its integer n is read from the bits of t = x * log2(e) + 1.5 * 2^23 (in [2^23, 2^24) for every
//     such x, so t's low mantissa bits are n + 2^22 exactly) instead of a float-to-int conversion,
//     which the SM runs at an eighth of its issue rate;
//   - where exp_rn gives 0 or a subnormal (x < -87.3) this gives p * 2^-126 instead: below 2^-24
//     all the same, so 1 + exp is 1 either way;
//   - where exp_rn gives +inf (x > 88.72283935546875, also for the clamped x = 89), the last
//     product overflows to +inf here too (r > 0 there, so p >= 1 and p * 2^128 >= 2^128);
//   - for a NaN g the result is a number, not NaN: every caller multiplies by g, so its outputs are
//     NaN (canonical) just as swiglu_math's.
// Hence the same bits as swiglu_math::sigmoid for every non-NaN g.
__device__ __forceinline__ float one_plus_exp_neg(float g) {
  const auto [t, p] = exp_parts(fminf(fmaxf(-g, -104.0f), 89.0f));
  const int ni = static_cast<int>(float_bits(t)) - 0x4B400000;  // in [-151, 129]
  const bool high = ni > 127;                                   // exp_rn: (p * 2^127) * 2^(n - 127)
  const float f2 = rn::pow2i(high ? ni - 127 : 0);
  const float e = rn::mul(rn::mul(p, rn::pow2i(min(max(ni, -126), 127))), f2);
  return rn::add(1.0f, e);
}

// 1 / y, correctly rounded, for y in [1, 2^125): the fast path nvcc emits for div.rn.f32 with
// numerator 1, operation for operation (rcp.approx, one Newton step, the residual and the final
// correction; the quotient q0 = 1 * r1 is r1). nvcc guards that path with a check of the operands'
// exponents (FCHK) and a slow path for quotients near the subnormal range and special operands,
// none of which y in this range gives; larger y go to rn::div.
__device__ __forceinline__ float rcp_small(float y) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(y));
  const float r1 = __fmaf_rn(r, __fmaf_rn(-y, r, 1.0f), r);
  return __fmaf_rn(r1, __fmaf_rn(-y, r1, 1.0f), r1);
}

// one_plus_exp_neg for |g| <= 80, the range of every trained model's gate: the clamp of x = -g, the
// exponent's two-factor split and its limits are then identities (n = ni is in [-116, 116], so
// 2^ni is a normal power of two and the product p * 2^ni is the same single rounding), so the
// same bits in fewer instructions; 2^ni's bits (ni + 127) << 23 come from t's bits by one integer
// multiply-add, t's low bits being ni + 0x4B400000 (see one_plus_exp_neg).
__device__ __forceinline__ float one_plus_exp_neg_mid(float g) {
  constexpr uint32_t kBias = static_cast<uint32_t>(127 - 0x4B400000) << 23;
  const auto [t, p] = exp_parts(-g);
  return rn::add(1.0f, rn::mul(p, bits_float(float_bits(t) * (1u << 23) + kBias)));
}

// swiglu_math::sigmoid of a lane's 8 elements: when every |g| of the warp is at most 80 (NaN is
// not), 1 / one_plus_exp_neg_mid by rcp_small (1 + e^80 < 2^125); otherwise 1 / one_plus_exp_neg,
// by rcp_small, or by rn::div for the whole warp when any of its lanes has a y >= 2^125 (g <= -86.6,
// never in trained models). So the common path has no branch per element. Every lane of the warp
// calls it.
__device__ __forceinline__ void sigmoid8(const float (&g)[kChunk], float (&s)[kChunk]) {
  bool mid = true;
#pragma unroll
  for (int e = 0; e < kChunk; ++e) mid &= fabsf(g[e]) <= 80.0f;
  if (__all_sync(0xFFFFFFFFu, mid)) {
#pragma unroll
    for (int e = 0; e < kChunk; ++e) s[e] = rcp_small(one_plus_exp_neg_mid(g[e]));
    return;
  }
  float y[kChunk];
  bool large = false;
#pragma unroll
  for (int e = 0; e < kChunk; ++e) {
    y[e] = one_plus_exp_neg(g[e]);
    large |= y[e] >= 0x1p125f;
  }
  if (__any_sync(0xFFFFFFFFu, large)) {
#pragma unroll
    for (int e = 0; e < kChunk; ++e) s[e] = rn::div(1.0f, y[e]);
  } else {
#pragma unroll
    for (int e = 0; e < kChunk; ++e) s[e] = rcp_small(y[e]);
  }
}

// swiglu_math::swiglu of a lane's 8 elements but for NaNs, which stay the GPU's products
// (0x7FFFFFFF), for the 1x128 quantizers: they quantize the same codes from any NaN and make the
// group's amax canonical instead (canonical_amax). Every lane of the warp calls it.
__device__ __forceinline__ void swiglu8_uncanonical(const float (&g)[kChunk],
                                                    const float (&u)[kChunk], float (&h)[kChunk]) {
  float s[kChunk];
  sigmoid8(g, s);
#pragma unroll
  for (int e = 0; e < kChunk; ++e) h[e] = rn::mul(rn::mul(g[e], s[e]), u[e]);
}

// swiglu_math::swiglu of a lane's 8 elements (every lane of the warp calls it).
__device__ __forceinline__ void swiglu8(const float (&g)[kChunk], const float (&u)[kChunk],
                                        float (&h)[kChunk]) {
  swiglu8_uncanonical(g, u, h);
#pragma unroll
  for (int e = 0; e < kChunk; ++e) h[e] = swiglu_math::canonical_nan(h[e]);
}

// swiglu_math::swiglu_grad(g, u, dh) and swiglu_math::swiglu(g, u) given s = sigmoid(g), sharing g * s:
// every output is the same sequence of operations as there, but none is made the canonical NaN: a
// NaN leaves as the GPU's product makes it (0x7FFFFFFF). Callers that store the values make them
// canonical; the 1x128 quantizers need not, as long as they canonicalise the group's amax
// (canonical_amax): the product by the scale turns any NaN into the same code.
struct GradH {
  float dg, du, h;
};
__device__ __forceinline__ GradH swiglu_grad_h(float g, float u, float dh, float s) {
  const float gs = rn::mul(g, s);
  const float dsilu = rn::mul(s, rn::add(1.0f, rn::mul(g, rn::add(1.0f, -s))));
  return {rn::mul(rn::mul(dh, u), dsilu), rn::mul(dh, gs), rn::mul(gs, u)};
}

// The amax bits of a group as they are when its values are canonical NaNs (swiglu_math::canonical_nan):
// any NaN's magnitude bits exceed +inf's and become 0x7FC00000. One compare and select a group
// instead of one per value.
__device__ __forceinline__ uint32_t canonical_amax(uint32_t a) {
  return a > 0x7F800000u ? 0x7FC00000u : a;
}

// max over e of abs_bits(v[e]) (numerics/scale.h) by the float unit: seven max.NaN of magnitudes
// (|x| is an operand modifier) instead of eight masks and integer maxima. For non-NaN values the
// float order of magnitudes is the order of their bits; a NaN gives 0x7FFFFFFF (max.NaN's
// canonical NaN) where abs_bits gives the NaN's own magnitude bits. Both are above +inf's bits and
// canonical_amax makes either 0x7FC00000, so a group's amax is the same word once it is canonical,
// as every caller makes it.
__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ uint32_t abs_max_bits8(const float (&v)[kChunk]) {
  static_assert(kChunk == 8, "a tree over 8 values");
  const float m01 = max_nan(fabsf(v[0]), fabsf(v[1])), m23 = max_nan(fabsf(v[2]), fabsf(v[3]));
  const float m45 = max_nan(fabsf(v[4]), fabsf(v[5])), m67 = max_nan(fabsf(v[6]), fabsf(v[7]));
  return float_bits(max_nan(max_nan(m01, m23), max_nan(m45, m67)));
}

// Max over the 16 lanes of a half-warp (every lane of the warp calls it).
__device__ __forceinline__ uint32_t half_warp_max(uint32_t v) {
  for (int o = 8; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

__device__ __forceinline__ __nv_fp8_interpretation_t fp8_kind(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2;
}

// The rule of a quantizing kernel's outputs, as a template parameter kE4M3Pow2 that the launcher
// sets when it holds (E4M3 codes, power-of-2 scales, no margin: every FP8 recipe's 1x128 tiles;
// an FP8 gate_up copy the kernel reads is E4M3 too) and clears otherwise (any ScaleRule, the
// format read at run time). The same bits either way (pow2_scale is compute_scale's rule, test
// Scale.Pow2WithoutDivisionGivesTheDivisionsBits); set, a group's scale is straight-line integer
// code and each FP8 conversion is compiled once instead of once per format under a predicate.
// These kernels issue instructions faster than memory feeds them, so that is their speed.
inline bool e4m3_pow2(const ScaleRule& r) {
  return r.format == Fp8Format::kE4M3 && r.rounding == ScaleRounding::kPow2 && r.margin == 0;
}
template <bool kE4M3Pow2>
__device__ __forceinline__ float rule_scale(uint32_t amax_bits, const ScaleRule& r) {
  if constexpr (kE4M3Pow2)
    return pow2_scale(bits_float(amax_bits), r.epsilon, Fp8Format::kE4M3);
  else
    return compute_scale(bits_float(amax_bits), r);
}
template <bool kE4M3Pow2>
__device__ __forceinline__ float rule_inverse(float scale) {
  if constexpr (kE4M3Pow2)
    return pow2_scale_inverse(scale);
  else
    return scale_inverse(scale);
}
template <bool kE4M3Pow2>
__device__ __forceinline__ __nv_fp8_interpretation_t rule_kind(const ScaleRule& r) {
  if constexpr (kE4M3Pow2)
    return __NV_E4M3;
  else
    return fp8_kind(r.format);
}

// The scales of two 1x128 groups whose amaxes a0 and a1 every lane of a half-warp holds: lanes 0-7
// compute the first and lanes 8-15 the second (one compute_scale a lane instead of two), then
// exchange them. own_inverse is the lane's own group's scale_inverse, meant for lanes 0 and 8.
struct TwoScales {
  float scale[2];
  float own_inverse;
};
// Groups of two outputs with their own rules: a0 (rule r0) on lanes 0-7 of each half-warp, a1 (r1)
// on lanes 8-15. With kE4M3Pow2 both rules are that one and differ at most in epsilon.
template <bool kE4M3Pow2>
__device__ __forceinline__ TwoScales two_scales(uint32_t a0, const ScaleRule& r0, uint32_t a1,
                                                const ScaleRule& r1, int sub) {
  const float s = rule_scale<kE4M3Pow2>(sub < 8 ? a0 : a1, sub < 8 ? r0 : r1);
  const int base = static_cast<int>(threadIdx.x % 32) & 16;
  TwoScales t;
  t.scale[0] = __shfl_sync(0xFFFFFFFFu, s, base);
  t.scale[1] = __shfl_sync(0xFFFFFFFFu, s, base + 8);
  t.own_inverse = sub % 8 == 0 ? rule_inverse<kE4M3Pow2>(s) : 0.0f;
  return t;
}

// Both groups under one rule.
template <bool kE4M3Pow2 = false>
__device__ __forceinline__ TwoScales two_scales(uint32_t a0, uint32_t a1, const ScaleRule& rule,
                                                int sub) {
  return two_scales<kE4M3Pow2>(a0, rule, a1, rule, sub);
}

// Max of v over the lanes whose chunk lies in the lane's 1x128 group, for chunks base + lane (16
// chunks a group): a segmented max by shuffles toward each group's first lane in the warp, then
// from it to the others. Every lane of the warp calls it.
__device__ __forceinline__ uint32_t group_max(uint32_t v, int64_t base) {
  const int lane = threadIdx.x % 32;
  const int pos = static_cast<int>((base + lane) % 16);  // the chunk's place in its group
#pragma unroll
  for (int o = 1; o < 16; o <<= 1) {
    const uint32_t t = __shfl_down_sync(0xFFFFFFFFu, v, o);
    if (lane + o < 32 && pos + o < 16) v = max(v, t);
  }
  return __shfl_sync(0xFFFFFFFFu, v, lane - min(pos, lane));
}

// The second half of a row in the kIt-step layout of the row kernels (swiglu_cache_kernels.cuh):
// chunk k = 32 i + lane of the half (i the step) lies in group (cpr + k) / 16 of the whole row, and
// a[i] holds its group's max over step i's lanes (group_max). When cpr % 16 != 0 a group that starts
// at step i ends at step i + 1: each side takes the other's maximum (both read before either
// changes), and group gb = cpr / 16, which also holds the first half's last chunks, takes their
// share. Every lane of the warp calls it.
template <int kIt>
__device__ __forceinline__ void merge_straddling_groups(uint32_t (&a)[kIt], int64_t cpr, int64_t gb,
                                                        uint32_t first_half_share, int lane) {
  uint32_t first[kIt], last[kIt];
#pragma unroll
  for (int i = 0; i < kIt; ++i) {
    first[i] = __shfl_sync(0xFFFFFFFFu, a[i], 0);
    last[i] = __shfl_sync(0xFFFFFFFFu, a[i], 31);
  }
#pragma unroll
  for (int i = 0; i < kIt; ++i) {
    const int64_t gid = (cpr + 32 * i + lane) / 16;
    if (i + 1 < kIt && gid == (cpr + 32 * (i + 1)) / 16) a[i] = max(a[i], first[i + 1]);
    if (i > 0 && gid == (cpr + 32 * i - 1) / 16) a[i] = max(a[i], last[i - 1]);
  }
  if ((cpr + lane) / 16 == gb) a[0] = max(a[0], first_half_share);
}

// Eight FP8 codes of v * scale (each product rounded to FP32, then cvt.rn.satfinite), element i in
// byte i, as the scalar kernels pack them.
__device__ __forceinline__ uint2 fp8x8(const float (&v)[kChunk], float scale,
                                       __nv_fp8_interpretation_t kind) {
  uint32_t w[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint16_t lo = __nv_cvt_float2_to_fp8x2(
        make_float2(rn::mul(v[4 * h], scale), rn::mul(v[4 * h + 1], scale)), __NV_SATFINITE, kind);
    const uint16_t hi = __nv_cvt_float2_to_fp8x2(
        make_float2(rn::mul(v[4 * h + 2], scale), rn::mul(v[4 * h + 3], scale)), __NV_SATFINITE,
        kind);
    w[h] = lo | (static_cast<uint32_t>(hi) << 16);
  }
  return make_uint2(w[0], w[1]);
}

// One quantized output of a fused kernel beside its main one (gate_up's copy in the cache kernels,
// h in the backward quantize kernel): codes (rows, cols) with K-major scales.
struct QuantOut {
  uint8_t* data;
  float* scale_inv;
  uint32_t* amax;  // bits of max |x|, atomicMax; null when not wanted
  ScaleRule rule;
};

// a / b and a % b, in 32 bits when the caller knows a < 2^32 (b >= 1).
struct QR {
  int64_t q, r;
};
__device__ __forceinline__ QR divmod(int64_t a, int64_t b, bool small) {
  if (small) {
    const uint32_t q = static_cast<uint32_t>(a) / static_cast<uint32_t>(b);
    return {q, static_cast<uint32_t>(a) - q * static_cast<uint32_t>(b)};
  }
  const int64_t q = a / b;
  return {q, a - q * b};
}

// The block's largest |value| bits into *amax_out (atomicMax of unsigned words: any order gives the
// same result). Every thread of the block calls it.
template <int kThreads>
__device__ __forceinline__ void block_amax(uint32_t running, uint32_t* amax_out) {
  __shared__ uint32_t warp_amax[kThreads / 32];
  running = warp_max(running);
  if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = running;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t m = 0;
    for (int w = 0; w < kThreads / 32; ++w) m = max(m, warp_amax[w]);
    if (m && amax_out != nullptr) atomicMax(amax_out, m);  // null: not wanted
  }
}

// Element-wise forward and backward: a thread per chunk, two chunks in flight, grid-stride over the
// rows * F / 8 chunks.
template <typename InT, typename OutT, int kThreads>
__global__ void __launch_bounds__(kThreads)
    swiglu_forward_vec_kernel(const InT* __restrict__ gate_up, int64_t rows, int64_t f,
                              OutT* __restrict__ h) {
  const int64_t cpr = f / kChunk, chunks = rows * cpr;
  const bool small = chunks <= int64_t{0xFFFFFFFF};
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  // The loop runs while any lane of the warp has a chunk (sigmoid8 is called by whole warps).
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  for (int64_t i0 = first; i0 - threadIdx.x % 32 < chunks; i0 += 2 * stride) {
    float g[2][kChunk] = {}, u[2][kChunk] = {};  // chunks past the end: zeros, not stored
    int64_t at[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int64_t i = i0 + k * stride;
      at[k] = -1;
      if (i >= chunks) continue;
      const QR rc = divmod(i, cpr, small);
      const InT* p = gate_up + rc.q * 2 * f + rc.r * kChunk;
      load8(p, g[k]);
      load8(p + f, u[k]);
      at[k] = rc.q * f + rc.r * kChunk;
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      float o[kChunk];
      swiglu8(g[k], u[k], o);
      if (at[k] >= 0) store8(h + at[k], o);
    }
  }
}

// Its load loop repeats the forward's on purpose: the same loop behind a shared __device__ helper
// measured 10% slower here on the H100 (174 -> 192 us at the baseline's 65536 x 2*704, same call).
// kE4M3: an FP8 gate_up copy is E4M3 (the launcher checked), decoded by that conversion alone.
template <typename Src, typename GradT, int kThreads, bool kE4M3>
__global__ void __launch_bounds__(kThreads)
    swiglu_backward_vec_kernel(const GradT* __restrict__ dh, Src gate_up, int64_t rows, int64_t f,
                               GradT* __restrict__ d_gate_up) {
  const int64_t cpr = f / kChunk, chunks = rows * cpr;
  const bool small = chunks <= int64_t{0xFFFFFFFF};
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  // The loop runs while any lane of the warp has a chunk (sigmoid8 is called by whole warps).
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  for (int64_t i0 = first; i0 - threadIdx.x % 32 < chunks; i0 += 2 * stride) {
    float g[2][kChunk] = {}, u[2][kChunk] = {}, d[2][kChunk] = {};  // past the end: zeros
    int64_t at[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int64_t i = i0 + k * stride;
      at[k] = -1;
      if (i >= chunks) continue;
      const QR rc = divmod(i, cpr, small);
      gate_up.template unpack<kE4M3>(gate_up.fetch(rc.q, rc.r * kChunk), g[k]);
      gate_up.template unpack<kE4M3>(gate_up.fetch(rc.q, f + rc.r * kChunk), u[k]);
      load8(dh + rc.q * f + rc.r * kChunk, d[k]);
      at[k] = rc.q * 2 * f + rc.r * kChunk;
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      float s[kChunk], dg[kChunk], du[kChunk];
      sigmoid8(g[k], s);
#pragma unroll
      for (int e = 0; e < kChunk; ++e) {
        const GradH gr = swiglu_grad_h(g[k][e], u[k][e], d[k][e], s[e]);
        dg[e] = swiglu_math::canonical_nan(gr.dg);
        du[e] = swiglu_math::canonical_nan(gr.du);
      }
      if (at[k] < 0) continue;
      store8(d_gate_up + at[k], dg);
      store8(d_gate_up + at[k] + f, du);
    }
  }
}

// Fused SwiGLU + 1x128 quantization: a half-warp per 128-column group of h (8 columns a lane, the
// amax by shuffles within the half-warp), a warp per pair of consecutive groups in row-major order,
// two pairs in flight, grid-stride. Lanes past F (the last group of a row when F % 128 != 0) hold
// 0, which leaves the amax as it is.
template <typename Src, int kThreads, bool kE4M3Pow2>
__global__ void __launch_bounds__(kThreads)
    swiglu_quantize_1x128_vec_kernel(Src gate_up, int64_t rows, int64_t f,
                                     const float* __restrict__ row_weight, ScaleRule rule,
                                     uint8_t* __restrict__ data, float* __restrict__ scale_inv,
                                     uint32_t* __restrict__ amax_out) {
  static_assert(kGroup == 16 * kChunk, "a half-warp of 8-column lanes covers one group");
  const int lane = threadIdx.x % 32, half = lane / 16, sub = lane % 16;
  const int64_t gpr = ceil_div(f, kGroup), groups = rows * gpr, pairs = ceil_div(groups, 2);
  const bool small = groups <= int64_t{0xFFFFFFFF};
  const __nv_fp8_interpretation_t kind = rule_kind<kE4M3Pow2>(rule);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kThreads / 32);
  uint32_t running = 0;
  for (int64_t t0 = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
       t0 < pairs; t0 += 2 * warps) {
    float g[2][kChunk] = {}, u[2][kChunk] = {}, w[2];  // lanes past F: h = 0, no branch
    int64_t grp[2], r[2], c[2];
    bool on[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      grp[k] = 2 * (t0 + k * warps) + half;
      const QR rc = divmod(grp[k] < groups ? grp[k] : 0, gpr, small);
      r[k] = rc.q;
      c[k] = rc.r * kGroup + sub * kChunk;
      on[k] = grp[k] < groups && c[k] < f;
      w[k] = 1.0f;
      if (on[k]) {
        gate_up.template unpack<kE4M3Pow2>(gate_up.fetch(r[k], c[k]), g[k]);
        gate_up.template unpack<kE4M3Pow2>(gate_up.fetch(r[k], f + c[k]), u[k]);
        if (row_weight != nullptr) w[k] = row_weight[r[k]];
      }
    }
    float h[2][kChunk];
    uint32_t a[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      a[k] = 0;
      swiglu8_uncanonical(g[k], u[k], h[k]);
#pragma unroll
      for (int e = 0; e < kChunk; ++e) {
        if (row_weight != nullptr) h[k][e] = rn::mul(h[k][e], w[k]);
        a[k] = max(a[k], abs_bits(h[k][e]));
      }
      a[k] = canonical_amax(half_warp_max(a[k]));
      running = max(running, a[k]);
    }
    const TwoScales sc = two_scales<kE4M3Pow2>(a[0], a[1], rule, sub);
    const int64_t own = sub < 8 ? grp[0] : grp[1];
    if (sub % 8 == 0 && own < groups) scale_inv[own] = sc.own_inverse;
#pragma unroll
    for (int k = 0; k < 2; ++k)
      if (on[k]) *reinterpret_cast<uint2*>(data + r[k] * f + c[k]) = fp8x8(h[k], sc.scale[k], kind);
  }
  block_amax<kThreads>(running, amax_out);
}

// The fast form of swiglu_quantize_1x128_vec_kernel for rows of at most 32 * kIt chunks of 8
// columns (F <= 256 * kIt): a warp per row (grid-stride) fetches all of the row's gate and up
// chunks first, every load in flight at once (lane l, step i: chunk k = 32 i + l), then computes h
// and quantizes it by half-warps: chunk k lies in h's group k / 16 = 2 i + (l / 16). The same
// operations as the vec kernel on the same values, so the same bits; it keeps more bytes in flight
// a warp (a quarter of the row's bytes a step instead of two groups), which matters most for the
// FP8 gate_up copy (8-byte loads).
template <typename Src, int kThreads, int kIt, bool kE4M3Pow2>
__global__ void __launch_bounds__(kThreads)
    swiglu_quantize_1x128_row_kernel(Src gate_up, int64_t rows, int64_t f,
                                     const float* __restrict__ row_weight, ScaleRule rule,
                                     uint8_t* __restrict__ data, float* __restrict__ scale_inv,
                                     uint32_t* __restrict__ amax_out) {
  static_assert(kGroup == 16 * kChunk, "a half-warp of 8-column lanes covers one group");
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x % 32, half = lane / 16, sub = lane % 16;
  const int64_t cpr = f / kChunk, groups = ceil_div(f, kGroup);
  const __nv_fp8_interpretation_t kind = rule_kind<kE4M3Pow2>(rule);
  uint32_t running = 0;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    typename Src::Raw rg[kIt] = {}, ru[kIt] = {};
    bool on[kIt];
#pragma unroll
    for (int i = 0; i < kIt; ++i) {
      const int64_t k = 32 * i + lane;
      on[i] = k < cpr;
      if (on[i]) {
        rg[i] = gate_up.fetch(r, k * kChunk);
        ru[i] = gate_up.fetch(r, f + k * kChunk);
      }
    }
    const float w = row_weight != nullptr ? row_weight[r] : 1.0f;
#pragma unroll
    for (int i = 0; i < kIt; ++i) {
      const int64_t k = 32 * i + lane, q = 2 * i + half;
      float g[kChunk] = {}, u[kChunk] = {}, h[kChunk];  // lanes past F: h = 0
      if (on[i]) {
        gate_up.template unpack<kE4M3Pow2>(rg[i], g);
        gate_up.template unpack<kE4M3Pow2>(ru[i], u);
      }
      swiglu8_uncanonical(g, u, h);
      uint32_t a = 0;
#pragma unroll
      for (int e = 0; e < kChunk; ++e) {
        if (row_weight != nullptr) h[e] = rn::mul(h[e], w);
        a = max(a, abs_bits(h[e]));
      }
      a = canonical_amax(half_warp_max(a));
      running = max(running, a);
      if (q >= groups) continue;  // the whole half-warp is past the row
      const float scale = rule_scale<kE4M3Pow2>(a, rule);
      if (sub == 0) scale_inv[r * groups + q] = rule_inverse<kE4M3Pow2>(scale);
      if (on[i]) *reinterpret_cast<uint2*>(data + r * f + k * kChunk) = fp8x8(h, scale, kind);
    }
  }
  block_amax<kThreads>(running, amax_out);
}

}  // namespace octet::cuda::swiglu_kernels
