// Linear layer: weight preparation, forward, and backward under it (linear.h states the math, the
// per-recipe operand copies, the delayed-scaling order and the CUDA shape rules).
#include "model/linear.h"

#include "dist/comm.h"

#include "ops/cast/cast.h"
#include "ops/gemm/gemm.h"

namespace octet {
namespace {

// The FP8 GEMMs on CUDA read rows of K in 16-byte vectors (gemm.h); each of In, Out and T is the K
// of one of the three GEMMs.
void check_cuda_dim(Context& ctx, GemmSite site, const GemmRecipe& r, const char* dim, int64_t v,
                    const char* gemm) {
  if (ctx.device != Device::kCuda || !r.is_fp8()) return;
  OCTET_CHECK(v % 16 == 0, "linear ", gemm_site_name(site), " on CUDA (",
              gemm_precision_name(r.precision), "): ", dim, " = ", v,
              " must be a multiple of 16; it is the K of the ", gemm,
              " GEMM and cuBLASLt reads FP8 rows in 16-byte vectors");
}

void check_state(GemmSite site, const GemmRecipe& r, const LinearScalingState* state) {
  OCTET_CHECK(!r.is_delayed() || state != nullptr, "linear ", gemm_site_name(site),
              ": the fp8-tensor recipe with delayed scaling needs a LinearScalingState "
              "(make_linear_scaling_state), got none");
}

void check_bf16_matrix(Context& ctx, GemmSite site, const Tensor& t, const char* name,
                       const GemmRecipe& r) {
  OCTET_CHECK(t.data() != nullptr || t.numel() == 0, "linear ", gemm_site_name(site), " ", name,
              ": tensor has no storage");
  OCTET_CHECK(t.rank() >= 2, "linear ", gemm_site_name(site), " ", name,
              ": expected shape (T, features), got ", shape_str(t.shape()));
  if (ctx.device == Device::kCpu && !r.is_fp8())
    check_dtype(t, name, {DType::kBF16, DType::kF32});  // F32: the FP32 checking mode
  else
    check_dtype(t, name, {DType::kBF16});
  check_device(t, name, ctx.device);
}

// x's shape with the last dimension replaced: y keeps x's leading (batch, sequence) dimensions.
Shape with_cols(const Shape& s, int64_t cols) {
  Shape out = s;
  out.back() = cols;
  return out;
}

// x or dy in one pass: row-wise for the GEMM of this pass, column-wise for Wgrad. Delayed scaling
// reads the state's scale (computed from earlier steps' amaxes). 1x128 scales are written in
// cuBLASLt's MN-major layout (core/scale_layout.h): every consumer of these copies is a dense
// gemm_fp8, which then reads them in place (no re-layout per GEMM call).
QuantTensor quantize_both(Context& ctx, const Tensor& t, const GemmRecipe& r, GemmOperand operand,
                          const DelayedScaling* ds, QuantizeOutput output = QuantizeOutput::kBoth) {
  QuantizeArgs qa = quantize_args(r, operand, t, output);
  if (ds != nullptr) qa.scale = ds->scale;
  if (qa.granularity == Granularity::k1x128) qa.scale_layout = ScaleLayout::kMNMajor;
  return quantize(ctx, qa);
}

// After the quantized tensor was consumed: this step's amax enters the history and sets the scale
// the next step uses (TransformerEngine's order).
void record_amax(Context& ctx, const LinearScalingState& st, DelayedScaling& ds, int64_t& steps,
                 const Tensor& amax, const GemmRecipe& r, GemmOperand operand) {
  const GemmRecipe::Quantization q = r.quantization(operand);
  reduce_amax_over_ranks(ctx, amax);
  delayed_scaling_update(
      ctx, ds, amax, steps, st.reduce,
      {.format = q.format, .rounding = q.rounding, .epsilon = 0.0f, .margin = st.margin});
  ++steps;
}

void check_prepared(GemmSite site, const PreparedWeight& w, const GemmRecipe& r, int64_t in,
                    const char* dim_name) {
  OCTET_CHECK(w.precision == r.precision, "linear ", gemm_site_name(site),
              ": the prepared weight is ", gemm_precision_name(w.precision), " but the recipe is ",
              gemm_precision_name(r.precision), " (prepare_weight with the same recipe)");
  OCTET_CHECK(w.in_features == in, "linear ", gemm_site_name(site), ": ", dim_name, " has ", in,
              " features (In), the weight expects ", w.in_features);
}

}  // namespace

bool same_input_quantization(const GemmRecipe& a, const GemmRecipe& b) {
  if (!a.is_fp8() || a.is_delayed() || a.precision != b.precision || b.is_delayed()) return false;
  const GemmRecipe::Quantization x = a.quantization(GemmOperand::kActivation),
                                 y = b.quantization(GemmOperand::kActivation);
  return x.format == y.format && x.granularity == y.granularity && x.rounding == y.rounding;
}

QuantizeArgs quantize_args(const GemmRecipe& recipe, GemmOperand operand, const Tensor& input,
                           QuantizeOutput output) {
  const GemmRecipe::Quantization q = recipe.quantization(operand);
  QuantizeArgs qa;
  qa.input = input;
  qa.format = q.format;
  qa.granularity = q.granularity;
  qa.rounding = q.rounding;
  qa.output = output;
  // The amax is read only by delayed scaling, and per-tensor current scaling needs it for its
  // scale: group-scaled quantizations skip it (and on CUDA the memset before their kernel).
  qa.amax = q.granularity == Granularity::kTensor;
  return qa;
}

void reduce_amax_over_ranks(Context& ctx, const Tensor& amax) {
  if (!ctx.comm || ctx.comm->size() <= 1) return;
  OCTET_CHECK(amax.dtype() == DType::kF32 && amax.device() == ctx.device,
              "delayed scaling: the amax to reduce over ranks must be f32 on ",
              device_name(ctx.device));
  ctx.comm->all_reduce(ctx, amax.data(), amax.data(), amax.numel(), DType::kF32, ReduceOp::kMax);
}

LinearScalingState make_linear_scaling_state(Context& ctx, const Recipe& recipe) {
  LinearScalingState s;
  s.x = make_delayed_scaling(ctx, recipe.amax_history_len);
  s.w = make_delayed_scaling(ctx, recipe.amax_history_len);
  s.dy = make_delayed_scaling(ctx, recipe.amax_history_len);
  s.reduce = recipe.amax_reduction;
  s.margin = recipe.margin;
  return s;
}

PreparedWeight prepare_weight(Context& ctx, const PrepareWeightArgs& a) {
  const Tensor& w = a.weight;
  const GemmRecipe& r = a.recipe;
  OCTET_CHECK(w.data() != nullptr || w.numel() == 0, "linear ", gemm_site_name(a.site),
              " weight: tensor has no storage");
  OCTET_CHECK(w.rank() == 2, "linear ", gemm_site_name(a.site),
              " weight: expected shape (Out, In), got ", shape_str(w.shape()));
  check_dtype(w, "linear weight", {DType::kF32});
  check_device(w, "linear weight", ctx.device);
  check_state(a.site, r, a.state);
  check_cuda_dim(ctx, a.site, r, "In", w.cols(), "Fprop");
  check_cuda_dim(ctx, a.site, r, "Out", w.rows(), "Dgrad");

  PreparedWeight p;
  p.precision = r.precision;
  p.out_features = w.rows();
  p.in_features = w.cols();
  if (!r.is_fp8()) {
    OCTET_CHECK(a.activation_dtype == DType::kBF16 ||
                    (a.activation_dtype == DType::kF32 && ctx.device == Device::kCpu),
                "linear ", gemm_site_name(a.site),
                ": activations must be BF16 (F32 only in the CPU's FP32 checking mode)");
    p.bf16 = cast(ctx, w, a.activation_dtype);  // Dgrad reads it MN-major: no transposed copy
    return p;
  }
  QuantizeArgs qa = quantize_args(r, GemmOperand::kWeight, w, QuantizeOutput::kBoth);
  if (r.is_delayed()) qa.scale = a.state->w.scale;
  p.fp8 = quantize(ctx, qa);
  // Delayed scaling: W's amax of this optimizer step sets the scale of the next preparation.
  if (r.is_delayed())
    record_amax(ctx, *a.state, a.state->w, a.state->w_steps, p.fp8.amax, r, GemmOperand::kWeight);
  return p;
}

Tensor linear_forward(Context& ctx, const LinearArgs& a, LinearSaved& saved) {
  const GemmRecipe& r = a.recipe;
  const PreparedWeight& w = a.weight;
  check_bf16_matrix(ctx, a.site, a.x, "linear x", r);
  check_prepared(a.site, w, r, a.x.cols(), "x");
  check_state(a.site, r, a.state);
  check_cuda_dim(ctx, a.site, r, "In", a.x.cols(), "Fprop");
  check_cuda_dim(ctx, a.site, r, "T (tokens)", a.x.rows(), "Wgrad");

  const int64_t t = a.x.rows();
  Tensor y = Tensor::empty(ctx, with_cols(a.x.shape(), w.out_features), a.x.dtype());
  Tensor y2 = y.reshape({t, w.out_features});
  saved = LinearSaved{};
  saved.precision = r.precision;
  if (!r.is_fp8()) {
    gemm_bf16(ctx, {.a = a.x.reshape({t, w.in_features}),
                    .b = w.bf16,
                    .d = y2,
                    .accumulate = Accumulate::kOverwrite});
    saved.x = a.x;
    return y;
  }
  DelayedScaling* ds = r.is_delayed() ? &a.state->x : nullptr;
  const bool keep_fp8 = a.saved_storage == Storage::kFp8;
  OCTET_CHECK(a.shared_x == nullptr || (keep_fp8 && !r.is_delayed()), "linear ",
              gemm_site_name(a.site),
              ": a shared quantization of x needs FP8 saved storage and no delayed scaling");
  const bool reuse = a.shared_x != nullptr && a.shared_x->data.data() != nullptr;
  QuantTensor qx = reuse
                       ? *a.shared_x
                       : quantize_both(ctx, a.x, r, GemmOperand::kActivation, ds,
                                       keep_fp8 ? QuantizeOutput::kBoth : QuantizeOutput::kRowwise);
  if (reuse)
    OCTET_CHECK(qx.rows() == t && qx.cols() == w.in_features && qx.has_columnwise(), "linear ",
                gemm_site_name(a.site), ": the shared quantization of x is ",
                shape_str(qx.data.shape()), ", x is ", shape_str({t, w.in_features}));
  else if (a.shared_x != nullptr)
    *a.shared_x = qx;
  GemmFp8Args g;
  g.a = rowwise_operand(qx);     // (T, In)
  g.b = rowwise_operand(w.fp8);  // (Out, In)
  g.d = y2;                      // (T, Out) bf16
  gemm_fp8(ctx, g);
  if (ds != nullptr)
    record_amax(ctx, *a.state, *ds, a.state->x_steps, qx.amax, r, GemmOperand::kActivation);
  if (!keep_fp8) {
    // The site keeps x in a wider storage (DeepSeek-V3's E5M6 o_proj input); backward rounds it
    // to that storage (E5M6: a pure function of x, so the same bits as rounding it here) and
    // quantizes it for Wgrad. x itself is kept: the caller keeps it anyway (the attention output,
    // which the attention backward reads), so the rounded copy lives only inside the backward.
    saved.x = a.x;
    saved.storage = a.saved_storage;
    return y;
  }
  // Wgrad reads only the column-wise copy: release the row-wise one, keep the logical shape.
  qx.data = Tensor::wrap(nullptr, {t, w.in_features}, qx.data.dtype(), ctx.device);
  qx.scale_inv = Tensor();
  saved.qx = qx;
  return y;
}

Tensor linear_backward(Context& ctx, const LinearBackwardArgs& a, LinearGrads& grads) {
  const GemmRecipe& r = a.recipe;
  const PreparedWeight& w = a.weight;
  const LinearSaved& s = a.saved;
  check_bf16_matrix(ctx, a.site, a.dy, "linear dy", r);
  OCTET_CHECK(s.precision == r.precision, "linear ", gemm_site_name(a.site), ": saved for ",
              gemm_precision_name(s.precision), " but the recipe is ",
              gemm_precision_name(r.precision));
  const bool saved_fp8 = r.is_fp8() && !s.x.defined();
  check_prepared(a.site, w, r, saved_fp8 ? s.qx.cols() : s.x.cols(), "the saved x");
  OCTET_CHECK(a.dy.cols() == w.out_features, "linear ", gemm_site_name(a.site), " dy: expected ",
              w.out_features, " (Out) columns, got ", a.dy.cols());
  const int64_t t = a.dy.rows(), saved_t = saved_fp8 ? s.qx.rows() : s.x.rows();
  OCTET_CHECK(t == saved_t, "linear ", gemm_site_name(a.site), " dy: expected ", saved_t,
              " tokens (the forward's T), got ", t);
  check_dtype(grads.weight, "linear grads.weight", {DType::kF32});
  check_device(grads.weight, "linear grads.weight", ctx.device);
  OCTET_CHECK(grads.weight.shape() == (Shape{w.out_features, w.in_features}), "linear ",
              gemm_site_name(a.site), " grads.weight: expected shape ",
              shape_str({w.out_features, w.in_features}), ", got ",
              shape_str(grads.weight.shape()));
  check_state(a.site, r, a.state);
  check_cuda_dim(ctx, a.site, r, "Out", a.dy.cols(), "Dgrad");
  check_cuda_dim(ctx, a.site, r, "T (tokens)", t, "Wgrad");

  Tensor dx = Tensor::empty(ctx, with_cols(a.dy.shape(), w.in_features), a.dy.dtype());
  Tensor dx2 = dx.reshape({t, w.in_features});
  const Accumulate wgrad_accumulate = grads.overwrite ? Accumulate::kOverwrite : Accumulate::kAdd;
  if (!r.is_fp8()) {
    const Tensor dy2 = a.dy.reshape({t, w.out_features});
    // dx = dy W: W (Out, In) is B = W^T stored MN-major.
    gemm_bf16(ctx, {.a = dy2,
                    .b = w.bf16,
                    .d = dx2,
                    .accumulate = Accumulate::kOverwrite,
                    .a_layout = OperandLayout::kKMajor,
                    .b_layout = OperandLayout::kMNMajor});
    // dW += dy^T x: Wgrad's K is T, and dy (T, Out) and x (T, In) are read as they are stored.
    gemm_bf16(ctx, {.a = dy2,
                    .b = s.x.reshape({t, w.in_features}),
                    .d = grads.weight,
                    .accumulate = wgrad_accumulate,
                    .a_layout = OperandLayout::kMNMajor,
                    .b_layout = OperandLayout::kMNMajor});
    return dx;
  }
  DelayedScaling* ds = r.is_delayed() ? &a.state->dy : nullptr;
  QuantTensor qdy = quantize_both(ctx, a.dy, r, GemmOperand::kGradient, ds);
  GemmFp8Args dgrad;
  dgrad.a = rowwise_operand(qdy);       // (T, Out)
  dgrad.b = columnwise_operand(w.fp8);  // W^T (In, Out)
  dgrad.d = dx2;                        // (T, In) bf16
  gemm_fp8(ctx, dgrad);                 // dx = dy W
  GemmFp8Args wgrad;
  wgrad.a = columnwise_operand(qdy);  // dy^T (Out, T), groups along T
  // x^T (In, T), groups along T: the saved FP8 copy, or quantized now from the wider storage.
  QuantTensor qx;
  if (saved_fp8) {
    qx = s.qx;
  } else {
    const Tensor x_stored =
        s.storage == Storage::kE5M6 ? round_to_storage(ctx, s.x, kE5M6Format) : s.x;
    qx = quantize_both(ctx, x_stored, r, GemmOperand::kActivation,
                       r.is_delayed() ? &a.state->x : nullptr, QuantizeOutput::kColumnwise);
  }
  wgrad.b = columnwise_operand(qx);
  wgrad.d = grads.weight;  // (Out, In) f32
  wgrad.accumulate = wgrad_accumulate;
  gemm_fp8(ctx, wgrad);  // dW += dy^T x (= for the first writer)
  if (ds != nullptr)
    record_amax(ctx, *a.state, *ds, a.state->dy_steps, qdy.amax, r, GemmOperand::kGradient);
  return dx;
}

}  // namespace octet
