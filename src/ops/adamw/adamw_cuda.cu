// CUDA launchers of the adamw family (device code in adamw_kernels.cuh). Everything is enqueued on
// the context's stream; nothing synchronises with the host.
#include <algorithm>
#include <cstdint>

#include "backend/cuda_check.h"
#include "numerics/scale.h"  // ceil_div
#include "ops/adamw/adamw_backends.h"
#include "ops/adamw/adamw_kernels.cuh"
#include "ops/quantize/quantize_kernels.cuh"

namespace octet::cuda {
namespace {

// The fused optimizer's values for the 128x128 tile kernel of ops/quantize: each load updates the 4
// parameters (r, c..c+3) as adamw_kernel does (the same element function) and returns the new
// values, which the tile kernel then quantizes. With found_inf set nothing is written and the
// unchanged values are returned.
struct AdamWSource {
  float* p;
  const float* g;
  uint16_t* m;
  uint16_t* v;
  const float* scale;
  const int32_t* found_inf;
  AdamWConsts k;
  const AdamWConsts* kd;  // the device's constants (adamw_device_consts), or null: k

  __device__ __forceinline__ float update(int64_t i, bool skip, float s,
                                          const AdamWConsts& kk) const {
    if (skip) return p[i];
    const kernels::StoredStep x = kernels::stored_update(p[i], g[i], m[i], v[i], scale, s, kk);
    p[i] = x.p;
    m[i] = x.m;
    v[i] = x.v;
    return x.p;
  }

  template <typename Held>
  __device__ __forceinline__ Held load(int64_t r, int64_t c, int64_t rows, int64_t cols,
                                       bool vec) const {
    static_assert(sizeof(Held) == 16, "the master weights are F32");
    const bool skip = found_inf && *found_inf != 0;
    const float s = scale ? *scale : 1.0f;
    const AdamWConsts kk = kd ? *kd : k;
    float out[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (vec && r < rows && c < cols) {
      const int64_t i = r * cols + c;
      // Non-coherent loads: each element is read once, before this thread's own store to it, so
      // the compiler may issue the loads of later rows ahead of this row's stores.
      const float4 pv = __ldg(reinterpret_cast<const float4*>(p + i));
      if (skip) return pv;
      const kernels::StoredStep4 x =
          kernels::stored_update(pv, __ldg(reinterpret_cast<const float4*>(g + i)),
                                 __ldg(reinterpret_cast<const uint2*>(m + i)),
                                 __ldg(reinterpret_cast<const uint2*>(v + i)), scale, s, kk);
      *reinterpret_cast<float4*>(p + i) = x.p;
      *reinterpret_cast<uint2*>(m + i) = x.m;
      *reinterpret_cast<uint2*>(v + i) = x.v;
      return x.p;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (r < rows && c + e < cols) out[e] = update(r * cols + c + e, skip, s, kk);
    return make_float4(out[0], out[1], out[2], out[3]);
  }
};

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

void adamw_step_block_quantize(Context& ctx, const AdamWArgs& a, const AdamWConsts& k,
                               const BlockQuantOutput& o) {
  namespace qk = kernels;  // the tile kernel of ops/quantize (quantize_kernels.cuh)
  const AdamWSource src{a.param.data_as<float>(),
                        a.grad.data_as<const float>(),
                        a.exp_avg.data_as<uint16_t>(),
                        a.exp_avg_sq.data_as<uint16_t>(),
                        a.grad_scale.data() ? a.grad_scale.data_as<const float>() : nullptr,
                        a.found_inf.data() ? a.found_inf.data_as<const int32_t>() : nullptr,
                        k,
                        device_consts(a)};
  qk::TileParams p;
  p.rows = o.rows;
  p.cols = o.cols;
  p.rule = ScaleRule{.format = o.format, .rounding = o.rounding, .epsilon = 0.0f, .margin = 0};
  p.rowwise = qk::TileOutput{o.data.data_as<uint8_t>(), o.scale_inv.data_as<float>(),
                             qk::ScaleSource::kTile, Granularity::k128x128};
  p.columnwise =
      qk::TileOutput{o.columnwise_data.data_as<uint8_t>(), o.columnwise_scale_inv.data_as<float>(),
                     qk::ScaleSource::kTile, Granularity::k128x128};
  p.amax_out = nullptr;
  auto at = [](const Tensor& t, uintptr_t bytes) {
    return reinterpret_cast<uintptr_t>(t.data()) % bytes == 0;
  };
  p.aligned_input = at(a.param, 16) && at(a.grad, 16) && at(a.exp_avg, 8) && at(a.exp_avg_sq, 8);
  p.batch_rows = o.batch_rows;
  const dim3 grid(static_cast<unsigned>(ceil_div(o.cols, kGroup)),
                  static_cast<unsigned>(ceil_div(o.rows, kGroup)));
  OCTET_CHECK(grid.y < 65536, "adamw_step_block_quantize: ", o.rows,
              " rows exceed the tile kernel's grid limit (65535 * 128)");
  qk::quantize_tile_kernel<float, AdamWSource>
      <<<grid, qk::kTileThreads, 0, stream_of(ctx)>>>(src, p);
  OCTET_CUDA_CHECK_LAUNCH();
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
