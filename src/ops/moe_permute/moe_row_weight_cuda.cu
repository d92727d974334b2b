// CUDA launchers and kernels of moe_row_weight.h: one thread per (token, slot), enqueued on the
// context's stream, no host sync.
#include <algorithm>
#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda_check.h"
#include "ops/moe_permute/moe_row_weight.h"

namespace octet::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void moe_permute_weights_kernel(const int32_t* __restrict__ row_of,
                                           const float* __restrict__ topk_weight, int64_t n,
                                           float* __restrict__ w_rows) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    if (row_of[i] >= 0) w_rows[row_of[i]] = topk_weight[i];
}

__global__ void moe_permute_weights_backward_kernel(const int32_t* __restrict__ row_of,
                                                    const float* __restrict__ d_rows, int64_t n,
                                                    float* __restrict__ d_topk_weight) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    d_topk_weight[i] = row_of[i] >= 0 ? d_rows[row_of[i]] : 0.0f;
}

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>(ceil_div(n, int64_t{kThreads}), 1, 1 << 16));
}

}  // namespace

void moe_permute_weights(Context& ctx, const PermuteMap& map, const Tensor& topk_weight,
                         Tensor& w_rows) {
  const auto st = static_cast<cudaStream_t>(ctx.stream);
  ctx.be().memset(w_rows.data(), 0, w_rows.nbytes());  // padding rows 0.0
  const int64_t n = map.num_tokens * map.top_k;
  if (n == 0) return;
  moe_permute_weights_kernel<<<blocks_for(n), kThreads, 0, st>>>(
      map.row_of.data_as<const int32_t>(), topk_weight.data_as<const float>(), n,
      w_rows.data_as<float>());
  OCTET_CUDA_CHECK_LAUNCH();
}

void moe_permute_weights_backward(Context& ctx, const PermuteMap& map, const Tensor& d_rows,
                                  Tensor& d_topk_weight) {
  const int64_t n = map.num_tokens * map.top_k;
  moe_permute_weights_backward_kernel<<<blocks_for(n), kThreads, 0,
                                        static_cast<cudaStream_t>(ctx.stream)>>>(
      map.row_of.data_as<const int32_t>(), d_rows.data_as<const float>(), n,
      d_topk_weight.data_as<float>());
  OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace octet::cuda
