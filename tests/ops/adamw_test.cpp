// AdamW, the global gradient norm, the clipping coefficient and the non-finite check on the CPU
// (ops/adamw/adamw.h): a hand-computed step, an FP64 re-implementation over several steps, the
// optional inputs (grad scale, found_inf, BF16 copy), and FP64 norms over awkward tensor sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/backend.h"
#include "numerics/fp8.h"
#include "ops/adamw/adamw.h"
#include "ops/quantize/quantize.h"
#include "test_util.h"

namespace octet {
namespace {

Context& cpu() {
  static Context c = make_context(Device::kCpu);
  return c;
}

Tensor scalar_f32(float v) {
  Tensor t = Tensor::empty({1}, DType::kF32);
  t.data_as<float>()[0] = v;
  return t;
}

Tensor scalar_i32(int32_t v) {
  Tensor t = Tensor::empty({1}, DType::kI32);
  t.data_as<int32_t>()[0] = v;
  return t;
}

Tensor bf16_of(const Tensor& f) {
  Tensor t = Tensor::empty(f.shape(), DType::kBF16);
  for (int64_t i = 0; i < f.numel(); ++i)
    t.data_as<uint16_t>()[i] = float_to_bf16(f.data_as<float>()[i]);
  return t;
}

float bf(uint16_t b) {
  return bf16_to_float(b);
}

TEST(AdamW, HandComputedFirstStep) {
  // p = 1, g = 0.5, m = v = 0, lr 0.1, betas (0.9, 0.95), wd 0.1, step 1:
  // m = 0.05, v = 0.0125, p = 0.99 - (0.1 / 0.1) * 0.05 / (sqrt(0.0125) / sqrt(0.05) + 1e-8) =
  // 0.89.
  AdamWArgs a;
  a.param = scalar_f32(1.0f);
  a.grad = scalar_f32(0.5f);
  a.exp_avg = bf16_of(scalar_f32(0.0f));
  a.exp_avg_sq = bf16_of(scalar_f32(0.0f));
  a.param_bf16 = bf16_of(scalar_f32(0.0f));
  a.lr = 0.1f;
  a.weight_decay = 0.1f;
  adamw_step(cpu(), a);
  EXPECT_NEAR(a.param.data_as<float>()[0], 0.89f, 2e-7);
  EXPECT_EQ(a.exp_avg.data_as<uint16_t>()[0], float_to_bf16(0.05f));
  EXPECT_EQ(a.exp_avg_sq.data_as<uint16_t>()[0], float_to_bf16(0.0125f));
  EXPECT_EQ(a.param_bf16.data_as<uint16_t>()[0], float_to_bf16(a.param.data_as<float>()[0]));
}

TEST(AdamW, MatchesFp64ReimplementationOverSteps) {
  const int64_t n = 1481;
  Tensor p = test::random_tensor({n}, DType::kF32, 1);
  Tensor m = bf16_of(test::random_tensor({n}, DType::kF32, 2));
  Tensor v = Tensor::empty({n}, DType::kBF16);
  const Tensor v0 = test::random_tensor({n}, DType::kF32, 3);
  for (int64_t i = 0; i < n; ++i)
    v.data_as<uint16_t>()[i] = float_to_bf16(v0.data_as<float>()[i] * v0.data_as<float>()[i]);
  const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  for (int64_t step = 1; step <= 5; ++step) {
    const Tensor g = test::random_tensor({n}, DType::kF32, 10 + step, test::Dist::kOutliers);
    std::vector<double> want_p(n), want_m(n), want_v(n);
    for (int64_t i = 0; i < n; ++i) {
      const double gi = g.data_as<float>()[i];
      const double mi = double{b1} * bf(m.data_as<uint16_t>()[i]) + (1.0 - double{b1}) * gi;
      const double vi = double{b2} * bf(v.data_as<uint16_t>()[i]) + (1.0 - double{b2}) * gi * gi;
      const double bc1 = 1.0 - std::pow(double{b1}, double(step)),
                   bc2 = 1.0 - std::pow(double{b2}, double(step));
      double pi = double{p.data_as<float>()[i]} * (1.0 - double{lr} * wd);
      pi -= lr / bc1 * mi / (std::sqrt(vi) / std::sqrt(bc2) + eps);
      want_p[i] = pi, want_m[i] = mi, want_v[i] = vi;
    }
    AdamWArgs a{.param = p, .grad = g, .exp_avg = m, .exp_avg_sq = v};
    a.lr = lr, a.beta1 = b1, a.beta2 = b2, a.eps = eps, a.weight_decay = wd, a.step = step;
    adamw_step(cpu(), a);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(p.data_as<float>()[i], want_p[i], 1e-6 * std::fabs(want_p[i]) + 1e-4 * lr)
          << "param " << i << " step " << step;
      ASSERT_NEAR(bf(m.data_as<uint16_t>()[i]), want_m[i], 4e-3 * std::fabs(want_m[i]) + 1e-30)
          << "m " << i;
      ASSERT_NEAR(bf(v.data_as<uint16_t>()[i]), want_v[i], 4e-3 * std::fabs(want_v[i]) + 1e-30)
          << "v " << i;
    }
  }
}

TEST(AdamW, GradScaleFoundInfAndBf16Copy) {
  const int64_t n = 257;
  const Tensor p0 = test::random_tensor({n}, DType::kF32, 1);
  const Tensor g = test::random_tensor({n}, DType::kF32, 2);
  const Tensor m0 = bf16_of(test::random_tensor({n}, DType::kF32, 3));
  const Tensor v0 = bf16_of(test::random_tensor({n}, DType::kF32, 4, test::Dist::kWide));
  auto copy = [](const Tensor& t) { return t.to(cpu(), Device::kCpu); };
  // Scaling the gradient inside the step equals scaling it before (the same FP32 product).
  Tensor gs = copy(g);
  for (int64_t i = 0; i < n; ++i) gs.data_as<float>()[i] = gs.data_as<float>()[i] * 0.375f;
  Tensor v0abs = copy(v0);
  for (int64_t i = 0; i < n; ++i) v0abs.data_as<uint16_t>()[i] &= 0x7FFF;  // v >= 0
  AdamWArgs a{.param = copy(p0), .grad = g, .exp_avg = copy(m0), .exp_avg_sq = copy(v0abs)};
  a.grad_scale = scalar_f32(0.375f);
  a.param_bf16 = Tensor::empty({n}, DType::kBF16);
  a.step = 7;
  adamw_step(cpu(), a);
  AdamWArgs b{.param = copy(p0), .grad = gs, .exp_avg = copy(m0), .exp_avg_sq = copy(v0abs)};
  b.step = 7;
  adamw_step(cpu(), b);
  ASSERT_TRUE(test::bitwise_equal(b.param, a.param));
  ASSERT_TRUE(test::bitwise_equal(b.exp_avg, a.exp_avg));
  ASSERT_TRUE(test::bitwise_equal(b.exp_avg_sq, a.exp_avg_sq));
  ASSERT_TRUE(test::bitwise_equal(bf16_of(a.param), a.param_bf16));
  // found_inf set: nothing changes.
  AdamWArgs c{.param = copy(p0), .grad = g, .exp_avg = copy(m0), .exp_avg_sq = copy(v0abs)};
  c.found_inf = scalar_i32(1);
  adamw_step(cpu(), c);
  ASSERT_TRUE(test::bitwise_equal(p0, c.param));
  ASSERT_TRUE(test::bitwise_equal(m0, c.exp_avg));
  c.found_inf = scalar_i32(0);
  adamw_step(cpu(), c);
  EXPECT_FALSE(test::bitwise_equal(p0, c.param));
}

TEST(AdamW, RejectsMismatchedState) {
  AdamWArgs a{.param = test::random_tensor({8}, DType::kF32, 1),
              .grad = test::random_tensor({8}, DType::kF32, 2),
              .exp_avg = test::random_tensor({8}, DType::kF32, 3),
              .exp_avg_sq = bf16_of(test::random_tensor({8}, DType::kF32, 4))};
  try {
    adamw_step(cpu(), a);
    FAIL() << "an F32 exp_avg was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("adamw exp_avg: expected dtype BF16, got F32"),
              std::string::npos)
        << e.what();
  }
  a.exp_avg = bf16_of(test::random_tensor({7}, DType::kF32, 3));
  try {
    adamw_step(cpu(), a);
    FAIL() << "a 7-element exp_avg was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected 8 elements"), std::string::npos) << e.what();
  }
  a.exp_avg = bf16_of(test::random_tensor({8}, DType::kF32, 3));
  a.step = 0;
  EXPECT_THROW(adamw_step(cpu(), a), Error);
}

TEST(GradNorm, MatchesFp64AcrossChunkBoundaries) {
  std::vector<Tensor> grads;
  double want = 0.0;
  int seed = 0;
  for (int64_t n : {1, 4095, 0, 4096, 4097, 100003, 17}) {
    grads.push_back(test::random_tensor({n}, DType::kF32, 100 + seed++, test::Dist::kOutliers));
    for (int64_t i = 0; i < n; ++i)
      want += double{grads.back().data_as<float>()[i]} * grads.back().data_as<float>()[i];
  }
  want = std::sqrt(want);
  const Tensor norm = global_grad_norm(cpu(), grads);
  EXPECT_NEAR(norm.data_as<float>()[0], want, 2e-6 * want);
  EXPECT_TRUE(test::bitwise_equal(norm, global_grad_norm(cpu(), grads))) << "not deterministic";
  EXPECT_EQ(global_grad_norm(cpu(), {}).data_as<float>()[0], 0.0f);
  // 3-4-5.
  Tensor t = Tensor::empty({2}, DType::kF32);
  t.data_as<float>()[0] = 3.0f, t.data_as<float>()[1] = 4.0f;
  EXPECT_EQ(global_grad_norm(cpu(), {t}).data_as<float>()[0], 5.0f);
}

TEST(GradNorm, ClipCoefficient) {
  EXPECT_EQ(grad_clip_coefficient(cpu(), scalar_f32(10.0f), 1.0f).data_as<float>()[0],
            1.0f / (10.0f + 1e-6f));
  EXPECT_EQ(grad_clip_coefficient(cpu(), scalar_f32(0.5f), 1.0f).data_as<float>()[0], 1.0f);
  EXPECT_EQ(grad_clip_coefficient(cpu(), scalar_f32(std::numeric_limits<float>::infinity()), 1.0f)
                .data_as<float>()[0],
            0.0f);
  EXPECT_TRUE(std::isnan(
      grad_clip_coefficient(cpu(), scalar_f32(std::nanf("")), 1.0f).data_as<float>()[0]));
  EXPECT_THROW(grad_clip_coefficient(cpu(), scalar_f32(1.0f), 0.0f), Error);
}

TEST(GradNorm, NonfiniteFlag) {
  std::vector<Tensor> grads = {test::random_tensor({5}, DType::kF32, 1),
                               test::random_tensor({9000}, DType::kF32, 2),
                               test::random_tensor({33}, DType::kF32, 3)};
  EXPECT_EQ(nonfinite_flag(cpu(), grads).data_as<int32_t>()[0], 0);
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    grads[1].data_as<float>()[8191] = bad;
    EXPECT_EQ(nonfinite_flag(cpu(), grads).data_as<int32_t>()[0], 1) << bad;
    grads[1].data_as<float>()[8191] = 0.5f;
  }
  EXPECT_EQ(nonfinite_flag(cpu(), {}).data_as<int32_t>()[0], 0);
  EXPECT_THROW(nonfinite_flag(cpu(), {test::random_tensor({4}, DType::kBF16, 1)}), Error);
}

// The fused update + weight quantization: the same master and moments as adamw_step, and, for
// stacked matrices, each matrix's own column-wise copy (the per-expert layout Dgrad reads).
TEST(AdamW, BlockQuantizeIsTheUpdateThenEachMatricesBlocks) {
  const int64_t E = 3, O = 128, I = 136, n = E * O * I;
  AdamWArgs a;
  a.param = test::random_tensor({n}, DType::kF32, 1, test::Dist::kOutliers);
  a.grad = test::random_tensor({n}, DType::kF32, 2);
  a.exp_avg = bf16_of(test::random_tensor({n}, DType::kF32, 3));
  a.exp_avg_sq = bf16_of(test::random_tensor({n}, DType::kF32, 4, test::Dist::kWide));
  for (int64_t i = 0; i < n; ++i) a.exp_avg_sq.data_as<uint16_t>()[i] &= 0x7FFFu;  // v >= 0
  a.lr = 0.01f;
  AdamWArgs b = a;
  for (Tensor* t : {&b.param, &b.exp_avg, &b.exp_avg_sq}) *t = t->to_host(cpu());
  adamw_step(cpu(), b);
  BlockQuantOutput o;
  o.rows = E * O;
  o.cols = I;
  o.batch_rows = O;
  o.data = Tensor::empty({E * O, I}, DType::kE4M3);
  o.scale_inv = Tensor::empty({E, 2}, DType::kF32);
  o.columnwise_data = Tensor::empty({E, I, O}, DType::kE4M3);
  o.columnwise_scale_inv = Tensor::empty({E, 2, 1}, DType::kF32);
  adamw_step_block_quantize(cpu(), a, o);
  EXPECT_TRUE(test::bitwise_equal(b.param, a.param));
  EXPECT_TRUE(test::bitwise_equal(b.exp_avg, a.exp_avg));
  EXPECT_TRUE(test::bitwise_equal(b.exp_avg_sq, a.exp_avg_sq));
  for (int64_t e = 0; e < E; ++e) {
    QuantizeArgs qa;
    qa.input =
        Tensor::wrap(b.param.data_as<float>() + e * O * I, {O, I}, DType::kF32, Device::kCpu);
    qa.granularity = Granularity::k128x128;
    qa.output = QuantizeOutput::kBoth;
    const QuantTensor q = quantize(cpu(), qa);
    const auto* rows = o.data.data_as<const uint8_t>() + e * O * I;
    const auto* cols = o.columnwise_data.data_as<const uint8_t>() + e * I * O;
    EXPECT_EQ(std::memcmp(rows, q.data.data(), O * I), 0) << "expert " << e;
    EXPECT_EQ(std::memcmp(cols, q.columnwise_data.data(), O * I), 0) << "expert " << e;
    EXPECT_EQ(std::memcmp(o.columnwise_scale_inv.data_as<float>() + e * 2,
                          q.columnwise_scale_inv.data(), 2 * sizeof(float)),
              0)
        << "expert " << e;
  }
  BlockQuantOutput bad = o;
  bad.batch_rows = 100;
  auto expect_error = [&](const BlockQuantOutput& out, const char* fragment) {
    try {
      adamw_step_block_quantize(cpu(), a, out);
      ADD_FAILURE() << "no error; expected " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_error(bad, "batch_rows 100 must be 0 or a multiple of 128");
  bad = o;
  bad.cols = 7;
  expect_error(bad, "is not the parameter's");
  // The batched form checks every step before it runs any: a bad second step leaves the first
  // parameter as it was.
  const Tensor before = a.param.to_host(cpu());
  bad = o;
  bad.batch_rows = 100;
  EXPECT_THROW(
      adamw_step_block_quantize_many(cpu(), {BlockQuantStep{a, o}, BlockQuantStep{a, bad}}), Error);
  EXPECT_TRUE(test::bitwise_equal(before, a.param));
  // And a good batch is the steps one after the other.
  AdamWArgs a2 = a;
  for (Tensor* t : {&a2.param, &a2.exp_avg, &a2.exp_avg_sq}) *t = t->to_host(cpu());
  BlockQuantOutput o2 = o;
  for (Tensor* t : {&o2.data, &o2.scale_inv, &o2.columnwise_data, &o2.columnwise_scale_inv})
    *t = Tensor::empty(t->shape(), t->dtype());
  adamw_step_block_quantize(cpu(), a2, o2);
  adamw_step_block_quantize_many(cpu(), {BlockQuantStep{a, o}});
  EXPECT_TRUE(test::bitwise_equal(a2.param, a.param));
  EXPECT_TRUE(test::bitwise_equal(o2.data, o.data));
  EXPECT_TRUE(test::bitwise_equal(o2.columnwise_data, o.columnwise_data));
}

}  // namespace
}  // namespace octet
