// Device code of adamw_step_block_quantize (adamw.h): the AdamW update and the 128x128 block
// quantization of the updated master in one pass over memory.
//
// One block of 256 threads per 128x128 tile, three blocks per SM. A launch covers the tiles of up
// to kBqMaxBatch parameters (BlockQuantBatch: the optimizer's FP8-block parameters in one launch,
// so that the small ones do not each pay a launch's latency and its partial last wave); block b
// finds its parameter among the batch's tile ranges, then does, for its tile of that parameter's
// (rows, cols) matrix:
//   1. update: a warp covers one tile row per step (4 elements a lane: 16-byte loads of master and
//      gradient, 8-byte loads of the moments), 16 steps in rounds of kBqInFlight steps whose loads
//      are all issued before the first is used (2: 78 registers, no spills; 4 spills at the 80 that
//      three blocks of 256 threads allow, and 24 warps x 2 x 1.5 KB in flight per SM already cover
//      the memory latency at full bandwidth). The new master, moments go back to global memory;
//      the new master is also staged in shared memory (64 KB, FP32, the whole tile), and each
//      thread keeps the max |x| of its 64 values.
//   2. scale: the tile's amax reduced through shared memory (warp shuffles, then 8 words); one
//      scale for the tile, as ops/quantize's k128x128 computes it; scale_inv written once for the
//      row-wise copy and once, at the transposed position, for the column-wise one.
//   3. codes: each thread reads its own 64 staged values back, casts them and stores the row-wise
//      codes (4 bytes a lane, 128 contiguous bytes a warp); the codes are then re-staged as bytes
//      (stride 129, over the FP32 staging) and written transposed, 16 bytes a lane.
// Both copies use the same tile scale, so the column-wise codes are the row-wise bytes transposed.
// Values outside the matrix (ragged tiles) count as 0 and are not stored.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "numerics/scale.h"
#include "ops/adamw/adamw_kernels.cuh"

namespace octet::cuda::kernels {

inline constexpr int kBqTile = 128;
inline constexpr int kBqThreads = 256;                                  // 8 warps
inline constexpr int kBqSteps = kBqTile / 8;                            // tile rows per warp
inline constexpr int kBqInFlight = 2;                                   // steps per load round
inline constexpr int kBqStride = 129;                                   // staged code bytes
inline constexpr int kBqSmemBytes = kBqTile * kBqTile * sizeof(float);  // 64 KB, dynamic
inline constexpr int kBqBlocksPerSm = 3;                                // 3 x 64 KB of 228 KB
static_assert(kBqTile == kGroup, "tiles must coincide with the 128x128 scale blocks");
static_assert(kBqTile * kBqStride <= kBqSmemBytes, "the code bytes reuse the FP32 staging");
static_assert(kBqSteps % kBqInFlight == 0, "whole load rounds");

struct BlockQuantParams {
  float* p;
  const float* g;
  uint16_t* m;
  uint16_t* v;
  const float* grad_scale;   // or null
  const int32_t* found_inf;  // or null
  AdamWConsts k;             // the host's constants, unless kd
  const AdamWConsts* kd;     // the device's constants (adamw_device_consts), or null
  int64_t rows, cols;
  int64_t batch_rows;  // 0, or the rows of each stacked matrix (a multiple of 128)
  ScaleRule rule;
  uint8_t* data;      // (rows, cols)
  float* scale_inv;   // ceil(rows / 128) x ceil(cols / 128)
  uint8_t* cdata;     // (cols, rows) or (rows / batch_rows, cols, batch_rows)
  float* cscale_inv;  // per matrix: ceil(cols / 128) x ceil(matrix rows / 128)
  bool vec_in;        // cols % 4 == 0, p and g 16-byte, m and v 8-byte aligned
  bool vec_rows;      // cols % 4 == 0, data 4-byte aligned
  bool vec_cols;      // matrix rows % 16 == 0, cdata 16-byte aligned
};

// Four consecutive parameters (r, c..c+3) in their stored forms.
struct Quad {
  float4 p, g;
  uint2 m, v;
};

__device__ __forceinline__ float quad_at(const float4& f, int e) {
  return e == 0 ? f.x : e == 1 ? f.y : e == 2 ? f.z : f.w;
}

// Loads the quad at (r, c); elements outside the matrix read as 0. `whole`: the vector path.
__device__ __forceinline__ Quad load_quad(const BlockQuantParams& a, int64_t r, int64_t c,
                                          bool whole, bool skip) {
  Quad q{make_float4(0, 0, 0, 0), make_float4(0, 0, 0, 0), make_uint2(0, 0), make_uint2(0, 0)};
  const int64_t i = r * a.cols + c;
  if (whole) {
    // Non-coherent loads: each element is read once, before this thread's own store to it.
    q.p = __ldg(reinterpret_cast<const float4*>(a.p + i));
    if (skip) return q;
    q.g = __ldg(reinterpret_cast<const float4*>(a.g + i));
    q.m = __ldg(reinterpret_cast<const uint2*>(a.m + i));
    q.v = __ldg(reinterpret_cast<const uint2*>(a.v + i));
    return q;
  }
  if (r >= a.rows) return q;
  float p[4] = {0, 0, 0, 0}, g[4] = {0, 0, 0, 0};
  uint16_t m[4] = {0, 0, 0, 0}, v[4] = {0, 0, 0, 0};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if (c + e >= a.cols) continue;
    p[e] = a.p[i + e];
    if (skip) continue;
    g[e] = a.g[i + e], m[e] = a.m[i + e], v[e] = a.v[i + e];
  }
  return {make_float4(p[0], p[1], p[2], p[3]), make_float4(g[0], g[1], g[2], g[3]), pack_halves(m),
          pack_halves(v)};
}

// The update of a loaded quad (adamw_kernel's element function); stores the new master and moments
// and returns the new master, 0 outside the matrix. With skip: the loaded master, nothing stored.
__device__ __forceinline__ float4 update_quad(const BlockQuantParams& a, const Quad& q, int64_t r,
                                              int64_t c, bool whole, bool skip, float s,
                                              const AdamWConsts& k) {
  if (skip) return q.p;  // 0 outside the matrix (load_quad)
  const StoredStep4 x = stored_update(q.p, q.g, q.m, q.v, a.grad_scale, s, k);
  const int64_t i = r * a.cols + c;
  if (whole) {
    *reinterpret_cast<float4*>(a.p + i) = x.p;
    *reinterpret_cast<uint2*>(a.m + i) = x.m;
    *reinterpret_cast<uint2*>(a.v + i) = x.v;
    return x.p;
  }
  float out[4] = {0, 0, 0, 0};
  if (r < a.rows) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (c + e >= a.cols) continue;
      out[e] = quad_at(x.p, e);  // a NaN grad_scale must not reach the amax through the padding
      a.p[i + e] = out[e];
      a.m[i + e] = half_of(x.m, e);
      a.v[i + e] = half_of(x.v, e);
    }
  }
  return make_float4(out[0], out[1], out[2], out[3]);
}

__device__ __forceinline__ uint32_t quad_amax(const float4& f) {
  return max(max(abs_bits(f.x), abs_bits(f.y)), max(abs_bits(f.z), abs_bits(f.w)));
}

__device__ __forceinline__ uint32_t bq_warp_max(uint32_t v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

// Four FP8 codes of x * scale (each product one FP32 rounding), packed little-endian.
__device__ __forceinline__ uint32_t codes4(const float4& f, float scale, Fp8Format format) {
  const __nv_fp8_interpretation_t t = format == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2;
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(
      make_float2(rn::mul(f.x, scale), rn::mul(f.y, scale)), __NV_SATFINITE, t);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(
      make_float2(rn::mul(f.z, scale), rn::mul(f.w, scale)), __NV_SATFINITE, t);
  return lo | (hi << 16);
}

// Up to kBqMaxBatch parameters of one launch, passed by value (__grid_constant__: read in place
// from the parameter space, about 10 KB, within CUDA's 32 KB for kernel parameters). Parameter i
// owns the launch's blocks [first_tile[i], first_tile[i + 1]).
inline constexpr int kBqMaxBatch = 56;
struct BlockQuantBatch {
  BlockQuantParams p[kBqMaxBatch];
  int64_t first_tile[kBqMaxBatch + 1];
  int count;
};
static_assert(sizeof(BlockQuantBatch) <= 32764, "CUDA's limit on a kernel's parameters");

// The tile `tile` (row-major over the matrix's 128x128 tiles) of parameter a.
__device__ __forceinline__ void block_quantize_tile(const BlockQuantParams& a, int64_t tile) {
  extern __shared__ float4 bq_smem[];  // the tile, [tile row][tile col], FP32
  __shared__ uint32_t warp_amax[kBqThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t tiles_c = ceil_div(a.cols, int64_t{kBqTile});
  const int64_t r0 = tile / tiles_c * kBqTile, c0 = tile % tiles_c * kBqTile;
  const bool skip = a.found_inf && *a.found_inf != 0;
  const float s = a.grad_scale ? *a.grad_scale : 1.0f;
  const AdamWConsts k = a.kd ? *a.kd : a.k;
  const int tc = lane * 4;
  const int64_t c = c0 + tc;

  // 1. The update, staged.
  uint32_t amax = 0;
#pragma unroll 1
  for (int round = 0; round < kBqSteps; round += kBqInFlight) {
    Quad q[kBqInFlight];
#pragma unroll
    for (int j = 0; j < kBqInFlight; ++j) {
      const int64_t r = r0 + (round + j) * 8 + warp;
      q[j] = load_quad(a, r, c, a.vec_in && r < a.rows && c < a.cols, skip);
    }
#pragma unroll
    for (int j = 0; j < kBqInFlight; ++j) {
      const int tr = (round + j) * 8 + warp;
      const int64_t r = r0 + tr;
      const float4 x = update_quad(a, q[j], r, c, a.vec_in && r < a.rows && c < a.cols, skip, s, k);
      amax = max(amax, quad_amax(x));
      bq_smem[(tr * kBqTile + tc) / 4] = x;
    }
  }

  // 2. The tile's scale.
  amax = bq_warp_max(amax);
  if (lane == 0) warp_amax[warp] = amax;
  __syncthreads();
  amax = 0;
#pragma unroll
  for (int w = 0; w < kBqThreads / 32; ++w) amax = max(amax, warp_amax[w]);
  const float scale = compute_scale(bits_float(amax), a.rule);
  // The column-wise copy of a stacked matrix (batch_rows > 0): this tile's matrix b, seen alone.
  const int64_t mrows = a.batch_rows > 0 ? a.batch_rows : a.rows;
  const int64_t b = a.batch_rows > 0 ? r0 / a.batch_rows : 0, cr0 = r0 - b * mrows;
  uint8_t* const cdata = a.cdata + b * a.cols * mrows;
  if (threadIdx.x == 0) {
    const float inv = scale_inverse(scale);
    a.scale_inv[r0 / kBqTile * tiles_c + c0 / kBqTile] = inv;
    a.cscale_inv[b * tiles_c * ceil_div(mrows, int64_t{kBqTile}) +
                 c0 / kBqTile * ceil_div(mrows, int64_t{kBqTile}) + cr0 / kBqTile] = inv;
  }

  // 3. The codes: row-wise straight to global memory, then transposed through shared memory.
  uint32_t words[kBqSteps];
#pragma unroll
  for (int step = 0; step < kBqSteps; ++step) {
    const int tr = step * 8 + warp;
    const int64_t r = r0 + tr;
    words[step] = codes4(bq_smem[(tr * kBqTile + tc) / 4], scale, a.rule.format);
    if (r >= a.rows || c >= a.cols) continue;
    uint8_t* out = a.data + r * a.cols + c;
    if (a.vec_rows) {
      *reinterpret_cast<uint32_t*>(out) = words[step];
    } else {
      for (int e = 0; e < 4 && c + e < a.cols; ++e)
        out[e] = static_cast<uint8_t>(words[step] >> 8 * e);
    }
  }
  __syncthreads();  // every staged value read: the bytes go over them
  uint8_t* q = reinterpret_cast<uint8_t*>(bq_smem);
#pragma unroll
  for (int step = 0; step < kBqSteps; ++step)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      q[(step * 8 + warp) * kBqStride + tc + e] = static_cast<uint8_t>(words[step] >> 8 * e);
  __syncthreads();
  // Row oc of the column-wise matrix, bytes orow..orow+15: 8 lanes write one 128-byte run.
  for (int item = threadIdx.x; item < kBqTile * 8; item += kBqThreads) {
    const int col = item / 8, kk = item % 8;
    const int64_t oc = c0 + col, orow = cr0 + 16 * kk;
    if (oc >= a.cols || r0 + 16 * kk >= a.rows) continue;
    uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < 16; ++j)
      w[j / 4] |= static_cast<uint32_t>(q[(16 * kk + j) * kBqStride + col]) << (8 * (j % 4));
    uint8_t* out = cdata + oc * mrows + orow;
    if (a.vec_cols) {
      *reinterpret_cast<uint4*>(out) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
      for (int j = 0; j < 16 && r0 + 16 * kk + j < a.rows; ++j)
        out[j] = static_cast<uint8_t>(w[j / 4] >> (8 * (j % 4)));
    }
  }
}

static __global__ void __launch_bounds__(kBqThreads, kBqBlocksPerSm)
    adamw_block_quantize_kernel(const __grid_constant__ BlockQuantBatch batch) {
  const int64_t b = blockIdx.x;
  int lo = 0, hi = batch.count - 1;  // the last i with first_tile[i] <= b
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (batch.first_tile[mid] <= b)
      lo = mid;
    else
      hi = mid - 1;
  }
  block_quantize_tile(batch.p[lo], b - batch.first_tile[lo]);
}

}  // namespace octet::cuda::kernels
