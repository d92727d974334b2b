// Device code of the scaling-aware transpose (FP8-Flow-MoE; quantize.h has the op's contract): from
// a row-wise 1x128 copy with power-of-2 scales, the column-wise (cols, rows) copy with one scale per
// 128x128 tile, without dequantizing. Per tile, S = the largest scale_inv of the rows that hold a
// non-zero code there (1.0 when none does), and every code moves to S by the exact factor
// ratio = min(s_row / S, 1), a power of two: q' = cvt_rn_satfinite(float(q) * ratio) with the FP32
// product of quantize_cpu.cpp's reference (exact while the value stays normal, round-to-nearest-even
// below). Both kernels compute exactly that, bit for bit:
//   - scaling_aware_transpose_tile_kernel, the one the op runs: 16-byte loads and stores, the codes
//     rescaled in registers (hardware FP8x2 -> F16x2 decode, exact for every code, then the FP32
//     product and the hardware conversion back), 4x4 byte transposes in registers, the transposed
//     words staged in a swizzled shared tile and stored as full 16-byte pieces of output rows;
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
#pragma unroll
  for (int i = 0; i < 4; ++i) ratio[i] = si[i] > 0.0f ? fminf(rn::div(si[i], smax), 1.0f) : 0.0f;

  // Rescale, transpose 4x4 bytes per word column j, stage. Chunks past the end hold codes of
  // zeros; no output reads them.
  const int swz = m ^ (cq << 2);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    auto word = [&](int i) { return j == 0 ? x[i].x : j == 1 ? x[i].y : j == 2 ? x[i].z : x[i].w; };
    uint32_t o[4];
    transpose4x4_bytes(
        rescale_fp8x4<kFmt>(word(0), ratio[0]), rescale_fp8x4<kFmt>(word(1), ratio[1]),
        rescale_fp8x4<kFmt>(word(2), ratio[2]), rescale_fp8x4<kFmt>(word(3), ratio[3]), o);
#pragma unroll
    for (int b = 0; b < 4; ++b) s.t[(cq * 16 + 4 * j + b) * 32 + swz] = o[b];
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
