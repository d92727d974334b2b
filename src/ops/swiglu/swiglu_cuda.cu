// CUDA launchers of the swiglu family (device code in swiglu_vec_kernels.cuh when F % 8 == 0 and
// the buffers are 16-byte aligned, else swiglu_kernels.cuh's scalar kernels; both give the same
// bits; swiglu_cache_kernels.cuh for swiglu_quantize_caching_input; gate_up read through
// swiglu_gate_up.cuh's sources, the tensor or its FP8 copy). Arguments were validated by swiglu.cpp; everything is enqueued on the context's stream,
// nothing synchronises with the host.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "backend/backend.h"
#include "backend/cuda_check.h"
#include "ops/swiglu/swiglu_backends.h"
#include "ops/swiglu/swiglu_cache_kernels.cuh"

namespace octet::cuda {
namespace {

namespace k = swiglu_kernels;

constexpr int kThreads = 256;
constexpr int kPerThread = 4;         // columns per thread per row: 1024 per block
constexpr int64_t kMaxGridY = 65535;  // CUDA's limit on gridDim.y; more rows loop inside the kernel
constexpr int kQuantThreads = 256;

cudaStream_t stream_of(const Context& ctx) {
  return static_cast<cudaStream_t>(ctx.stream);
}

// The vectorised kernels need 8-column chunks that start on 16 bytes.
bool vectorizable(int64_t f, std::initializer_list<const void*> ptrs) {
  if (f % k::kChunk != 0) return false;
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// A persistent grid: as many blocks of `threads` as the SMs hold at once, at most `want`.
template <typename Kernel>
unsigned persistent_blocks(const Context& ctx, Kernel kernel, int threads, int64_t want,
                           size_t smem = 0) {
  int per_sm = 0, sms = 0;
  OCTET_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  OCTET_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx.device_index));
  return static_cast<unsigned>(std::clamp<int64_t>(want, 1, int64_t{sms} * std::max(per_sm, 1)));
}

dim3 elementwise_grid(int64_t rows, int64_t f) {
  return dim3(static_cast<unsigned>(ceil_div(f, int64_t{kThreads} * kPerThread)),
              static_cast<unsigned>(std::min(rows, kMaxGridY)));
}

template <typename InT, typename OutT>
void forward_typed(Context& ctx, const SwigluForwardArgs& a) {
  const int64_t rows = a.h.rows(), f = a.h.cols();
  if (vectorizable(f, {a.gate_up.data(), a.h.data()})) {
    auto kernel = k::swiglu_forward_vec_kernel<InT, OutT, kThreads>;
    const unsigned blocks =
        persistent_blocks(ctx, kernel, kThreads, ceil_div(rows * (f / k::kChunk), 2 * kThreads));
    kernel<<<blocks, kThreads, 0, stream_of(ctx)>>>(a.gate_up.data_as<const InT>(), rows, f,
                                                    a.h.data_as<OutT>());
    OCTET_CUDA_CHECK_LAUNCH();
    return;
  }
  k::swiglu_forward_kernel<InT, OutT, kThreads, kPerThread>
      <<<elementwise_grid(rows, f), kThreads, 0, stream_of(ctx)>>>(a.gate_up.data_as<const InT>(),
                                                                   rows, f, a.h.data_as<OutT>());
  OCTET_CUDA_CHECK_LAUNCH();
}

// gate_up's source for the kernels (swiglu_gate_up.cuh): the tensor, or its FP8 copy read as
// `as`. Calls fn(src, data pointer) with the source typed for its element type.
template <typename Fn>
void with_gate_up(const Tensor& gu, const QuantTensor& q, DType as, Fn&& fn) {
  if (gu.defined()) {
    const int64_t n = gu.cols();
    if (gu.dtype() == DType::kF32)
      fn(k::DenseGateUp<float>{gu.data_as<const float>(), n}, gu.data());
    else
      fn(k::DenseGateUp<uint16_t>{gu.data_as<const uint16_t>(), n}, gu.data());
    return;
  }
  const int64_t n = q.data.cols();
  const auto* codes = q.data.data_as<const uint8_t>();
  const auto* scales = q.scale_inv.data_as<const float>();
  const int64_t groups = ceil_div(n, kGroup);
  if (as == DType::kF32)
    fn(k::Fp8GateUp<float>{codes, scales, n, groups, q.format}, q.data.data());
  else
    fn(k::Fp8GateUp<uint16_t>{codes, scales, n, groups, q.format}, q.data.data());
}

template <typename GradT>
void backward_typed(Context& ctx, const SwigluBackwardArgs& a) {
  const int64_t rows = a.dh.rows(), f = a.dh.cols();
  with_gate_up(a.gate_up, a.gate_up_fp8, a.dh.dtype(), [&](auto src, const void* gu_ptr) {
    using Src = decltype(src);
    if (vectorizable(f, {a.dh.data(), gu_ptr, a.d_gate_up.data()})) {
      auto kernel = src.e4m3() ? k::swiglu_backward_vec_kernel<Src, GradT, kThreads, true>
                               : k::swiglu_backward_vec_kernel<Src, GradT, kThreads, false>;
      const unsigned blocks =
          persistent_blocks(ctx, kernel, kThreads, ceil_div(rows * (f / k::kChunk), 2 * kThreads));
      kernel<<<blocks, kThreads, 0, stream_of(ctx)>>>(a.dh.data_as<const GradT>(), src, rows, f,
                                                      a.d_gate_up.data_as<GradT>());
      OCTET_CUDA_CHECK_LAUNCH();
      return;
    }
    k::swiglu_backward_kernel<Src, GradT, kThreads, kPerThread>
        <<<elementwise_grid(rows, f), kThreads, 0, stream_of(ctx)>>>(
            a.dh.data_as<const GradT>(), src, rows, f, a.d_gate_up.data_as<GradT>());
    OCTET_CUDA_CHECK_LAUNCH();
  });
}

void quantize_any(Context& ctx, const SwigluQuantizeArgs& a, QuantTensor& out) {
  const int64_t rows = out.data.rows(), f = out.data.cols();
  const cudaStream_t st = stream_of(ctx);
  uint32_t* amax_bits = zeroed_amax_bits(ctx, out);  // null: not wanted
  const ScaleRule rule{
      .format = a.format, .rounding = a.rounding, .epsilon = a.epsilon, .margin = 0};
  const int64_t groups = rows * ceil_div(f, kGroup);
  const float* w = a.row_weight.defined() ? a.row_weight.data_as<const float>() : nullptr;
  with_gate_up(a.gate_up, a.gate_up_fp8, a.gate_up_dtype, [&](auto src, const void* gu_ptr) {
    using Src = decltype(src);
    auto launch = [&](auto kernel, int64_t want) {
      kernel<<<persistent_blocks(ctx, kernel, kQuantThreads, want), kQuantThreads, 0, st>>>(
          src, rows, f, w, rule, out.data.data_as<uint8_t>(), out.scale_inv.data_as<float>(),
          amax_bits);
      OCTET_CUDA_CHECK_LAUNCH();
    };
    const bool vec = vectorizable(f, {gu_ptr, out.data.data()});
    const int64_t steps = ceil_div(f / k::kChunk, int64_t{32});  // a warp's 8-column steps a row
    const int64_t row_warps = ceil_div(rows, int64_t{kQuantThreads / 32});
    // A warp per row, the whole row in flight; the rule fixed at compile time where it allows.
    auto launch_row = [&](auto it) {
      constexpr int kIt = decltype(it)::value;
      if (k::e4m3_pow2(rule) && src.e4m3())
        launch(k::swiglu_quantize_1x128_row_kernel<Src, kQuantThreads, kIt, true>, row_warps);
      else
        launch(k::swiglu_quantize_1x128_row_kernel<Src, kQuantThreads, kIt, false>, row_warps);
    };
    if (vec && steps == 1)
      launch_row(std::integral_constant<int, 1>{});
    else if (vec && steps == 2)
      launch_row(std::integral_constant<int, 2>{});
    else if (vec && steps == 3)
      launch_row(std::integral_constant<int, 3>{});
    else if (vec && steps == 4)
      launch_row(std::integral_constant<int, 4>{});
    else if (vec && k::e4m3_pow2(rule) && src.e4m3())  // a warp per 2 groups, 2 in flight
      launch(k::swiglu_quantize_1x128_vec_kernel<Src, kQuantThreads, true>,
             ceil_div(groups, 4 * (kQuantThreads / 32)));
    else if (vec)
      launch(k::swiglu_quantize_1x128_vec_kernel<Src, kQuantThreads, false>,
             ceil_div(groups, 4 * (kQuantThreads / 32)));
    else  // a warp per group
      launch(k::swiglu_quantize_1x128_kernel<Src, kQuantThreads>,
             ceil_div(groups, kQuantThreads / 32));
  });
}

// swiglu_quantize_caching_input: a warp per row writes both copies (swiglu_cache_kernels.cuh).
template <typename InT>
void quantize_caching_typed(Context& ctx, const SwigluQuantizeArgs& a, QuantTensor& out,
                            QuantTensor& gu_out) {
  const int64_t rows = a.gate_up.rows(), f = a.gate_up.cols() / 2;
  const cudaStream_t st = stream_of(ctx);
  const k::QuantOut h{
      out.data.data_as<uint8_t>(), out.scale_inv.data_as<float>(), zeroed_amax_bits(ctx, out),
      ScaleRule{.format = a.format, .rounding = a.rounding, .epsilon = a.epsilon, .margin = 0}};
  const k::QuantOut g{
      gu_out.data.data_as<uint8_t>(), gu_out.scale_inv.data_as<float>(),
      zeroed_amax_bits(ctx, gu_out),
      ScaleRule{
          .format = gu_out.format, .rounding = gu_out.rounding, .epsilon = 0.0f, .margin = 0}};
  const float* w = a.row_weight.defined() ? a.row_weight.data_as<const float>() : nullptr;
  auto launch = [&](auto kernel) {
    const int64_t want = ceil_div(rows, kQuantThreads / 32);
    kernel<<<persistent_blocks(ctx, kernel, kQuantThreads, want), kQuantThreads, 0, st>>>(
        a.gate_up.data_as<const InT>(), rows, f, w, h, g);
    OCTET_CUDA_CHECK_LAUNCH();
  };
  // The rule fixed at compile time where both outputs allow it.
  const bool fixed = k::e4m3_pow2(h.rule) && k::e4m3_pow2(g.rule);
  auto launch_row = [&](auto it) {
    constexpr int kIt = decltype(it)::value;
    if (fixed)
      launch(k::swiglu_quantize_cache_1x128_row_kernel<InT, kQuantThreads, kIt, true>);
    else
      launch(k::swiglu_quantize_cache_1x128_row_kernel<InT, kQuantThreads, kIt, false>);
  };
  if (vectorizable(f, {a.gate_up.data(), out.data.data(), gu_out.data.data()})) {
    switch (ceil_div(f / k::kChunk, 32)) {  // steps of 32 chunks in a row (F <= 1024: in registers)
      case 1:
        launch_row(std::integral_constant<int, 1>{});
        break;
      case 2:
        launch_row(std::integral_constant<int, 2>{});
        break;
      case 3:
        launch_row(std::integral_constant<int, 3>{});
        break;
      case 4:
        launch_row(std::integral_constant<int, 4>{});
        break;
      default:
        if (fixed)
          launch(k::swiglu_quantize_cache_1x128_vec_kernel<InT, kQuantThreads, true>);
        else
          launch(k::swiglu_quantize_cache_1x128_vec_kernel<InT, kQuantThreads, false>);
    }
  } else
    launch(k::swiglu_quantize_cache_1x128_kernel<InT, kQuantThreads>);
}

}  // namespace

void swiglu_forward(Context& ctx, const SwigluForwardArgs& a) {
  const bool in_f = a.gate_up.dtype() == DType::kF32, out_f = a.h.dtype() == DType::kF32;
  if (in_f && out_f)
    forward_typed<float, float>(ctx, a);
  else if (in_f)
    forward_typed<float, uint16_t>(ctx, a);
  else if (out_f)
    forward_typed<uint16_t, float>(ctx, a);
  else
    forward_typed<uint16_t, uint16_t>(ctx, a);
}

void swiglu_backward(Context& ctx, const SwigluBackwardArgs& a) {
  if (a.dh.dtype() == DType::kF32)
    backward_typed<float>(ctx, a);
  else
    backward_typed<uint16_t>(ctx, a);
}

void swiglu_quantize(Context& ctx, const SwigluQuantizeArgs& a, QuantTensor& out,
                     QuantTensor* gate_up_out) {
  if (gate_up_out == nullptr)
    quantize_any(ctx, a, out);
  else if (a.gate_up.dtype() == DType::kF32)
    quantize_caching_typed<float>(ctx, a, out, *gate_up_out);
  else
    quantize_caching_typed<uint16_t>(ctx, a, out, *gate_up_out);
}

}  // namespace octet::cuda
