// Grouped Linear: weight preparation, forward and backward (grouped_linear.h has the math).
#include "model/grouped_linear.h"

#include <memory>
#include <utility>

#include "backend/backend.h"
#include "ops/cast/cast.h"
#include "ops/grouped_gemm/grouped_gemm.h"
#include "ops/layout/layout.h"
#include "ops/quantize/quantize.h"
#include "ops/quantize/quantize_grouped.h"

namespace octet {
namespace {

CopyKind same_device(const Context& ctx) {
  return ctx.device == Device::kCpu ? CopyKind::kHostToHost : CopyKind::kDeviceToDevice;
}

// Rows [row0, row0 + rows) of a (R, C) tensor as a tensor sharing its storage.
Tensor row_slice(const Tensor& t, int64_t row0, int64_t rows) {
  const int64_t c = t.cols();
  auto* base = static_cast<char*>(t.data()) + row0 * c * dtype_size(t.dtype());
  return Tensor::wrap(base, {rows, c}, t.dtype(), t.device());
}

void copy_into(Context& ctx, const Tensor& dst, int64_t offset_elems, const Tensor& src) {
  auto* d = static_cast<char*>(dst.data()) + offset_elems * dtype_size(dst.dtype());
  ctx.be().copy(d, src.data(), src.nbytes(), same_device(ctx));
}

// While alive, ctx.comm is `group` (when set): the delayed-scaling amaxes recorded meanwhile are
// reduced over the ranks that hold the same experts (grouped_linear.h). ctx.comm serves only that
// reduction (model/linear.h), so nothing else sees the swap.
class AmaxGroupScope {
 public:
  AmaxGroupScope(Context& ctx, const std::shared_ptr<Comm>& group) : ctx_(ctx), saved_(ctx.comm) {
    if (group) ctx_.comm = group;
  }
  AmaxGroupScope(const AmaxGroupScope&) = delete;
  AmaxGroupScope& operator=(const AmaxGroupScope&) = delete;
  ~AmaxGroupScope() { ctx_.comm = saved_; }

 private:
  Context& ctx_;
  std::shared_ptr<Comm> saved_;
};

// The CPU's row counts (the CPU path only: on CUDA they stay on the device).
int64_t cpu_rows(const GroupLayoutRef& l, int64_t e) {
  return l.sizes.dtype() == DType::kI32 ? l.sizes.data_as<const int32_t>()[e]
                                        : l.sizes.data_as<const int64_t>()[e];
}

// Element e of a (E) f32 tensor as a (1) tensor sharing its storage.
Tensor element(const Tensor& t, int64_t e) {
  return Tensor::wrap(t.data_as<float>() + e, {1}, DType::kF32, t.device());
}

// This pass's amax of one operand into a per-expert delayed-scaling history (model/linear.cpp's
// order: after the GEMM that consumed the quantization). The amax is already the maximum over the
// ranks (reduce_amax_over_ranks: the CUDA path reduces every expert's at once).
void record_amax(Context& ctx, const LinearScalingState& st, DelayedScaling& ds, int64_t& steps,
                 const Tensor& amax, const GemmRecipe& r, GemmOperand operand) {
  const GemmRecipe::Quantization q = r.quantization(operand);
  delayed_scaling_update(ctx, ds, amax, steps, st.reduce, {q.format, q.rounding, 0.0f, st.margin});
  ++steps;
}

// The column-wise copy of a row-wise 1x128 power-of-2 FP8 tensor that already exists, as the
// recipe's fp8_transpose makes it. The Wgrad GEMM takes one operand in 1x128 groups along K and
// the other in 128x128 blocks (DeepSeek-V3's pairing; grouped_gemm.h): `tiles` is the granularity
// this operand's scales take when the scaling-aware transpose makes it. For dY (A), k1x128: the
// transpose writes each 128x128 tile's scale for every one of its rows, the same numbers (nothing
// is rounded differently). The requantize paths quantize the transpose in 1x128 groups, which
// either operand reads.
void add_columnwise(Context& ctx, QuantTensor& q, Fp8Transpose how, Granularity tiles) {
  if (how == Fp8Transpose::kScalingAware) {
    scaling_aware_transpose(ctx, q, tiles);
    return;
  }
  const QuantTensor c = quantize(
      ctx, {.input = dequantize(ctx, q, DType::kF32),
            .format = q.format,
            .granularity = Granularity::k1x128,
            .rounding = how == Fp8Transpose::kRequantizeExact ? ScaleRounding::kExact : q.rounding,
            .output = QuantizeOutput::kColumnwise,
            .scale = Tensor()});
  q.columnwise_data = c.columnwise_data;
  q.columnwise_scale_inv = c.columnwise_scale_inv;
  q.columnwise_granularity = c.columnwise_granularity;
}

void check_prequantized(const QuantTensor& q, GemmSite site, const char* what) {
  OCTET_CHECK(q.rounding == ScaleRounding::kPow2 && q.granularity == Granularity::k1x128,
              "grouped linear ", gemm_site_name(site), ": a pre-quantized ", what,
              " must be 1x128 with power-of-2 scales (the scaling-aware transpose makes its Wgrad "
              "copy)");
}

}  // namespace

void GroupedLinearLayer::init_state(Context& ctx, const Recipe& recipe) {
  views_.clear();
  per_expert_.clear();
  if (recipe.at(site).precision != GemmPrecision::kFp8Tensor) return;
  const int64_t E = experts();
  views_.resize(E);
  per_expert_.resize(E);
  for (int64_t e = 0; e < E; ++e) {
    views_[e].name = param->name + "[" + std::to_string(first_expert + e) + "]";
    views_[e].value = row_slice(param->value.reshape({E * out(), in()}), e * out(), out());
    views_[e].grad = row_slice(param->grad.reshape({E * out(), in()}), e * out(), out());
    per_expert_[e].site = site;
    per_expert_[e].param = &views_[e];
    per_expert_[e].init_state(ctx, recipe);
  }
}

void GroupedLinearLayer::prepare(Context& ctx, const Precision& p, PrepareScope scope) {
  const AmaxGroupScope amax_scope(ctx, amax_group);
  const GemmRecipe& r = p.recipe.at(site);
  const int64_t E = experts(), O = out(), I = in();
  if (scope == PrepareScope::kNotFused && fused) {
    if (prepared_ == GemmPrecision::kBf16)  // the optimizer wrote w_; its transpose follows it
      w_t_ = transpose_batched(ctx, w_.reshape({E, O, I}));
    return;
  }
  fused = false;
  prepared_ = r.precision;
  if (r.precision == GemmPrecision::kFp8Tensor) {
    OCTET_CHECK(static_cast<int64_t>(per_expert_.size()) == E, "grouped linear ",
                gemm_site_name(site), ": init_state was not called for the fp8-tensor recipe");
    for (auto& l : per_expert_) l.prepare(ctx, p);
    if (ctx.device == Device::kCuda) stack_tensorwise_weights(ctx, r);
    return;
  }
  if (r.precision == GemmPrecision::kBf16) {
    w_ = cast(ctx, param->value, p.act);
    w_t_ = transpose_batched(ctx, w_.reshape({E, O, I}));  // (E, In, Out): W_e^T stacked
    return;
  }
  // fp8-block: 128x128 blocks per expert, both copies, stacked.
  const int64_t so = ceil_div(O, kGroup), si = ceil_div(I, kGroup);
  const DType d8 = fp8_dtype(r.forward_format);
  fp8_ = {Tensor(), Tensor(), Granularity::k128x128, r.forward_format};
  fp8_t_ = fp8_;
  QuantizeArgs qa = quantize_args(r, GemmOperand::kWeight, Tensor(), QuantizeOutput::kBoth);
  if (O % kGroup == 0) {
    // No block straddles two experts: one quantization of the stacked (E Out, In) matrix, row-wise
    // only. W_e^T has the same 128x128 blocks, so the same scales and the same FP8 values: Dgrad's
    // stacked (E In, Out) copy is each expert's bytes and scales transposed (one launch each).
    qa.input = param->value.reshape({E * O, I});
    qa.output = QuantizeOutput::kRowwise;
    const QuantTensor q = quantize(ctx, qa);
    fp8_.data = q.data;
    fp8_.scale_inv = q.scale_inv.reshape({E, so, si});
    fp8_t_.data = transpose_batched(ctx, q.data.reshape({E, O, I})).reshape({E * I, O});
    fp8_t_.scale_inv = transpose_batched(ctx, fp8_.scale_inv);
    return;
  }
  fp8_.data = Tensor::empty(ctx, {E * O, I}, d8);
  fp8_.scale_inv = Tensor::empty(ctx, {E, so, si}, DType::kF32);
  fp8_t_.data = Tensor::empty(ctx, {E * I, O}, d8);
  fp8_t_.scale_inv = Tensor::empty(ctx, {E, si, so}, DType::kF32);
  for (int64_t e = 0; e < E; ++e) {  // each expert on its own
    qa.input = row_slice(param->value.reshape({E * O, I}), e * O, O);
    const QuantTensor q = quantize(ctx, qa);
    copy_into(ctx, fp8_.data, e * O * I, q.data);
    copy_into(ctx, fp8_.scale_inv, e * so * si, q.scale_inv);
    copy_into(ctx, fp8_t_.data, e * I * O, q.columnwise_data);
    copy_into(ctx, fp8_t_.scale_inv, e * si * so, q.columnwise_scale_inv);
  }
}

bool GroupedLinearLayer::weight_output(WeightOutput& out) const {
  out = WeightOutput{param, Tensor(), BlockQuantOutput{}};
  const int64_t E = experts(), O = this->out(), I = in();
  if (prepared_ == GemmPrecision::kBf16) {
    if (w_.dtype() != DType::kBF16 || w_.data() == nullptr) return false;
    out.bf16 = w_;
    return true;
  }
  if (prepared_ != GemmPrecision::kFp8Block || O % kGroup != 0 || fp8_.data.data() == nullptr)
    return false;
  out.fp8 =
      BlockQuantOutput{fp8_.format,    ScaleRounding::kExact, E * O,           I, O, fp8_.data,
                       fp8_.scale_inv, fp8_t_.data,           fp8_t_.scale_inv};
  return true;
}

Tensor GroupedLinearLayer::forward(Context& ctx, const Precision& p, const GroupedInput& in_,
                                   const GroupLayoutRef& layout, Saved& s) {
  const AmaxGroupScope amax_scope(ctx, amax_group);
  const GemmRecipe& r = p.recipe.at(site);
  const int64_t R = in_.x.defined() ? in_.x.rows() : in_.qx.rows();
  s = Saved{};
  if (p.probe != nullptr && in_.x.defined() && r.precision != GemmPrecision::kFp8Tensor)
    p.probe->record(ctx, site, GemmOperand::kActivation, in_.x, r, nullptr);
  if (r.precision == GemmPrecision::kBf16) {
    Tensor y = Tensor::empty(ctx, {R, out()}, in_.x.dtype());
    grouped_gemm_bf16(ctx, {.a = in_.x,
                            .b = w_,
                            .group_sizes = layout.sizes,
                            .d = y,
                            .accumulate = Accumulate::kOverwrite});
    s.x = in_.x;
    return y;
  }
  if (r.precision == GemmPrecision::kFp8Tensor) {
    OCTET_CHECK(in_.x.defined(), "grouped linear ", gemm_site_name(site),
                ": the fp8-tensor recipe quantizes its input itself (no FP8 dispatch)");
    if (ctx.device != Device::kCpu) return forward_tensorwise(ctx, r, in_.x, layout, s);
    Tensor y = zeros(ctx, {R, out()}, DType::kBF16);  // a padded layout's tail stays zero
    s.per_expert.resize(per_expert_.size());
    int64_t row = 0;
    for (size_t e = 0; e < per_expert_.size(); ++e) {
      const int64_t m = cpu_rows(layout, static_cast<int64_t>(e));
      if (m > 0) {
        const Tensor ye = per_expert_[e].forward(ctx, p, row_slice(in_.x, row, m), s.per_expert[e]);
        copy_into(ctx, y, row * out(), ye);
      } else if (r.is_delayed()) {  // an empty expert records amax 0, as on CUDA
        LinearScalingState& st = per_expert_[e].state;
        const Tensor amax = zeros(ctx, {1}, DType::kF32);
        reduce_amax_over_ranks(ctx, amax);  // as the ranks where it has rows (linear.cpp)
        record_amax(ctx, st, st.x, st.x_steps, amax, r, GemmOperand::kActivation);
      }
      row += m;
    }
    return y;
  }
  // fp8-block.
  if (!in_.x.defined()) {  // pre-quantized: the column-wise copy from the row-wise one, if kept
    check_prequantized(in_.qx, site, "input");
    Tensor y = Tensor::empty(ctx, {R, out()}, DType::kBF16);
    grouped_gemm_fp8(ctx, {.a = rowwise_operand(in_.qx),
                           .b = fp8_,
                           .group_sizes = layout.sizes,
                           .d = y,
                           .accumulate = Accumulate::kOverwrite});
    if (in_.keep_for_wgrad) s = wgrad_saved(ctx, p, in_.qx);
    return y;
  }
  QuantTensor qx =
      quantize(ctx, quantize_args(r, GemmOperand::kActivation, in_.x, QuantizeOutput::kBoth));
  Tensor y = Tensor::empty(ctx, {R, out()}, DType::kBF16);
  grouped_gemm_fp8(ctx, {.a = rowwise_operand(qx),
                         .b = fp8_,
                         .group_sizes = layout.sizes,
                         .d = y,
                         .accumulate = Accumulate::kOverwrite});
  // Wgrad reads only the column-wise copy.
  qx.data = Tensor::wrap(nullptr, {R, in()}, qx.data.dtype(), ctx.device);
  qx.scale_inv = Tensor();
  s.qx = qx;
  return y;
}

GroupedLinearLayer::Saved GroupedLinearLayer::wgrad_saved(Context& ctx, const Precision& p,
                                                          QuantTensor qx) const {
  check_prequantized(qx, site, "input");
  // The column-wise copy may come with the row-wise one (moe_permute_quantize_transposed).
  if (qx.columnwise_data.defined()) {
    OCTET_CHECK(qx.columnwise_granularity == Granularity::k128x128 &&
                    p.recipe.fp8_transpose == Fp8Transpose::kScalingAware,
                "grouped linear ", gemm_site_name(site),
                ": a pre-made column-wise input must be the scaling-aware transpose in 128x128 "
                "tiles");
  } else {
    add_columnwise(ctx, qx, p.recipe.fp8_transpose, Granularity::k128x128);
  }
  // Wgrad reads only the column-wise copy.
  qx.data = Tensor::wrap(nullptr, {qx.rows(), in()}, qx.data.dtype(), ctx.device);
  qx.scale_inv = Tensor();
  Saved s;
  s.qx = qx;
  return s;
}

Tensor GroupedLinearLayer::backward(Context& ctx, const Precision& p, const Tensor& dy,
                                    const GroupLayoutRef& layout, const Saved& s) {
  const AmaxGroupScope amax_scope(ctx, amax_group);
  const GemmRecipe& r = p.recipe.at(site);
  const int64_t R = dy.rows(), E = experts();
  if (p.probe != nullptr && r.precision != GemmPrecision::kFp8Tensor)
    p.probe->record(ctx, site, GemmOperand::kGradient, dy, r, nullptr);
  const Tensor grad3 = param->grad;                                              // (E, Out, In) f32
  if (r.precision != GemmPrecision::kFp8Block) first_write(ctx, *param, false);  // then +=
  if (r.precision == GemmPrecision::kBf16) {
    Tensor dx = Tensor::empty(ctx, {R, in()}, dy.dtype());
    // dX = dY W
    grouped_gemm_bf16(ctx, {.a = dy,
                            .b = w_t_,
                            .group_sizes = layout.sizes,
                            .d = dx,
                            .accumulate = Accumulate::kOverwrite});
    // dW += dY^T X
    grouped_wgrad_bf16(ctx, {.a = dy,
                             .b = s.x,
                             .group_sizes = layout.sizes,
                             .d = grad3,
                             .accumulate = Accumulate::kAdd,
                             .layout = OperandLayout::kMNMajor});
    return dx;
  }
  if (r.precision == GemmPrecision::kFp8Tensor) {
    if (ctx.device != Device::kCpu) return backward_tensorwise(ctx, r, dy, layout, s);
    Tensor dx = zeros(ctx, {R, in()}, DType::kBF16);
    int64_t row = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t m = cpu_rows(layout, e);
      if (m > 0) {
        const Tensor dxe =
            per_expert_[e].backward(ctx, p, row_slice(dy, row, m), s.per_expert[e]);  // grad +=
        copy_into(ctx, dx, row * in(), dxe);
      } else if (r.is_delayed()) {  // an empty expert records amax 0, as on CUDA
        LinearScalingState& st = per_expert_[e].state;
        const Tensor amax = zeros(ctx, {1}, DType::kF32);
        reduce_amax_over_ranks(ctx, amax);  // as the ranks where it has rows (linear.cpp)
        record_amax(ctx, st, st.dy, st.dy_steps, amax, r, GemmOperand::kGradient);
      }
      row += m;
    }
    return dx;
  }
  return fp8_block_backward(
      ctx, quantize(ctx, quantize_args(r, GemmOperand::kGradient, dy, QuantizeOutput::kBoth)),
      layout, s);
}

Tensor GroupedLinearLayer::backward(Context& ctx, const Precision& p, const GroupedInput& dy,
                                    const GroupLayoutRef& layout, const Saved& s) {
  if (dy.x.defined()) return backward(ctx, p, dy.x, layout, s);
  return fp8_block_backward(ctx, backward_operand(ctx, p, dy), layout, s);
}

QuantTensor GroupedLinearLayer::backward_operand(Context& ctx, const Precision& p,
                                                 const GroupedInput& dy) const {
  OCTET_CHECK(p.recipe.at(site).precision == GemmPrecision::kFp8Block && !dy.x.defined(),
              "grouped linear ", gemm_site_name(site),
              ": a pre-quantized dY needs fp8-block and dy.qx, the site is ",
              gemm_precision_name(p.recipe.at(site).precision));
  QuantTensor qdy = dy.qx;
  check_prequantized(qdy, site, "dY");
  if (qdy.columnwise_data.defined()) {  // made by the caller (fp8-flow's dispatch)
    OCTET_CHECK(qdy.columnwise_granularity == Granularity::k1x128 &&
                    (qdy.columnwise_data.shape() == Shape{qdy.cols(), qdy.rows()}),
                "grouped linear ", gemm_site_name(site),
                ": a given column-wise dY must be (cols, rows) with 1x128 scales");
    return qdy;
  }
  add_columnwise(ctx, qdy, p.recipe.fp8_transpose, Granularity::k1x128);
  return qdy;
}

Tensor GroupedLinearLayer::fp8_block_backward(Context& ctx, const QuantTensor& qdy,
                                              const GroupLayoutRef& layout, const Saved& s) {
  Tensor dx = backward_data(ctx, qdy, layout);
  backward_weight(ctx, qdy, layout, s);
  return dx;
}

Tensor GroupedLinearLayer::backward_data(Context& ctx, const QuantTensor& qdy,
                                         const GroupLayoutRef& layout) {
  Tensor dx = Tensor::empty(ctx, {qdy.rows(), in()}, DType::kBF16);
  // dX = dY W
  grouped_gemm_fp8(ctx, {.a = rowwise_operand(qdy),
                         .b = fp8_t_,
                         .group_sizes = layout.sizes,
                         .d = dx,
                         .accumulate = Accumulate::kOverwrite});
  return dx;
}

void GroupedLinearLayer::backward_weight(Context& ctx, const QuantTensor& qdy,
                                         const GroupLayoutRef& layout, const Saved& s) {
  // dW += dY^T X (dW = for a fresh gradient's first writer)
  GroupedWgradFp8Args a{.a = columnwise_operand(qdy),
                        .b = columnwise_operand(s.qx),
                        .group_sizes = layout.sizes,
                        .d = param->grad,  // (E, Out, In) f32
                        .accumulate = Accumulate::kAdd};
  a.accumulate = first_write(ctx, *param, grouped_wgrad_fp8_overwrites(ctx, a))
                     ? Accumulate::kOverwrite
                     : Accumulate::kAdd;
  grouped_wgrad_fp8(ctx, a);
}

// fp8-tensor on CUDA. The per-expert preparations (their W histories) made each expert's FP8 copies
// and scale: stacked here as the blockwise grouped GEMMs read them (the per-expert copies are then
// released), each expert's scale repeated over its 128x128 blocks. W and W^T have the same
// per-tensor scale, so one expanded tensor serves both.
void GroupedLinearLayer::stack_tensorwise_weights(Context& ctx, const GemmRecipe& r) {
  const int64_t E = experts(), O = out(), I = in();
  const int64_t blocks = ceil_div(O, kGroup) * ceil_div(I, kGroup);
  const DType d8 = fp8_dtype(r.forward_format);
  fp8_ = {Tensor::empty(ctx, {E * O, I}, d8), Tensor(), Granularity::k128x128, r.forward_format};
  fp8_t_ = {Tensor::empty(ctx, {E * I, O}, d8), Tensor(), Granularity::k128x128, r.forward_format};
  Tensor per_expert = Tensor::empty(ctx, {E, 1}, DType::kF32);
  for (int64_t e = 0; e < E; ++e) {
    const QuantTensor& w = per_expert_[e].prepared.fp8;
    copy_into(ctx, fp8_.data, e * O * I, w.data);
    copy_into(ctx, fp8_t_.data, e * I * O, w.columnwise_data);
    copy_into(ctx, per_expert, e, w.scale_inv);
    // Only the stacked copies are read on CUDA: the per-expert ones go back to the stream-ordered
    // pool once the copies above have run (their W histories were recorded by the preparation).
    per_expert_[e].prepared.fp8 = QuantTensor{};
  }
  Tensor expanded = Tensor::empty(ctx, {E * blocks, 1}, DType::kF32);
  copy_columns(ctx, {.src = per_expert,
                     .src_col = 0,
                     .dst = expanded,
                     .dst_col = 0,
                     .width = 1,
                     .repeat = blocks,
                     .mode = CopyMode::kBroadcast});
  fp8_.scale_inv = expanded.reshape({E, ceil_div(O, kGroup), ceil_div(I, kGroup)});
  fp8_t_.scale_inv = expanded.reshape({E, ceil_div(I, kGroup), ceil_div(O, kGroup)});
}

Tensor GroupedLinearLayer::forward_tensorwise(Context& ctx, const GemmRecipe& r, const Tensor& x,
                                              const GroupLayoutRef& layout, Saved& s) {
  const int64_t E = experts(), R = x.rows();
  OCTET_CHECK(fp8_.data.defined() && fp8_.data.numel() == E * out() * in(), "grouped linear ",
              gemm_site_name(site), ": prepare was not called for the fp8-tensor recipe");
  const GemmRecipe::Quantization q = r.quantization(GemmOperand::kActivation);
  GroupedQuantizeArgs qa{.input = x,
                         .group_sizes = layout.sizes,
                         .format = q.format,
                         .rounding = q.rounding,
                         .output = QuantizeOutput::kBoth,
                         .columnwise_granularity = Granularity::k128x128};
  if (r.is_delayed()) qa.scale = expert_scales(ctx, &LinearScalingState::x);
  GroupedQuantTensor gx = quantize_grouped_tensorwise(ctx, qa);
  Tensor y = Tensor::empty(ctx, {R, out()}, DType::kBF16);
  grouped_gemm_fp8(ctx, {.a = rowwise_operand(gx.q),
                         .b = fp8_,
                         .group_sizes = layout.sizes,
                         .d = y,
                         .accumulate = Accumulate::kOverwrite});
  if (r.is_delayed()) {
    reduce_amax_over_ranks(ctx, gx.amax);  // every expert's at once
    for (int64_t e = 0; e < E; ++e) {
      LinearScalingState& st = per_expert_[e].state;
      record_amax(ctx, st, st.x, st.x_steps, element(gx.amax, e), r, GemmOperand::kActivation);
    }
  }
  // Wgrad reads only the column-wise copy.
  s.qx = gx.q;
  s.qx.data = Tensor::wrap(nullptr, {R, in()}, gx.q.data.dtype(), ctx.device);
  s.qx.scale_inv = Tensor();
  return y;
}

Tensor GroupedLinearLayer::expert_scales(Context& ctx,
                                         DelayedScaling LinearScalingState::*operand) const {
  Tensor scales = Tensor::empty(ctx, {experts()}, DType::kF32);
  for (int64_t e = 0; e < experts(); ++e)
    copy_into(ctx, scales, e, (per_expert_[static_cast<size_t>(e)].state.*operand).scale);
  return scales;
}

Tensor GroupedLinearLayer::backward_tensorwise(Context& ctx, const GemmRecipe& r, const Tensor& dy,
                                               const GroupLayoutRef& layout, const Saved& s) {
  const int64_t E = experts(), R = dy.rows();
  const GemmRecipe::Quantization q = r.quantization(GemmOperand::kGradient);
  GroupedQuantizeArgs qa{.input = dy,
                         .group_sizes = layout.sizes,
                         .format = q.format,
                         .rounding = q.rounding,
                         .output = QuantizeOutput::kBoth,
                         .columnwise_granularity = Granularity::k1x128};
  if (r.is_delayed()) qa.scale = expert_scales(ctx, &LinearScalingState::dy);
  GroupedQuantTensor gdy = quantize_grouped_tensorwise(ctx, qa);
  Tensor dx = Tensor::empty(ctx, {R, in()}, DType::kBF16);
  // dX = dY W
  grouped_gemm_fp8(ctx, {.a = rowwise_operand(gdy.q),
                         .b = fp8_t_,
                         .group_sizes = layout.sizes,
                         .d = dx,
                         .accumulate = Accumulate::kOverwrite});
  // dW += dY^T X
  grouped_wgrad_fp8(ctx, {.a = columnwise_operand(gdy.q),
                          .b = columnwise_operand(s.qx),
                          .group_sizes = layout.sizes,
                          .d = param->grad,
                          .accumulate = Accumulate::kAdd});
  if (r.is_delayed()) {
    reduce_amax_over_ranks(ctx, gdy.amax);  // every expert's at once
    for (int64_t e = 0; e < E; ++e) {
      LinearScalingState& st = per_expert_[e].state;
      record_amax(ctx, st, st.dy, st.dy_steps, element(gdy.amax, e), r, GemmOperand::kGradient);
    }
  }
  return dx;
}

}  // namespace octet
