// Device code of the cast family. Elementwise kernels are grid-stride loops over the flat index;
// the transpose stages 32 x 32 tiles through shared memory so that both the read of x and the
// write of out are coalesced along rows (a warp touches 32 consecutive elements either way).
#pragma once

#include <cstdint>

#include "numerics/fp8.h"
#include "ops/cast/cast_backends.h"

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

}  // namespace octet::cuda::cast_kernels
