// CUDA side of quantize_grouped.h: the groups' offsets and amaxes, their scales, then one tiled pass
// that writes the row-wise and column-wise FP8 copies and one that writes the scale layouts. The
// counts stay on the device; everything is enqueued on the context's stream, nothing waits.
#include <algorithm>
#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda_check.h"
#include "numerics/fp8.h"
#include "ops/quantize/quantize_grouped.h"

namespace octet::cuda {
namespace {

constexpr int kTile = 32, kTileRows = 8;  // quantize tiles: 32 x 32 elements, 32 x 8 threads

cudaStream_t stream_of(const Context& ctx) {
  return static_cast<cudaStream_t>(ctx.stream);
}

__device__ float load(const float* x, int64_t i) {
  return x[i];
}
__device__ float load(const uint16_t* x, int64_t i) {
  return bf16_to_float(x[i]);
}

// The group that owns row r (offsets[g] <= r < offsets[g + 1]), or -1 for the tail past the sum.
__device__ int group_of(const int64_t* offsets, int groups, int64_t r) {
  if (r >= offsets[groups]) return -1;
  int lo = 0, hi = groups - 1;  // the last group whose first row is <= r
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= r)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// One thread: the prefix sums of the counts (clipped to the rows, so bad counts cannot index past
// the tensor) and the amax accumulators cleared.
__global__ void grouped_offsets_kernel(const int32_t* sizes, int groups, int64_t rows,
                                       int64_t* offsets, uint32_t* amax_bits) {
  int64_t sum = 0;
  for (int g = 0; g < groups; ++g) {
    offsets[g] = sum;
    int64_t m = sizes[g] < 0 ? 0 : sizes[g];
    if (sum + m > rows) m = rows - sum;
    sum += m;
    amax_bits[g] = 0;
  }
  offsets[groups] = sum;
}

// One block per row (grid-stride): max |x| bits of the row, then one atomicMax into its group.
template <typename T>
__global__ void grouped_amax_kernel(const T* x, int64_t rows, int64_t cols, const int64_t* offsets,
                                    int groups, uint32_t* amax_bits) {
  __shared__ uint32_t warp_max[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int g = group_of(offsets, groups, r);
    if (g < 0) return;  // rows only grow: the rest of this block's rows are tail too
    uint32_t m = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      m = max(m, abs_bits(load(x, r * cols + c)));
    for (int s = 16; s > 0; s /= 2) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, s));
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) m = max(m, warp_max[w]);
      atomicMax(&amax_bits[g], m);
    }
    __syncthreads();
  }
}

// Per group: amax out, the scale (given or from the amax) and its inverse.
__global__ void grouped_scale_kernel(const uint32_t* amax_bits, const float* given, int groups,
                                     ScaleRule rule, float* amax, float* scale, float* scale_inv) {
  for (int g = threadIdx.x; g < groups; g += blockDim.x) {
    const float a = bits_float(amax_bits[g]);
    amax[g] = a;
    const float fixed = given != nullptr ? given[g] : 0.0f;
    const float s = fixed > 0.0f ? fixed : compute_scale(a, rule);
    scale[g] = s;
    scale_inv[g] = scale_inverse(s);
  }
}

// 32 x 32 tiles: each element quantized with its row's group scale, written row-wise (coalesced
// along columns) and, through shared memory, column-wise (coalesced along rows).
template <typename T>
__global__ void grouped_quantize_kernel(const T* x, int64_t rows, int64_t cols,
                                        const int64_t* offsets, int groups, const float* scale,
                                        Fp8Format format, uint8_t* q, uint8_t* qt) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const int64_t r0 = int64_t{blockIdx.y} * kTile, c0 = int64_t{blockIdx.x} * kTile;
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  for (int i = ty; i < kTile; i += kTileRows) {
    const int64_t r = r0 + i, c = c0 + tx;
    if (r >= rows || c >= cols) continue;
    const int g = group_of(offsets, groups, r);
    const uint8_t v = quantize_value(load(x, r * cols + c), g < 0 ? 1.0f : scale[g], format);
    if (q != nullptr) q[r * cols + c] = v;
    tile[i][tx] = v;
  }
  if (qt == nullptr) return;
  __syncthreads();
  for (int i = ty; i < kTile; i += kTileRows) {
    const int64_t c = c0 + i, r = r0 + tx;
    if (c < cols && r < rows) qt[c * rows + r] = tile[tx][i];
  }
}

// The scale layouts: row-wise (rows, cb) with row r's group scale_inv; column-wise (srows, rb) with
// block b's (the group of row 128 b).
__global__ void grouped_scales_kernel(const int64_t* offsets, int groups, const float* scale_inv,
                                      int64_t rows, int64_t cb, float* row_s, int64_t srows,
                                      int64_t rb, float* col_s) {
  const int64_t n_row = row_s != nullptr ? rows * cb : 0;
  const int64_t n_col = col_s != nullptr ? srows * rb : 0;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n_row + n_col;
       i += int64_t{gridDim.x} * blockDim.x) {
    if (i < n_row) {
      const int g = group_of(offsets, groups, i / cb);
      row_s[i] = g < 0 ? 1.0f : scale_inv[g];
    } else {
      const int64_t j = i - n_row;
      const int g = group_of(offsets, groups, (j % rb) * 128);
      col_s[j] = g < 0 ? 1.0f : scale_inv[g];
    }
  }
}

template <typename T>
void run(Context& ctx, const GroupedQuantizeArgs& args, GroupedQuantTensor& out, const T* x) {
  const cudaStream_t stream = stream_of(ctx);
  const int64_t rows = args.input.rows(), cols = args.input.cols();
  const int groups = static_cast<int>(args.group_sizes.numel());
  Tensor offsets = Tensor::empty(ctx, {groups + 1}, DType::kI64);
  Tensor amax_bits = Tensor::empty(ctx, {groups}, DType::kI32);
  Tensor scale = Tensor::empty(ctx, {groups}, DType::kF32);
  auto* off = offsets.data_as<int64_t>();
  auto* bits = static_cast<uint32_t*>(amax_bits.data());
  grouped_offsets_kernel<<<1, 1, 0, stream>>>(args.group_sizes.data_as<const int32_t>(), groups,
                                              rows, off, bits);
  OCTET_CUDA_CHECK_LAUNCH();
  if (rows > 0 && cols > 0) {
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(rows, 8192));
    grouped_amax_kernel<T><<<blocks, 256, 0, stream>>>(x, rows, cols, off, groups, bits);
    OCTET_CUDA_CHECK_LAUNCH();
  }
  const ScaleRule rule{args.format, args.rounding, args.epsilon, 0};
  grouped_scale_kernel<<<1, 256, 0, stream>>>(
      bits, args.scale.defined() ? args.scale.data_as<const float>() : nullptr, groups, rule,
      out.amax.data_as<float>(), scale.data_as<float>(), out.scale_inv.data_as<float>());
  OCTET_CUDA_CHECK_LAUNCH();
  if (rows == 0 || cols == 0) return;
  const bool row = args.output != QuantizeOutput::kColumnwise;
  const bool col = args.output != QuantizeOutput::kRowwise;
  const dim3 grid(static_cast<unsigned>(ceil_div(cols, kTile)),
                  static_cast<unsigned>(ceil_div(rows, kTile)));
  grouped_quantize_kernel<T><<<grid, dim3(kTile, kTileRows), 0, stream>>>(
      x, rows, cols, off, groups, scale.data_as<const float>(), args.format,
      row ? out.q.data.data_as<uint8_t>() : nullptr,
      col ? out.q.columnwise_data.data_as<uint8_t>() : nullptr);
  OCTET_CUDA_CHECK_LAUNCH();
  const int64_t cb = ceil_div(cols, kGroup), rb = ceil_div(rows, kGroup);
  const int64_t srows = args.columnwise_granularity == Granularity::k128x128 ? cb : cols;
  const int64_t work = (row ? rows * cb : 0) + (col ? srows * rb : 0);
  const auto blocks =
      static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((work + 255) / 256, 4096)));
  grouped_scales_kernel<<<blocks, 256, 0, stream>>>(
      off, groups, out.scale_inv.data_as<const float>(), rows, cb,
      row ? out.q.scale_inv.data_as<float>() : nullptr, srows, rb,
      col ? out.q.columnwise_scale_inv.data_as<float>() : nullptr);
  OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace

void quantize_grouped_tensorwise(Context& ctx, const GroupedQuantizeArgs& args,
                                 GroupedQuantTensor& out) {
  if (args.input.dtype() == DType::kF32)
    run(ctx, args, out, args.input.data_as<const float>());
  else
    run(ctx, args, out, args.input.data_as<const uint16_t>());
}

}  // namespace octet::cuda
