// Dispatcher for swiglu.h: validates once, allocates the quantized output, routes to cpu:: or
// cuda::.
#include "ops/swiglu/swiglu.h"

#include <cmath>

#include "backend/backend.h"
#include "backend/dispatch.h"
#include "core/cast_counter.h"
#include "core/scale_layout.h"
#include "numerics/scale.h"
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
Dims check_shape(const Tensor& gu, const char* name) {
  OCTET_CHECK(gu.rank() == 2, name, ": expected shape (rows, 2F), got ", shape_str(gu.shape()));
  OCTET_CHECK(gu.cols() >= 2 && gu.cols() % 2 == 0, name,
              ": the last dimension must be 2F >= 2, got ", shape_str(gu.shape()));
  return {gu.rows(), gu.cols() / 2};
}
Dims check_gate_up(Context& ctx, const Tensor& gu) {
  const Dims d = check_shape(gu, "swiglu gate_up");
  check_tensor(ctx, gu, "swiglu gate_up", gu.shape());
  return d;
}

// gate_up given either as a tensor or as its 1x128 row-wise FP8 copy (K-major scales), not both.
Dims check_gate_up(Context& ctx, const Tensor& gu, const QuantTensor& q) {
  const bool fp8 = q.data.defined();
  OCTET_CHECK(fp8 != gu.defined(),
              "swiglu: give gate_up either as a tensor or as its FP8 copy (gate_up_fp8), ",
              fp8 ? "not both" : "got neither");
  if (!fp8) return check_gate_up(ctx, gu);
  const Dims d = check_shape(q.data, "swiglu gate_up_fp8 data");
  OCTET_CHECK(q.data.data() != nullptr || q.data.numel() == 0,
              "swiglu gate_up_fp8 data: tensor has no storage");
  check_dtype(q.data, "swiglu gate_up_fp8 data", {fp8_dtype(q.format)});
  check_device(q.data, "swiglu gate_up_fp8 data", ctx.device);
  OCTET_CHECK(q.granularity == Granularity::k1x128,
              "swiglu gate_up_fp8: expected 1x128 row-wise scales, got granularity ",
              granularity_name(q.granularity));
  check_k_major_scales(q.granularity, q.scale_inv, "swiglu gate_up_fp8");
  check_dtype(q.scale_inv, "swiglu gate_up_fp8 scale_inv", {DType::kF32});
  check_device(q.scale_inv, "swiglu gate_up_fp8 scale_inv", ctx.device);
  const Shape want = scale_shape(Granularity::k1x128, d.rows, 2 * d.f);
  OCTET_CHECK(q.scale_inv.shape() == want, "swiglu gate_up_fp8 scale_inv: expected shape ",
              shape_str(want), ", got ", shape_str(q.scale_inv.shape()));
  return d;
}

void check_read_dtype(DType t) {
  OCTET_CHECK(t == DType::kBF16 || t == DType::kF32,
              "swiglu_quantize gate_up_dtype: expected bf16 or f32, got ", dtype_name(t));
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
                       int64_t cols, bool amax) {
  QuantTensor q;
  q.format = format;
  q.granularity = Granularity::k1x128;
  q.columnwise_granularity = Granularity::k1x128;
  q.rounding = rounding;
  q.data = Tensor::empty(ctx, {rows, cols}, fp8_dtype(format));
  q.scale_inv = Tensor::empty(ctx, scale_shape(Granularity::k1x128, rows, cols), DType::kF32);
  if (amax) q.amax = Tensor::empty(ctx, {1}, DType::kF32);
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
  const auto [rows, f] = check_gate_up(ctx, args.gate_up, args.gate_up_fp8);
  check_tensor(ctx, args.dh, "swiglu dh", {rows, f});
  check_tensor(ctx, args.d_gate_up, "swiglu d_gate_up", {rows, 2 * f});
  check_dtype(args.d_gate_up, "swiglu d_gate_up", {args.dh.dtype()});
  OCTET_CHECK(args.d_gate_up.data() != args.gate_up.data() || rows == 0 || !args.gate_up.defined(),
              "swiglu backward: d_gate_up must not alias gate_up");
  if (rows == 0) return;
  OCTET_DISPATCH(ctx, swiglu_backward, ctx, args);
}

namespace {

// swiglu_quantize with or without gate_up's own copy (cache: null when none).
SwigluQuantizeCachedResult quantize_checked(Context& ctx, const SwigluQuantizeArgs& args,
                                            const SwigluInputCache* cache) {
  const auto [rows, f] = check_gate_up(ctx, args.gate_up, args.gate_up_fp8);
  if (args.gate_up_fp8.data.defined()) check_read_dtype(args.gate_up_dtype);
  OCTET_CHECK(cache == nullptr || args.gate_up.defined(),
              "swiglu_quantize_caching_input: gate_up must be a BF16 or FP32 tensor (it is "
              "already FP8)");
  OCTET_CHECK(std::isfinite(args.epsilon) && args.epsilon >= 0.0f,
              "swiglu_quantize: epsilon must be finite and >= 0, got ", args.epsilon);
  check_row_weight(ctx, args.row_weight, rows, "swiglu_quantize row_weight");
  SwigluQuantizeCachedResult out;
  out.h = make_1x128(ctx, args.format, args.rounding, rows, f, args.amax);
  if (cache != nullptr)
    out.gate_up = make_1x128(ctx, cache->format, cache->rounding, rows, 2 * f, args.amax);
  // h's quantization, and with the cache gate_up's own copy: two FP8 tensors from one pass.
  count_casts(ctx, CastKind::kFusedQuantize, cache != nullptr ? 2 : 1);
  if (rows == 0) {  // max over nothing: 0, as quantize() gives
    if (args.amax) ctx.be().memset(out.h.amax.data(), 0, sizeof(float));
    if (args.amax && cache != nullptr) ctx.be().memset(out.gate_up.amax.data(), 0, sizeof(float));
    return out;
  }
  QuantTensor* gu_out = cache != nullptr ? &out.gate_up : nullptr;
  OCTET_DISPATCH(ctx, swiglu_quantize, ctx, args, out.h, gu_out);
  return out;
}

}  // namespace

QuantTensor swiglu_quantize(Context& ctx, const SwigluQuantizeArgs& args) {
  return quantize_checked(ctx, args, nullptr).h;
}

SwigluQuantizeCachedResult swiglu_quantize_caching_input(Context& ctx,
                                                         const SwigluQuantizeArgs& args,
                                                         const SwigluInputCache& cache) {
  return quantize_checked(ctx, args, &cache);
}

SwigluBackwardQuantizeResult swiglu_backward_quantize(Context& ctx,
                                                      const SwigluBackwardQuantizeArgs& args) {
  const auto [rows, f] = check_gate_up(ctx, args.gate_up, args.gate_up_fp8);
  check_tensor(ctx, args.dh, "swiglu_backward_quantize dh", {rows, f});
  OCTET_CHECK(std::isfinite(args.epsilon) && args.epsilon >= 0.0f,
              "swiglu_backward_quantize: epsilon must be finite and >= 0, got ", args.epsilon);
  check_row_weight(ctx, args.row_weight, rows, "swiglu_backward_quantize row_weight");
  SwigluBackwardQuantizeResult out;
  out.d_gate_up = make_1x128(ctx, args.format, args.rounding, rows, 2 * f, args.amax);
  if (args.row_weight.defined()) out.d_row_weight = Tensor::empty(ctx, {rows}, DType::kF32);
  if (args.want_h) out.h = make_1x128(ctx, args.h_format, args.h_rounding, rows, f, args.amax);
  count_casts(ctx, CastKind::kFusedQuantize, args.want_h ? 2 : 1);
  if (rows == 0) {
    if (args.amax) ctx.be().memset(out.d_gate_up.amax.data(), 0, sizeof(float));
    if (args.amax && args.want_h) ctx.be().memset(out.h.amax.data(), 0, sizeof(float));
    return out;
  }
  OCTET_DISPATCH(ctx, swiglu_backward_quantize, ctx, args, out);
  return out;
}

}  // namespace octet
