// The MoE router on the CPU (ops/moe_router/moe_router.h): hand-computed cases, a brute-force
// selection written here (linear scans, no keys, no sorts), finite-difference checks of the
// backward and of the balance loss gradient against double-precision re-implementations, and the
// bias update.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "numerics/fp32_rn.h"
#include "ops/moe_router/moe_router.h"
#include "test_util.h"

namespace octet {
namespace {

Context& cpu() {
  static Context c = make_context(Device::kCpu);
  return c;
}

Tensor f32(const Shape& shape, const std::vector<float>& v) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  std::copy(v.begin(), v.end(), t.data_as<float>());
  return t;
}

Tensor i32(const Shape& shape, const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty(shape, DType::kI32);
  std::copy(v.begin(), v.end(), t.data_as<int32_t>());
  return t;
}

RouterConfig config(int64_t E, int64_t k, int64_t groups, int64_t keep,
                    TopkNorm norm = TopkNorm::kSumToOne, float scale = 2.5f,
                    GroupMaskFill fill = GroupMaskFill::kZero) {
  RouterConfig c;
  c.num_experts = E;
  c.top_k = k;
  c.n_group = groups;
  c.topk_group = keep;
  c.norm = norm;
  c.routed_scaling_factor = scale;
  c.mask_fill = fill;
  return c;
}

// Logits on a coarse grid (many exact ties) or Gaussian.
Tensor random_logits(int64_t T, int64_t E, uint64_t seed, bool ties) {
  Tensor t = Tensor::empty({T, E}, DType::kF32);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.5f);
  std::uniform_int_distribution<int> q(-4, 4);
  for (int64_t i = 0; i < T * E; ++i)
    t.data_as<float>()[i] = ties ? 0.5f * static_cast<float>(q(rng)) : n(rng);
  return t;
}

Tensor random_bias(int64_t E, uint64_t seed, float spread) {
  Tensor t = Tensor::empty({E}, DType::kF32);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-spread, spread);
  for (int64_t i = 0; i < E; ++i) t.data_as<float>()[i] = u(rng);
  return t;
}

// ---------------------------------------------------------------------------------------------------
// exp / sigmoid

TEST(FP32Rn, ExpWithinTwoUlpOfLibm) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> u(-103.0f, 88.7f);
  for (int i = 0; i < 200000; ++i) {
    const float x = i < 1000 ? -10.0f + 0.02f * static_cast<float>(i) : u(rng);
    const double want = std::exp(static_cast<double>(x));
    const float got = rn::exp_rn(x);
    const double ulp = want < 1.17549435e-38 ? 1.4e-45 : std::ldexp(1.0, std::ilogb(want) - 23);
    ASSERT_LE(std::fabs(got - want), 2.0 * ulp)
        << "exp(" << x << "): got " << got << ", want " << want;
  }
  EXPECT_EQ(rn::exp_rn(0.0f), 1.0f);
  EXPECT_EQ(rn::exp_rn(-200.0f), 0.0f);
  EXPECT_TRUE(std::isinf(rn::exp_rn(89.0f)));
  EXPECT_TRUE(std::isinf(rn::exp_rn(std::numeric_limits<float>::infinity())));
  EXPECT_EQ(rn::exp_rn(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_TRUE(std::isnan(rn::exp_rn(std::nanf(""))));
}

TEST(FP32Rn, SigmoidWithinThreeUlp) {
  for (float x = -30.0f; x <= 30.0f; x += 0.001953125f) {
    const double want = 1.0 / (1.0 + std::exp(-static_cast<double>(x)));
    const float got = rn::sigmoid_rn(x);
    const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
    ASSERT_LE(std::fabs(got - want), 3.0 * ulp) << "sigmoid(" << x << ")";
  }
  EXPECT_EQ(rn::sigmoid_rn(0.0f), 0.5f);
  EXPECT_EQ(rn::sigmoid_rn(200.0f), 1.0f);
  EXPECT_EQ(rn::sigmoid_rn(-200.0f), 0.0f);
}

// ---------------------------------------------------------------------------------------------------
// Hand-computed routing

TEST(MoeRouter, HandComputedGroupLimitedTopk) {
  // E = 8, four groups of two, keep 2 groups, k = 2. All logits 0: every score is 0.5.
  // Token 0, biased scores [.6 .5 | .8 .7 | .4 .9 | .5 .55]: group scores 1.1, 1.5, 1.3, 1.05 keep
  // groups 1 and 2; among experts 2..5 the best are 5 (.9) then 2 (.8).
  // Token 1 uses a zero bias: all equal, ties go to groups 0, 1 and experts 0, 1.
  const std::vector<float> bias = {0.1f, 0.0f, 0.3f, 0.2f, -0.1f, 0.4f, 0.0f, 0.05f};
  RouterForwardArgs a{.logits = f32({1, 8}, std::vector<float>(8, 0.0f)),
                      .bias = f32({8}, bias),
                      .config = config(8, 2, 4, 2)};
  RouterOutput out = moe_router_forward(cpu(), a);
  EXPECT_EQ(out.topk_idx.data_as<int32_t>()[0], 5);
  EXPECT_EQ(out.topk_idx.data_as<int32_t>()[1], 2);
  EXPECT_EQ(out.topk_weight.data_as<float>()[0], 1.25f);  // 0.5 / (1.0 + 1e-20) * 2.5
  EXPECT_EQ(out.topk_weight.data_as<float>()[1], 1.25f);
  const std::vector<int32_t> want_counts = {0, 0, 1, 0, 0, 1, 0, 0};
  for (int e = 0; e < 8; ++e)
    EXPECT_EQ(out.counts.data_as<int32_t>()[e], want_counts[e]) << "expert " << e;

  a.bias = f32({8}, std::vector<float>(8, 0.0f));
  out = moe_router_forward(cpu(), a);
  EXPECT_EQ(out.topk_idx.data_as<int32_t>()[0], 0);
  EXPECT_EQ(out.topk_idx.data_as<int32_t>()[1], 1);
}

TEST(MoeRouter, MaskFillZeroVersusExclude) {
  // Biased scores [-.4 -.4 | -.3 -.3 | .2 .2 | -.45 -.45]: groups 2 and 1 are kept. With k = 3 the
  // third choice is expert 2 (-0.3) when dropped groups are excluded, but expert 0 with the
  // transformers library's zero fill (0.0 > -0.3).
  const std::vector<float> bias = {-0.9f, -0.9f, -0.8f, -0.8f, -0.3f, -0.3f, -0.95f, -0.95f};
  RouterForwardArgs a{.logits = f32({1, 8}, std::vector<float>(8, 0.0f)),
                      .bias = f32({8}, bias),
                      .config = config(8, 3, 4, 2, TopkNorm::kNone, 1.0f, GroupMaskFill::kZero)};
  RouterOutput z = moe_router_forward(cpu(), a);
  EXPECT_EQ(z.topk_idx.data_as<int32_t>()[0], 4);
  EXPECT_EQ(z.topk_idx.data_as<int32_t>()[1], 5);
  EXPECT_EQ(z.topk_idx.data_as<int32_t>()[2], 0);
  EXPECT_EQ(z.topk_weight.data_as<float>()[2], 0.5f);  // unbiased score, no normalisation
  a.config.mask_fill = GroupMaskFill::kExclude;
  RouterOutput x = moe_router_forward(cpu(), a);
  EXPECT_EQ(x.topk_idx.data_as<int32_t>()[2], 2);
}

// ---------------------------------------------------------------------------------------------------
// Brute force: linear scans with strict comparisons (the first maximum wins: lower index on ties).

struct Routed {
  std::vector<int32_t> idx;
  std::vector<float> w;
};

Routed brute_force(const Tensor& logits, const Tensor& bias, const RouterConfig& c) {
  const int64_t T = logits.rows(), E = c.num_experts, G = E / c.n_group;
  Routed r;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> s(E), b(E);
    for (int64_t e = 0; e < E; ++e) {
      s[e] = rn::sigmoid_rn(logits.data_as<float>()[t * E + e]);
      b[e] = s[e] + bias.data_as<float>()[e];
    }
    std::vector<float> gs(c.n_group, 0.0f);
    for (int64_t g = 0; c.n_group > 1 && g < c.n_group; ++g) {
      int64_t first = g * G;
      for (int64_t e = g * G; e < (g + 1) * G; ++e)
        if (b[e] > b[first]) first = e;
      int64_t second = first == g * G ? g * G + 1 : g * G;
      for (int64_t e = g * G; e < (g + 1) * G; ++e)
        if (e != first && b[e] > b[second]) second = e;
      gs[g] = b[first] + b[second];
    }
    std::vector<bool> kept(c.n_group, false);
    for (int64_t i = 0; i < c.topk_group; ++i) {
      int64_t best = -1;
      for (int64_t g = 0; g < c.n_group; ++g)
        if (!kept[g] && (best < 0 || gs[g] > gs[best])) best = g;
      kept[best] = true;
    }
    std::vector<bool> taken(E, false);
    float denom = 0.0f;
    std::vector<int32_t> chosen;
    for (int64_t j = 0; j < c.top_k; ++j) {
      int64_t best = -1;
      float best_v = 0.0f;
      for (int64_t e = 0; e < E; ++e) {
        if (taken[e]) continue;
        if (!kept[e / G] && c.mask_fill == GroupMaskFill::kExclude) continue;
        const float v = kept[e / G] ? b[e] : 0.0f;
        if (best < 0 || v > best_v) best = e, best_v = v;
      }
      taken[best] = true;
      chosen.push_back(static_cast<int32_t>(best));
      denom = rn::add(denom, s[best]);
    }
    denom = rn::add(denom, 1e-20f);
    for (int32_t e : chosen) {
      r.idx.push_back(e);
      r.w.push_back(c.norm == TopkNorm::kSumToOne
                        ? rn::mul(rn::div(s[e], denom), c.routed_scaling_factor)
                        : rn::mul(s[e], c.routed_scaling_factor));
    }
  }
  return r;
}

struct Shape4 {
  int64_t T, E, groups, keep, k;
};

TEST(MoeRouter, MatchesBruteForce) {
  const Shape4 shapes[] = {{1, 8, 1, 1, 2},    {127, 8, 4, 2, 3},  {127, 32, 4, 2, 4},
                           {64, 256, 8, 4, 8}, {33, 64, 32, 3, 6}, {19, 16, 2, 1, 8}};
  for (const Shape4& sh : shapes) {
    for (GroupMaskFill fill : {GroupMaskFill::kZero, GroupMaskFill::kExclude}) {
      for (bool ties : {false, true}) {
        for (TopkNorm norm : {TopkNorm::kSumToOne, TopkNorm::kNone}) {
          const RouterConfig c = config(sh.E, sh.k, sh.groups, sh.keep, norm, 2.5f, fill);
          const Tensor logits = random_logits(sh.T, sh.E, 100 + sh.E + sh.T, ties);
          const Tensor bias =
              ties ? f32({sh.E}, std::vector<float>(sh.E, 0.0f)) : random_bias(sh.E, 3, 0.7f);
          const RouterOutput out =
              moe_router_forward(cpu(), {.logits = logits, .bias = bias, .config = c});
          const Routed want = brute_force(logits, bias, c);
          std::vector<int32_t> hist(sh.E, 0);
          for (int64_t i = 0; i < sh.T * sh.k; ++i) {
            ASSERT_EQ(out.topk_idx.data_as<int32_t>()[i], want.idx[i])
                << "token " << i / sh.k << " slot " << i % sh.k << " E=" << sh.E << " ties=" << ties
                << " exclude=" << (fill == GroupMaskFill::kExclude);
            ASSERT_EQ(out.topk_weight.data_as<float>()[i], want.w[i])
                << "token " << i / sh.k << " slot " << i % sh.k;
            ++hist[want.idx[i]];
          }
          for (int64_t e = 0; e < sh.E; ++e)
            ASSERT_EQ(out.counts.data_as<int32_t>()[e], hist[e]) << "expert " << e;
        }
      }
    }
  }
}

TEST(MoeRouter, RejectsBadConfigAndShapes) {
  const Tensor logits = random_logits(4, 8, 1, false);
  const Tensor bias = random_bias(8, 1, 0.1f);
  EXPECT_THROW(
      moe_router_forward(cpu(), {.logits = logits, .bias = bias, .config = config(8, 2, 3, 1)}),
      Error);  // 3 does not divide 8
  EXPECT_THROW(
      moe_router_forward(cpu(), {.logits = logits, .bias = bias, .config = config(8, 2, 8, 1)}),
      Error);  // groups of one
  EXPECT_THROW(
      moe_router_forward(cpu(), {.logits = logits, .bias = bias, .config = config(8, 9, 1, 1)}),
      Error);  // k > E
  EXPECT_THROW(moe_router_forward(cpu(), {.logits = logits,
                                          .bias = bias,
                                          .config = config(8, 5, 4, 2, TopkNorm::kNone, 1.0f,
                                                           GroupMaskFill::kExclude)}),
               Error);  // 5 > 4 experts in the kept groups
  try {
    moe_router_forward(
        cpu(), {.logits = logits, .bias = random_bias(7, 1, 0.1f), .config = config(8, 2, 4, 2)});
    FAIL() << "a bias of 7 elements was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("e_score_correction_bias"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[8]"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------------
// Backward: finite differences of L = sum r_tj w_tj, (a) through the op's own FP32 forward and (b)
// of a double-precision re-implementation with the selection held fixed.

double weights_loss_double(const float* logit_row, const int32_t* idx, const float* r,
                           const RouterConfig& c, double bump, int64_t bump_e) {
  double s[32], sum = 0.0;
  for (int64_t j = 0; j < c.top_k; ++j) {
    const double x = logit_row[idx[j]] + (idx[j] == bump_e ? bump : 0.0);
    s[j] = 1.0 / (1.0 + std::exp(-x));
    sum += s[j];
  }
  double L = 0.0;
  for (int64_t j = 0; j < c.top_k; ++j)
    L += r[j] * c.routed_scaling_factor * (c.norm == TopkNorm::kSumToOne ? s[j] / sum : s[j]);
  return L;
}

TEST(MoeRouter, BackwardMatchesFiniteDifferences) {
  for (TopkNorm norm : {TopkNorm::kSumToOne, TopkNorm::kNone}) {
    const RouterConfig c = config(16, 4, 4, 2, norm, 2.5f);
    const int64_t T = 5, E = 16, k = 4;
    Tensor logits = random_logits(T, E, 11, false);
    const Tensor bias = random_bias(E, 12, 0.2f);
    const RouterOutput out =
        moe_router_forward(cpu(), {.logits = logits, .bias = bias, .config = c});
    const Tensor r = test::random_tensor({T, k}, DType::kF32, 13);
    const Tensor d = moe_router_backward(
        cpu(), {.logits = logits, .topk_idx = out.topk_idx, .d_topk_weight = r, .config = c});
    const float* rr = r.data_as<float>();
    for (int64_t t = 0; t < T; ++t) {
      const int32_t* idx = out.topk_idx.data_as<int32_t>() + t * k;
      for (int64_t e = 0; e < E; ++e) {
        const float got = d.data_as<float>()[t * E + e];
        const bool chosen = std::find(idx, idx + k, e) != idx + k;
        if (!chosen) {
          ASSERT_EQ(got, 0.0f) << "unchosen expert " << e << " of token " << t << " got a gradient";
          continue;
        }
        // (b) double re-implementation, central difference.
        const double h = 1e-5;
        const float* row = logits.data_as<float>() + t * E;
        const double fd = (weights_loss_double(row, idx, rr + t * k, c, h, e) -
                           weights_loss_double(row, idx, rr + t * k, c, -h, e)) /
                          (2 * h);
        ASSERT_NEAR(got, fd, 1e-5 + 1e-4 * std::fabs(fd)) << "token " << t << " expert " << e;
        // (a) through the op's FP32 forward (selection must not change).
        const float hf = 1e-2f, x0 = logits.data_as<float>()[t * E + e];
        double lpm[2];
        bool same = true;
        for (int sgn = 0; sgn < 2; ++sgn) {
          logits.data_as<float>()[t * E + e] = x0 + (sgn ? -hf : hf);
          const RouterOutput o =
              moe_router_forward(cpu(), {.logits = logits, .bias = bias, .config = c});
          lpm[sgn] = 0.0;
          for (int64_t j = 0; j < k; ++j) {
            same &= o.topk_idx.data_as<int32_t>()[t * k + j] == idx[j];
            lpm[sgn] +=
                static_cast<double>(rr[t * k + j]) * o.topk_weight.data_as<float>()[t * k + j];
          }
        }
        logits.data_as<float>()[t * E + e] = x0;
        if (same) {
          const double fd32 = (lpm[0] - lpm[1]) / (2.0 * hf);
          EXPECT_NEAR(got, fd32, 2e-3 + 2e-2 * std::fabs(fd32))
              << "FP32 FD, token " << t << " expert " << e;
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Bias update

TEST(MoeRouter, BiasUpdateSignRule) {
  // counts [5 3 4 0]: total 12, mean 3. sign(12 - 4 c) = [-1 0 -1 +1].
  Tensor bias = f32({4}, {0.25f, -0.5f, 0.0f, 1.0f});
  moe_router_bias_update(cpu(), {.bias = bias, .counts = i32({4}, {5, 3, 4, 0}), .rate = 0.125f});
  const std::vector<float> want = {0.125f, -0.5f, -0.125f, 1.125f};
  for (int e = 0; e < 4; ++e) EXPECT_EQ(bias.data_as<float>()[e], want[e]) << "expert " << e;
  // Balanced load: nothing moves.
  moe_router_bias_update(cpu(), {.bias = bias, .counts = i32({4}, {2, 2, 2, 2}), .rate = 0.125f});
  for (int e = 0; e < 4; ++e) EXPECT_EQ(bias.data_as<float>()[e], want[e]) << "expert " << e;
  EXPECT_THROW(
      moe_router_bias_update(cpu(), {.bias = bias, .counts = i32({3}, {1, 2, 3}), .rate = 0.1f}),
      Error);
}

// ---------------------------------------------------------------------------------------------------
// Sequence-wise balance loss

double balance_loss_double(const Tensor& logits, const Tensor& idx, int64_t B, double alpha,
                           int64_t bump_at, double bump) {
  const int64_t rows = logits.rows(), E = logits.cols(), k = idx.cols(), T = rows / B;
  double total = 0.0;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<double> f(E, 0.0), P(E, 0.0);
    for (int64_t t = b * T; t < (b + 1) * T; ++t) {
      std::vector<double> s(E);
      double sum = 0.0;
      for (int64_t e = 0; e < E; ++e) {
        const double x = logits.data_as<float>()[t * E + e] + (t * E + e == bump_at ? bump : 0.0);
        s[e] = 1.0 / (1.0 + std::exp(-x));
        sum += s[e];
      }
      for (int64_t e = 0; e < E; ++e) P[e] += s[e] / sum / T;
      for (int64_t j = 0; j < k; ++j)
        f[idx.data_as<int32_t>()[t * k + j]] += static_cast<double>(E) / (k * T);
    }
    for (int64_t e = 0; e < E; ++e) total += alpha * f[e] * P[e];
  }
  return total / B;
}

TEST(MoeRouter, SeqBalanceLossForwardAndGradient) {
  const int64_t B = 3, T = 7, E = 16, k = 4;
  const RouterConfig c = config(E, k, 4, 2);
  const Tensor logits = random_logits(B * T, E, 21, false);
  const RouterOutput out =
      moe_router_forward(cpu(), {.logits = logits, .bias = random_bias(E, 22, 0.3f), .config = c});
  const SeqBalanceLossArgs a{
      .logits = logits, .topk_idx = out.topk_idx, .num_sequences = B, .alpha = 0.5f};
  const Tensor loss = moe_seq_balance_loss_forward(cpu(), a);
  const double want = balance_loss_double(logits, out.topk_idx, B, 0.5, -1, 0.0);
  EXPECT_NEAR(loss.data_as<float>()[0], want, 1e-6 * want) << "loss";
  // A perfectly uniform router (all scores equal, every expert chosen equally) gives alpha exactly.
  {
    const Tensor flat = f32({2, 4}, std::vector<float>(8, 0.3f));
    const Tensor idx = i32({2, 2}, {0, 1, 2, 3});
    const Tensor l = moe_seq_balance_loss_forward(
        cpu(), {.logits = flat, .topk_idx = idx, .num_sequences = 1, .alpha = 0.25f});
    EXPECT_FLOAT_EQ(l.data_as<float>()[0], 0.25f);
  }
  // Gradient (+=): start from a non-zero d_logits and subtract it afterwards.
  Tensor d = test::random_tensor({B * T, E}, DType::kF32, 23);
  const Tensor d0 = d.to(cpu(), Device::kCpu);
  const float d_loss = 1.75f;
  moe_seq_balance_loss_backward(cpu(), a, d_loss, d);
  double max_g = 0.0;
  std::vector<double> g(B * T * E);
  for (int64_t i = 0; i < B * T * E; ++i) {
    g[i] = static_cast<double>(d.data_as<float>()[i]) - d0.data_as<float>()[i];
    max_g = std::max(max_g, std::fabs(g[i]));
  }
  ASSERT_GT(max_g, 0.0);
  for (int64_t i = 0; i < B * T * E; i += 5) {
    const double h = 1e-4;
    const double fd = d_loss *
                      (balance_loss_double(logits, out.topk_idx, B, 0.5, i, h) -
                       balance_loss_double(logits, out.topk_idx, B, 0.5, i, -h)) /
                      (2 * h);
    // Tolerance: the FP32 rounding of d0 + g dominates (|d0| ~ 1).
    ASSERT_NEAR(g[i], fd, 1e-6 + 1e-3 * max_g) << "row " << i / E << " expert " << i % E;
  }
}

TEST(MoeRouter, SeqBalanceLossRejectsBadSequenceCount) {
  const Tensor logits = random_logits(10, 8, 1, false);
  const Tensor idx = i32({10, 1}, std::vector<int32_t>(10, 0));
  EXPECT_THROW(moe_seq_balance_loss_forward(
                   cpu(), {.logits = logits, .topk_idx = idx, .num_sequences = 3, .alpha = 0.1f}),
               Error);
}

}  // namespace
}  // namespace octet
