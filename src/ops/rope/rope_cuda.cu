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
  if (args.input.dtype() == DType::kF32)
    kernels::rope_kernel<float>
        <<<blocks, kThreads, 0, st>>>(args.input.data_as<const float>(), out.data_as<float>(), p);
  else
    kernels::rope_kernel<uint16_t><<<blocks, kThreads, 0, st>>>(
        args.input.data_as<const uint16_t>(), out.data_as<uint16_t>(), p);
  OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace octet::cuda
