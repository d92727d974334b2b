// CUDA launchers of the cast family (device code in cast_kernels.cuh). Arguments were validated by
// cast.cpp; everything is enqueued on the context's stream, nothing synchronises with the host.
#include <algorithm>
#include <cstdint>

#include "backend/cuda_check.h"
#include "numerics/scale.h"
#include "ops/cast/cast_backends.h"
#include "ops/cast/cast_kernels.cuh"

namespace octet::cuda {
namespace {

namespace k = cast_kernels;

constexpr int kThreads = 256;
// Elementwise grids beyond this many blocks become grid-stride loops (bandwidth is saturated long
// before, and grid.x stays far below its limit).
constexpr int64_t kMaxBlocks = int64_t{1} << 16;
constexpr int kTile = 32;
constexpr int kRowsPerPass = 8;  // 256 threads per tile: 4 elements each
constexpr int64_t kMaxGridY = 65535;

cudaStream_t stream_of(const Context& ctx) {
  return static_cast<cudaStream_t>(ctx.stream);
}

unsigned elementwise_grid(int64_t n) {
  return static_cast<unsigned>(std::min(ceil_div(n, kThreads), kMaxBlocks));
}

template <typename XT, typename OT>
void launch_cast(Context& ctx, const Tensor& x, const Tensor& out) {
  const int64_t n = x.numel();
  k::cast_elementwise_kernel<XT, OT><<<elementwise_grid(n), kThreads, 0, stream_of(ctx)>>>(
      x.data_as<const XT>(), n, out.data_as<OT>());
  OCTET_CUDA_CHECK_LAUNCH();
}

template <typename YT, typename XT>
void launch_add(Context& ctx, const Tensor& y, const Tensor& x) {
  const int64_t n = y.numel();
  if constexpr (sizeof(YT) == 2 && sizeof(XT) == 2) {
    if (n % 8 == 0 && reinterpret_cast<uintptr_t>(y.data()) % 16 == 0 &&
        reinterpret_cast<uintptr_t>(x.data()) % 16 == 0) {
      k::add_into_bf16x8_kernel<<<elementwise_grid(n / 8), kThreads, 0, stream_of(ctx)>>>(
          y.data_as<uint4>(), x.data_as<const uint4>(), n / 8);
      OCTET_CUDA_CHECK_LAUNCH();
      return;
    }
  }
  k::add_into_elementwise_kernel<YT, XT><<<elementwise_grid(n), kThreads, 0, stream_of(ctx)>>>(
      y.data_as<YT>(), x.data_as<const XT>(), n);
  OCTET_CUDA_CHECK_LAUNCH();
}

// `batch` matrices of (rows, cols), one per grid z.
template <typename T>
void launch_transpose(Context& ctx, const Tensor& x, const Tensor& out, int64_t batch = 1) {
  const int64_t rows = batch > 1 ? x.size(1) : x.rows(), cols = x.cols();
  OCTET_CHECK(batch <= kMaxGridY, "transpose_batched: at most ", kMaxGridY, " matrices, got ",
              batch);
  const dim3 grid(static_cast<unsigned>(ceil_div(cols, kTile)),
                  static_cast<unsigned>(std::min(ceil_div(rows, kTile), kMaxGridY)),
                  static_cast<unsigned>(batch));
  const dim3 block(kTile, kRowsPerPass);
  k::transpose_tiled_kernel<T, kTile, kRowsPerPass>
      <<<grid, block, 0, stream_of(ctx)>>>(x.data_as<const T>(), rows, cols, out.data_as<T>());
  OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace

void cast(Context& ctx, const Tensor& x, const Tensor& out) {
  const bool xf = x.dtype() == DType::kF32, of = out.dtype() == DType::kF32;
  if (xf && !of)
    launch_cast<float, uint16_t>(ctx, x, out);
  else if (!xf && of)
    launch_cast<uint16_t, float>(ctx, x, out);
  else if (xf)
    launch_cast<float, float>(ctx, x, out);
  else
    launch_cast<uint16_t, uint16_t>(ctx, x, out);
}

void transpose(Context& ctx, const Tensor& x, const Tensor& out) {
  if (dtype_size(x.dtype()) == 4)
    launch_transpose<uint32_t>(ctx, x, out);
  else
    launch_transpose<uint16_t>(ctx, x, out);
}

void transpose_batched(Context& ctx, const Tensor& x, const Tensor& out) {
  const int64_t batch = x.size(0);
  switch (dtype_size(x.dtype())) {
    case 4:
      return launch_transpose<uint32_t>(ctx, x, out, batch);
    case 2:
      return launch_transpose<uint16_t>(ctx, x, out, batch);
    default:
      return launch_transpose<uint8_t>(ctx, x, out, batch);
  }
}

void add_into(Context& ctx, const Tensor& y, const Tensor& x) {
  const bool yf = y.dtype() == DType::kF32, xf = x.dtype() == DType::kF32;
  if (yf && xf)
    launch_add<float, float>(ctx, y, x);
  else if (yf)
    launch_add<float, uint16_t>(ctx, y, x);
  else if (xf)
    launch_add<uint16_t, float>(ctx, y, x);
  else
    launch_add<uint16_t, uint16_t>(ctx, y, x);
}

void round_to_storage(Context& ctx, const Tensor& x, ExMyFormat f, StorageKernel kernel,
                      const Tensor& out) {
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (x.cols() % 8 == 0 && aligned16(x.data()) && aligned16(out.data())) {
    const int64_t half_warps = x.rows() * ceil_div(x.cols(), kGroup);
    if (x.dtype() == DType::kBF16 && kernel == StorageKernel::kAuto && storage_bf16_supported(f)) {
      // Two tiles a half-warp: half the blocks of the kernel below.
      const auto blocks =
          static_cast<unsigned>(std::min(ceil_div(half_warps, kThreads / 16 * 2), kMaxBlocks));
      k::round_to_storage_bf16_kernel<<<blocks, kThreads, 0, stream_of(ctx)>>>(
          x.data_as<const uint4>(), x.rows(), x.cols(), storage_bf16_format(f),
          out.data_as<uint4>());
      OCTET_CUDA_CHECK_LAUNCH();
      return;
    }
    const auto blocks =
        static_cast<unsigned>(std::min(ceil_div(half_warps, kThreads / 16), kMaxBlocks));
    if (x.dtype() == DType::kF32)
      k::round_to_storage_vec_kernel<float><<<blocks, kThreads, 0, stream_of(ctx)>>>(
          x.data_as<const float>(), x.rows(), x.cols(), f, out.data_as<float>());
    else
      k::round_to_storage_vec_kernel<uint16_t><<<blocks, kThreads, 0, stream_of(ctx)>>>(
          x.data_as<const uint16_t>(), x.rows(), x.cols(), f, out.data_as<uint16_t>());
    OCTET_CUDA_CHECK_LAUNCH();
    return;
  }
  const int64_t warps = x.rows() * ceil_div(x.cols(), kGroup);
  const auto blocks = static_cast<unsigned>(std::min(ceil_div(warps, kThreads / 32), kMaxBlocks));
  if (x.dtype() == DType::kF32)
    k::round_to_storage_kernel<float><<<blocks, kThreads, 0, stream_of(ctx)>>>(
        x.data_as<const float>(), x.rows(), x.cols(), f, out.data_as<float>());
  else
    k::round_to_storage_kernel<uint16_t><<<blocks, kThreads, 0, stream_of(ctx)>>>(
        x.data_as<const uint16_t>(), x.rows(), x.cols(), f, out.data_as<uint16_t>());
  OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace octet::cuda
