// Dispatcher for rmsnorm.h: validates once, routes to cpu:: or cuda::.
#include "ops/rmsnorm/rmsnorm.h"

#include <cmath>

#include "backend/dispatch.h"
#include "ops/rmsnorm/rmsnorm_backends.h"

namespace octet {
namespace {

void check_shape(const Tensor& t, const char* name, const Shape& want) {
  OCTET_CHECK(t.shape() == want, name, ": expected shape ", shape_str(want), ", got ",
              shape_str(t.shape()));
}

void check_defined(const Tensor& t, const char* name) {
  OCTET_CHECK(t.data() != nullptr || t.numel() == 0, name, ": tensor has no storage");
}

// The checks shared by forward and backward: x, the weight (D) and rstd (rows).
void check_common(Context& ctx, const Tensor& x, const char* xname, const Tensor& w,
                  const Tensor& rstd) {
  check_defined(x, xname);
  check_dtype(x, xname, {DType::kBF16, DType::kF32});
  check_device(x, xname, ctx.device);
  OCTET_CHECK(x.rank() >= 1 && x.cols() >= 1, xname, ": expected shape (rows, D) with D >= 1, got ",
              shape_str(x.shape()));
  check_defined(w, "rmsnorm weight");
  check_dtype(w, "rmsnorm weight", {DType::kF32});
  check_device(w, "rmsnorm weight", ctx.device);
  check_shape(w, "rmsnorm weight", {x.cols()});
  check_defined(rstd, "rmsnorm rstd");
  check_dtype(rstd, "rmsnorm rstd", {DType::kF32});
  check_device(rstd, "rmsnorm rstd", ctx.device);
  check_shape(rstd, "rmsnorm rstd", {x.rows()});
}

}  // namespace

void rmsnorm_forward(Context& ctx, const RmsNormForwardArgs& args) {
  check_common(ctx, args.x, "rmsnorm x", args.weight, args.rstd);
  OCTET_CHECK(std::isfinite(args.epsilon) && args.epsilon > 0.0f,
              "rmsnorm: epsilon must be finite and > 0, got ", args.epsilon);
  check_defined(args.y, "rmsnorm y");
  check_dtype(args.y, "rmsnorm y", {DType::kBF16, DType::kF32});
  check_device(args.y, "rmsnorm y", ctx.device);
  check_shape(args.y, "rmsnorm y", args.x.shape());
  if (args.residual.defined()) {
    check_defined(args.residual, "rmsnorm residual");
    check_dtype(args.residual, "rmsnorm residual", {args.x.dtype()});
    check_device(args.residual, "rmsnorm residual", ctx.device);
    check_shape(args.residual, "rmsnorm residual", args.x.shape());
  }
  if (args.x.rows() == 0) return;
  OCTET_DISPATCH(ctx, rmsnorm_forward, ctx, args);
}

void rmsnorm_backward(Context& ctx, const RmsNormBackwardArgs& args) {
  check_common(ctx, args.x, "rmsnorm x", args.weight, args.rstd);
  check_defined(args.dy, "rmsnorm dy");
  check_dtype(args.dy, "rmsnorm dy", {DType::kBF16, DType::kF32});
  check_device(args.dy, "rmsnorm dy", ctx.device);
  check_shape(args.dy, "rmsnorm dy", args.x.shape());
  check_defined(args.dx, "rmsnorm dx");
  check_dtype(args.dx, "rmsnorm dx", {args.dy.dtype()});
  check_device(args.dx, "rmsnorm dx", ctx.device);
  check_shape(args.dx, "rmsnorm dx", args.x.shape());
  check_defined(args.dweight, "rmsnorm dweight");
  check_dtype(args.dweight, "rmsnorm dweight", {DType::kF32});
  check_device(args.dweight, "rmsnorm dweight", ctx.device);
  check_shape(args.dweight, "rmsnorm dweight", {args.x.cols()});
  OCTET_CHECK(args.dx.data() != args.dweight.data() || args.dx.numel() == 0,
              "rmsnorm: dx and dweight must not alias");
  if (args.residual_grad.defined()) {
    check_defined(args.residual_grad, "rmsnorm residual_grad");
    check_dtype(args.residual_grad, "rmsnorm residual_grad", {args.dy.dtype()});
    check_device(args.residual_grad, "rmsnorm residual_grad", ctx.device);
    check_shape(args.residual_grad, "rmsnorm residual_grad", args.x.shape());
  }
  if (args.x.rows() == 0) return;  // dw += 0
  OCTET_DISPATCH(ctx, rmsnorm_backward, ctx, args);
}

}  // namespace octet
