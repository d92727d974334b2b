// Device code of the scaling-aware transpose (FP8-Flow-MoE; quantize.h has the op's contract): from
// a row-wise 1x128 copy with power-of-2 scales, the column-wise (cols, rows) copy with one scale per
// 128x128 tile, without dequantizing. Per tile, S = the largest scale_inv of the rows that hold a
// non-zero code there (1.0 when none does), and every code moves to S by the exact factor
// ratio = min(s_row / S, 1), a power of two: q' = cvt_rn_satfinite(float(q) * ratio) with the FP32
// product of quantize_cpu.cpp's reference (exact while the value stays normal, round-to-nearest-even
// below). Both kernels compute exactly that, bit for bit:
//   - scaling_aware_transpose_tile_kernel, the one the op runs: 16-byte loads and stores, the codes
//     rescaled in registers (hardware FP8x2 -> F16x2 decode, exact for every code, then the FP32
//     product and the hardware conversion back; or, when every ratio of a thread's rows is a power
//     of two of at least 2^-24 and no code is NaN, the product in F16x2, which gives the same bits:
//     rescale_fp8x4_f16), 4x4 byte
//     transposes in registers, the transposed words staged in a swizzled shared tile and stored as
//     full 16-byte pieces of output rows;
//   - scaling_aware_transpose_legacy_kernel (quantize_transpose_cuda.cu, its only user), the kernel
//     it replaced (4-byte loads, bytewise shared staging, a shared decode table), kept so that
//     `octet bench quantize` times both in one run and the GPU tests compare them.
// NaN codes: both FP32 products are NaN and the device's FMUL returns the canonical NaN whatever the
// input's payload, so both kernels write the format's NaN code, as the CPU reference does.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "ops/quantize/quantize_bf16_tile_kernels.cuh"
#include "ops/quantize/quantize_kernels.cuh"

namespace octet::cuda::kernels {

// ---------------------------------------------------------------------------------------------------
// One block of 256 threads per 128x128 tile. Thread t owns tile rows 4 m .. 4 m + 3 (m = t / 8, the
// row quad) and tile columns 16 cq .. 16 cq + 15 (cq = t % 8, the column chunk): four 16-byte loads,
// each a warp's 4 x 128 consecutive bytes of 4 rows. Its 4 x 16 block becomes 16 words of the
// transpose (output row 16 cq + 4 j + b, tile rows 4 m .. 4 m + 3: logical word m of that row).

// The transposed tile: 128 output rows of 32 words; logical word m of output row ct lives at
// m ^ 4 (ct / 16). A warp's stores (8 chunks x 4 row quads, one output row each per chunk) hit 32
// different banks; a quarter-warp's 16-byte reads (one output row, logical words 4k .. 4k + 3 at
// physical 4 (k ^ ct / 16) .. + 3) cover all 32 banks once.
struct TransposeSmem {
  alignas(16) uint32_t t[kTile * 32];
  uint32_t warp_max[8];
};

// Four codes of one row (byte i = element i) moved to the tile's scale: q' = cvt(float(q) * ratio).
template <Fp8Format kFmt>
__device__ __forceinline__ uint32_t rescale_fp8x4(uint32_t w, float ratio) {
  constexpr __nv_fp8_interpretation_t kInterp = kFmt == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2;
  const float2 a = __half22float2(
      __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xFFFFu), kInterp)));
  const float2 b = __half22float2(
      __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), kInterp)));
  return cvt_fp8x4<kFmt>(rn::mul(a.x, ratio), rn::mul(a.y, ratio), rn::mul(b.x, ratio),
                         rn::mul(b.y, ratio));
}

// The same four codes moved by 2^d with the half-precision pipe: the pair decode to F16x2 (exact),
// one HMUL2.RN by 2^d and the pair encode cvt.rn.satfinite from F16x2. For 1 >= 2^d >= 2^-24 (a
// half-precision number, subnormal below 2^-14) and no NaN code this is rescale_fp8x4's result bit
// for bit. A code is M 2^q with M < 16 (E4M3; < 8 for E5M2), so its product by 2^d is M 2^(q+d),
// below 65504. When q + d >= -24 that is a half-precision number: the half product is exact, as the
// FP32 one is, and both round that same value once, to nearest even, with satfinite. When q + d <
// -24 the value is below 16 2^-25 = 2^-21, under half the smallest subnormal of either format (2^-10
// for E4M3, 2^-17 for E5M2): the FP32 path rounds it to a zero of its sign, and the half product,
// at most 2^-21 once rounded, converts to that same zero. (A NaN code would leave as whatever NaN
// HMUL2 makes, not FMUL's canonical one, so NaN tiles take the FP32 path.)
template <Fp8Format kFmt>
__device__ __forceinline__ uint32_t rescale_fp8x4_f16(uint32_t w, __half2 ratio) {
  constexpr __nv_fp8_interpretation_t kInterp = kFmt == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2;
  const __half2 a = __hmul2_rn(
      __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xFFFFu), kInterp)),
      ratio);
  const __half2 b = __hmul2_rn(
      __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), kInterp)),
      ratio);
  const uint32_t lo = __nv_cvt_halfraw2_to_fp8x2(__half2_raw(a), __NV_SATFINITE, kInterp);
  const uint32_t hi = __nv_cvt_halfraw2_to_fp8x2(__half2_raw(b), __NV_SATFINITE, kInterp);
  return lo | (hi << 16);
}

// Whether a word of four codes holds a NaN code (E4M3: 0x7F / 0xFF; E5M2: exponent all ones and a
// non-zero significand, 0x7D-0x7F / 0xFD-0xFF).
template <Fp8Format kFmt>
__device__ __forceinline__ bool has_nan_code(uint32_t w) {
  const uint32_t m = w & 0x7F7F7F7Fu;
  const uint32_t top = kFmt == Fp8Format::kE4M3 ? m + 0x01010101u : m + 0x03030303u;
  return (top & 0x80808080u) != 0;
}

// min(si / smax, 1) for a row's scale_inv si > 0, else 0 (FP32 division, correctly rounded). Both
// are positive normal powers of two for every pow2 recipe: then the quotient is exactly 2^d, written
// from the exponents (2^-127 .. 2^-149 subnormal, 0 below, as the division rounds them).
__device__ __forceinline__ float row_ratio(float si, float smax) {
  const uint32_t a = float_bits(si), b = float_bits(smax);
  if (((a | b) & 0x807FFFFFu) == 0 && a != 0 && b != 0) {
    const int d = static_cast<int>(a >> 23) - static_cast<int>(b >> 23);
    if (d >= 0) return 1.0f;
    if (d >= -126) return bits_float(static_cast<uint32_t>(d + 127) << 23);
    return d >= -149 ? bits_float(1u << (d + 149)) : 0.0f;
  }
  return si > 0.0f ? fminf(rn::div(si, smax), 1.0f) : 0.0f;
}

// The second half of a tile's transpose, shared by scaling_aware_transpose_tile_kernel and the
// fused dispatch (moe_permute_transpose_kernels.cuh). Block (blockIdx.x, blockIdx.y) is tile column
// c0 / 128, tile row r0 / 128; thread t holds the codes x[i] of tile rows 4 m + i (m = t / 8) at
// tile columns 16 cq .. 16 cq + 15 (cq = t % 8), 16 bytes a row, and their rows' scale_inv si[i]
// (a padding row 1.0, a row past the end 0). Finds the tile's S, writes it, moves every code to it
// and stores the (cols, rows) copy.
template <Fp8Format kFmt>
__device__ __forceinline__ void transpose_tile_store(TransposeSmem& s, const uint4 (&x)[4],
                                                     const float (&si)[4], int64_t rows,
                                                     int64_t cols, uint8_t* __restrict__ out,
                                                     float* __restrict__ out_scale_inv, bool ovec,
                                                     bool per_row) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int cq = threadIdx.x % 8, m = threadIdx.x / 8;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile,
                c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t rblocks = ceil_div(rows, kGroup);
  // S: the largest scale_inv of the rows holding a non-zero code (+-0 are 0x00 and 0x80) in the
  // tile; a row's 128 columns are the 8 lanes 8 (lane / 8) .. + 7 of one warp. Positive powers of
  // two order like their bit patterns.
  uint32_t cand = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const bool nz = ((x[i].x | x[i].y | x[i].z | x[i].w) & 0x7F7F7F7Fu) != 0;
    const uint32_t ballot = __ballot_sync(~0u, nz);
    if ((ballot >> (lane & 24)) & 0xFFu) cand = max(cand, float_bits(si[i]));
  }
  cand = warp_max(cand);
  if (lane == 0) s.warp_max[warp] = cand;
  __syncthreads();
  uint32_t sbits = 0;
#pragma unroll
  for (int w = 0; w < 8; ++w) sbits = max(sbits, s.warp_max[w]);
  const float smax = sbits == 0 ? 1.0f : bits_float(sbits);  // an all-zero tile: quantize's 1.0
  if (per_row) {
    if (threadIdx.x < kTile && c0 + threadIdx.x < cols)
      out_scale_inv[(c0 + threadIdx.x) * rblocks + blockIdx.y] = smax;
  } else if (threadIdx.x == 0) {
    out_scale_inv[blockIdx.x * rblocks + blockIdx.y] = smax;
  }
  // Capped at 1 for the all-zero rows, whose scale_inv may exceed S (their codes stay zero).
  float ratio[4];
  bool f16 = true;  // every row's move fits rescale_fp8x4_f16 and no code is NaN
  constexpr float kF16Floor = 0x1p-24f;  // the smallest half-precision subnormal
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    ratio[i] = row_ratio(si[i], smax);
    // a power of two at or above the floor, or a row past the end (no scale, zero codes); a row
    // moved below 2^-149 (ratio 0) takes the FP32 path, where an E5M2 inf times 0 is NaN
    f16 &= (ratio[i] >= kF16Floor && (float_bits(ratio[i]) & 0x7FFFFFu) == 0) || si[i] == 0.0f;
    f16 &= !(has_nan_code<kFmt>(x[i].x) || has_nan_code<kFmt>(x[i].y) ||
             has_nan_code<kFmt>(x[i].z) || has_nan_code<kFmt>(x[i].w));
  }

  // Rescale, transpose 4x4 bytes per word column j, stage. Chunks past the end hold codes of
  // zeros; no output reads them.
  const int swz = m ^ (cq << 2);
  auto stage = [&](auto rescale) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      auto word = [&](int i) {
        return j == 0 ? x[i].x : j == 1 ? x[i].y : j == 2 ? x[i].z : x[i].w;
      };
      uint32_t o[4];
      transpose4x4_bytes(rescale(word(0), 0), rescale(word(1), 1), rescale(word(2), 2),
                         rescale(word(3), 3), o);
#pragma unroll
      for (int b = 0; b < 4; ++b) s.t[(cq * 16 + 4 * j + b) * 32 + swz] = o[b];
    }
  };
  if (f16) {
    __half2 r2[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) r2[i] = __float2half2_rn(ratio[i]);  // 2^d: exact in half
    stage([&](uint32_t w, int i) { return rescale_fp8x4_f16<kFmt>(w, r2[i]); });
  } else {
    stage([&](uint32_t w, int i) { return rescale_fp8x4<kFmt>(w, ratio[i]); });
  }
  __syncthreads();

  // The (cols, rows) copy: output row c0 + ct, 16-byte piece k = tile rows 16 k .. 16 k + 15.
  // 8 threads write one output row's 128 bytes, a warp 4 rows.
#pragma unroll
  for (int it = 0; it < 4; ++it) {
    const int item = threadIdx.x + it * kTileThreads;
    const int ct = item / 8, k = item % 8;
    const uint4 w = *reinterpret_cast<const uint4*>(&s.t[ct * 32 + 4 * (k ^ (ct >> 4))]);
    const int64_t oc = c0 + ct, orow = r0 + 16 * k;
    if (oc >= cols || orow >= rows) continue;
    if (ovec) {
      *reinterpret_cast<uint4*>(out + oc * rows + orow) = w;
    } else {
      const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int j = 0; j < 16; ++j)
        if (orow + j < rows)
          out[oc * rows + orow + j] = static_cast<uint8_t>(ws[j / 4] >> (8 * (j % 4)));
    }
  }
}

// kVec: cols % 16 == 0 and q 16-byte aligned (a chunk is wholly inside or outside the tensor);
// otherwise bytewise loads. ovec: rows % 16 == 0 and out 16-byte aligned (16-byte output stores);
// otherwise bytewise stores. With row_src, row r of the tensor transposed is row row_src[r] of q
// (-1: a row of zero codes with scale_inv 1.0, moe_permute's padding): the transpose of a row
// gather, without storing it. per_row: out_scale_inv in the 1x128 form (cols, rblocks), the tile's
// S at each of its 128 output rows, instead of one value per tile (cblocks, rblocks).
template <Fp8Format kFmt, bool kVec>
__global__ void __launch_bounds__(kTileThreads, 6)
    scaling_aware_transpose_tile_kernel(const uint8_t* __restrict__ q,
                                        const float* __restrict__ scale_inv, int64_t rows,
                                        int64_t cols, uint8_t* __restrict__ out,
                                        float* __restrict__ out_scale_inv,
                                        const int32_t* __restrict__ row_src, bool ovec,
                                        bool per_row) {
  static_assert(kTile == 128 && kTileThreads == 256, "32 row quads x 8 column chunks");
  __shared__ TransposeSmem s;
  const int cq = threadIdx.x % 8, m = threadIdx.x / 8;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile,
                c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t cblocks = ceil_div(cols, kGroup);
  const int64_t c = c0 + cq * 16;

  // Source rows (-1: padding, -2: past the end) and their scale_invs (padding 1.0, past the end 0).
  int64_t src[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = r0 + 4 * m + i;
    src[i] = r < rows ? (row_src != nullptr ? int64_t{row_src[r]} : r) : -2;
  }
  float si[4];
  uint4 x[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    si[i] = src[i] >= 0 ? scale_inv[src[i] * cblocks + blockIdx.x] : (src[i] == -1 ? 1.0f : 0.0f);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (kVec) {
      x[i] = src[i] >= 0 && c < cols ? *reinterpret_cast<const uint4*>(q + src[i] * cols + c)
                                     : make_uint4(0, 0, 0, 0);
    } else {
      uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
      for (int b = 0; b < 16; ++b)
        if (src[i] >= 0 && c + b < cols)
          w[b / 4] |= static_cast<uint32_t>(q[src[i] * cols + c + b]) << (8 * (b % 4));
      x[i] = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }

  transpose_tile_store<kFmt>(s, x, si, rows, cols, out, out_scale_inv, ovec, per_row);
}

}  // namespace octet::cuda::kernels
