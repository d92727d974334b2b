// CUDA launchers of the adamw family (device code in adamw_kernels.cuh). Everything is enqueued on
// the context's stream; nothing synchronises with the host.
#include <algorithm>
#include <atomic>
#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda_check.h"
#include "numerics/scale.h"  // ceil_div
#include "ops/adamw/adamw_backends.h"
#include "ops/adamw/adamw_block_kernels.cuh"
#include "ops/adamw/adamw_kernels.cuh"

namespace octet::cuda {
namespace {

const AdamWConsts* device_consts(const AdamWArgs& a) {
  return a.consts.data() ? static_cast<const AdamWConsts*>(a.consts.data()) : nullptr;
}

// adamw_device_consts: the host's formulas of adamw.cpp in double on the device, rounded to FP32.
__global__ void device_consts_kernel(float lr_f, float beta1, float beta2, float eps,
                                     float weight_decay, const int64_t* steps_taken,
                                     AdamWConsts* out) {
  const double step = static_cast<double>(*steps_taken + 1);
  const auto lr = static_cast<double>(lr_f);
  for (int i = 0; i < 2; ++i) {
    const double wd = i == 0 ? static_cast<double>(weight_decay) : 0.0;
    AdamWConsts k;
    k.beta1 = beta1;
    k.beta2 = beta2;
    k.one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(beta1));
    k.one_minus_beta2 = static_cast<float>(1.0 - static_cast<double>(beta2));
    k.decay = static_cast<float>(1.0 - lr * wd);
    k.step_size = static_cast<float>(lr / (1.0 - pow(static_cast<double>(beta1), step)));
    k.bc2_sqrt = static_cast<float>(sqrt(1.0 - pow(static_cast<double>(beta2), step)));
    k.eps = eps;
    out[i] = k;
  }
}

__global__ void advance_steps_kernel(int64_t* steps, const int32_t* skipped) {
  if (!skipped || *skipped == 0) *steps += 1;
}

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
    kernels::adamw_kernel<float4, uint2>
        <<<stride_blocks(ctx, n / 4, 256), 256, 0, stream_of(ctx)>>>(
            a.param.data_as<float4>(), a.grad.data_as<const float4>(), a.exp_avg.data_as<uint2>(),
            a.exp_avg_sq.data_as<uint2>(),
            a.param_bf16.data() ? a.param_bf16.data_as<uint2>() : nullptr,
            a.grad_scale.data() ? a.grad_scale.data_as<const float>() : nullptr,
            a.found_inf.data() ? a.found_inf.data_as<const int32_t>() : nullptr, n / 4, k,
            device_consts(a));
    OCTET_CUDA_CHECK_LAUNCH();
    return;
  }
  kernels::adamw_kernel<float, uint16_t><<<stride_blocks(ctx, n, 256), 256, 0, stream_of(ctx)>>>(
      a.param.data_as<float>(), a.grad.data_as<const float>(), a.exp_avg.data_as<uint16_t>(),
      a.exp_avg_sq.data_as<uint16_t>(),
      a.param_bf16.data() ? a.param_bf16.data_as<uint16_t>() : nullptr,
      a.grad_scale.data() ? a.grad_scale.data_as<const float>() : nullptr,
      a.found_inf.data() ? a.found_inf.data_as<const int32_t>() : nullptr, n, k, device_consts(a));
  OCTET_CUDA_CHECK_LAUNCH();
}

namespace {

// One parameter's entry of a batched launch.
kernels::BlockQuantParams block_params(const AdamWArgs& a, const AdamWConsts& k,
                                       const BlockQuantOutput& o) {
  const int64_t mrows = o.batch_rows > 0 ? o.batch_rows : o.rows;
  kernels::BlockQuantParams p;
  p.p = a.param.data_as<float>();
  p.g = a.grad.data_as<const float>();
  p.m = a.exp_avg.data_as<uint16_t>();
  p.v = a.exp_avg_sq.data_as<uint16_t>();
  p.grad_scale = a.grad_scale.data() ? a.grad_scale.data_as<const float>() : nullptr;
  p.found_inf = a.found_inf.data() ? a.found_inf.data_as<const int32_t>() : nullptr;
  p.k = k;
  p.kd = device_consts(a);
  p.rows = o.rows;
  p.cols = o.cols;
  p.batch_rows = o.batch_rows;
  p.rule = ScaleRule{.format = o.format, .rounding = o.rounding, .epsilon = 0.0f, .margin = 0};
  p.data = o.data.data_as<uint8_t>();
  p.scale_inv = o.scale_inv.data_as<float>();
  p.cdata = o.columnwise_data.data_as<uint8_t>();
  p.cscale_inv = o.columnwise_scale_inv.data_as<float>();
  p.vec_in = o.cols % 4 == 0 && aligned(a.param, 16) && aligned(a.grad, 16) &&
             aligned(a.exp_avg, 8) && aligned(a.exp_avg_sq, 8);
  p.vec_rows = o.cols % 4 == 0 && aligned(o.data, 4);
  p.vec_cols = mrows % 16 == 0 && aligned(o.columnwise_data, 16);
  return p;
}

int64_t block_tiles(const BlockQuantOutput& o) {
  return ceil_div(o.rows, int64_t{kGroup}) * ceil_div(o.cols, int64_t{kGroup});
}

}  // namespace

void adamw_step_block_quantize_many(Context& ctx, const std::vector<BlockQuantStep>& steps,
                                    const std::vector<AdamWConsts>& k) {
  // 64 KB of dynamic shared memory per block (above the default 48 KB), and the largest carveout so
  // that kBqBlocksPerSm blocks fit. Set once per device.
  static std::atomic<bool> configured[64] = {};
  OCTET_CHECK(ctx.device_index >= 0 && ctx.device_index < 64, "adamw_step_block_quantize: device ",
              ctx.device_index, " out of range");
  if (!configured[ctx.device_index]) {
    OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernels::adamw_block_quantize_kernel,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          kernels::kBqSmemBytes));
    OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernels::adamw_block_quantize_kernel,
                                          cudaFuncAttributePreferredSharedMemoryCarveout,
                                          cudaSharedmemCarveoutMaxShared));
    configured[ctx.device_index] = true;
  }
  // The largest parameters first, so that the small ones fill the last wave's idle SMs.
  std::vector<size_t> order(steps.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return block_tiles(steps[x].out) > block_tiles(steps[y].out);
  });
  kernels::BlockQuantBatch batch{};
  auto launch = [&] {
    if (batch.count == 0) return;
    const int64_t tiles = batch.first_tile[batch.count];
    OCTET_CHECK(tiles <= 0x7FFFFFFF, "adamw_step_block_quantize: ", tiles,
                " tiles exceed the grid limit");
    kernels::adamw_block_quantize_kernel<<<static_cast<unsigned>(tiles), kernels::kBqThreads,
                                           kernels::kBqSmemBytes, stream_of(ctx)>>>(batch);
    OCTET_CUDA_CHECK_LAUNCH();
    batch.count = 0;
  };
  for (const size_t i : order) {
    if (batch.count == kernels::kBqMaxBatch) launch();
    batch.p[batch.count] = block_params(steps[i].args, k[i], steps[i].out);
    batch.first_tile[batch.count + 1] = batch.first_tile[batch.count] + block_tiles(steps[i].out);
    ++batch.count;
  }
  launch();
}

void adamw_device_consts(Context& ctx, const AdamWDeviceConstsArgs& a) {
  device_consts_kernel<<<1, 1, 0, stream_of(ctx)>>>(a.lr, a.beta1, a.beta2, a.eps, a.weight_decay,
                                                    a.steps_taken.data_as<const int64_t>(),
                                                    static_cast<AdamWConsts*>(a.out.data()));
  OCTET_CUDA_CHECK_LAUNCH();
}

void adamw_advance_steps(Context& ctx, const Tensor& steps, const Tensor& skipped) {
  advance_steps_kernel<<<1, 1, 0, stream_of(ctx)>>>(
      steps.data_as<int64_t>(), skipped.data() ? skipped.data_as<const int32_t>() : nullptr);
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
  ctx.be().memset(flag.data(), 0, sizeof(int32_t));
  for (const auto& b : make_batches(grads)) {
    int64_t biggest = 0;
    for (int i = 0; i < b.count; ++i) biggest = std::max(biggest, b.numel[i]);
    kernels::nonfinite_kernel<<<stride_blocks(ctx, biggest, 256), 256, 0, stream_of(ctx)>>>(
        b, flag.data_as<int32_t>());
    OCTET_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace octet::cuda
