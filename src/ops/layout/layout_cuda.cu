// CUDA implementation of layout.h: one thread per output element, grid-stride over rows x width.
// The sum over `repeat` runs in the same order as the CPU reference, so results agree bit for bit.
#include <algorithm>

#include "backend/cuda_check.h"
#include "numerics/fp8.h"
#include "numerics/scale.h"
#include "ops/layout/layout_backends.h"

namespace octet::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 16;

template <typename S, typename D>
__global__ void copy_columns_kernel(const S* __restrict__ src, int64_t src_ld, int64_t src_col,
                                    D* __restrict__ dst, int64_t dst_ld, int64_t dst_col,
                                    int64_t rows, int64_t width, int64_t repeat, bool sum) {
  const int64_t n = rows * width;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = idx / width, j = idx % width;
    float v = 0.0f;
    if (sum) {
      for (int64_t i = 0; i < repeat; ++i)
        v = __fadd_rn(v, load_float(src, (r * repeat + i) * src_ld + src_col + j));
    } else {
      v = load_float(src, (r / repeat) * src_ld + src_col + j);
    }
    store_float(dst, r * dst_ld + dst_col + j, v);
  }
}

template <typename S, typename D>
void launch(Context& ctx, const CopyColumnsArgs& a) {
  const int64_t n = a.dst.rows() * a.width;
  const auto blocks = static_cast<unsigned>(std::min(ceil_div(n, kThreads), kMaxBlocks));
  copy_columns_kernel<S, D><<<blocks, kThreads, 0, static_cast<cudaStream_t>(ctx.stream)>>>(
      a.src.data_as<const S>(), a.src.cols(), a.src_col, a.dst.data_as<D>(), a.dst.cols(),
      a.dst_col, a.dst.rows(), a.width, a.repeat, a.mode == CopyMode::kSum);
  OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace

void copy_columns(Context& ctx, const CopyColumnsArgs& a) {
  const bool sf = a.src.dtype() == DType::kF32, df = a.dst.dtype() == DType::kF32;
  if (sf && df)
    launch<float, float>(ctx, a);
  else if (sf)
    launch<float, uint16_t>(ctx, a);
  else if (df)
    launch<uint16_t, float>(ctx, a);
  else
    launch<uint16_t, uint16_t>(ctx, a);
}

}  // namespace octet::cuda
