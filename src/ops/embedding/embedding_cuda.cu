// CUDA launchers and kernels of the embedding family. Arguments were validated by embedding.cpp;
// everything is enqueued on the context's stream, nothing synchronises with the host.
//
// Backward: (1) keys = ids with invalid ones mapped to the sentinel V, values = positions; (2)
// CUB's radix sort, which is stable, orders the pairs by id keeping positions increasing within an
// id; (3) a block per (sorted index, column slab): the block at the first index of a run of equal
// ids sums that run's rows in order and adds the sum to dtable once. Every run has exactly one
// owner, so there are no atomics and the result does not depend on scheduling.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstdint>

#include "backend/cuda_check.h"
#include "numerics/fp8.h"
#include "numerics/scale.h"
#include "ops/embedding/embedding_backends.h"

namespace octet::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridY = 65535;  // CUDA's gridDim.y limit

cudaStream_t stream_of(const Context& ctx) {
  return static_cast<cudaStream_t>(ctx.stream);
}

template <typename T>
__device__ __forceinline__ float load(const T* p, int64_t i) {
  if constexpr (sizeof(T) == 4)
    return p[i];
  else
    return bf16_to_float(p[i]);
}

template <typename T>
__device__ __forceinline__ void store(T* p, int64_t i, float v) {
  if constexpr (sizeof(T) == 4)
    p[i] = v;
  else
    p[i] = float_to_bf16(v);
}

// blockIdx.x: a slab of kThreads columns; blockIdx.y strides over positions.
template <typename TableT, typename OutT, int kBlock>
__global__ void __launch_bounds__(kBlock)
    embedding_forward_kernel(const int32_t* __restrict__ ids, const TableT* __restrict__ table,
                             int64_t rows, int64_t vocab, int64_t d, OutT* __restrict__ out) {
  static_assert(kBlock % 32 == 0, "whole warps");
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (j >= d) return;
  for (int64_t t = blockIdx.y; t < rows; t += gridDim.y) {
    const int32_t id = ids[t];
    const float v =
        (id >= 0 && id < vocab) ? load(table, id * d + j) : bits_float(0x7FC00000u);  // NaN: bad id
    store(out, t * d + j, v);
  }
}

__global__ void __launch_bounds__(256)
    embedding_sort_keys_kernel(const int32_t* __restrict__ ids, int64_t rows, int32_t vocab,
                               int32_t* __restrict__ keys, int32_t* __restrict__ positions) {
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < rows;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t id = ids[t];
    keys[t] = (id >= 0 && id < vocab) ? id : vocab;  // sentinel: sorts last, skipped below
    positions[t] = static_cast<int32_t>(t);
  }
}

// One 16-byte piece of global memory into shared memory without passing through registers
// (cp.async, L2 only); completed by cp_async_wait_all.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) {
  const auto s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}

__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// Rows of one slab of kBlock columns in a batch of the backward's shared tile: 32 KB.
template <typename GradT, int kBlock>
constexpr int kTileRows = 32768 / (kBlock * static_cast<int>(sizeof(GradT)));

// blockIdx.x: a sorted index i (grid-stride); blockIdx.y: a slab of kBlock columns, thread t its
// column t. Only the block at the start of a run works: it sums the run's rows in position order
// and adds the sum once. Real text has runs of a thousand rows and more (a space, a newline), so a
// run is read a batch of kRows rows at a time into a shared tile: the batch's keys and positions
// (the rows of the run are a prefix of the batch, keys being sorted), then its rows by cp.async,
// all in flight together while the next batch's keys and positions load, then each thread adds
// its column's rows in order. Loads in registers under the branch that adds them were issued a
// few rows ahead of the adds, which walked a run at about a round trip per few rows (541 us for a
// batch of byte-level text under Nsight Compute, the SMs idle 62% of it). vec: d a multiple of 16
// bytes' elements and dout 16-byte aligned (16-byte pieces); otherwise the tile is filled element
// by element.
template <typename GradT, int kBlock>
__global__ void __launch_bounds__(kBlock)
    embedding_backward_runs_kernel(const int32_t* __restrict__ keys,
                                   const int32_t* __restrict__ positions,
                                   const GradT* __restrict__ dout, int64_t rows, int32_t vocab,
                                   int64_t d, float* __restrict__ dtable, bool vec) {
  constexpr int kRows = kTileRows<GradT, kBlock>;
  constexpr int kElems = 16 / static_cast<int>(sizeof(GradT));  // elements in 16 bytes
  constexpr int kPieces = kBlock / kElems;                      // 16-byte pieces in a tile row
  static_assert(kBlock % 32 == 0 && kRows <= kBlock && kBlock % kElems == 0, "tile shape");
  __shared__ alignas(16) GradT tile[kRows][kBlock];
  __shared__ int32_t row_at[kRows];
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * kBlock, j = c0 + threadIdx.x;
  for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
    const int32_t id = keys[i];
    if (id == vocab || (i > 0 && keys[i - 1] == id)) continue;  // the same for the whole block
    float sum = 0.0f;
    // The batch's keys and positions, thread t < kRows row k + t (-1: past the tensor). The next
    // batch's are loaded while this batch's rows are in flight.
    int32_t key = -1, at = 0;
    if (threadIdx.x < kRows && i + threadIdx.x < rows) {
      key = keys[i + threadIdx.x];
      at = positions[i + threadIdx.x];
    }
    for (int64_t k = i;; k += kRows) {
      if (threadIdx.x < kRows) row_at[threadIdx.x] = at;
      const int n = __syncthreads_count(key == id);  // the run's rows here: rows 0 .. n - 1
      if (vec) {
        for (int p = threadIdx.x; p < n * kPieces; p += kBlock) {
          const int r = p / kPieces, col = (p % kPieces) * kElems;
          if (c0 + col < d)
            cp_async_16(&tile[r][col], dout + static_cast<int64_t>(row_at[r]) * d + c0 + col);
        }
      } else if (j < d) {
        for (int r = 0; r < n; ++r) tile[r][threadIdx.x] = dout[int64_t{row_at[r]} * d + j];
      }
      if (n == kRows && threadIdx.x < kRows) {
        const int64_t next = k + kRows + threadIdx.x;
        key = next < rows ? keys[next] : -1;
        at = next < rows ? positions[next] : 0;
      }
      if (vec) cp_async_wait_all();
      __syncthreads();
      if (j < d)
        for (int r = 0; r < n; ++r) sum += load(&tile[r][0], threadIdx.x);
      if (n < kRows) break;
      __syncthreads();  // the tile and row_at are refilled next
    }
    if (j < d) dtable[static_cast<int64_t>(id) * d + j] += sum;
  }
}

template <typename TableT, typename OutT>
void forward_typed(Context& ctx, const EmbeddingForwardArgs& a) {
  const int64_t rows = a.ids.numel(), vocab = a.table.size(0), d = a.table.size(1);
  const dim3 grid(static_cast<unsigned>(ceil_div(d, kThreads)),
                  static_cast<unsigned>(std::min(rows, kMaxGridY)));
  embedding_forward_kernel<TableT, OutT, kThreads><<<grid, kThreads, 0, stream_of(ctx)>>>(
      a.ids.data_as<const int32_t>(), a.table.data_as<const TableT>(), rows, vocab, d,
      a.out.data_as<OutT>());
  OCTET_CUDA_CHECK_LAUNCH();
}

// Bits the radix sort must look at: keys lie in [0, vocab] (vocab is the sentinel).
int key_bits(int64_t vocab) {
  int bits = 1;
  while ((int64_t{1} << bits) <= vocab) ++bits;
  return bits;
}

template <typename GradT>
void backward_typed(Context& ctx, const EmbeddingBackwardArgs& a) {
  const int64_t rows = a.ids.numel(), d = a.dtable.size(1);
  const auto vocab = static_cast<int32_t>(a.dtable.size(0));
  const cudaStream_t st = stream_of(ctx);
  Tensor pairs =
      Tensor::empty(ctx, {4, rows}, DType::kI32);  // keys, positions, sorted keys, sorted positions
  int32_t* keys = pairs.data_as<int32_t>();
  int32_t* pos = keys + rows;
  int32_t* keys_sorted = pos + rows;
  int32_t* pos_sorted = keys_sorted + rows;
  int sms = 0;
  OCTET_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx.device_index));
  const auto key_blocks =
      static_cast<unsigned>(std::clamp<int64_t>(ceil_div(rows, 256), 1, int64_t{sms} * 8));
  embedding_sort_keys_kernel<<<key_blocks, 256, 0, st>>>(a.ids.data_as<const int32_t>(), rows,
                                                         vocab, keys, pos);
  OCTET_CUDA_CHECK_LAUNCH();

  const int n = static_cast<int>(rows), end_bit = key_bits(vocab);
  size_t temp_bytes = 0;
  OCTET_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys, keys_sorted, pos,
                                                   pos_sorted, n, 0, end_bit, st));
  Tensor temp =
      Tensor::empty(ctx, {static_cast<int64_t>(std::max<size_t>(temp_bytes, 1))}, DType::kU8);
  OCTET_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data(), temp_bytes, keys, keys_sorted, pos,
                                                   pos_sorted, n, 0, end_bit, st));

  const int64_t slabs = ceil_div(d, kThreads);
  OCTET_CHECK(slabs <= kMaxGridY, "embedding backward: D = ", d, " exceeds ", kMaxGridY * kThreads,
              " columns");
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(rows, int64_t{1} << 30)),
                  static_cast<unsigned>(slabs));
  constexpr int64_t kElems = 16 / sizeof(GradT);
  const bool vec = d % kElems == 0 && reinterpret_cast<uintptr_t>(a.dout.data()) % 16 == 0;
  embedding_backward_runs_kernel<GradT, kThreads>
      <<<grid, kThreads, 0, st>>>(keys_sorted, pos_sorted, a.dout.data_as<const GradT>(), rows,
                                  vocab, d, a.dtable.data_as<float>(), vec);
  OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace

void embedding_forward(Context& ctx, const EmbeddingForwardArgs& a) {
  const bool tf = a.table.dtype() == DType::kF32, of = a.out.dtype() == DType::kF32;
  if (tf && of)
    forward_typed<float, float>(ctx, a);
  else if (tf)
    forward_typed<float, uint16_t>(ctx, a);
  else if (of)
    forward_typed<uint16_t, float>(ctx, a);
  else
    forward_typed<uint16_t, uint16_t>(ctx, a);
}

void embedding_backward(Context& ctx, const EmbeddingBackwardArgs& a) {
  if (a.dout.dtype() == DType::kF32)
    backward_typed<float>(ctx, a);
  else
    backward_typed<uint16_t>(ctx, a);
}

}  // namespace octet::cuda
