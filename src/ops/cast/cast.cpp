// Dispatcher for cast.h: validates once, allocates the outputs, routes to cpu:: or cuda::.
#include "ops/cast/cast.h"

#include "backend/backend.h"
#include "backend/dispatch.h"
#include "ops/cast/cast_backends.h"

namespace octet {
namespace {

void check_input(Context& ctx, const Tensor& t, const char* name) {
  OCTET_CHECK(t.data() != nullptr || t.numel() == 0, name, ": tensor has no storage");
  check_dtype(t, name, {DType::kF32, DType::kBF16});
  check_device(t, name, ctx.device);
}

}  // namespace

Tensor cast(Context& ctx, const Tensor& x, DType to) {
  check_input(ctx, x, "cast input");
  OCTET_CHECK(to == DType::kF32 || to == DType::kBF16,
              "cast: target dtype must be F32 or BF16, got ", dtype_name(to));
  Tensor out = Tensor::empty(ctx, x.shape(), to);
  if (x.numel() == 0) return out;
  if (x.dtype() == to) {  // a copy of the bytes: exact, NaN payloads included
    const CopyKind kind =
        ctx.device == Device::kCpu ? CopyKind::kHostToHost : CopyKind::kDeviceToDevice;
    ctx.be().copy(out.data(), x.data(), x.nbytes(), kind);
    return out;
  }
  OCTET_DISPATCH(ctx, cast, ctx, x, out);
  return out;
}

Tensor transpose(Context& ctx, const Tensor& x) {
  check_input(ctx, x, "transpose input");
  OCTET_CHECK(x.rank() >= 1, "transpose input: expected a (rows, cols) matrix, got shape ",
              shape_str(x.shape()));
  Tensor out = Tensor::empty(ctx, {x.cols(), x.rows()}, x.dtype());
  if (x.numel() == 0) return out;
  OCTET_DISPATCH(ctx, transpose, ctx, x, out);
  return out;
}

Tensor transpose_batched(Context& ctx, const Tensor& x) {
  OCTET_CHECK(x.data() != nullptr || x.numel() == 0,
              "transpose_batched input: tensor has no storage");
  check_dtype(x, "transpose_batched input",
              {DType::kF32, DType::kBF16, DType::kE4M3, DType::kE5M2, DType::kU8});
  check_device(x, "transpose_batched input", ctx.device);
  OCTET_CHECK(x.rank() == 3, "transpose_batched input: expected (batch, rows, cols), got shape ",
              shape_str(x.shape()));
  Tensor out = Tensor::empty(ctx, {x.size(0), x.size(2), x.size(1)}, x.dtype());
  if (x.numel() == 0) return out;
  OCTET_DISPATCH(ctx, transpose_batched, ctx, x, out);
  return out;
}

void add_into(Context& ctx, Tensor& y, const Tensor& x) {
  check_input(ctx, y, "add_into y");
  check_input(ctx, x, "add_into x");
  OCTET_CHECK(y.shape() == x.shape(), "add_into x: expected y's shape ", shape_str(y.shape()),
              ", got ", shape_str(x.shape()));
  const auto* yb = static_cast<const char*>(y.data());
  const auto* xb = static_cast<const char*>(x.data());
  OCTET_CHECK(y.numel() == 0 || yb + y.nbytes() <= xb || xb + x.nbytes() <= yb,
              "add_into: y and x must not overlap");
  if (y.numel() == 0) return;
  OCTET_DISPATCH(ctx, add_into, ctx, y, x);
}

Tensor round_to_storage(Context& ctx, const Tensor& x, ExMyFormat format, StorageKernel kernel) {
  check_input(ctx, x, "round_to_storage input");
  OCTET_CHECK(x.rank() >= 1, "round_to_storage input: expected a (rows, cols) matrix, got shape ",
              shape_str(x.shape()));
  Tensor out = Tensor::empty(ctx, x.shape(), x.dtype());
  if (x.numel() == 0) return out;
  OCTET_DISPATCH(ctx, round_to_storage, ctx, x, format, kernel, out);
  return out;
}

}  // namespace octet
