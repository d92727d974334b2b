// The fused SwiGLU + quantize of the dense SwiGLU MLP (model/dense_mlp.h) on CUDA:
//   - swiglu_quantize_stored / swiglu_backward_quantize_stored (ops/quantize's tile kernel with a
//     SwiGLU source) bit for bit against the CPU reference and against the unfused pair on the GPU
//     (swiglu_forward / swiglu_backward, then quantize()), on odd shapes, both dtypes, formats,
//     roundings and outputs;
//   - SwigluMlp forward and backward on CUDA bit for bit against the old unfused layer composed on
//     the GPU from the same LinearLayers (y, dx, both weight gradients, the saved FP8 copies): the
//     GEMMs read the same operands, so the layer's results cannot move. The CPU comparison of the
//     whole layer (within the GEMMs' tolerance) is the model GPU tests'.
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "backend/backend.h"
#include "model/dense_mlp.h"
#include "ops/quantize/quantize.h"
#include "ops/swiglu/swiglu.h"
#include "test_util.h"

namespace octet {
namespace {

using test::bitwise_equal;
using test::Dist;
using test::random_tensor;

struct Devices {
  Context cpu = make_context(Device::kCpu);
  Context gpu = make_context(Device::kCuda);
};

Devices& devices() {
  static Devices d;
  return d;
}

Tensor host(const Tensor& t) {
  return t.device() == Device::kCuda ? t.to_host(devices().gpu) : t;
}

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
    auto r = bitwise_equal(host(*a), host(*b));
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

using Case = std::tuple<int64_t, int64_t, DType>;  // rows, F, stored dtype
class SwigluQuantizeStoredGpu : public ::testing::TestWithParam<Case> {};

TEST_P(SwigluQuantizeStoredGpu, MatchesCpuAndTheUnfusedPairBitwise) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const auto& [rows, f, dt] = GetParam();
  for (Dist dist : {Dist::kGaussian, Dist::kOutliers, Dist::kWide}) {
    const int seed = static_cast<int>(rows * 7 + f) + static_cast<int>(dist);
    const Tensor gu = random_tensor({rows, 2 * f}, dt, 300 + seed, dist);
    const Tensor dh = random_tensor({rows, f}, dt, 900 + seed, dist);
    const Tensor gu_d = gu.to(gpu, Device::kCuda), dh_d = dh.to(gpu, Device::kCuda);
    Tensor h_d = Tensor::empty(gpu, {rows, f}, dt), dgu_d = Tensor::empty(gpu, {rows, 2 * f}, dt);
    swiglu_forward(gpu, {.gate_up = gu_d, .h = h_d});
    swiglu_backward(gpu, {.dh = dh_d, .gate_up = gu_d, .d_gate_up = dgu_d});
    for (Fp8Format fmt : {Fp8Format::kE4M3, Fp8Format::kE5M2})
      for (ScaleRounding rnd : {ScaleRounding::kExact, ScaleRounding::kPow2})
        for (QuantizeOutput out :
             {QuantizeOutput::kBoth, QuantizeOutput::kRowwise, QuantizeOutput::kColumnwise}) {
          const std::string where =
              std::to_string(rows) + "x" + std::to_string(f) + " " + std::string(dtype_name(dt)) +
              " dist " + std::to_string(static_cast<int>(dist)) + " " + format_name(fmt) +
              " output " + std::to_string(static_cast<int>(out));
          const SwigluStoredQuantizeArgs a{
              .gate_up = gu, .dh = dh, .format = fmt, .rounding = rnd, .output = out};
          SwigluStoredQuantizeArgs ad = a;
          ad.gate_up = gu_d;
          ad.dh = dh_d;
          const QuantTensor fwd = swiglu_quantize_stored(gpu, ad);
          ASSERT_TRUE(same_quant(swiglu_quantize_stored(cpu, a), fwd)) << where << " fwd vs cpu";
          ASSERT_TRUE(same_quant(quantize(gpu, quantize_1x128(h_d, fmt, rnd, out)), fwd))
              << where << " fwd vs the unfused pair on the GPU";
          const QuantTensor bwd = swiglu_backward_quantize_stored(gpu, ad);
          ASSERT_TRUE(same_quant(swiglu_backward_quantize_stored(cpu, a), bwd))
              << where << " bwd vs cpu";
          ASSERT_TRUE(same_quant(quantize(gpu, quantize_1x128(dgu_d, fmt, rnd, out)), bwd))
              << where << " bwd vs the unfused pair on the GPU";
        }
  }
}

INSTANTIATE_TEST_SUITE_P(OddShapes, SwigluQuantizeStoredGpu,
                         ::testing::Combine(::testing::Values(1, 127, 129, 1481),
                                            ::testing::Values(7, 129, 704, 2048),
                                            ::testing::Values(DType::kBF16, DType::kF32)));

// One SwiGLU MLP on the GPU, at the dense or the shared-expert sites.
struct GpuMlp {
  static constexpr int64_t kD = 256, kI = 384;
  Parameter up, down;
  SwigluMlp mlp;

  GpuMlp(GemmSite up_site, GemmSite down_site, const Precision& p) {
    Context& gpu = devices().gpu;
    int seed = 51;
    for (Parameter* w : {&up, &down}) {
      Tensor v = random_tensor(w == &up ? Shape{2 * kI, kD} : Shape{kD, kI}, DType::kF32, ++seed);
      for (int64_t i = 0; i < v.numel(); ++i) v.data_as<float>()[i] *= 0.05f;
      w->value = v.to(gpu, Device::kCuda);
      w->grad = Tensor::empty(gpu, v.shape(), DType::kF32);
    }
    mlp.gate_up = LinearLayer{.site = up_site, .param = &up};
    mlp.down = LinearLayer{.site = down_site, .param = &down};
    for (LinearLayer* l : {&mlp.gate_up, &mlp.down}) {
      l->init_state(gpu, p.recipe);
      l->prepare(gpu, p);
    }
  }
  void zero_grads() {
    Context& gpu = devices().gpu;
    for (Parameter* w : {&up, &down}) gpu.be().memset(w->grad.data(), 0, w->grad.nbytes());
  }
};

struct Pass {
  Tensor y, dx, d_up, d_down;
  LinearSaved saved_up, saved_down;
};

Pass finish(Pass r, GpuMlp& m) {
  r.y = host(r.y);
  r.dx = host(r.dx);
  r.d_up = host(m.up.grad);
  r.d_down = host(m.down.grad);
  return r;
}

Pass unfused(GpuMlp& m, const Precision& p, const Tensor& x, const Tensor& dy) {
  Context& gpu = devices().gpu;
  m.zero_grads();
  Pass r;
  const Tensor gu = m.mlp.gate_up.forward(gpu, p, x, r.saved_up);
  Tensor h = Tensor::empty(gpu, {gu.rows(), gu.cols() / 2}, gu.dtype());
  swiglu_forward(gpu, {.gate_up = gu, .h = h});
  r.y = m.mlp.down.forward(gpu, p, h, r.saved_down);
  const Tensor dh = m.mlp.down.backward(gpu, p, dy, r.saved_down);
  Tensor dgu = Tensor::empty(gpu, gu.shape(), dh.dtype());
  swiglu_backward(gpu, {.dh = dh, .gate_up = gu, .d_gate_up = dgu});
  r.dx = m.mlp.gate_up.backward(gpu, p, dgu, r.saved_up);
  return finish(r, m);
}

Pass layer(GpuMlp& m, const Precision& p, const Tensor& x, const Tensor& dy) {
  Context& gpu = devices().gpu;
  m.zero_grads();
  SwigluMlp::Saved s;
  Pass r;
  r.y = m.mlp.forward(gpu, p, x, s);
  r.dx = m.mlp.backward(gpu, p, dy, s);
  r.saved_up = s.gate_up;
  r.saved_down = s.down;
  return finish(r, m);
}

class DenseMlpFusedGpu : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(DenseMlpFusedGpu, BitwiseTheUnfusedLayer) {
  OCTET_REQUIRE_GPU();
  const auto& [recipe, shared] = GetParam();
  const Precision p{recipe_preset(recipe), DType::kBF16};
  GpuMlp m(shared ? GemmSite::kSharedGateUp : GemmSite::kDenseGateUp,
           shared ? GemmSite::kSharedDown : GemmSite::kDenseDown, p);
  Context& gpu = devices().gpu;
  for (int64_t tokens : {int64_t{256}, int64_t{400}}) {
    const Tensor x = random_tensor({tokens, GpuMlp::kD}, DType::kBF16, 61 + tokens, Dist::kOutliers)
                         .to(gpu, Device::kCuda);
    const Tensor dy =
        random_tensor({tokens, GpuMlp::kD}, DType::kBF16, 62 + tokens).to(gpu, Device::kCuda);
    const Pass want = unfused(m, p, x, dy), got = layer(m, p, x, dy);
    const std::string where =
        recipe + (shared ? " shared" : " dense") + " T " + std::to_string(tokens);
    EXPECT_TRUE(bitwise_equal(want.y, got.y)) << where << " y";
    EXPECT_TRUE(bitwise_equal(want.dx, got.dx)) << where << " dx";
    EXPECT_TRUE(bitwise_equal(want.d_up, got.d_up)) << where << " d gate_up";
    EXPECT_TRUE(bitwise_equal(want.d_down, got.d_down)) << where << " d down";
    for (auto [w, g, what] : {std::tuple{&want.saved_up, &got.saved_up, "gate_up input"},
                              std::tuple{&want.saved_down, &got.saved_down, "down input (h)"}}) {
      ASSERT_EQ(w->x.defined(), g->x.defined()) << where << " " << what;
      if (w->x.defined())
        EXPECT_TRUE(bitwise_equal(host(w->x), host(g->x))) << where << " saved " << what;
      else
        EXPECT_TRUE(same_quant(w->qx, g->qx)) << where << " saved " << what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, DenseMlpFusedGpu,
                         ::testing::Combine(::testing::Values("deepseek", "fp8-flow", "bf16"),
                                            ::testing::Bool()));

}  // namespace
}  // namespace octet
