// The dense SwiGLU MLP (model/dense_mlp.h: the dense layer and the MoE's shared experts) with its
// SwiGLU and dSwiGLU fused into the next Linear's 1x128 quantization, on the CPU:
//   - swiglu_quantize_stored / swiglu_backward_quantize_stored bit for bit against the unfused
//     pair they replace (swiglu_forward / swiglu_backward in the stored dtype, then quantize()),
//     on partial groups and tiles, both formats, both roundings, every output;
//   - SwigluMlp forward and backward bit for bit against the old unfused layer composed here from
//     the same LinearLayers (output, dx, both weight gradients, the saved FP8 copies), at the
//     dense and the shared-expert sites, in deepseek, fp8-flow, bf16 and fp8-tensor-current (the
//     last two keep the unfused path);
//   - the casts the fused path counts (core/cast_counter.h).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <tuple>

#include "backend/backend.h"
#include "core/cast_counter.h"
#include "model/dense_mlp.h"
#include "model/site_probe.h"
#include "ops/quantize/quantize.h"
#include "ops/swiglu/swiglu.h"
#include "test_util.h"

namespace octet {
namespace {

using test::bitwise_equal;
using test::Dist;
using test::random_tensor;

Context& cpu() {
  static Context c = make_context(Device::kCpu);
  return c;
}

// Every copy a QuantTensor holds, bit for bit (a copy absent from `want` must be absent from
// `got`).
::testing::AssertionResult same_quant(const QuantTensor& want, const QuantTensor& got) {
  for (auto [a, b, what] :
       {std::tuple{&want.data, &got.data, "data"},
        std::tuple{&want.scale_inv, &got.scale_inv, "scale_inv"},
        std::tuple{&want.columnwise_data, &got.columnwise_data, "columnwise_data"},
        std::tuple{&want.columnwise_scale_inv, &got.columnwise_scale_inv, "columnwise_scale_inv"},
        std::tuple{&want.amax, &got.amax, "amax"}}) {
    if ((a->data() == nullptr) != (b->data() == nullptr))
      return ::testing::AssertionFailure() << what << ": present in one result only";
    if (a->data() == nullptr) continue;
    auto r = bitwise_equal(*a, *b);
    if (!r) return r << " [" << what << "]";
  }
  return ::testing::AssertionSuccess();
}

QuantizeArgs quantize_1x128(const Tensor& t, Fp8Format f, ScaleRounding r, QuantizeOutput o) {
  QuantizeArgs qa;
  qa.input = t;
  qa.format = f;
  qa.granularity = Granularity::k1x128;
  qa.rounding = r;
  qa.output = o;
  return qa;
}

TEST(SwigluQuantizeStored, MatchesTheUnfusedPairBitwise) {
  Context& ctx = cpu();
  int seed = 0;
  for (auto [rows, f] : {std::pair<int64_t, int64_t>{1, 7}, {127, 129}, {129, 64}, {200, 704}})
    for (DType dt : {DType::kBF16, DType::kF32})
      for (Dist dist : {Dist::kGaussian, Dist::kOutliers, Dist::kWide}) {
        const Tensor gu = random_tensor({rows, 2 * f}, dt, 100 + ++seed, dist);
        const Tensor dh = random_tensor({rows, f}, dt, 500 + seed, dist);
        Tensor h = Tensor::empty({rows, f}, dt), dgu = Tensor::empty({rows, 2 * f}, dt);
        swiglu_forward(ctx, {.gate_up = gu, .h = h});
        swiglu_backward(ctx, {.dh = dh, .gate_up = gu, .d_gate_up = dgu});
        for (Fp8Format fmt : {Fp8Format::kE4M3, Fp8Format::kE5M2})
          for (ScaleRounding rnd : {ScaleRounding::kExact, ScaleRounding::kPow2})
            for (QuantizeOutput out :
                 {QuantizeOutput::kBoth, QuantizeOutput::kRowwise, QuantizeOutput::kColumnwise}) {
              const std::string where =
                  std::to_string(rows) + "x" + std::to_string(f) + " " +
                  std::string(dtype_name(dt)) + " dist " + std::to_string(static_cast<int>(dist)) +
                  " " + format_name(fmt) + " output " + std::to_string(static_cast<int>(out));
              const SwigluStoredQuantizeArgs a{
                  .gate_up = gu, .dh = dh, .format = fmt, .rounding = rnd, .output = out};
              ASSERT_TRUE(same_quant(quantize(ctx, quantize_1x128(h, fmt, rnd, out)),
                                     swiglu_quantize_stored(ctx, a)))
                  << where << " forward";
              ASSERT_TRUE(same_quant(quantize(ctx, quantize_1x128(dgu, fmt, rnd, out)),
                                     swiglu_backward_quantize_stored(ctx, a)))
                  << where << " backward";
            }
      }
}

TEST(SwigluQuantizeStored, EmptyRowsAndBadInput) {
  Context& ctx = cpu();
  const QuantTensor q =
      swiglu_quantize_stored(ctx, {.gate_up = Tensor::empty({0, 256}, DType::kBF16)});
  EXPECT_EQ(q.data.shape(), (Shape{0, 128}));
  EXPECT_EQ(q.columnwise_data.shape(), (Shape{128, 0}));
  EXPECT_EQ(q.amax.data_as<float>()[0], 0.0f);
  const Tensor gu = random_tensor({4, 256}, DType::kBF16, 1);
  EXPECT_THROW(swiglu_backward_quantize_stored(ctx, {.gate_up = gu}), Error);  // no dh
  EXPECT_THROW(swiglu_backward_quantize_stored(
                   ctx, {.gate_up = gu, .dh = random_tensor({4, 128}, DType::kF32, 2)}),
               Error);  // dh not in the stored dtype
  EXPECT_THROW(swiglu_quantize_stored(ctx, {.gate_up = random_tensor({4, 255}, DType::kBF16, 3)}),
               Error);  // odd width
  EXPECT_THROW(swiglu_quantize_stored(ctx, {.gate_up = gu, .epsilon = -1.0f}), Error);
}

// One SwiGLU MLP with its own master weights, at the dense or the shared-expert sites.
struct Mlp {
  static constexpr int64_t kD = 256, kI = 384;
  Parameter up, down;
  SwigluMlp mlp;

  Mlp(GemmSite up_site, GemmSite down_site, const Precision& p) {
    up.value = random_tensor({2 * kI, kD}, DType::kF32, 11);
    down.value = random_tensor({kD, kI}, DType::kF32, 12);
    for (Parameter* w : {&up, &down}) {
      scale(w->value, 0.05f);
      w->grad = Tensor::empty(w->value.shape(), DType::kF32);
    }
    mlp.gate_up = LinearLayer{.site = up_site, .param = &up};
    mlp.down = LinearLayer{.site = down_site, .param = &down};
    for (LinearLayer* l : {&mlp.gate_up, &mlp.down}) {
      l->init_state(cpu(), p.recipe);
      l->prepare(cpu(), p);
    }
  }
  static void scale(Tensor& t, float s) {
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] *= s;
  }
  void zero_grads() {
    for (Parameter* w : {&up, &down}) std::memset(w->grad.data(), 0, w->grad.nbytes());
  }
};

struct Pass {
  Tensor y, dx, d_up, d_down;
  LinearSaved saved_up, saved_down;
};

Pass copy_grads(Pass r, Mlp& m) {
  r.d_up = m.up.grad.to_host(cpu());
  r.d_down = m.down.grad.to_host(cpu());
  return r;
}

// The layer as it ran before the fusion: SwiGLU into a BF16 h, down quantizes h itself; dSwiGLU
// into a BF16 dgu, gate_up quantizes it itself.
Pass unfused(Mlp& m, const Precision& p, const Tensor& x, const Tensor& dy) {
  Context& ctx = cpu();
  m.zero_grads();
  Pass r;
  const Tensor gu = m.mlp.gate_up.forward(ctx, p, x, r.saved_up);
  Tensor h = Tensor::empty(ctx, {gu.rows(), gu.cols() / 2}, gu.dtype());
  swiglu_forward(ctx, {.gate_up = gu, .h = h});
  r.y = m.mlp.down.forward(ctx, p, h, r.saved_down);
  const Tensor dh = m.mlp.down.backward(ctx, p, dy, r.saved_down);
  Tensor dgu = Tensor::empty(ctx, gu.shape(), dh.dtype());
  swiglu_backward(ctx, {.dh = dh, .gate_up = gu, .d_gate_up = dgu});
  r.dx = m.mlp.gate_up.backward(ctx, p, dgu, r.saved_up);
  return copy_grads(r, m);
}

Pass layer(Mlp& m, const Precision& p, const Tensor& x, const Tensor& dy) {
  Context& ctx = cpu();
  m.zero_grads();
  SwigluMlp::Saved s;
  Pass r;
  r.y = m.mlp.forward(ctx, p, x, s);
  r.dx = m.mlp.backward(ctx, p, dy, s);
  r.saved_up = s.gate_up;
  r.saved_down = s.down;
  return copy_grads(r, m);
}

::testing::AssertionResult same_saved(const LinearSaved& want, const LinearSaved& got) {
  if (want.x.defined() != got.x.defined())
    return ::testing::AssertionFailure() << "x kept by one path only";
  if (want.x.defined()) return bitwise_equal(want.x, got.x);
  return same_quant(want.qx, got.qx);
}

class DenseMlpFused : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(DenseMlpFused, BitwiseTheUnfusedLayer) {
  const auto& [recipe, shared] = GetParam();
  const Precision p{recipe_preset(recipe), DType::kBF16};
  Mlp m(shared ? GemmSite::kSharedGateUp : GemmSite::kDenseGateUp,
        shared ? GemmSite::kSharedDown : GemmSite::kDenseDown, p);
  for (int64_t tokens : {int64_t{200}, int64_t{256}}) {
    const Tensor x = random_tensor({tokens, Mlp::kD}, DType::kBF16, 21 + tokens, Dist::kOutliers);
    const Tensor dy = random_tensor({tokens, Mlp::kD}, DType::kBF16, 22 + tokens);
    const Pass want = unfused(m, p, x, dy), got = layer(m, p, x, dy);
    const std::string where =
        recipe + (shared ? " shared" : " dense") + " T " + std::to_string(tokens);
    EXPECT_TRUE(bitwise_equal(want.y, got.y)) << where << " y";
    EXPECT_TRUE(bitwise_equal(want.dx, got.dx)) << where << " dx";
    EXPECT_TRUE(bitwise_equal(want.d_up, got.d_up)) << where << " d gate_up";
    EXPECT_TRUE(bitwise_equal(want.d_down, got.d_down)) << where << " d down";
    EXPECT_TRUE(same_saved(want.saved_up, got.saved_up)) << where << " saved gate_up input";
    EXPECT_TRUE(same_saved(want.saved_down, got.saved_down)) << where << " saved down input (h)";
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, DenseMlpFused,
                         ::testing::Combine(::testing::Values("deepseek", "fp8-flow", "bf16",
                                                              "fp8-tensor-current"),
                                            ::testing::Bool()));

// Per forward + backward: x and dy are quantized by the Linears (both copies each: 4 explicit
// casts); h and dgu by the fused SwiGLU kernels (both copies each: 4 fused). Before the fusion
// SwiGLU's output and gradient were quantized explicitly too (8 explicit, 0 fused).
TEST(DenseMlpFusedCasts, Counted) {
  for (const char* recipe : {"deepseek", "fp8-flow", "fp8-tensor-current", "bf16"}) {
    const Precision p{recipe_preset(recipe), DType::kBF16};
    Mlp m(GemmSite::kSharedGateUp, GemmSite::kSharedDown, p);
    Context ctx = make_context(Device::kCpu);
    ctx.casts = std::make_shared<CastCounter>();
    SwigluMlp::Saved s;
    const Tensor x = random_tensor({128, Mlp::kD}, DType::kBF16, 31);
    m.zero_grads();
    m.mlp.backward(ctx, p, m.mlp.forward(ctx, p, x, s), s);
    const CastCounts c = ctx.casts->at("other");
    const bool block = std::string(recipe) != "bf16" && std::string(recipe) != "fp8-tensor-current";
    const bool fp8 = std::string(recipe) != "bf16";
    EXPECT_EQ(c[CastKind::kQuantize], block ? 4 : (fp8 ? 8 : 0)) << recipe;
    EXPECT_EQ(c[CastKind::kFusedQuantize], block ? 4 : 0) << recipe;
    EXPECT_EQ(c[CastKind::kDequantize], 0) << recipe;
  }
}

// With a site probe the Linears record their unquantized inputs, so the layer keeps the unfused
// pair (and still gives the same bits).
TEST(DenseMlpFused, ProbeKeepsTheUnfusedPath) {
  const Precision plain{recipe_preset("deepseek"), DType::kBF16};
  Mlp m(GemmSite::kDenseGateUp, GemmSite::kDenseDown, plain);
  const Tensor x = random_tensor({128, Mlp::kD}, DType::kBF16, 41);
  const Tensor dy = random_tensor({128, Mlp::kD}, DType::kBF16, 42);
  const Pass want = layer(m, plain, x, dy);
  SiteProbe probe;
  Precision probed = plain;
  probed.probe = &probe;
  Context ctx = make_context(Device::kCpu);
  ctx.casts = std::make_shared<CastCounter>();
  m.zero_grads();
  SwigluMlp::Saved s;
  const Tensor y = m.mlp.forward(ctx, probed, x, s);
  const Tensor dx = m.mlp.backward(ctx, probed, dy, s);
  EXPECT_EQ(ctx.casts->at("other")[CastKind::kFusedQuantize], 0);
  EXPECT_TRUE(bitwise_equal(want.y, y));
  EXPECT_TRUE(bitwise_equal(want.dx, dx));
  EXPECT_TRUE(bitwise_equal(want.d_up, m.up.grad));
}

}  // namespace
}  // namespace octet
