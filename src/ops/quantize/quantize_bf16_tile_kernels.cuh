// Device code of the quantize family's hot tile case: BF16 input, 1x128 groups, the column-wise
// (transposed) copy with or without the row-wise one. This is what every FP8 linear and grouped
// linear of the deepseek recipe runs on x and dy (QuantizeOutput::kBoth, or kColumnwise for a site
// whose x is kept in a wider storage). quantize_tile_kernel (quantize_kernels.cuh) stays the
// general path for every other granularity, dtype, shape and alignment; this kernel computes the
// same scales and codes bit for bit (the same amax per group, the same compute_scale, the same
// FP32 product and hardware conversion), with fewer instructions per element:
//   - 16-byte loads (8 BF16 per thread and row), all 8 of a thread's loads issued before the first
//     use;
//   - |x| maxima on the packed BF16 bits with 16-bit unsigned max (VIMNMX.U16x2, two elements per
//     instruction): max over (bits & 0x7FFF) orders like abs_bits of the widened FP32 value, NaN
//     patterns above inf, exactly as the FP32 reduction does;
//   - the transposed codes are transposed 8x8 bytes in registers (byte permutes), staged as 8-byte
//     words in shared memory and stored as 16-byte rows of the (cols, rows) output.
// Contract (checked by the launcher): cols % 8 == 0, rows % 16 == 0, input and column-wise data
// 16-byte aligned, row-wise data 8-byte aligned. Partial tiles (cols or rows not multiples of 128)
// are handled: missing columns and rows read as 0 (as in the general kernel) and are not written.
#pragma once

#include <cstdint>

#include "ops/quantize/quantize_kernels.cuh"

namespace octet::cuda::kernels {

// One 128x128 tile. Thread (warp w, lane l) owns columns 8 * (l % 16) .. + 7 (chunk cc) of tile
// rows 8 m .. 8 m + 7, m = 2 w + l / 16 (row block): each of its loads is one of two 256-byte row
// segments per warp, and its 8x8 block transposes in registers.
struct Bf16TileSmem {
  // Transposed codes: tile column ct holds 16 slots of 8 bytes (tile rows 8 m .. 8 m + 7, slot m)
  // at physical slot m ^ (ct / 8), so that the 16 lanes of a half-warp (same m, ct / 8 = 0..15)
  // write 16 different bank pairs.
  alignas(16) uint2 t[kTile * 16];
  alignas(16) uint32_t col_part[8][kTile / 2];  // per-warp column maxima, two |BF16| per word
  alignas(16) uint32_t row_amax[kTile];         // FP32 abs bits
  alignas(16) float row_scale[kTile];
  alignas(16) float col_scale[kTile];
  uint32_t warp_amax[4];
};

// 4x4 byte transpose: out[j] byte i = in[i] byte j.
__device__ __forceinline__ void transpose4x4_bytes(uint32_t a0, uint32_t a1, uint32_t a2,
                                                   uint32_t a3, uint32_t (&o)[4]) {
  const uint32_t t0 = __byte_perm(a0, a1, 0x5140), t1 = __byte_perm(a0, a1, 0x7362);
  const uint32_t t2 = __byte_perm(a2, a3, 0x5140), t3 = __byte_perm(a2, a3, 0x7362);
  o[0] = __byte_perm(t0, t2, 0x5410), o[1] = __byte_perm(t0, t2, 0x7632);
  o[2] = __byte_perm(t1, t3, 0x5410), o[3] = __byte_perm(t1, t3, 0x7632);
}

// Four FP32 products -> four codes in one word (byte i = element i), hardware RN satfinite.
template <Fp8Format kFmt>
__device__ __forceinline__ uint32_t cvt_fp8x4(float a, float b, float c, float d) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE,
                                               kFmt == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE,
                                               kFmt == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2);
  return lo | (hi << 16);
}

template <Fp8Format kFmt, bool kRowwise>
__global__ void __launch_bounds__(kTileThreads, 4)
    quantize_bf16_1x128_tile_kernel(const uint16_t* __restrict__ in, int64_t rows, int64_t cols,
                                    ScaleRule rule, uint8_t* __restrict__ data,
                                    float* __restrict__ scale_inv, uint8_t* __restrict__ cdata,
                                    float* __restrict__ cscale_inv, ScaleLayout layout,
                                    uint32_t* amax_out) {
  static_assert(kTile == 128 && kTileThreads == 256, "16 chunks x 16 row blocks of 8x8");
  __shared__ Bf16TileSmem s;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int cc = lane % 16, m = warp * 2 + lane / 16;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile,
                c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t c = c0 + cc * 8, rb = r0 + m * 8;
  // cols % 8 == 0 and rows % 16 == 0: a chunk's 8 columns and a block's 8 rows are all present
  // or all absent.
  const bool live = c < cols && rb < rows;

  uint4 x[8];
#pragma unroll
  for (int i = 0; i < 8; ++i)
    x[i] =
        live ? *reinterpret_cast<const uint4*>(in + (rb + i) * cols + c) : make_uint4(0, 0, 0, 0);

  // |x| maxima on BF16 bits. Words hold columns (2j, 2j + 1) of the chunk in their low and high
  // halves. cmax: per column pair over the 8 rows; rpair[k]: rows 2k (low) and 2k + 1 (high).
  constexpr uint32_t kAbs = 0x7FFF7FFFu;
  uint32_t cmax[4] = {0, 0, 0, 0}, rpair[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    uint32_t ra = 0, rb2 = 0;
    const uint32_t wa[4] = {x[2 * k].x, x[2 * k].y, x[2 * k].z, x[2 * k].w};
    const uint32_t wb[4] = {x[2 * k + 1].x, x[2 * k + 1].y, x[2 * k + 1].z, x[2 * k + 1].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t a = wa[j] & kAbs, b = wb[j] & kAbs;
      ra = __vmaxu2(ra, a), rb2 = __vmaxu2(rb2, b);
      cmax[j] = __vmaxu2(cmax[j], __vmaxu2(a, b));
    }
    rpair[k] = __vmaxu2(__byte_perm(ra, rb2, 0x5410), __byte_perm(ra, rb2, 0x7632));
  }
  // Rows: over the 16 lanes of the half-warp (the 16 chunks). Columns: over the two row blocks of
  // the warp, then over the 8 warps through shared memory.
#pragma unroll
  for (int o = 1; o < 16; o <<= 1)
#pragma unroll
    for (int k = 0; k < 4; ++k) rpair[k] = __vmaxu2(rpair[k], __shfl_xor_sync(~0u, rpair[k], o));
#pragma unroll
  for (int j = 0; j < 4; ++j) cmax[j] = __vmaxu2(cmax[j], __shfl_xor_sync(~0u, cmax[j], 16));
  if (cc == 0) {
    auto* ra = reinterpret_cast<uint4*>(s.row_amax + m * 8);
    ra[0] =
        make_uint4(rpair[0] << 16, rpair[0] & 0xFFFF0000u, rpair[1] << 16, rpair[1] & 0xFFFF0000u);
    ra[1] =
        make_uint4(rpair[2] << 16, rpair[2] & 0xFFFF0000u, rpair[3] << 16, rpair[3] & 0xFFFF0000u);
  }
  if (lane < 16)
    *reinterpret_cast<uint4*>(&s.col_part[warp][cc * 4]) =
        make_uint4(cmax[0], cmax[1], cmax[2], cmax[3]);
  __syncthreads();

  // Scales: threads 0-127 the tile rows (row-wise 1x128 groups), 128-255 the tile columns (the
  // transpose's 1x128 groups), both copies' scales in `layout` (core/scale_layout.h) as
  // scale_offset(k1x128, ...) in the general path.
  {
    const int i = threadIdx.x % kTile;
    uint32_t amax;
    if (threadIdx.x < kTile) {
      amax = s.row_amax[i];
    } else {
      uint32_t w = 0;
#pragma unroll
      for (int p = 0; p < 8; ++p) w = __vmaxu2(w, s.col_part[p][i / 2]);
      amax = (i & 1) ? (w & 0xFFFF0000u) : (w << 16);
    }
    const float scale = compute_scale(bits_float(amax), rule);
    if (threadIdx.x < kTile) {
      s.row_scale[i] = scale;
      if (kRowwise && r0 + i < rows)
        store_1x128_scale(scale_inv, layout, r0 + i, blockIdx.x, rows, ceil_div(cols, kGroup),
                          scale_inverse(scale));
      const uint32_t wm = warp_max(amax);  // warps 0-3: the tile's amax
      if (lane == 0) s.warp_amax[warp] = wm;
    } else {
      s.col_scale[i] = scale;
      if (c0 + i < cols)
        store_1x128_scale(cscale_inv, layout, c0 + i, blockIdx.y, cols, ceil_div(rows, kGroup),
                          scale_inverse(scale));
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t t =
        max(max(s.warp_amax[0], s.warp_amax[1]), max(s.warp_amax[2], s.warp_amax[3]));
    if (t && amax_out != nullptr) atomicMax(amax_out, t);  // null: not wanted
  }

  // Codes. a[i] / b[i]: the transposed copy's codes of row i, columns 0-3 / 4-7 of the chunk.
  float cs[8];
  {
    const float4 lo = *reinterpret_cast<const float4*>(s.col_scale + cc * 8);
    const float4 hi = *reinterpret_cast<const float4*>(s.col_scale + cc * 8 + 4);
    cs[0] = lo.x, cs[1] = lo.y, cs[2] = lo.z, cs[3] = lo.w;
    cs[4] = hi.x, cs[5] = hi.y, cs[6] = hi.z, cs[7] = hi.w;
  }
  uint32_t a[8], b[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t w[4] = {x[i].x, x[i].y, x[i].z, x[i].w};
    float v[8];
#pragma unroll
    for (int j = 0; j < 4; ++j)
      v[2 * j] = bits_float(w[j] << 16), v[2 * j + 1] = bits_float(w[j] & 0xFFFF0000u);
    if constexpr (kRowwise) {
      const float rs = s.row_scale[m * 8 + i];
      const uint32_t q0 = cvt_fp8x4<kFmt>(rn::mul(v[0], rs), rn::mul(v[1], rs), rn::mul(v[2], rs),
                                          rn::mul(v[3], rs));
      const uint32_t q1 = cvt_fp8x4<kFmt>(rn::mul(v[4], rs), rn::mul(v[5], rs), rn::mul(v[6], rs),
                                          rn::mul(v[7], rs));
      if (live) *reinterpret_cast<uint2*>(data + (rb + i) * cols + c) = make_uint2(q0, q1);
    }
    a[i] = cvt_fp8x4<kFmt>(rn::mul(v[0], cs[0]), rn::mul(v[1], cs[1]), rn::mul(v[2], cs[2]),
                           rn::mul(v[3], cs[3]));
    b[i] = cvt_fp8x4<kFmt>(rn::mul(v[4], cs[4]), rn::mul(v[5], cs[5]), rn::mul(v[6], cs[6]),
                           rn::mul(v[7], cs[7]));
  }
  // Column j of the chunk, rows 0-3 (lo) and 4-7 (hi) of the block, into slot m of tile column
  // 8 cc + j. Blocks that are not live hold codes of zeros there; no output reads them.
  {
    uint32_t lo[4], hi[4];
    transpose4x4_bytes(a[0], a[1], a[2], a[3], lo);
    transpose4x4_bytes(a[4], a[5], a[6], a[7], hi);
#pragma unroll
    for (int j = 0; j < 4; ++j) s.t[(cc * 8 + j) * 16 + (m ^ cc)] = make_uint2(lo[j], hi[j]);
    transpose4x4_bytes(b[0], b[1], b[2], b[3], lo);
    transpose4x4_bytes(b[4], b[5], b[6], b[7], hi);
#pragma unroll
    for (int j = 0; j < 4; ++j) s.t[(cc * 8 + j + 4) * 16 + (m ^ cc)] = make_uint2(lo[j], hi[j]);
  }
  __syncthreads();
  // The (cols, rows) copy: output row c0 + ct, 16-byte piece k = tile rows 16 k .. 16 k + 15 =
  // logical slots 2k, 2k + 1, at physical slots (2k) ^ g and (2k + 1) ^ g (g = ct / 8): the aligned
  // pair k ^ (g / 2), its halves swapped when g is odd. A quarter-warp reads one tile column's 128
  // bytes (conflict-free) and writes 128 consecutive output bytes.
#pragma unroll
  for (int it = 0; it < 4; ++it) {
    const int item = threadIdx.x + it * kTileThreads;
    const int ct = item / 8, k = item % 8, g = ct / 8;
    const uint4 w = reinterpret_cast<const uint4*>(s.t)[ct * 8 + (k ^ (g >> 1))];
    const uint4 o = (g & 1) ? make_uint4(w.z, w.w, w.x, w.y) : w;
    const int64_t oc = c0 + ct, orow = r0 + 16 * k;
    if (oc < cols && orow < rows) *reinterpret_cast<uint4*>(cdata + oc * rows + orow) = o;
  }
}

}  // namespace octet::cuda::kernels
