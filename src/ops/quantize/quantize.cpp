// Dispatcher for quantize.h: validates once, allocates outputs, routes to cpu:: or cuda::.
#include "ops/quantize/quantize.h"

#include "backend/backend.h"
#include "backend/dispatch.h"
#include "core/cast_counter.h"
#include "ops/quantize/quantize_backends.h"

#include <algorithm>

namespace octet {
namespace {

// Writes `value` into every element of an f32 tensor on the context's device.
void fill_f32(Context& ctx, Tensor& t, float value) {
  if (!t.data() || t.numel() == 0) return;
  Tensor host = Tensor::empty(t.shape(), DType::kF32);
  std::fill_n(host.data_as<float>(), host.numel(), value);
  ctx.be().copy(t.data(), host.data(), t.nbytes(),
                ctx.device == Device::kCpu ? CopyKind::kHostToHost : CopyKind::kHostToDevice);
}

}  // namespace

QuantTensor quantize(Context& ctx, const QuantizeArgs& args) {
  const Tensor& x = args.input;
  check_dtype(x, "quantize input", {DType::kF32, DType::kBF16});
  check_device(x, "quantize input", ctx.device);
  OCTET_CHECK(args.epsilon >= 0.0f && args.epsilon < 3.4e38f,
              "quantize: epsilon must be finite and >= 0, got ", args.epsilon);
  if (args.scale.defined()) {
    OCTET_CHECK(args.granularity == Granularity::kTensor,
                "quantize: a given (delayed) scale needs granularity tensor, got ",
                granularity_name(args.granularity));
    check_dtype(args.scale, "quantize scale", {DType::kF32});
    check_device(args.scale, "quantize scale", ctx.device);
    OCTET_CHECK(args.scale.numel() == 1, "quantize scale: expected 1 element, got ",
                args.scale.numel());
  }
  OCTET_CHECK(args.scale_layout == ScaleLayout::kKMajor || args.granularity == Granularity::k1x128,
              "quantize: the MN-major scale layout exists for 1x128 groups only, got ",
              granularity_name(args.granularity));
  const int64_t rows = x.rows(), cols = x.cols();
  QuantTensor q;
  q.format = args.format;
  q.granularity = args.granularity;
  q.columnwise_granularity = args.granularity;
  q.rounding = args.rounding;
  const DType dt = fp8_dtype(args.format);
  Shape shape = x.shape().empty() ? Shape{1} : x.shape();
  OCTET_CHECK(args.amax || args.granularity != Granularity::kTensor,
              "quantize: per-tensor scaling needs the amax (QuantizeArgs::amax must stay true)");
  if (args.amax) q.amax = Tensor::empty(ctx, {1}, DType::kF32);
  count_casts(ctx, CastKind::kQuantize, args.output == QuantizeOutput::kBoth ? 2 : 1);
  if (args.output != QuantizeOutput::kColumnwise) {
    q.data = Tensor::empty(ctx, shape, dt);
    q.scale_inv = Tensor::empty(ctx, scale_shape(args.granularity, rows, cols, args.scale_layout),
                                DType::kF32);
  } else {
    // Keep the logical shape visible even when only the column-wise copy is written.
    q.data = Tensor::wrap(nullptr, {rows, cols}, dt, ctx.device);
  }
  if (args.output != QuantizeOutput::kRowwise) {
    q.columnwise_data = Tensor::empty(ctx, {cols, rows}, dt);
    q.columnwise_scale_inv = Tensor::empty(
        ctx, scale_shape(args.granularity, cols, rows, args.scale_layout), DType::kF32);
  }
  if (x.numel() == 0) {
    // Nothing to scale: every group that exists is an all-zero group (scale 1), and amax is 0.
    fill_f32(ctx, q.scale_inv, 1.0f);
    fill_f32(ctx, q.columnwise_scale_inv, 1.0f);
    if (q.amax.defined()) fill_f32(ctx, q.amax, 0.0f);
    return q;
  }
  OCTET_DISPATCH(ctx, quantize, ctx, args, q);
  return q;
}

Tensor dequantize(Context& ctx, const QuantTensor& q, DType out_dtype, Copy copy) {
  OCTET_CHECK(out_dtype == DType::kF32 || out_dtype == DType::kBF16,
              "dequantize: output dtype must be F32 or BF16, got ", dtype_name(out_dtype));
  const bool col = copy == Copy::kColumnwise;
  const Tensor& data = col ? q.columnwise_data : q.data;
  const Tensor& sinv = col ? q.columnwise_scale_inv : q.scale_inv;
  const Granularity g = col ? q.columnwise_granularity : q.granularity;
  OCTET_CHECK(data.data() != nullptr || data.numel() == 0, "dequantize: the ",
              col ? "column-wise" : "row-wise", " copy was not written");
  check_dtype(data, "dequantize data", {fp8_dtype(q.format)});
  check_device(data, "dequantize data", ctx.device);
  check_dtype(sinv, "dequantize scale_inv", {DType::kF32});
  const ScaleLayout layout = scale_layout(g, sinv);
  const Shape want = scale_shape(g, data.rows(), data.cols(), layout);
  OCTET_CHECK(
      layout == ScaleLayout::kKMajor ? sinv.numel() == shape_numel(want) : sinv.shape() == want,
      "dequantize scale_inv: expected shape ", shape_str(want), " for granularity ",
      granularity_name(g), " (", scale_layout_name(layout), "), got ", shape_str(sinv.shape()));
  Tensor out = Tensor::empty(ctx, data.shape(), out_dtype);
  count_casts(ctx, CastKind::kDequantize, 1);
  OCTET_DISPATCH(ctx, dequantize, ctx, data, sinv, g, q.format, out);
  return out;
}

Tensor amax(Context& ctx, const Tensor& x) {
  check_dtype(x, "amax input", {DType::kF32, DType::kBF16});
  check_device(x, "amax input", ctx.device);
  Tensor out = Tensor::empty(ctx, {1}, DType::kF32);
  OCTET_DISPATCH(ctx, amax, ctx, x, out);
  return out;
}

void scaling_aware_transpose(Context& ctx, QuantTensor& q, Granularity columnwise) {
  OCTET_CHECK(columnwise == Granularity::k128x128 || columnwise == Granularity::k1x128,
              "scaling-aware transpose: the column-wise scales are 128x128 tiles or their 1x128 "
              "form, not ",
              granularity_name(columnwise));
  OCTET_CHECK(q.granularity == Granularity::k1x128,
              "scaling-aware transpose: input must have 1x128 scales, got ",
              granularity_name(q.granularity));
  OCTET_CHECK(
      q.rounding == ScaleRounding::kPow2,
      "scaling-aware transpose: input scales must be powers of 2 (quantize with pow2 scales)");
  OCTET_CHECK(q.data.data() != nullptr || q.data.numel() == 0,
              "scaling-aware transpose: the row-wise copy was not written");
  check_k_major_scales(q.granularity, q.scale_inv, "scaling-aware transpose input");
  check_device(q.data, "scaling-aware transpose input", ctx.device);
  const int64_t rows = q.rows(), cols = q.cols();
  Tensor cdata = Tensor::empty(ctx, {cols, rows}, fp8_dtype(q.format));
  Tensor cscale = Tensor::empty(ctx, scale_shape(columnwise, cols, rows), DType::kF32);
  count_casts(ctx, CastKind::kTranspose, 1);
  OCTET_DISPATCH(ctx, scaling_aware_transpose, ctx, q, cdata, cscale, columnwise);
  q.columnwise_data = cdata;
  q.columnwise_scale_inv = cscale;
  q.columnwise_granularity = columnwise;
}

DelayedScaling make_delayed_scaling(Context& ctx, int64_t history_len) {
  OCTET_CHECK(history_len >= 1 && history_len <= 1 << 20,
              "amax history length must be in [1, 2^20], got ", history_len);
  DelayedScaling s;
  Tensor hist = Tensor::empty({history_len}, DType::kF32);
  std::fill_n(hist.data_as<float>(), history_len, 0.0f);
  Tensor one = Tensor::empty({1}, DType::kF32);
  one.data_as<float>()[0] = 1.0f;
  s.amax_history = hist.to(ctx, ctx.device);
  s.scale = one.to(ctx, ctx.device);
  s.scale_inv = one.to(ctx, ctx.device);
  return s;
}

void delayed_scaling_update(Context& ctx, DelayedScaling& state, const Tensor& amax, int64_t step,
                            AmaxReduction reduce, const ScaleRule& rule) {
  OCTET_CHECK(step >= 0, "delayed scaling: step must be >= 0, got ", step);
  OCTET_CHECK(rule.margin >= 0 && rule.margin <= 64,
              "delayed scaling: margin must be in [0, 64], got ", rule.margin);
  check_dtype(amax, "delayed scaling amax", {DType::kF32});
  check_device(amax, "delayed scaling amax", ctx.device);
  OCTET_CHECK(amax.numel() == 1, "delayed scaling amax: expected 1 element, got ", amax.numel());
  // quantize.h: delayed scaling has no amax floor (TransformerEngine's DelayedScaling has none), so
  // a recipe's epsilon for current scaling does not leak into it. Done here so both backends agree.
  const ScaleRule no_floor{
      .format = rule.format, .rounding = rule.rounding, .epsilon = 0.0f, .margin = rule.margin};
  OCTET_DISPATCH(ctx, delayed_scaling_update, ctx, state, amax, step, reduce, no_floor);
}

}  // namespace octet
