// Dispatcher for cross_entropy.h: validates once, routes to cpu:: or cuda::.
#include "ops/cross_entropy/cross_entropy.h"

#include "backend/backend.h"
#include "backend/dispatch.h"
#include "ops/cross_entropy/cross_entropy_backends.h"

namespace octet {
namespace {

void check_tensor(Context& ctx, const Tensor& t, const char* name,
                  std::initializer_list<DType> dtypes, const Shape& want) {
  OCTET_CHECK(t.data() != nullptr || t.numel() == 0, name, ": tensor has no storage");
  check_dtype(t, name, dtypes);
  check_device(t, name, ctx.device);
  OCTET_CHECK(t.shape() == want, name, ": expected shape ", shape_str(want), ", got ",
              shape_str(t.shape()));
}

// logits and targets, shared by both directions; returns rows.
int64_t check_inputs(Context& ctx, const Tensor& logits, const Tensor& targets) {
  OCTET_CHECK(logits.rank() >= 1 && logits.cols() >= 1,
              "cross_entropy logits: expected shape (rows, V) with V >= 1, got ",
              shape_str(logits.shape()));
  OCTET_CHECK(logits.cols() < (int64_t{1} << 31), "cross_entropy logits: V = ", logits.cols(),
              " exceeds int32 targets");
  check_tensor(ctx, logits, "cross_entropy logits", {DType::kBF16, DType::kF32}, logits.shape());
  check_tensor(ctx, targets, "cross_entropy targets", {DType::kI32}, {logits.rows()});
  return logits.rows();
}

}  // namespace

void cross_entropy_forward(Context& ctx, const CrossEntropyForwardArgs& args) {
  cross_entropy_rows(
      ctx,
      {.logits = args.logits, .targets = args.targets, .losses = args.losses, .lse = args.lse});
  cross_entropy_mean(
      ctx,
      {.losses = args.losses, .targets = args.targets, .count = args.count, .loss = args.loss});
}

void cross_entropy_rows(Context& ctx, const CrossEntropyRowsArgs& args) {
  const int64_t rows = check_inputs(ctx, args.logits, args.targets);
  check_tensor(ctx, args.losses, "cross_entropy losses", {DType::kF32}, {rows});
  check_tensor(ctx, args.lse, "cross_entropy lse", {DType::kF32}, {rows});
  if (rows == 0) return;
  OCTET_DISPATCH(ctx, cross_entropy_rows, ctx, args);
}

void cross_entropy_mean(Context& ctx, const CrossEntropyMeanArgs& args) {
  OCTET_CHECK(args.targets.rank() == 1, "cross_entropy targets: expected shape (rows), got ",
              shape_str(args.targets.shape()));
  const int64_t rows = args.targets.size(0);
  check_tensor(ctx, args.targets, "cross_entropy targets", {DType::kI32}, {rows});
  check_tensor(ctx, args.count, "cross_entropy count", {DType::kI32}, {1});
  const bool with_loss = args.losses.defined();
  OCTET_CHECK(with_loss == args.loss.defined(),
              "cross_entropy_mean: losses and loss must both be given (the mean) or both be "
              "undefined (the count only)");
  if (with_loss) {
    check_tensor(ctx, args.losses, "cross_entropy losses", {DType::kF32}, {rows});
    check_tensor(ctx, args.loss, "cross_entropy loss", {DType::kF32}, {1});
  }
  if (rows == 0) {  // nothing counts: loss 0, count 0 (both words all-zero bits)
    ctx.be().memset(args.count.data(), 0, sizeof(int32_t));
    if (with_loss) ctx.be().memset(args.loss.data(), 0, sizeof(float));
    return;
  }
  OCTET_DISPATCH(ctx, cross_entropy_mean, ctx, args);
}

void cross_entropy_backward(Context& ctx, const CrossEntropyBackwardArgs& args) {
  const int64_t rows = check_inputs(ctx, args.logits, args.targets);
  check_tensor(ctx, args.lse, "cross_entropy lse", {DType::kF32}, {rows});
  check_tensor(ctx, args.count, "cross_entropy count", {DType::kI32}, {1});
  check_tensor(ctx, args.dloss, "cross_entropy dloss", {DType::kF32}, {1});
  check_tensor(ctx, args.dlogits, "cross_entropy dlogits", {args.logits.dtype()},
               args.logits.shape());
  if (rows == 0) return;
  OCTET_DISPATCH(ctx, cross_entropy_backward, ctx, args);
}

}  // namespace octet
