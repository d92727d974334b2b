// Device code of the cast family. Elementwise kernels are grid-stride loops over the flat index;
// the transpose stages 32 x 32 tiles through shared memory so that both the read of x and the
// write of out are coalesced along rows (a warp touches 32 consecutive elements either way).
#pragma once

#include <cstdint>

#include "numerics/fp8.h"
#include "ops/cast/cast_backends.h"
#include "ops/cast/storage_round_bf16.h"

namespace octet::cuda::cast_kernels {

template <typename XT, typename OT>
__global__ void cast_elementwise_kernel(const XT* __restrict__ x, int64_t n, OT* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    store_float(out, i, load_float(x, i));
}

// y[i] = round(y[i] + x[i]), the element function shared with the CPU (cast_backends.h).
template <typename YT, typename XT>
__global__ void add_into_elementwise_kernel(YT* __restrict__ y, const XT* __restrict__ x,
                                            int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    store_float(y, i, add_element(load_float(y, i), load_float(x, i)));
}

// BF16 y += BF16 x, 8 elements (16 bytes) per thread: the element function of the kernel above.
// n8 = n / 8; both pointers 16-byte aligned.
__global__ void add_into_bf16x8_kernel(uint4* __restrict__ y, const uint4* __restrict__ x,
                                       int64_t n8) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n8;
       i += stride) {
    const uint4 a = y[i], b = x[i];
    const uint32_t aw[4] = {a.x, a.y, a.z, a.w}, bw[4] = {b.x, b.y, b.z, b.w};
    uint32_t o[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint16_t lo = float_to_bf16(add_element(bf16_to_float(static_cast<uint16_t>(aw[k])),
                                                    bf16_to_float(static_cast<uint16_t>(bw[k]))));
      const uint16_t hi =
          float_to_bf16(add_element(bf16_to_float(static_cast<uint16_t>(aw[k] >> 16)),
                                    bf16_to_float(static_cast<uint16_t>(bw[k] >> 16))));
      o[k] = lo | (static_cast<uint32_t>(hi) << 16);
    }
    y[i] = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

// A block of (kTile, kRowsPerPass) threads moves one kTile x kTile tile per iteration: each thread
// reads kTile / kRowsPerPass elements of x along a row and writes as many of out along a row. The
// tile row is padded by one element so that the column-wise reads from shared memory fall into
// different banks. Tiles are visited with a grid stride in y (gridDim.y is limited to 65535).
// T is the raw element type (uint32_t or uint16_t): a transpose moves bits, it never rounds.
template <typename T, int kTile, int kRowsPerPass>
__global__ void __launch_bounds__(kTile* kRowsPerPass)
    transpose_tiled_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                           T* __restrict__ out) {
  static_assert(kTile % kRowsPerPass == 0, "whole passes per tile");
  static_assert(kTile == 32, "one warp per tile row: coalesced 32-element segments");
  __shared__ T tile[kTile][kTile + 1];
  x += static_cast<int64_t>(blockIdx.z) * rows * cols;  // one matrix of a batch per z
  out += static_cast<int64_t>(blockIdx.z) * rows * cols;
  const int64_t tiles_r = (rows + kTile - 1) / kTile;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  for (int64_t tr = blockIdx.y; tr < tiles_r; tr += gridDim.y) {
    const int64_t r0 = tr * kTile;
    for (int k = threadIdx.y; k < kTile; k += kRowsPerPass) {
      const int64_t r = r0 + k, c = c0 + threadIdx.x;
      if (r < rows && c < cols) tile[k][threadIdx.x] = x[r * cols + c];
    }
    __syncthreads();
    // out row = a column c of x, out column = a row r of x.
    for (int k = threadIdx.y; k < kTile; k += kRowsPerPass) {
      const int64_t c = c0 + k, r = r0 + threadIdx.x;
      if (r < rows && c < cols) out[c * rows + r] = tile[threadIdx.x][k];
    }
    __syncthreads();  // the tile is refilled by the next iteration
  }
}

// round_to_storage: one warp per 1x128 tile (4 elements per lane). The tile's amax is a max (order
// free, exact) and a NaN anywhere gives scale 1, as in the CPU reference.
template <typename T>
__global__ void round_to_storage_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                        ExMyFormat f, T* __restrict__ out) {
  const int lane = threadIdx.x % 32;
  const int64_t tiles_per_row = (cols + 127) / 128;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t w = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
       w < rows * tiles_per_row; w += warps) {
    const int64_t r = w / tiles_per_row, c0 = (w % tiles_per_row) * 128;
    float v[4];
    float amax = 0.0f;
    bool nan = false;
    for (int i = 0; i < 4; ++i) {
      const int64_t c = c0 + lane + 32 * i;
      v[i] = c < cols ? load_float(x, r * cols + c) : 0.0f;
      nan |= v[i] != v[i];
      amax = fmaxf(amax, fabsf(v[i]));
    }
    for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
    nan = __any_sync(0xFFFFFFFFu, nan);
    const float s = storage_tile_scale(nan ? __int_as_float(0x7FC00000) : amax, f);
    for (int i = 0; i < 4; ++i) {
      const int64_t c = c0 + lane + 32 * i;
      if (c < cols) store_float(out, r * cols + c, storage_round(v[i], s, f));
    }
  }
}

// round_to_storage for cols % 8 == 0 with 16-byte aligned x and out (the o_proj input, (B*T, H*dv)
// BF16): a half-warp per 1x128 tile, 8 elements per lane in one 16-byte load (two for FP32). The
// tile's amax is the unsigned max of |x| bits, which orders finite values and inf like fmaxf and
// puts any NaN above them: storage_tile_scale sees the same amax, inf or a NaN (scale 1 either
// way). The element is storage_round's: the division by the power-of-2 scale is a multiplication by
// its exact inverse (2^-100 .. 2^126, normal), the same real number rounded once, so the same FP32
// result, overflow and subnormals included; NaN keeps the division so that its bits are untouched.
template <typename T>
__device__ __forceinline__ void load8(const T* p, float (&v)[8]) {
  if constexpr (sizeof(T) == 2) {
    const uint4 w = *reinterpret_cast<const uint4*>(p);
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i)
      v[2 * i] = bits_float(u[i] << 16), v[2 * i + 1] = bits_float(u[i] & 0xFFFF0000u);
  } else {
    const float4 a = reinterpret_cast<const float4*>(p)[0],
                 b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
}

template <typename T>
__device__ __forceinline__ void store8(T* p, const float (&v)[8]) {
  if constexpr (sizeof(T) == 2) {
    uint32_t u[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      u[i] = float_to_bf16(v[2 * i]) | (static_cast<uint32_t>(float_to_bf16(v[2 * i + 1])) << 16);
    *reinterpret_cast<uint4*>(p) = make_uint4(u[0], u[1], u[2], u[3]);
  } else {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
}

template <typename T>
__global__ void __launch_bounds__(256)
    round_to_storage_vec_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, ExMyFormat f,
                                T* __restrict__ out) {
  const int64_t tiles_per_row = (cols + 127) / 128, tiles = rows * tiles_per_row;
  const int half = (threadIdx.x % 32) / 16, lane16 = threadIdx.x % 16;
  // A warp takes two adjacent tiles per step; all its lanes run the same steps (the shuffles need
  // all 32).
  const int64_t stride = static_cast<int64_t>(gridDim.x) * (blockDim.x / 16);
  for (int64_t t0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32 * 2;
       t0 < tiles; t0 += stride) {
    const int64_t t = t0 + half;
    const int64_t r = t < tiles ? t / tiles_per_row : 0;
    const int64_t c = t < tiles ? (t % tiles_per_row) * 128 + lane16 * 8 : cols;
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (c < cols) load8(x + r * cols + c, v);
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) m = max(m, float_bits(v[i]) & 0x7FFFFFFFu);
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
    if (c >= cols) continue;
    const float s = storage_tile_scale(bits_float(m), f);
    const float inv = rn::div(1.0f, s);  // exact: s is a power of 2 in [2^-126, 2^100]
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float q = round_to_exmy(rn::mul(v[i], s), f);
      v[i] = q != q ? rn::div(q, s) : rn::mul(q, inv);
    }
    store8(out + r * cols + c, v);
  }
}

// round_to_storage for BF16 with a format storage_round_bf16.h supports (E5M6), cols % 8 == 0 and
// 16-byte aligned x and out: the layout of round_to_storage_vec_kernel (a half-warp per 1x128
// tile, 8 elements a lane in one 16-byte load) with the element in integer operations on the bits
// (storage_round_bf16.h), two values at a time in 16x2 instructions: the tile's amax is the unsigned
// max of the 15-bit |x| fields (NaN above inf, as there), its scale storage_tile_scale's from the
// format's largest value, and a lane whose 8 values all take the normal branch runs it on pairs
// without a branch. A lane loads its part of
// two tiles before it reduces either (32 bytes a thread in flight). Tiles are flat (t * 128) when
// cols % 128 == 0, else (row, column) by division.
struct Bf16Tile {
  int64_t at;  // the lane's 8 values: x[at], out[at] (16-byte units)
  bool ok;     // the lane has values (inside the matrix)
};

__device__ __forceinline__ Bf16Tile bf16_tile_at(int64_t t, int64_t tiles, int64_t cols,
                                                 int64_t tiles_per_row, bool flat, int lane16) {
  if (t >= tiles) return {0, false};
  if (flat) return {t * 16 + lane16, true};
  const int64_t r = t / tiles_per_row, c8 = (t - r * tiles_per_row) * 16 + lane16;
  return {r * (cols / 8) + c8, c8 < cols / 8};
}

__global__ void __launch_bounds__(256)
    round_to_storage_bf16_kernel(const uint4* __restrict__ x, int64_t rows, int64_t cols,
                                 StorageBf16Format g, uint4* __restrict__ out) {
  constexpr int kTilesPerLane = 2;
  const int64_t tiles_per_row = (cols + 127) / 128, tiles = rows * tiles_per_row;
  const bool flat = cols % 128 == 0;
  const int lane16 = threadIdx.x % 16;
  const int64_t hw = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 16;
  const int64_t halves = static_cast<int64_t>(gridDim.x) * (blockDim.x / 16);
  // The loop test uses the warp's first half-warp, so all 32 lanes run the same steps (the
  // shuffles need them all).
  for (int64_t t0 = hw; t0 - hw % 2 < tiles; t0 += kTilesPerLane * halves) {
    Bf16Tile lane[kTilesPerLane];
    uint4 w[kTilesPerLane];
#pragma unroll
    for (int u = 0; u < kTilesPerLane; ++u) {
      lane[u] = bf16_tile_at(t0 + u * halves, tiles, cols, tiles_per_row, flat, lane16);
      w[u] = lane[u].ok ? x[lane[u].at] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kTilesPerLane; ++u) {
      const uint32_t v[4] = {w[u].x, w[u].y, w[u].z, w[u].w};
      // The lane's largest |x| and smallest |x| - 1 (a zero wraps to 0xFFFF), per half, then
      // over the halves; the largest over the tile's 16 lanes.
      uint32_t hi2 = 0, lo2 = 0xFFFFFFFFu;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t a = v[i] & 0x7FFF7FFFu;
        hi2 = max_u16x2(hi2, a);
        lo2 = min_u16x2(lo2, sub_u16x2(a, 0x10001u));
      }
      const uint32_t lane_max = max(hi2 & 0xFFFFu, hi2 >> 16);
      const uint32_t lane_min = min(lo2 & 0xFFFFu, lo2 >> 16);
      uint32_t m = lane_max;
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
      if (!lane[u].ok) continue;
      const StorageBf16Tile tile = storage_bf16_tile(
          g, storage_tile_scale_for_max(bits_float(m << 16), bits_float(g.max_bits << 16)));
      // All 8 values in the normal branch (storage_bf16_is_normal): two at a time, no branch.
      uint32_t o[4];
      if (lane_min >= tile.normal_min - 1u && lane_max <= 0x7F80u) {
#pragma unroll
        for (int i = 0; i < 4; ++i) o[i] = storage_bf16_normal_pair(v[i], g, tile);
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i)
          o[i] = storage_round_bf16(v[i] & 0xFFFFu, g, tile) |
                 (storage_round_bf16(v[i] >> 16, g, tile) << 16);
      }
      out[lane[u].at] = make_uint4(o[0], o[1], o[2], o[3]);
    }
  }
}

}  // namespace octet::cuda::cast_kernels
