// CUDA launchers of the cross_entropy family (device code in cross_entropy_kernels.cuh). Arguments
// were validated by cross_entropy.cpp; everything is enqueued on the context's stream, nothing
// synchronises with the host.
#include <algorithm>
#include <cstdint>

#include "backend/cuda_check.h"
#include "ops/cross_entropy/cross_entropy_backends.h"
#include "ops/cross_entropy/cross_entropy_kernels.cuh"

namespace octet::cuda {
namespace {

namespace k = cross_entropy_kernels;

constexpr int kRowThreads = 256;    // 8 warps per row: V = 131072 is 64 chunks of 8 a thread
constexpr int kMeanThreads = 1024;  // one block sums up to ~10^5 row losses
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // beyond this, rows loop inside the kernel
static_assert(k::kIgnore == kIgnoreIndex,
              "the device copy of the ignore index must match cross_entropy.h");

cudaStream_t stream_of(const Context& ctx) {
  return static_cast<cudaStream_t>(ctx.stream);
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// 16-byte chunks need every row to start 16-byte aligned: V a multiple of 8 and aligned base
// pointers.
bool vectorizable(const Tensor& logits, const Tensor& out) {
  return logits.cols() % k::kChunk == 0 && aligned16(logits.data()) && aligned16(out.data());
}

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(std::min(rows, kMaxBlocks));
}

template <typename T>
void rows_typed(Context& ctx, const CrossEntropyRowsArgs& a) {
  const int64_t rows = a.logits.rows(), vocab = a.logits.cols();
  const cudaStream_t st = stream_of(ctx);
  auto launch = [&](auto kernel) {
    kernel<<<row_blocks(rows), kRowThreads, 0, st>>>(
        a.logits.data_as<const T>(), a.targets.data_as<const int32_t>(), rows, vocab,
        a.losses.data_as<float>(), a.lse.data_as<float>());
  };
  if (vectorizable(a.logits, a.logits))
    launch(k::cross_entropy_forward_kernel<T, true, kRowThreads>);
  else
    launch(k::cross_entropy_forward_kernel<T, false, kRowThreads>);
  OCTET_CUDA_CHECK_LAUNCH();
}

template <typename T>
void backward_typed(Context& ctx, const CrossEntropyBackwardArgs& a) {
  const int64_t rows = a.logits.rows(), vocab = a.logits.cols();
  auto launch = [&](auto kernel) {
    kernel<<<row_blocks(rows), kRowThreads, 0, stream_of(ctx)>>>(
        a.logits.data_as<const T>(), a.targets.data_as<const int32_t>(),
        a.lse.data_as<const float>(), a.count.data_as<const int32_t>(),
        a.dloss.data_as<const float>(), rows, vocab, a.dlogits.data_as<T>());
  };
  if (vectorizable(a.logits, a.dlogits))
    launch(k::cross_entropy_backward_kernel<T, true, kRowThreads>);
  else
    launch(k::cross_entropy_backward_kernel<T, false, kRowThreads>);
  OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace

void cross_entropy_rows(Context& ctx, const CrossEntropyRowsArgs& a) {
  if (a.logits.dtype() == DType::kF32)
    rows_typed<float>(ctx, a);
  else
    rows_typed<uint16_t>(ctx, a);
}

void cross_entropy_mean(Context& ctx, const CrossEntropyMeanArgs& a) {
  const bool with_loss = a.losses.defined();
  k::cross_entropy_mean_kernel<kMeanThreads><<<1, kMeanThreads, 0, stream_of(ctx)>>>(
      with_loss ? a.losses.data_as<const float>() : nullptr, a.targets.data_as<const int32_t>(),
      a.targets.size(0), a.count.data_as<int32_t>(), with_loss ? a.loss.data_as<float>() : nullptr);
  OCTET_CUDA_CHECK_LAUNCH();
}

void cross_entropy_backward(Context& ctx, const CrossEntropyBackwardArgs& a) {
  if (a.logits.dtype() == DType::kF32)
    backward_typed<float>(ctx, a);
  else
    backward_typed<uint16_t>(ctx, a);
}

}  // namespace octet::cuda
