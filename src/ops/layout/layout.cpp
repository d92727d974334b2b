// Dispatcher for layout.h: validates once, routes to cpu:: or cuda::.
#include "ops/layout/layout.h"

#include "backend/backend.h"
#include "backend/dispatch.h"
#include "ops/layout/layout_backends.h"

namespace octet {

void copy_columns(Context& ctx, const CopyColumnsArgs& a) {
  for (const auto* t : {&a.src, &a.dst}) {
    const char* name = t == &a.src ? "copy_columns src" : "copy_columns dst";
    OCTET_CHECK(t->data() != nullptr || t->numel() == 0, name, ": tensor has no storage");
    check_dtype(*t, name, {DType::kF32, DType::kBF16});
    check_device(*t, name, ctx.device);
    OCTET_CHECK(t->rank() >= 1, name, ": expected a matrix, got shape ", shape_str(t->shape()));
  }
  OCTET_CHECK(a.width >= 0 && a.src_col >= 0 && a.dst_col >= 0 && a.repeat >= 1,
              "copy_columns: width, src_col, dst_col must be >= 0 and repeat >= 1, got ", a.width,
              ", ", a.src_col, ", ", a.dst_col, ", ", a.repeat);
  OCTET_CHECK(a.src_col + a.width <= a.src.cols(), "copy_columns: src columns [", a.src_col, ", ",
              a.src_col + a.width, ") exceed src's ", a.src.cols());
  OCTET_CHECK(a.dst_col + a.width <= a.dst.cols(), "copy_columns: dst columns [", a.dst_col, ", ",
              a.dst_col + a.width, ") exceed dst's ", a.dst.cols());
  const int64_t want_src = a.mode == CopyMode::kBroadcast ? a.dst.rows() : a.dst.rows() * a.repeat;
  OCTET_CHECK(a.mode == CopyMode::kBroadcast ? a.dst.rows() == a.src.rows() * a.repeat
                                             : a.src.rows() == want_src,
              "copy_columns: ", a.mode == CopyMode::kBroadcast ? "broadcast" : "sum",
              " with repeat ", a.repeat, " needs src rows ",
              a.mode == CopyMode::kBroadcast ? "x repeat = dst rows" : "= dst rows x repeat",
              "; got src ", a.src.rows(), ", dst ", a.dst.rows());
  if (a.width == 0 || a.dst.rows() == 0) return;
  OCTET_DISPATCH(ctx, copy_columns, ctx, a);
}

Tensor slice_columns(Context& ctx, const Tensor& x, int64_t col, int64_t width, DType dtype) {
  Tensor out = Tensor::empty(ctx, {x.rows(), width}, dtype);
  copy_columns(ctx, {.src = x, .src_col = col, .dst = out, .width = width});
  return out;
}

Tensor zeros(Context& ctx, const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(ctx, shape, dtype);
  if (t.nbytes() > 0) ctx.be().memset(t.data(), 0, t.nbytes());
  return t;
}

}  // namespace octet
