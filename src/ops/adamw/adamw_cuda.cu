// CUDA launchers of the adamw family (device code in adamw_kernels.cuh). Everything is enqueued on
// the context's stream; nothing synchronises with the host.
#include <algorithm>
#include <cstdint>

#include "backend/cuda_check.h"
#include "numerics/scale.h"  // ceil_div
#include "ops/adamw/adamw_backends.h"
#include "ops/adamw/adamw_kernels.cuh"

namespace octet::cuda {
namespace {

cudaStream_t stream_of(const Context& ctx) {
  return static_cast<cudaStream_t>(ctx.stream);
}

// Grid-stride kernels: a few waves of blocks are enough to saturate memory bandwidth.
unsigned stride_blocks(const Context& ctx, int64_t n, int threads) {
  int sms = 0;
  OCTET_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx.device_index));
  return static_cast<unsigned>(std::clamp<int64_t>(ceil_div(n, threads), 1, int64_t{sms} * 8));
}

// Splits the list into batches of kernels::kMaxNormTensors, skipping empty tensors.
std::vector<kernels::TensorBatch> make_batches(const std::vector<Tensor>& grads) {
  std::vector<kernels::TensorBatch> out;
  kernels::TensorBatch b{};
  for (const Tensor& t : grads) {
    if (t.numel() == 0) continue;
    if (b.count == kernels::kMaxNormTensors) {
      out.push_back(b);
      b = kernels::TensorBatch{};
    }
    b.ptr[b.count] = t.data_as<const float>();
    b.numel[b.count] = t.numel();
    b.chunk_begin[b.count + 1] = b.chunk_begin[b.count] + ceil_div(t.numel(), kNormChunk);
    ++b.count;
  }
  if (b.count) out.push_back(b);
  return out;
}

}  // namespace

bool aligned(const Tensor& t, uintptr_t bytes) {
  return t.data() == nullptr || reinterpret_cast<uintptr_t>(t.data()) % bytes == 0;
}

void adamw_step(Context& ctx, const AdamWArgs& a, const AdamWConsts& k) {
  const int64_t n = a.param.numel();
  if (n % 4 == 0 && aligned(a.param, 16) && aligned(a.grad, 16) && aligned(a.exp_avg, 8) &&
      aligned(a.exp_avg_sq, 8) && aligned(a.param_bf16, 8)) {
    kernels::adamw_x4_kernel<<<stride_blocks(ctx, n / 4, 256), 256, 0, stream_of(ctx)>>>(
        a.param.data_as<float4>(), a.grad.data_as<const float4>(), a.exp_avg.data_as<uint2>(),
        a.exp_avg_sq.data_as<uint2>(),
        a.param_bf16.data() ? a.param_bf16.data_as<uint2>() : nullptr,
        a.grad_scale.data() ? a.grad_scale.data_as<const float>() : nullptr,
        a.found_inf.data() ? a.found_inf.data_as<const int32_t>() : nullptr, n / 4, k);
    OCTET_CUDA_CHECK_LAUNCH();
    return;
  }
  kernels::adamw_kernel<<<stride_blocks(ctx, n, 256), 256, 0, stream_of(ctx)>>>(
      a.param.data_as<float>(), a.grad.data_as<const float>(), a.exp_avg.data_as<uint16_t>(),
      a.exp_avg_sq.data_as<uint16_t>(),
      a.param_bf16.data() ? a.param_bf16.data_as<uint16_t>() : nullptr,
      a.grad_scale.data() ? a.grad_scale.data_as<const float>() : nullptr,
      a.found_inf.data() ? a.found_inf.data_as<const int32_t>() : nullptr, n, k);
  OCTET_CUDA_CHECK_LAUNCH();
}

void global_grad_norm(Context& ctx, const std::vector<Tensor>& grads, Tensor& norm) {
  const std::vector<kernels::TensorBatch> batches = make_batches(grads);
  int64_t total = 0;
  for (const auto& b : batches) total += b.chunk_begin[b.count];
  Tensor partials = Tensor::empty(ctx, {std::max<int64_t>(total, 1)}, DType::kF32);
  int64_t offset = 0;
  for (const auto& b : batches) {
    const int64_t chunks = b.chunk_begin[b.count];
    OCTET_CHECK(chunks <= 0x7FFFFFFF, "global_grad_norm: ", chunks,
                " chunks exceed the grid limit");
    kernels::norm_chunks_kernel<<<static_cast<unsigned>(chunks), kNormLanes, 0, stream_of(ctx)>>>(
        b, partials.data_as<float>() + offset);
    OCTET_CUDA_CHECK_LAUNCH();
    offset += chunks;
  }
  kernels::norm_finish_kernel<<<1, kNormLanes, 0, stream_of(ctx)>>>(partials.data_as<const float>(),
                                                                    total, norm.data_as<float>());
  OCTET_CUDA_CHECK_LAUNCH();
}

void grad_clip_coefficient(Context& ctx, const Tensor& norm, float max_norm, Tensor& out) {
  kernels::clip_coefficient_kernel<<<1, 32, 0, stream_of(ctx)>>>(norm.data_as<const float>(),
                                                                 max_norm, out.data_as<float>());
  OCTET_CUDA_CHECK_LAUNCH();
}

void nonfinite_flag(Context& ctx, const std::vector<Tensor>& grads, Tensor& flag) {
  OCTET_CUDA_CHECK(cudaMemsetAsync(flag.data(), 0, sizeof(int32_t), stream_of(ctx)));
  for (const auto& b : make_batches(grads)) {
    int64_t biggest = 0;
    for (int i = 0; i < b.count; ++i) biggest = std::max(biggest, b.numel[i]);
    kernels::nonfinite_kernel<<<stride_blocks(ctx, biggest, 256), 256, 0, stream_of(ctx)>>>(
        b, flag.data_as<int32_t>());
    OCTET_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace octet::cuda
