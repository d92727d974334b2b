// Dispatcher for swiglu.h: validates once, allocates the quantized output, routes to cpu:: or
// cuda::.
#include "ops/swiglu/swiglu.h"

#include <cmath>

#include "backend/backend.h"
#include "backend/dispatch.h"
#include "ops/swiglu/swiglu_backends.h"

namespace octet {
namespace {

void check_tensor(Context& ctx, const Tensor& t, const char* name, const Shape& want) {
  OCTET_CHECK(t.data() != nullptr || t.numel() == 0, name, ": tensor has no storage");
  check_dtype(t, name, {DType::kBF16, DType::kF32});
  check_device(t, name, ctx.device);
  OCTET_CHECK(t.shape() == want, name, ": expected shape ", shape_str(want), ", got ",
              shape_str(t.shape()));
}

// gate_up's (rows, F); gate_up must be (rows, 2F) with F >= 1.
struct Dims {
  int64_t rows, f;
};
Dims check_gate_up(Context& ctx, const Tensor& gu) {
  OCTET_CHECK(gu.rank() == 2, "swiglu gate_up: expected shape (rows, 2F), got ",
              shape_str(gu.shape()));
  OCTET_CHECK(gu.cols() >= 2 && gu.cols() % 2 == 0,
              "swiglu gate_up: the last dimension must be 2F >= 2, got ", shape_str(gu.shape()));
  check_tensor(ctx, gu, "swiglu gate_up", gu.shape());
  return {gu.rows(), gu.cols() / 2};
}

}  // namespace

void swiglu_forward(Context& ctx, const SwigluForwardArgs& args) {
  const auto [rows, f] = check_gate_up(ctx, args.gate_up);
  check_tensor(ctx, args.h, "swiglu h", {rows, f});
  if (rows == 0) return;
  OCTET_DISPATCH(ctx, swiglu_forward, ctx, args);
}

void swiglu_backward(Context& ctx, const SwigluBackwardArgs& args) {
  const auto [rows, f] = check_gate_up(ctx, args.gate_up);
  check_tensor(ctx, args.dh, "swiglu dh", {rows, f});
  check_tensor(ctx, args.d_gate_up, "swiglu d_gate_up", {rows, 2 * f});
  check_dtype(args.d_gate_up, "swiglu d_gate_up", {args.dh.dtype()});
  OCTET_CHECK(args.d_gate_up.data() != args.gate_up.data() || rows == 0,
              "swiglu backward: d_gate_up must not alias gate_up");
  if (rows == 0) return;
  OCTET_DISPATCH(ctx, swiglu_backward, ctx, args);
}

QuantTensor swiglu_quantize(Context& ctx, const SwigluQuantizeArgs& args) {
  const auto [rows, f] = check_gate_up(ctx, args.gate_up);
  OCTET_CHECK(std::isfinite(args.epsilon) && args.epsilon >= 0.0f,
              "swiglu_quantize: epsilon must be finite and >= 0, got ", args.epsilon);
  QuantTensor q;
  q.format = args.format;
  q.granularity = Granularity::k1x128;
  q.columnwise_granularity = Granularity::k1x128;
  q.rounding = args.rounding;
  q.data = Tensor::empty(ctx, {rows, f}, fp8_dtype(args.format));
  q.scale_inv = Tensor::empty(ctx, scale_shape(Granularity::k1x128, rows, f), DType::kF32);
  q.amax = Tensor::empty(ctx, {1}, DType::kF32);
  if (rows == 0) {
    ctx.be().memset(q.amax.data(), 0, sizeof(float));  // max over nothing: 0, as quantize() gives
    return q;
  }
  OCTET_DISPATCH(ctx, swiglu_quantize, ctx, args, q);
  return q;
}

}  // namespace octet
