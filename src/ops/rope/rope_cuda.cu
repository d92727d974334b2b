// CUDA launcher of the rope family (device code in rope_kernels.cuh). Arguments were validated and
// outputs allocated by rope.cpp; the kernel is enqueued on the context's stream.
#include <algorithm>

#include "backend/cuda_check.h"
#include "ops/rope/rope_backends.h"
#include "ops/rope/rope_kernels.cuh"

namespace octet::cuda {

void rope(Context& ctx, const RopeArgs& args, const RopeGeometry& g, RopeDirection dir,
          Tensor& out) {
  kernels::RopeParams p;
  p.rows = g.rows;
  p.width = g.width;
  p.heads = g.heads;
  p.seq = g.seq;
  p.offset = args.offset;
  p.rope_dim = static_cast<int>(args.table.rope_dim);
  p.forward = dir == RopeDirection::kForward;
  p.interleave = args.pairing == RopePairing::kInterleave;
  p.cos = args.table.cos.data_as<const float>();
  p.sin = args.table.sin.data_as<const float>();
  int sms = 0;
  OCTET_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx.device_index));
  constexpr int kThreads = 256;
  const int64_t n = g.rows * g.width;
  // Grid-stride: enough blocks to fill every SM several times over, never more than the work.
  const int blocks = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t{sms} * 16)));
  const auto st = static_cast<cudaStream_t>(ctx.stream);
  const auto aligned16 = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  if (g.width % 8 == 0 && args.offset % 8 == 0 && p.rope_dim % 8 == 0 &&
      aligned16(args.input.data()) && aligned16(out.data()) && aligned16(p.cos) &&
      aligned16(p.sin)) {
    const int64_t items = g.rows * (g.width / 8);
    const int vblocks = static_cast<int>(std::max<int64_t>(
        1, std::min<int64_t>((items + kThreads - 1) / kThreads, int64_t{sms} * 16)));
    const bool narrow = items < (int64_t{1} << 31);
    auto launch = [&](auto kernel, const auto* x, auto* y) {
      kernel<<<vblocks, kThreads, 0, st>>>(x, y, p);
    };
    if (args.input.dtype() == DType::kF32) {
      const auto* x = args.input.data_as<const float>();
      auto* y = out.data_as<float>();
      if (narrow)
        launch(kernels::rope_vec_kernel<float, uint32_t>, x, y);
      else
        launch(kernels::rope_vec_kernel<float, int64_t>, x, y);
    } else {
      const auto* x = args.input.data_as<const uint16_t>();
      auto* y = out.data_as<uint16_t>();
      if (narrow)
        launch(kernels::rope_vec_kernel<uint16_t, uint32_t>, x, y);
      else
        launch(kernels::rope_vec_kernel<uint16_t, int64_t>, x, y);
    }
    OCTET_CUDA_CHECK_LAUNCH();
    return;
  }
  if (args.input.dtype() == DType::kF32)
    kernels::rope_kernel<float>
        <<<blocks, kThreads, 0, st>>>(args.input.data_as<const float>(), out.data_as<float>(), p);
  else
    kernels::rope_kernel<uint16_t><<<blocks, kThreads, 0, st>>>(
        args.input.data_as<const uint16_t>(), out.data_as<uint16_t>(), p);
  OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace octet::cuda
