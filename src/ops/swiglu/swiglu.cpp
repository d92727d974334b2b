// Dispatcher for swiglu.h: validates once, allocates the quantized output, routes to cpu:: or
// cuda::.
#include "ops/swiglu/swiglu.h"

#include <cmath>

#include "backend/backend.h"
#include "backend/dispatch.h"
#include "core/cast_counter.h"
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

void check_row_weight(Context& ctx, const Tensor& w, int64_t rows, const char* name) {
  if (!w.defined()) return;
  OCTET_CHECK(w.data() != nullptr || w.numel() == 0, name, ": tensor has no storage");
  check_dtype(w, name, {DType::kF32});
  check_device(w, name, ctx.device);
  OCTET_CHECK(w.rank() == 1 && w.size(0) == rows, name, ": expected shape (", rows, "), got ",
              shape_str(w.shape()));
}

QuantTensor make_1x128(Context& ctx, Fp8Format format, ScaleRounding rounding, int64_t rows,
                       int64_t cols) {
  QuantTensor q;
  q.format = format;
  q.granularity = Granularity::k1x128;
  q.columnwise_granularity = Granularity::k1x128;
  q.rounding = rounding;
  q.data = Tensor::empty(ctx, {rows, cols}, fp8_dtype(format));
  q.scale_inv = Tensor::empty(ctx, scale_shape(Granularity::k1x128, rows, cols), DType::kF32);
  q.amax = Tensor::empty(ctx, {1}, DType::kF32);
  return q;
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
  check_row_weight(ctx, args.row_weight, rows, "swiglu_quantize row_weight");
  QuantTensor q = make_1x128(ctx, args.format, args.rounding, rows, f);
  count_casts(ctx, CastKind::kFusedQuantize, 1);
  if (rows == 0) {
    ctx.be().memset(q.amax.data(), 0, sizeof(float));  // max over nothing: 0, as quantize() gives
    return q;
  }
  OCTET_DISPATCH(ctx, swiglu_quantize, ctx, args, q);
  return q;
}

SwigluBackwardQuantizeResult swiglu_backward_quantize(Context& ctx,
                                                      const SwigluBackwardQuantizeArgs& args) {
  const auto [rows, f] = check_gate_up(ctx, args.gate_up);
  check_tensor(ctx, args.dh, "swiglu_backward_quantize dh", {rows, f});
  OCTET_CHECK(std::isfinite(args.epsilon) && args.epsilon >= 0.0f,
              "swiglu_backward_quantize: epsilon must be finite and >= 0, got ", args.epsilon);
  check_row_weight(ctx, args.row_weight, rows, "swiglu_backward_quantize row_weight");
  SwigluBackwardQuantizeResult out;
  out.d_gate_up = make_1x128(ctx, args.format, args.rounding, rows, 2 * f);
  if (args.row_weight.defined()) out.d_row_weight = Tensor::empty(ctx, {rows}, DType::kF32);
  count_casts(ctx, CastKind::kFusedQuantize, 1);
  if (rows == 0) {
    ctx.be().memset(out.d_gate_up.amax.data(), 0, sizeof(float));
    return out;
  }
  OCTET_DISPATCH(ctx, swiglu_backward_quantize, ctx, args, out);
  return out;
}

}  // namespace octet
