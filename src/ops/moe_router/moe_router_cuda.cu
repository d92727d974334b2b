// CUDA launchers of the moe_router family (device code in moe_router_kernels.cuh). Arguments were
// validated and outputs allocated by moe_router.cpp; everything is enqueued on the context's stream
// and nothing synchronises with the host.
#include <algorithm>
#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda_check.h"
#include "numerics/scale.h"  // ceil_div
#include "ops/moe_router/moe_router_backends.h"
#include "ops/moe_router/moe_router_kernels.cuh"

namespace octet::cuda {
namespace {

cudaStream_t stream_of(const Context& ctx) {
  return static_cast<cudaStream_t>(ctx.stream);
}

unsigned blocks_for(int64_t n, int threads) {
  const int64_t b = std::max<int64_t>(1, ceil_div(n, threads));
  OCTET_CHECK(b <= 0x7FFFFFFF, "router: ", n, " work items exceed the grid limit");
  return static_cast<unsigned>(b);
}

int sm_count(const Context& ctx) {
  int sms = 0;
  OCTET_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx.device_index));
  return std::max(sms, 1);
}

kernels::RouterParams params_of(const RouterConfig& c) {
  kernels::RouterParams p;
  p.experts = static_cast<int>(c.num_experts);
  p.top_k = static_cast<int>(c.top_k);
  p.n_group = static_cast<int>(c.n_group);
  p.topk_group = static_cast<int>(c.topk_group);
  p.norm = c.norm == TopkNorm::kSumToOne;
  p.exclude = c.mask_fill == GroupMaskFill::kExclude;
  p.scaling = c.routed_scaling_factor;
  return p;
}

// Per-token score sums and per-(sequence, expert) counts of the balance loss, in scratch tensors.
struct BalanceScratch {
  Tensor score_sum;  // (rows) f32
  Tensor counts;     // (B, E) int32
};

BalanceScratch balance_stats(Context& ctx, const SeqBalanceLossArgs& a, float* share) {
  const int64_t rows = a.logits.rows(), E = a.logits.cols(), k = a.topk_idx.cols();
  OCTET_CHECK(E <= 8192, "balance loss: ", E,
              " experts exceed the CUDA kernels' 8192 (a token's scores are staged in shared "
              "memory; the router allows 1024)");
  BalanceScratch s{Tensor::empty(ctx, {rows}, DType::kF32),
                   Tensor::empty(ctx, {a.num_sequences, E}, DType::kI32)};
  ctx.be().memset(s.counts.data(), 0, s.counts.nbytes());
  const int tile = kernels::balance_tile_tokens(static_cast<int>(E));
  const size_t smem = sizeof(float) * (static_cast<size_t>(tile) * static_cast<size_t>(E + 2) +
                                       kernels::kBalanceHist);
  kernels::balance_stats_kernel<<<blocks_for(rows, tile), kernels::kBalanceThreads, smem,
                                  stream_of(ctx)>>>(
      a.logits.data_as<const float>(), a.topk_idx.data_as<const int32_t>(), rows,
      static_cast<int>(E), static_cast<int>(k), rows / a.num_sequences,
      s.score_sum.data_as<float>(), s.counts.data_as<int32_t>(), share);
  OCTET_CUDA_CHECK_LAUNCH();
  return s;
}

}  // namespace

void moe_router_forward(Context& ctx, const RouterForwardArgs& args, RouterOutput& out) {
  const RouterConfig& c = args.config;
  const int64_t tokens = args.logits.rows();
  const cudaStream_t st = stream_of(ctx);
  ctx.be().memset(out.counts.data(), 0, out.counts.nbytes());
  if (tokens == 0) return;
  static_assert(kernels::kMaxExperts >= 1024, "RouterConfig::validate allows up to 1024 experts");
  // Per warp the scores and candidates, then the block's histogram (E ints).
  const size_t smem =
      sizeof(float) * (2 * kernels::kRouterWarps + 1) * static_cast<size_t>(c.num_experts);
  const unsigned grid = std::min(blocks_for(tokens, kernels::kRouterWarps), 16u * sm_count(ctx));
  kernels::router_forward_kernel<<<grid, 32 * kernels::kRouterWarps, smem, st>>>(
      args.logits.data_as<const float>(), args.bias.data_as<const float>(), tokens, params_of(c),
      out.topk_idx.data_as<int32_t>(), out.topk_weight.data_as<float>(),
      out.counts.data_as<int32_t>());
  OCTET_CUDA_CHECK_LAUNCH();
}

void moe_router_backward(Context& ctx, const RouterBackwardArgs& args, Tensor& d_logits) {
  const int64_t tokens = args.logits.rows();
  const cudaStream_t st = stream_of(ctx);
  ctx.be().memset(d_logits.data(), 0, d_logits.nbytes());
  if (tokens == 0) return;
  kernels::router_backward_kernel<<<blocks_for(tokens, 128), 128, 0, st>>>(
      args.logits.data_as<const float>(), args.topk_idx.data_as<const int32_t>(),
      args.d_topk_weight.data_as<const float>(), tokens, params_of(args.config),
      d_logits.data_as<float>());
  OCTET_CUDA_CHECK_LAUNCH();
}

void moe_router_bias_update(Context& ctx, const RouterBiasUpdateArgs& args) {
  kernels::router_bias_update_kernel<<<1, 1024, 0, stream_of(ctx)>>>(
      args.bias.data_as<float>(), args.counts.data_as<const int32_t>(),
      static_cast<int>(args.bias.numel()), args.rate);
  OCTET_CUDA_CHECK_LAUNCH();
}

void moe_seq_balance_loss_forward(Context& ctx, const SeqBalanceLossArgs& args, Tensor& loss) {
  const int64_t rows = args.logits.rows(), E = args.logits.cols(), k = args.topk_idx.cols();
  const int64_t B = args.num_sequences;
  Tensor share = Tensor::empty(ctx, {rows, E}, DType::kF32);
  const BalanceScratch s = balance_stats(ctx, args, share.data_as<float>());
  Tensor terms = Tensor::empty(ctx, {B * E}, DType::kI64);  // FP64 storage (no F64 dtype)
  OCTET_CHECK(B <= 0x7FFFFFFF, "balance loss: ", B, " sequences exceed the grid limit");
  const dim3 grid(static_cast<unsigned>(B), static_cast<unsigned>(ceil_div(E, int64_t{32})));
  kernels::balance_terms_kernel<<<grid, kernels::kBalanceThreads, 0, stream_of(ctx)>>>(
      share.data_as<const float>(), s.counts.data_as<const int32_t>(), static_cast<int>(E),
      static_cast<int>(k), rows / B, terms.data_as<double>());
  OCTET_CUDA_CHECK_LAUNCH();
  kernels::balance_sum_kernel<<<1, 256, 0, stream_of(ctx)>>>(terms.data_as<const double>(), B * E,
                                                             static_cast<double>(args.alpha), B,
                                                             loss.data_as<float>());
  OCTET_CUDA_CHECK_LAUNCH();
}

void moe_seq_balance_loss_backward(Context& ctx, const SeqBalanceLossArgs& args, float d_loss,
                                   Tensor& d_logits) {
  const int64_t rows = args.logits.rows(), E = args.logits.cols(), k = args.topk_idx.cols();
  const int64_t B = args.num_sequences, T = rows / B;
  const BalanceScratch s = balance_stats(ctx, args, nullptr);
  // The same FP64 operations, in the same order, as the CPU reference.
  const double num = rn::mul(rn::mul(static_cast<double>(d_loss), static_cast<double>(args.alpha)),
                             static_cast<double>(E));
  const double denom = rn::mul(
      rn::mul(rn::mul(static_cast<double>(k), static_cast<double>(T)), static_cast<double>(T)),
      static_cast<double>(B));
  Tensor coef = Tensor::empty(ctx, {B, E}, DType::kF32);
  kernels::balance_coef_kernel<<<blocks_for(B * E, 256), 256, 0, stream_of(ctx)>>>(
      s.counts.data_as<const int32_t>(), B * E, num, denom, coef.data_as<float>());
  OCTET_CUDA_CHECK_LAUNCH();
  const int tile = kernels::balance_tile_tokens(static_cast<int>(E));
  const size_t smem = sizeof(float) * static_cast<size_t>(tile) * static_cast<size_t>(E + 2);
  kernels::balance_backward_kernel<<<blocks_for(rows, tile), kernels::kBalanceThreads, smem,
                                     stream_of(ctx)>>>(
      args.logits.data_as<const float>(), s.score_sum.data_as<const float>(),
      coef.data_as<const float>(), rows, static_cast<int>(E), T, d_logits.data_as<float>());
  OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace octet::cuda
