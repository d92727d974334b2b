// Device helpers of the grouped GEMMs' setup kernels: where group e's rows are, from the row counts
// on the device, computed by one thread block without a separate prefix-sum launch.
#pragma once

#include <cstdint>

namespace octet::cuda {

// Group e's first row and row count. Negative counts are empty groups, and the groups never run past
// `limit` rows in all (a group that would is cut there, later ones are empty): the clamped prefix
// sum the setup kernels used to compute serially.
struct GroupSpan {
  int64_t offset;
  int64_t rows;
};

__device__ __forceinline__ int64_t group_rows_at(const void* sizes, bool sizes_i64, int e) {
  const int64_t m = sizes_i64 ? static_cast<const int64_t*>(sizes)[e]
                              : int64_t{static_cast<const int32_t*>(sizes)[e]};
  return m < 0 ? 0 : m;
}

// Called by every thread of the block (it synchronises); e in [0, groups]: e == groups gives the
// offset past the last group (the rows the groups use) and rows 0.
__device__ __forceinline__ GroupSpan group_span(const void* sizes, bool sizes_i64, int groups,
                                                int e, int64_t limit) {
  __shared__ int64_t partial[32];
  int64_t s = 0;
  for (int i = threadIdx.x; i < e; i += blockDim.x) s += group_rows_at(sizes, sizes_i64, i);
  for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(~0u, s, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = s;
  __syncthreads();
  int64_t before = 0;
  for (int w = 0; w < static_cast<int>((blockDim.x + 31) / 32); ++w) before += partial[w];
  __syncthreads();  // `partial` is free for the next call
  const int64_t offset = before < limit ? before : limit;
  int64_t m = e < groups ? group_rows_at(sizes, sizes_i64, e) : 0;
  if (m > limit - offset) m = limit - offset;
  return {offset, m};
}

// The exclusive prefix of v over the block's threads in thread order, and the block's total in
// *total. Every thread calls it (it synchronises).
__device__ __forceinline__ int64_t block_exclusive_scan(int64_t v, int64_t* warp_sums,
                                                        int64_t* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32,
            warps = static_cast<int>((blockDim.x + 31) / 32);
  int64_t x = v;  // inclusive within the warp
  for (int o = 1; o < 32; o *= 2) {
    const int64_t y = __shfl_up_sync(~0u, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  int64_t before = 0, all = 0;
  for (int w = 0; w < warps; ++w) {
    if (w < warp) before += warp_sums[w];
    all += warp_sums[w];
  }
  __syncthreads();  // warp_sums is free for the next scan
  *total = all;
  return before + x - v;
}

// Rows [used, rows) of D zero, `used` the groups' row sum (group_span(.., groups, ..).offset): the
// padded tail of grouped_gemm.h's kOverwrite contract, which only the device knows. Every block of
// the grid takes its share, 16 bytes a store: row_bytes a multiple of 16, D 16-byte aligned.
__device__ __forceinline__ void zero_rows_past(void* d, int64_t row_bytes, int64_t used,
                                               int64_t rows) {
  const int64_t vecs = row_bytes / 16;
  auto* z = static_cast<uint4*>(d);
  for (int64_t i = used * vecs + int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < rows * vecs;
       i += int64_t{gridDim.x} * blockDim.x)
    z[i] = make_uint4(0, 0, 0, 0);
}

}  // namespace octet::cuda
