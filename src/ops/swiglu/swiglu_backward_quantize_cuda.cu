// CUDA launcher of swiglu_backward_quantize (device code in swiglu_backward_quantize_kernels.cuh).
// Arguments were validated by swiglu.cpp; enqueued on the context's stream, no host sync.
#include <algorithm>
#include <cstdint>

#include "backend/cuda_check.h"
#include "ops/swiglu/swiglu_backends.h"
#include "ops/swiglu/swiglu_backward_quantize_kernels.cuh"

namespace octet::cuda {
namespace {

constexpr int kThreads = 256;  // 8 rows per block, a warp each

template <typename InT, typename GradT>
void backward_quantize_typed(Context& ctx, const SwigluBackwardQuantizeArgs& a,
                             SwigluBackwardQuantizeResult& out) {
  const int64_t rows = a.gate_up.rows(), f = a.gate_up.cols() / 2;
  const auto st = static_cast<cudaStream_t>(ctx.stream);
  auto* amax_bits = out.d_gate_up.amax.data_as<uint32_t>();
  OCTET_CUDA_CHECK(cudaMemsetAsync(amax_bits, 0, sizeof(uint32_t), st));
  auto kernel = swiglu_kernels::swiglu_backward_quantize_1x128_kernel<InT, GradT, kThreads>;
  int per_sm = 0, sms = 0;
  OCTET_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
  OCTET_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx.device_index));
  const int64_t blocks =
      std::clamp<int64_t>(ceil_div(rows, kThreads / 32), 1, int64_t{sms} * std::max(per_sm, 1));
  const ScaleRule rule{a.format, a.rounding, a.epsilon, 0};
  kernel<<<static_cast<unsigned>(blocks), kThreads, 0, st>>>(
      a.dh.data_as<const GradT>(), a.gate_up.data_as<const InT>(),
      a.row_weight.defined() ? a.row_weight.data_as<const float>() : nullptr, rows, f, rule,
      out.d_gate_up.data.data_as<uint8_t>(), out.d_gate_up.scale_inv.data_as<float>(), amax_bits,
      out.d_row_weight.defined() ? out.d_row_weight.data_as<float>() : nullptr);
  OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace

void swiglu_backward_quantize(Context& ctx, const SwigluBackwardQuantizeArgs& a,
                              SwigluBackwardQuantizeResult& out) {
  const bool in_f = a.gate_up.dtype() == DType::kF32, grad_f = a.dh.dtype() == DType::kF32;
  if (in_f && grad_f)
    backward_quantize_typed<float, float>(ctx, a, out);
  else if (in_f)
    backward_quantize_typed<float, uint16_t>(ctx, a, out);
  else if (grad_f)
    backward_quantize_typed<uint16_t, float>(ctx, a, out);
  else
    backward_quantize_typed<uint16_t, uint16_t>(ctx, a, out);
}

}  // namespace octet::cuda
