// CUDA launcher of swiglu_backward_quantize (device code in swiglu_backward_quantize_kernels.cuh):
// when F % 8 == 0 and the buffers are 16-byte aligned, the row kernel for want_h and F <= 768 and
// the vectorised one when a row's staging fits in shared memory; else the scalar one (the same bits
// every way). want_h's h comes from the row or vectorised kernel's pass, or from swiglu_quantize
// after the scalar one. Arguments were validated by swiglu.cpp; enqueued on the context's stream,
// no host sync.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "backend/backend.h"
#include "backend/cuda_check.h"
#include "ops/swiglu/swiglu_backends.h"
#include "ops/swiglu/swiglu_backward_quantize_kernels.cuh"

namespace octet::cuda {
namespace {

constexpr int kThreads = 256;     // 8 rows per block, a warp each
constexpr int kVecThreads = 128;  // the vectorised kernel: 4 rows per block, a warp each
constexpr int kRowThreads = 256;  // the row kernel: 8 rows per block, a warp each

int device_attr(const Context& ctx, cudaDeviceAttr attr) {
  int v = 0;
  OCTET_CUDA_CHECK(cudaDeviceGetAttribute(&v, attr, ctx.device_index));
  return v;
}

// Launches a vectorised kernel (row or staged) and returns true, or returns false when none applies.
template <typename Src, typename GradT>
bool launch_vec(Context& ctx, const SwigluBackwardQuantizeArgs& a, Src src, const void* gu_ptr,
                SwigluBackwardQuantizeResult& out, const ScaleRule& rule) {
  const int64_t rows = a.dh.rows(), f = a.dh.cols();
  if (f % swiglu_kernels::kChunk != 0) return false;
  for (const void* p : std::initializer_list<const void*>{
           a.dh.data(), gu_ptr, out.d_gate_up.data.data(), a.want_h ? out.h.data.data() : nullptr})
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  swiglu_kernels::QuantOut h_out{nullptr, nullptr, nullptr, {}};
  if (a.want_h) {  // h in the same pass (swiglu.h want_h)
    h_out = {out.h.data.data_as<uint8_t>(), out.h.scale_inv.data_as<float>(),
             zeroed_amax_bits(ctx, out.h), ScaleRule{a.h_format, a.h_rounding, 0.0f, 0}};
  }
  const bool fixed = swiglu_kernels::e4m3_pow2(rule) && src.e4m3() &&
                     (!a.want_h || swiglu_kernels::e4m3_pow2(h_out.rule));
  const auto st = static_cast<cudaStream_t>(ctx.stream);
  auto launch = [&](auto kernel, int threads, int64_t smem) {
    int per_sm = 0;
    OCTET_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
    const int64_t blocks = std::clamp<int64_t>(
        ceil_div(rows, threads / 32), 1,
        int64_t{device_attr(ctx, cudaDevAttrMultiProcessorCount)} * std::max(per_sm, 1));
    kernel<<<static_cast<unsigned>(blocks), threads, static_cast<size_t>(smem), st>>>(
        a.dh.data_as<const GradT>(), src,
        a.row_weight.defined() ? a.row_weight.data_as<const float>() : nullptr, rows, f, rule,
        out.d_gate_up.data.data_as<uint8_t>(), out.d_gate_up.scale_inv.data_as<float>(),
        amax_bits_of(out.d_gate_up),
        out.d_row_weight.defined() ? out.d_row_weight.data_as<float>() : nullptr, h_out);
    OCTET_CUDA_CHECK_LAUNCH();
  };
  // With h, rows of at most 96 chunks (F <= 768): the register-resident row kernel (without h
  // the staged kernel below is the faster one: 186 against 197 us at the baseline's 65536 x 704 on
  // the H200, while with h the row kernel is: 217 against 230 us).
  auto launch_row = [&](auto it) {
    constexpr int kIt = decltype(it)::value;
    using swiglu_kernels::swiglu_backward_quantize_1x128_row_kernel;
    if (fixed)
      launch(swiglu_backward_quantize_1x128_row_kernel<Src, GradT, kRowThreads, kIt, true>,
             kRowThreads, 0);
    else
      launch(swiglu_backward_quantize_1x128_row_kernel<Src, GradT, kRowThreads, kIt, false>,
             kRowThreads, 0);
  };
  switch (a.want_h ? ceil_div(f / swiglu_kernels::kChunk, 32) : 0) {
    case 1:
      launch_row(std::integral_constant<int, 1>{});
      return true;
    case 2:
      launch_row(std::integral_constant<int, 2>{});
      return true;
    case 3:
      launch_row(std::integral_constant<int, 3>{});
      return true;
    default:
      break;
  }
  const bool aligned = f % kGroup == 0;
  const int64_t smem = int64_t{kVecThreads / 32} * (256 + (aligned ? 0 : 2 * f)) * 4;
  if (smem > device_attr(ctx, cudaDevAttrMaxSharedMemoryPerBlockOptin)) return false;
  auto kernel = [&] {
    using swiglu_kernels::swiglu_backward_quantize_1x128_vec_kernel;
    if (aligned)
      return fixed
                 ? swiglu_backward_quantize_1x128_vec_kernel<Src, GradT, kVecThreads, true, true>
                 : swiglu_backward_quantize_1x128_vec_kernel<Src, GradT, kVecThreads, true, false>;
    return fixed ? swiglu_backward_quantize_1x128_vec_kernel<Src, GradT, kVecThreads, false, true>
                 : swiglu_backward_quantize_1x128_vec_kernel<Src, GradT, kVecThreads, false, false>;
  }();
  if (smem > 48 * 1024)
    OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
  launch(kernel, kVecThreads, smem);
  return true;
}

template <typename Src, typename GradT>
void backward_quantize_typed(Context& ctx, const SwigluBackwardQuantizeArgs& a, Src src,
                             const void* gu_ptr, SwigluBackwardQuantizeResult& out) {
  const int64_t rows = a.dh.rows(), f = a.dh.cols();
  const auto st = static_cast<cudaStream_t>(ctx.stream);
  uint32_t* amax_bits = zeroed_amax_bits(ctx, out.d_gate_up);  // null: not wanted
  const ScaleRule rule{a.format, a.rounding, a.epsilon, 0};
  if (launch_vec<Src, GradT>(ctx, a, src, gu_ptr, out, rule)) return;
  auto kernel = swiglu_kernels::swiglu_backward_quantize_1x128_kernel<Src, GradT, kThreads>;
  int per_sm = 0, sms = 0;
  OCTET_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
  OCTET_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx.device_index));
  const int64_t blocks =
      std::clamp<int64_t>(ceil_div(rows, kThreads / 32), 1, int64_t{sms} * std::max(per_sm, 1));
  kernel<<<static_cast<unsigned>(blocks), kThreads, 0, st>>>(
      a.dh.data_as<const GradT>(), src,
      a.row_weight.defined() ? a.row_weight.data_as<const float>() : nullptr, rows, f, rule,
      out.d_gate_up.data.data_as<uint8_t>(), out.d_gate_up.scale_inv.data_as<float>(), amax_bits,
      out.d_row_weight.defined() ? out.d_row_weight.data_as<float>() : nullptr);
  OCTET_CUDA_CHECK_LAUNCH();
  if (a.want_h) swiglu_quantize(ctx, h_quantize_args(a), out.h, nullptr);  // a pass of its own
}

}  // namespace

void swiglu_backward_quantize(Context& ctx, const SwigluBackwardQuantizeArgs& a,
                              SwigluBackwardQuantizeResult& out) {
  namespace k = swiglu_kernels;
  auto run = [&](auto grad_tag) {
    using GradT = decltype(grad_tag);
    if (a.gate_up.defined()) {
      const int64_t n = a.gate_up.cols();
      if (a.gate_up.dtype() == DType::kF32)
        backward_quantize_typed<k::DenseGateUp<float>, GradT>(
            ctx, a, {a.gate_up.data_as<const float>(), n}, a.gate_up.data(), out);
      else
        backward_quantize_typed<k::DenseGateUp<uint16_t>, GradT>(
            ctx, a, {a.gate_up.data_as<const uint16_t>(), n}, a.gate_up.data(), out);
      return;
    }
    // The FP8 copy, read as dh's dtype (swiglu.h).
    const QuantTensor& q = a.gate_up_fp8;
    const int64_t n = q.data.cols();
    backward_quantize_typed<k::Fp8GateUp<GradT>, GradT>(
        ctx, a,
        {q.data.data_as<const uint8_t>(), q.scale_inv.data_as<const float>(), n,
         ceil_div(n, kGroup), q.format},
        q.data.data(), out);
  };
  if (a.dh.dtype() == DType::kF32)
    run(float{});
  else
    run(uint16_t{});
}

}  // namespace octet::cuda
