// Dispatcher for moe_router.h: validates once, allocates outputs, routes to cpu:: or cuda::.
#include "ops/moe_router/moe_router.h"

#include "backend/dispatch.h"
#include "ops/moe_router/moe_router_backends.h"

namespace octet {
namespace {

void check_matrix(const Tensor& t, const char* name, DType dtype, int64_t rows, int64_t cols,
                  Device device) {
  check_dtype(t, name, {dtype});
  check_device(t, name, device);
  OCTET_CHECK(t.rank() >= 1 && t.rows() == rows && t.cols() == cols, name, ": expected shape [",
              rows, ", ", cols, "], got ", shape_str(t.shape()));
}

void check_vector(const Tensor& t, const char* name, DType dtype, int64_t n, Device device) {
  check_dtype(t, name, {dtype});
  check_device(t, name, device);
  OCTET_CHECK(t.numel() == n && t.rank() <= 1, name, ": expected shape [", n, "], got ",
              shape_str(t.shape()));
}

void check_logits(const Tensor& logits, const char* name, int64_t experts, Device device) {
  check_dtype(logits, name, {DType::kF32});
  check_device(logits, name, device);
  OCTET_CHECK(logits.rank() >= 2 && logits.cols() == experts, name, ": expected shape [T, ",
              experts, "] (E = num_experts), got ", shape_str(logits.shape()));
}

}  // namespace

void RouterConfig::validate() const {
  OCTET_CHECK(num_experts >= 1 && num_experts <= 1024,
              "router: num_experts must be in [1, 1024], got ", num_experts);
  OCTET_CHECK(top_k >= 1 && top_k <= 32 && top_k <= num_experts,
              "router: top_k must be in [1, min(32, num_experts = ", num_experts, ")], got ",
              top_k);
  OCTET_CHECK(n_group >= 1 && n_group <= 32 && num_experts % n_group == 0,
              "router: n_group must be in [1, 32] and divide num_experts = ", num_experts, ", got ",
              n_group);
  OCTET_CHECK(n_group == 1 || num_experts / n_group >= 2, "router: n_group = ", n_group,
              " leaves groups of one expert (the group score needs the top 2), num_experts = ",
              num_experts);
  OCTET_CHECK(topk_group >= 1 && topk_group <= n_group,
              "router: topk_group must be in [1, n_group = ", n_group, "], got ", topk_group);
  OCTET_CHECK(mask_fill == GroupMaskFill::kZero || top_k <= topk_group * (num_experts / n_group),
              "router: top_k = ", top_k, " exceeds the ", topk_group * (num_experts / n_group),
              " experts of the kept groups (mask fill exclude)");
  OCTET_CHECK(routed_scaling_factor == routed_scaling_factor && routed_scaling_factor > 0.0f &&
                  routed_scaling_factor < 3.4e38f,
              "router: routed_scaling_factor must be finite and > 0, got ", routed_scaling_factor);
}

RouterOutput moe_router_forward(Context& ctx, const RouterForwardArgs& args) {
  const RouterConfig& c = args.config;
  c.validate();
  check_logits(args.logits, "router logits", c.num_experts, ctx.device);
  check_vector(args.bias, "router e_score_correction_bias", DType::kF32, c.num_experts, ctx.device);
  const int64_t tokens = args.logits.rows();
  RouterOutput out;
  out.topk_idx = Tensor::empty(ctx, {tokens, c.top_k}, DType::kI32);
  out.topk_weight = Tensor::empty(ctx, {tokens, c.top_k}, DType::kF32);
  out.counts = Tensor::empty(ctx, {c.num_experts}, DType::kI32);
  OCTET_DISPATCH(ctx, moe_router_forward, ctx, args, out);
  return out;
}

Tensor moe_router_backward(Context& ctx, const RouterBackwardArgs& args) {
  const RouterConfig& c = args.config;
  c.validate();
  check_logits(args.logits, "router backward logits", c.num_experts, ctx.device);
  const int64_t tokens = args.logits.rows();
  check_matrix(args.topk_idx, "router backward topk_idx", DType::kI32, tokens, c.top_k, ctx.device);
  check_matrix(args.d_topk_weight, "router backward d_topk_weight", DType::kF32, tokens, c.top_k,
               ctx.device);
  Tensor d_logits = Tensor::empty(ctx, args.logits.shape(), DType::kF32);
  OCTET_DISPATCH(ctx, moe_router_backward, ctx, args, d_logits);
  return d_logits;
}

void moe_router_bias_update(Context& ctx, const RouterBiasUpdateArgs& args) {
  check_dtype(args.bias, "router bias update: bias", {DType::kF32});
  check_device(args.bias, "router bias update: bias", ctx.device);
  const int64_t experts = args.bias.numel();
  OCTET_CHECK(experts >= 1 && args.bias.rank() == 1, "router bias update: bias must be (E), got ",
              shape_str(args.bias.shape()));
  check_vector(args.counts, "router bias update: counts", DType::kI32, experts, ctx.device);
  OCTET_CHECK(args.rate == args.rate && args.rate >= 0.0f && args.rate < 3.4e38f,
              "router bias update: rate must be finite and >= 0, got ", args.rate);
  OCTET_DISPATCH(ctx, moe_router_bias_update, ctx, args);
}

namespace {
void check_balance_args(Context& ctx, const SeqBalanceLossArgs& args) {
  check_dtype(args.logits, "balance loss logits", {DType::kF32});
  check_device(args.logits, "balance loss logits", ctx.device);
  OCTET_CHECK(args.logits.rank() >= 2 && args.logits.cols() >= 1,
              "balance loss logits: expected shape [B * T, E], got ",
              shape_str(args.logits.shape()));
  const int64_t rows = args.logits.rows();
  OCTET_CHECK(args.num_sequences >= 1 && rows % args.num_sequences == 0 && rows > 0,
              "balance loss: num_sequences = ", args.num_sequences, " must divide the ", rows,
              " token rows of the logits (and there must be at least one)");
  check_dtype(args.topk_idx, "balance loss topk_idx", {DType::kI32});
  check_device(args.topk_idx, "balance loss topk_idx", ctx.device);
  OCTET_CHECK(
      args.topk_idx.rank() >= 2 && args.topk_idx.rows() == rows && args.topk_idx.cols() >= 1,
      "balance loss topk_idx: expected shape [", rows, ", k], got ",
      shape_str(args.topk_idx.shape()));
  OCTET_CHECK(args.alpha == args.alpha && args.alpha >= 0.0f && args.alpha < 3.4e38f,
              "balance loss: alpha must be finite and >= 0, got ", args.alpha);
}
}  // namespace

Tensor moe_seq_balance_loss_forward(Context& ctx, const SeqBalanceLossArgs& args) {
  check_balance_args(ctx, args);
  Tensor loss = Tensor::empty(ctx, {1}, DType::kF32);
  OCTET_DISPATCH(ctx, moe_seq_balance_loss_forward, ctx, args, loss);
  return loss;
}

void moe_seq_balance_loss_backward(Context& ctx, const SeqBalanceLossArgs& args, float d_loss,
                                   Tensor& d_logits) {
  check_balance_args(ctx, args);
  check_matrix(d_logits, "balance loss d_logits", DType::kF32, args.logits.rows(),
               args.logits.cols(), ctx.device);
  OCTET_CHECK(d_loss == d_loss && d_loss > -3.4e38f && d_loss < 3.4e38f,
              "balance loss backward: d_loss must be finite, got ", d_loss);
  OCTET_DISPATCH(ctx, moe_seq_balance_loss_backward, ctx, args, d_loss, d_logits);
}

}  // namespace octet
