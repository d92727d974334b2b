// Dispatcher for step_verdict.h: validates once, routes to cpu:: or cuda::.
#include "ops/step_verdict/step_verdict.h"

#include <string>

#include "backend/backend.h"
#include "backend/dispatch.h"
#include "ops/step_verdict/step_verdict_backends.h"

namespace octet {
namespace {

void check(const Tensor& t, const char* name, DType dtype, Device device, int64_t numel) {
  check_dtype(t, name, {dtype});
  check_device(t, name, device);
  OCTET_CHECK(t.numel() == numel, name, ": expected ", numel, " elements, got shape ",
              shape_str(t.shape()));
}

void check_window(const LossWindow& w, const char* op, Device device) {
  const std::string v = std::string(op) + " window.values", s = std::string(op) + " window.state";
  check(w.values, v.c_str(), DType::kI64, device, w.values.numel());
  check(w.state, s.c_str(), DType::kI64, device, 2);
}

}  // namespace

LossWindow make_loss_window(Context& ctx, int64_t capacity) {
  OCTET_CHECK(capacity >= 0, "loss window: capacity must be >= 0, got ", capacity);
  LossWindow w{.values = Tensor::empty(ctx, {capacity}, DType::kI64),
               .state = Tensor::empty(ctx, {2}, DType::kI64)};
  if (w.values.nbytes()) ctx.be().memset(w.values.data(), 0, w.values.nbytes());
  ctx.be().memset(w.state.data(), 0, w.state.nbytes());
  return w;
}

void step_loss_verdict(Context& ctx, const StepVerdictArgs& a) {
  OCTET_CHECK(a.ranks >= 1 && a.depths >= 0,
              "step_loss_verdict: ranks must be >= 1 and depths >= 0");
  const int64_t n = a.main.numel();
  OCTET_CHECK(n >= a.ranks && n % a.ranks == 0, "step_loss_verdict: main has ", n,
              " losses, not a positive multiple of ranks = ", a.ranks);
  check(a.main, "step_loss_verdict main", DType::kF32, ctx.device, n);
  if (a.depths > 0) check(a.mtp, "step_loss_verdict mtp", DType::kF32, ctx.device, a.depths * n);
  check_window(a.window, "step_loss_verdict", ctx.device);
  check(a.means, "step_loss_verdict means", DType::kI64, ctx.device, 1 + a.depths);
  check(a.flags, "step_loss_verdict flags", DType::kI32, ctx.device, 1);
  check(a.skip, "step_loss_verdict skip", DType::kF32, ctx.device, 1);
  OCTET_DISPATCH(ctx, step_loss_verdict, ctx, a);
}

void step_remember_loss(Context& ctx, const RememberLossArgs& a) {
  check_window(a.window, "step_remember_loss", ctx.device);
  check_dtype(a.means, "step_remember_loss means", {DType::kI64});
  check_device(a.means, "step_remember_loss means", ctx.device);
  OCTET_CHECK(a.means.numel() >= 1, "step_remember_loss: means is empty");
  if (a.skipped.data()) check(a.skipped, "step_remember_loss skipped", DType::kI32, ctx.device, 1);
  OCTET_DISPATCH(ctx, step_remember_loss, ctx, a);
}

void sum_counts_unless_skipped(Context& ctx, const SumCountsArgs& a) {
  OCTET_CHECK(!a.counts.empty(), "sum_counts_unless_skipped: no counts");
  const int64_t e = a.out.numel();
  check(a.out, "sum_counts_unless_skipped out", DType::kI32, ctx.device, e);
  for (const Tensor& c : a.counts)
    check(c, "sum_counts_unless_skipped counts", DType::kI32, ctx.device, e);
  if (a.skipped.data())
    check(a.skipped, "sum_counts_unless_skipped skipped", DType::kI32, ctx.device, 1);
  OCTET_DISPATCH(ctx, sum_counts_unless_skipped, ctx, a);
}

}  // namespace octet
