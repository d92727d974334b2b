// CUDA launchers of the rmsnorm family (device code in rmsnorm_kernels.cuh). Arguments were
// validated by rmsnorm.cpp; everything is enqueued on the context's stream, nothing synchronises
// with the host.
#include <algorithm>
#include <cstdint>

#include "backend/cuda_check.h"
#include "numerics/scale.h"
#include "ops/cast/cast_backends.h"
#include "ops/rmsnorm/rmsnorm_backends.h"
#include "ops/rmsnorm/rmsnorm_kernels.cuh"

namespace octet::cuda {
namespace {

namespace k = rmsnorm_kernels;

// The dw partition: parts of at least kMinRowsPerPart rows, at most kMaxParts of them. A function
// of the row count alone, so dw has the same bits on every GPU (rmsnorm.h).
constexpr int64_t kMinRowsPerPart = 8;
constexpr int64_t kMaxParts = 512;
// Blocks beyond this run as a grid-stride loop (keeps grid.x far below its limit).
constexpr int64_t kMaxForwardBlocks = int64_t{1} << 20;

cudaStream_t stream_of(const Context& ctx) {
  return static_cast<cudaStream_t>(ctx.stream);
}

// Narrow rows do not fill 256 threads; wide rows need them to keep enough loads in flight.
bool wide(int64_t d) {
  return d >= 1024;
}

template <typename XT, typename YT, int kThreads>
void launch_forward(Context& ctx, const RmsNormForwardArgs& a) {
  const int64_t rows = a.x.rows(), d = a.x.cols();
  const auto grid = static_cast<unsigned>(std::min(rows, kMaxForwardBlocks));
  k::rmsnorm_forward_kernel<XT, YT, kThreads><<<grid, kThreads, 0, stream_of(ctx)>>>(
      a.x.data_as<const XT>(), a.weight.data_as<const float>(), rows, d, a.epsilon,
      a.y.data_as<YT>(), a.rstd.data_as<float>());
  OCTET_CUDA_CHECK_LAUNCH();
}

bool aligned16(const Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data()) % 16 == 0;
}

// The vectorised BF16 kernels: every tensor BF16 (the weight F32), D a multiple of 8, 16-byte
// aligned rows.
bool bf16x8(const Tensor& x, std::initializer_list<const Tensor*> others, const Tensor& w) {
  if (x.dtype() != DType::kBF16 || x.cols() % k::kVec != 0 || !aligned16(x) || !aligned16(w))
    return false;
  for (const Tensor* t : others)
    if (t->defined() && (t->dtype() != DType::kBF16 || !aligned16(*t))) return false;
  return true;
}

// The dw partition of the vectorised backward: parts of at least 128 rows, at most 128 parts; a
// function of the row count alone.
constexpr int64_t kMinRowsPerPartX8 = 128;
constexpr int64_t kMaxPartsX8 = 128;

void forward_bf16x8(Context& ctx, const RmsNormForwardArgs& a) {
  const int64_t rows = a.x.rows(), d = a.x.cols();
  const auto grid = static_cast<unsigned>(ceil_div(rows, int64_t{k::kRowWarps}));
  k::rmsnorm_forward_bf16x8_kernel<<<grid, k::kRowWarps * 32, 0, stream_of(ctx)>>>(
      a.x.data_as<uint16_t>(),
      a.residual.defined() ? a.residual.data_as<const uint16_t>() : nullptr,
      a.weight.data_as<const float>(), rows, d, a.epsilon, a.y.data_as<uint16_t>(),
      a.rstd.data_as<float>());
  OCTET_CUDA_CHECK_LAUNCH();
}

void backward_bf16x8(Context& ctx, const RmsNormBackwardArgs& a) {
  const int64_t rows = a.x.rows(), d = a.x.cols();
  const cudaStream_t st = stream_of(ctx);
  const auto grid = static_cast<unsigned>(ceil_div(rows, int64_t{k::kRowWarps}));
  k::rmsnorm_backward_bf16x8_kernel<<<grid, k::kRowWarps * 32, 0, st>>>(
      a.dy.data_as<const uint16_t>(), a.x.data_as<const uint16_t>(),
      a.weight.data_as<const float>(), a.rstd.data_as<const float>(),
      a.residual_grad.defined() ? a.residual_grad.data_as<const uint16_t>() : nullptr, rows, d,
      a.dx.data_as<uint16_t>());
  OCTET_CUDA_CHECK_LAUNCH();
  int64_t parts = std::min(ceil_div(rows, kMinRowsPerPartX8), kMaxPartsX8);
  const int64_t rows_per_part = ceil_div(rows, parts);
  parts = ceil_div(rows, rows_per_part);
  Tensor partials = Tensor::empty(ctx, {parts, d}, DType::kF32);  // freed stream-ordered after use
  const dim3 dw_grid(static_cast<unsigned>(ceil_div(d, int64_t{k::kVecColumns})),
                     static_cast<unsigned>(parts));
  k::rmsnorm_dweight_bf16x8_kernel<<<dw_grid, k::kRowWarps * 32, 0, st>>>(
      a.dy.data_as<const uint16_t>(), a.x.data_as<const uint16_t>(), a.rstd.data_as<const float>(),
      rows, d, rows_per_part, partials.data_as<float>());
  OCTET_CUDA_CHECK_LAUNCH();
  k::rmsnorm_dweight_reduce_x8_kernel<<<static_cast<unsigned>(ceil_div(d, int64_t{32})), 256, 0,
                                        st>>>(partials.data_as<const float>(), parts, d,
                                              a.dweight.data_as<float>());
  OCTET_CUDA_CHECK_LAUNCH();
}

template <typename XT, typename YT>
void forward_typed(Context& ctx, const RmsNormForwardArgs& a) {
  if (wide(a.x.cols()))
    launch_forward<XT, YT, 256>(ctx, a);
  else
    launch_forward<XT, YT, 64>(ctx, a);
}

template <typename XT, typename GT, int kThreads>
void launch_backward(Context& ctx, const RmsNormBackwardArgs& a) {
  const int64_t rows = a.x.rows(), d = a.x.cols();
  const cudaStream_t st = stream_of(ctx);
  int64_t parts = std::min(ceil_div(rows, kMinRowsPerPart), kMaxParts);
  const int64_t rows_per_part = ceil_div(rows, parts);
  parts = ceil_div(rows, rows_per_part);

  auto kernel = k::rmsnorm_backward_kernel<XT, GT, kThreads>;
  const int64_t smem = d * static_cast<int64_t>(sizeof(float));
  int optin = 0;
  OCTET_CUDA_CHECK(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx.device_index));
  const int64_t static_smem = (kThreads / 32) * static_cast<int64_t>(sizeof(float));
  OCTET_CHECK(smem + static_smem <= optin, "rmsnorm backward: D = ", d, " needs ", smem,
              " bytes of shared memory for the dw partial; this GPU allows ", optin - static_smem);
  OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));

  Tensor partials = Tensor::empty(ctx, {parts, d}, DType::kF32);  // freed stream-ordered after use
  kernel<<<static_cast<unsigned>(parts), kThreads, static_cast<size_t>(smem), st>>>(
      a.dy.data_as<const GT>(), a.x.data_as<const XT>(), a.weight.data_as<const float>(),
      a.rstd.data_as<const float>(), rows, d, rows_per_part, a.dx.data_as<GT>(),
      partials.data_as<float>());
  OCTET_CUDA_CHECK_LAUNCH();
  k::rmsnorm_dweight_reduce_kernel<<<static_cast<unsigned>(ceil_div(d, 256)), 256, 0, st>>>(
      partials.data_as<const float>(), parts, d, a.dweight.data_as<float>());
  OCTET_CUDA_CHECK_LAUNCH();
}

template <typename XT, typename GT>
void backward_typed(Context& ctx, const RmsNormBackwardArgs& a) {
  if (wide(a.x.cols()))
    launch_backward<XT, GT, 256>(ctx, a);
  else
    launch_backward<XT, GT, 64>(ctx, a);
}

}  // namespace

void rmsnorm_forward(Context& ctx, const RmsNormForwardArgs& a) {
  if (bf16x8(a.x, {&a.y, &a.residual}, a.weight)) return forward_bf16x8(ctx, a);
  if (a.residual.defined()) add_into(ctx, a.x, a.residual);  // the general path: add, then norm
  const bool xf = a.x.dtype() == DType::kF32, yf = a.y.dtype() == DType::kF32;
  if (xf && yf)
    forward_typed<float, float>(ctx, a);
  else if (xf)
    forward_typed<float, uint16_t>(ctx, a);
  else if (yf)
    forward_typed<uint16_t, float>(ctx, a);
  else
    forward_typed<uint16_t, uint16_t>(ctx, a);
}

void rmsnorm_backward(Context& ctx, const RmsNormBackwardArgs& a) {
  if (bf16x8(a.x, {&a.dy, &a.dx, &a.residual_grad}, a.weight)) return backward_bf16x8(ctx, a);
  const bool xf = a.x.dtype() == DType::kF32, gf = a.dy.dtype() == DType::kF32;
  if (xf && gf)
    backward_typed<float, float>(ctx, a);
  else if (xf)
    backward_typed<float, uint16_t>(ctx, a);
  else if (gf)
    backward_typed<uint16_t, float>(ctx, a);
  else
    backward_typed<uint16_t, uint16_t>(ctx, a);
  if (a.residual_grad.defined()) add_into(ctx, a.dx, a.residual_grad);  // the general path
}

}  // namespace octet::cuda
