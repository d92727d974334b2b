// Attention on the CPU: forward against an independent full-matrix softmax in FP64, the causal
// mask, finite-difference checks of the backward in F32 (double-precision central differences of L
// = sum(o * w)), and argument validation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "numerics/fp8.h"
#include "ops/attention/attention.h"
#include "test_util.h"

namespace octet {
namespace {

using test::random_tensor;

float get(const Tensor& t, int64_t i) {
  return t.dtype() == DType::kF32 ? t.data_as<const float>()[i]
                                  : bf16_to_float(t.data_as<const uint16_t>()[i]);
}

// Independent forward: materialises the whole masked (T, T) score matrix of one head, softmax by
// rows.
void naive_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                   std::vector<double>& o, std::vector<double>& lse) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), Dk = q.size(3), Dv = v.size(3);
  o.assign(static_cast<size_t>(B * T * H * Dv), 0.0);
  lse.assign(static_cast<size_t>(B * H * T), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> S(static_cast<size_t>(T * T), -INFINITY);
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j <= i; ++j) {
          double s = 0;
          for (int64_t d = 0; d < Dk; ++d)
            s += double{get(q, ((b * T + i) * H + h) * Dk + d)} *
                 get(k, ((b * T + j) * H + h) * Dk + d);
          S[i * T + j] = scale * s;
        }
      for (int64_t i = 0; i < T; ++i) {
        double m = -INFINITY, l = 0;
        for (int64_t j = 0; j < T; ++j) m = std::max(m, S[i * T + j]);
        for (int64_t j = 0; j < T; ++j) l += std::exp(S[i * T + j] - m);
        lse[(b * H + h) * T + i] = m + std::log(l);
        for (int64_t j = 0; j < T; ++j) {
          const double p = std::exp(S[i * T + j] - m) / l;
          for (int64_t d = 0; d < Dv; ++d)
            o[((b * T + i) * H + h) * Dv + d] += p * get(v, ((b * T + j) * H + h) * Dv + d);
        }
      }
    }
}

TEST(AttentionCpu, ForwardMatchesFullMatrixSoftmax) {
  Context cpu = make_context(Device::kCpu);
  for (auto [T, H, Dk, Dv, scale] : {std::tuple{7, 3, 48, 32, 0.0f}, std::tuple{1, 2, 16, 16, 0.0f},
                                     std::tuple{19, 1, 32, 64, 0.37f}}) {
    const Tensor q = random_tensor({2, T, H, Dk}, DType::kF32, 1),
                 k = random_tensor({2, T, H, Dk}, DType::kF32, 2);
    const Tensor v = random_tensor({2, T, H, Dv}, DType::kF32, 3);
    const auto r = attention_forward(cpu, {.q = q, .k = k, .v = v, .softmax_scale = scale});
    ASSERT_EQ(r.o.shape(), (Shape{2, T, H, Dv}));
    ASSERT_EQ(r.lse.shape(), (Shape{2, H, T}));
    std::vector<double> o, lse;
    naive_forward(q, k, v, scale == 0.0f ? 1.0 / std::sqrt(double(Dk)) : scale, o, lse);
    for (size_t i = 0; i < o.size(); ++i)
      ASSERT_NEAR(get(r.o, i), o[i], 1e-6 * (1 + std::abs(o[i]))) << "o[" << i << "] T=" << T;
    for (size_t i = 0; i < lse.size(); ++i)
      ASSERT_NEAR(get(r.lse, i), lse[i], 1e-6 * (1 + std::abs(lse[i]))) << "lse[" << i << "]";
  }
}

TEST(AttentionCpu, SingleTokenOutputIsV) {
  Context cpu = make_context(Device::kCpu);
  const Tensor q = random_tensor({3, 1, 2, 32}, DType::kF32, 1),
               k = random_tensor({3, 1, 2, 32}, DType::kF32, 2);
  const Tensor v = random_tensor({3, 1, 2, 16}, DType::kF32, 3);
  const auto r = attention_forward(cpu, {.q = q, .k = k, .v = v, .softmax_scale = 0.0f});
  EXPECT_TRUE(test::bitwise_equal(v, r.o));
}

TEST(AttentionCpu, CausalMaskIgnoresFutureTokens) {
  Context cpu = make_context(Device::kCpu);
  const int64_t T = 23, t0 = 11, H = 2, D = 32;
  Tensor q = random_tensor({2, T, H, D}, DType::kF32, 1),
         k = random_tensor({2, T, H, D}, DType::kF32, 2);
  Tensor v = random_tensor({2, T, H, D}, DType::kF32, 3);
  const auto before = attention_forward(cpu, {.q = q, .k = k, .v = v, .softmax_scale = 0.0f});
  for (Tensor* t : {&q, &k, &v})
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t i = t0; i < T; ++i)
        for (int64_t e = 0; e < H * D; ++e) t->data_as<float>()[(b * T + i) * H * D + e] *= -3.0f;
  const auto after = attention_forward(cpu, {.q = q, .k = k, .v = v, .softmax_scale = 0.0f});
  for (int64_t b = 0; b < 2; ++b) {
    ASSERT_EQ(
        std::memcmp(before.o.data_as<float>() + b * T * H * D,
                    after.o.data_as<float>() + b * T * H * D, static_cast<size_t>(t0 * H * D * 4)),
        0)
        << "o before position " << t0 << " changed, batch " << b;
    for (int64_t h = 0; h < H; ++h)
      ASSERT_EQ(
          std::memcmp(before.lse.data_as<float>() + (b * H + h) * T,
                      after.lse.data_as<float>() + (b * H + h) * T, static_cast<size_t>(t0 * 4)),
          0)
          << "lse changed";
    // ...and the later outputs did change, so the edit was visible to them.
    EXPECT_NE(get(before.o, (b * T + T - 1) * H * D), get(after.o, (b * T + T - 1) * H * D));
  }
}

// dL/dx by central differences in double for L = sum(o * w), against attention_backward, F32 mode.
TEST(AttentionCpu, BackwardMatchesFiniteDifferences) {
  Context cpu = make_context(Device::kCpu);
  for (auto [B, T, H, Dk, Dv, scale] :
       {std::tuple{2, 5, 2, 32, 16, 0.0f}, std::tuple{1, 6, 1, 16, 32, 0.6f}}) {
    Tensor q = random_tensor({B, T, H, Dk}, DType::kF32, 11),
           k = random_tensor({B, T, H, Dk}, DType::kF32, 12);
    Tensor v = random_tensor({B, T, H, Dv}, DType::kF32, 13);
    const Tensor w = random_tensor({B, T, H, Dv}, DType::kF32, 14);
    auto loss = [&] {
      const auto r = attention_forward(cpu, {.q = q, .k = k, .v = v, .softmax_scale = scale});
      double s = 0;
      for (int64_t i = 0; i < r.o.numel(); ++i) s += double{get(r.o, i)} * get(w, i);
      return s;
    };
    const auto fwd = attention_forward(cpu, {.q = q, .k = k, .v = v, .softmax_scale = scale});
    const AttentionGrads g = attention_backward(
        cpu,
        {.q = q, .k = k, .v = v, .o = fwd.o, .lse = fwd.lse, .grad_o = w, .softmax_scale = scale});
    const float eps = 1e-2f;
    for (auto [x, gx, name] : {std::tuple{&q, &g.grad_q, "dq"}, std::tuple{&k, &g.grad_k, "dk"},
                               std::tuple{&v, &g.grad_v, "dv"}}) {
      double err2 = 0, ref2 = 0, max_err = 0;
      for (int64_t i = 0; i < x->numel(); ++i) {
        float* p = x->data_as<float>() + i;
        const float keep = *p;
        *p = keep + eps;
        const double lp = loss();
        *p = keep - eps;
        const double lm = loss();
        *p = keep;
        const double fd = (lp - lm) / (2.0 * double{eps}), an = get(*gx, i);
        err2 += (fd - an) * (fd - an);
        ref2 += fd * fd;
        max_err = std::max(max_err, std::abs(fd - an));
        ASSERT_NEAR(an, fd, 2e-3 + 1e-2 * std::abs(fd)) << name << "[" << i << "] T=" << T;
      }
      EXPECT_LT(std::sqrt(err2 / ref2), 1e-3)
          << name << ": relative Frobenius error vs finite differences, max abs " << max_err;
    }
  }
}

TEST(AttentionCpu, Bf16AgreesWithF32) {
  Context cpu = make_context(Device::kCpu);
  const Tensor qb = random_tensor({1, 9, 2, 32}, DType::kBF16, 1),
               kb = random_tensor({1, 9, 2, 32}, DType::kBF16, 2);
  const Tensor vb = random_tensor({1, 9, 2, 16}, DType::kBF16, 3);
  auto widen = [](const Tensor& t) {
    Tensor f = Tensor::empty(t.shape(), DType::kF32);
    for (int64_t i = 0; i < t.numel(); ++i) f.data_as<float>()[i] = get(t, i);
    return f;
  };
  const auto rb = attention_forward(cpu, {.q = qb, .k = kb, .v = vb, .softmax_scale = 0.0f});
  const auto rf = attention_forward(
      cpu, {.q = widen(qb), .k = widen(kb), .v = widen(vb), .softmax_scale = 0.0f});
  ASSERT_EQ(rb.o.dtype(), DType::kBF16);
  for (int64_t i = 0; i < rb.o.numel(); ++i)
    ASSERT_EQ(rb.o.data_as<uint16_t>()[i], float_to_bf16(rf.o.data_as<float>()[i]))
        << "o[" << i << "]";
  EXPECT_TRUE(test::bitwise_equal(rf.lse, rb.lse));
}

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& words) {
  try {
    fn();
    ADD_FAILURE() << "expected octet::Error";
  } catch (const Error& e) {
    for (const auto& w : words)
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos)
          << "'" << w << "' not in: " << e.what();
  }
}

TEST(AttentionCpu, RejectsBadShapesWithClearMessages) {
  Context cpu = make_context(Device::kCpu);
  const Tensor q = random_tensor({1, 4, 2, 32}, DType::kF32, 1),
               v = random_tensor({1, 4, 2, 16}, DType::kF32, 2);
  const Tensor q100 = random_tensor({1, 4, 2, 100}, DType::kF32, 1);
  expect_error(
      [&] { attention_forward(cpu, {.q = q100, .k = q100, .v = v, .softmax_scale = 0.0f}); },
      {"q", "Dqk", "100", "multiples of 8"});
  // The rule is cuDNN's (multiples of 8), not the old kernels' (multiples of 16): 40 runs.
  const Tensor q40 = random_tensor({1, 4, 2, 40}, DType::kF32, 3);
  EXPECT_EQ(attention_forward(cpu, {.q = q40, .k = q40, .v = v, .softmax_scale = 0.0f}).o.shape(),
            (Shape{1, 4, 2, 16}));
  expect_error([&] { attention_check_supported(cpu, 100, 64); }, {"Dqk", "100", "multiples of 8"});
  expect_error([&] { attention_check_supported(cpu, 64, 264); }, {"Dv", "264"});
  attention_check_supported(cpu, 192, 128);
  const Tensor v272 = random_tensor({1, 4, 2, 272}, DType::kF32, 1);
  expect_error([&] { attention_forward(cpu, {.q = q, .k = q, .v = v272, .softmax_scale = 0.0f}); },
               {"v", "Dv", "272"});
  const Tensor k_bad = random_tensor({1, 5, 2, 32}, DType::kF32, 1);
  expect_error([&] { attention_forward(cpu, {.q = q, .k = k_bad, .v = v, .softmax_scale = 0.0f}); },
               {"k", "[1, 4, 2, 32]"});
  const Tensor k_bf = random_tensor({1, 4, 2, 32}, DType::kBF16, 1);
  expect_error([&] { attention_forward(cpu, {.q = q, .k = k_bf, .v = v, .softmax_scale = 0.0f}); },
               {"k", "BF16"});
  expect_error([&] { attention_forward(cpu, {.q = q, .k = q, .v = v, .softmax_scale = -1.0f}); },
               {"softmax_scale"});
  const auto r = attention_forward(cpu, {.q = q, .k = q, .v = v, .softmax_scale = 0.0f});
  const Tensor lse_bad = Tensor::empty({1, 4, 2}, DType::kF32);
  expect_error(
      [&] {
        attention_backward(cpu, {.q = q,
                                 .k = q,
                                 .v = v,
                                 .o = r.o,
                                 .lse = lse_bad,
                                 .grad_o = r.o,
                                 .softmax_scale = 0.0f});
      },
      {"lse", "(B, H, T)"});
  expect_error(
      [&] {
        attention_backward(cpu, {.q = q,
                                 .k = q,
                                 .v = v,
                                 .o = r.o,
                                 .lse = r.lse,
                                 .grad_o = r.o,
                                 .max_workspace_bytes = -1});
      },
      {"max_workspace_bytes", "-1"});
  expect_error([&] { attention_workspace(cpu, 1, 4, 2, 32, 16, 0.0f, -5); },
               {"max_backward_workspace", "-5"});
  // The CPU takes no workspace and ignores the cap.
  const AttentionWorkspace ws = attention_workspace(cpu, 8, 64, 4, 32, 16, 0.0f, 1);
  EXPECT_EQ(ws.backward_bytes, 0);
  EXPECT_EQ(ws.backward_chunks, 1);
}

TEST(AttentionCpu, EmptySequenceIsAllowed) {
  Context cpu = make_context(Device::kCpu);
  const Tensor q = Tensor::empty({2, 0, 3, 32}, DType::kF32),
               v = Tensor::empty({2, 0, 3, 16}, DType::kF32);
  const auto r = attention_forward(cpu, {.q = q, .k = q, .v = v, .softmax_scale = 0.0f});
  EXPECT_EQ(r.o.numel(), 0);
  const auto g = attention_backward(
      cpu, {.q = q, .k = q, .v = v, .o = r.o, .lse = r.lse, .grad_o = r.o, .softmax_scale = 0.0f});
  EXPECT_EQ(g.grad_q.numel(), 0);
}

}  // namespace
}  // namespace octet
