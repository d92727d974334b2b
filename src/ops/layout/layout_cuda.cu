// CUDA implementation of layout.h: one thread per output element (or per 8 BF16 columns when the
// layout allows 16-byte accesses), grid-stride over rows x width.
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

// BF16 to BF16 with every column offset, width and leading dimension a multiple of 8: one thread
// per 8 columns (16-byte loads and stores, an eighth of the index arithmetic). The sum adds the
// same values in the same order as copy_columns_kernel, so the results are bitwise the same.
__global__ void copy_columns_bf16x8_kernel(const uint16_t* __restrict__ src, int64_t src_ld,
                                           int64_t src_col, uint16_t* __restrict__ dst,
                                           int64_t dst_ld, int64_t dst_col, int64_t rows,
                                           int64_t width8, int64_t repeat, bool sum) {
  const int64_t n = rows * width8;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = idx / width8, j = (idx % width8) * 8;
    uint4 out;
    if (sum) {
      float v[8] = {};
      for (int64_t i = 0; i < repeat; ++i) {
        const uint4 in =
            *reinterpret_cast<const uint4*>(src + (r * repeat + i) * src_ld + src_col + j);
        const auto* h = reinterpret_cast<const uint16_t*>(&in);
        for (int q = 0; q < 8; ++q) v[q] = __fadd_rn(v[q], bf16_to_float(h[q]));
      }
      auto* o = reinterpret_cast<uint16_t*>(&out);
      for (int q = 0; q < 8; ++q) o[q] = float_to_bf16(v[q]);
    } else {
      out = *reinterpret_cast<const uint4*>(src + (r / repeat) * src_ld + src_col + j);
    }
    *reinterpret_cast<uint4*>(dst + r * dst_ld + dst_col + j) = out;
  }
}

bool bf16x8_ok(const CopyColumnsArgs& a) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return a.src.dtype() == DType::kBF16 && a.dst.dtype() == DType::kBF16 && a.width % 8 == 0 &&
         a.src_col % 8 == 0 && a.dst_col % 8 == 0 && a.src.cols() % 8 == 0 &&
         a.dst.cols() % 8 == 0 && aligned(a.src.data()) && aligned(a.dst.data());
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
  if (bf16x8_ok(a)) {
    const int64_t n = a.dst.rows() * (a.width / 8);
    const auto blocks =
        static_cast<unsigned>(std::max<int64_t>(std::min(ceil_div(n, kThreads), kMaxBlocks), 1));
    copy_columns_bf16x8_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(ctx.stream)>>>(
        a.src.data_as<const uint16_t>(), a.src.cols(), a.src_col, a.dst.data_as<uint16_t>(),
        a.dst.cols(), a.dst_col, a.dst.rows(), a.width / 8, a.repeat, a.mode == CopyMode::kSum);
    OCTET_CUDA_CHECK_LAUNCH();
    return;
  }
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
