// MoE permute / combine on the CPU (ops/moe_permute/moe_permute.h): hand-computed maps (with
// padding and empty experts), the layout's invariants on random routings, payload moves (BF16 and
// FP8 with scales), combine against FP64 sums, and finite-difference / adjoint checks of the
// backwards.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/cast_counter.h"
#include "ops/cast/cast.h"
#include "ops/moe_permute/moe_permute.h"
#include "ops/moe_permute/moe_row_weight.h"
#include "ops/quantize/quantize.h"
#include "test_util.h"

namespace octet {
namespace {

Context& cpu() {
  static Context c = make_context(Device::kCpu);
  return c;
}

Tensor i32(const Shape& shape, const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty(shape, DType::kI32);
  std::copy(v.begin(), v.end(), t.data_as<int32_t>());
  return t;
}

std::vector<int32_t> vec(const Tensor& t) {
  return std::vector<int32_t>(t.data_as<int32_t>(), t.data_as<int32_t>() + t.numel());
}

// Distinct experts per token, skewed toward low ids (quadratic draw) so that loads differ widely;
// the last `empty_tail` experts get no token.
Tensor random_routing(int64_t T, int64_t k, int64_t E, uint64_t seed, int64_t empty_tail = 0) {
  Tensor t = Tensor::empty({T, k}, DType::kI32);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const int64_t usable = E - empty_tail;
  for (int64_t i = 0; i < T; ++i) {
    int32_t* row = t.data_as<int32_t>() + i * k;
    for (int64_t j = 0; j < k; ++j) {
      int32_t e;
      do {
        const double v = u(rng);
        e = static_cast<int32_t>(
            std::min<int64_t>(usable - 1, static_cast<int64_t>(v * v * usable)));
      } while (std::find(row, row + j, e) != row + j);
      row[j] = e;
    }
  }
  return t;
}

TEST(MoePermute, HandComputedMap) {
  const Tensor idx = i32({3, 2}, {2, 0, 0, 3, 2, 1});
  PermuteMap m =
      moe_permute_map(cpu(), {.topk_idx = idx, .num_experts = 4, .padding = PermutePadding::kNone});
  EXPECT_EQ(m.num_rows, 6);
  EXPECT_EQ(vec(m.counts), (std::vector<int32_t>{2, 1, 2, 1}));
  EXPECT_EQ(vec(m.offsets), (std::vector<int32_t>{0, 2, 3, 5, 6}));
  EXPECT_EQ(vec(m.row_of), (std::vector<int32_t>{3, 0, 1, 5, 4, 2}));
  EXPECT_EQ(vec(m.token_of), (std::vector<int32_t>{0, 1, 2, 0, 2, 1}));

  m = moe_permute_map(cpu(),
                      {.topk_idx = idx, .num_experts = 4, .padding = PermutePadding::kTo128});
  EXPECT_EQ(m.num_rows, 512);  // floor((6 + 127 * 4) / 128) * 128
  EXPECT_EQ(vec(m.group_sizes), (std::vector<int32_t>{128, 128, 128, 128}));
  EXPECT_EQ(vec(m.offsets), (std::vector<int32_t>{0, 128, 256, 384, 512}));
  EXPECT_EQ(vec(m.row_of), (std::vector<int32_t>{256, 0, 1, 384, 257, 128}));

  // Expert 1 gets no token: an empty group, and the tail after offsets[E] is padding.
  m = moe_permute_map(cpu(), {.topk_idx = i32({3, 2}, {2, 0, 0, 3, 2, 3}),
                              .num_experts = 4,
                              .padding = PermutePadding::kTo128});
  EXPECT_EQ(vec(m.counts), (std::vector<int32_t>{2, 0, 2, 2}));
  EXPECT_EQ(vec(m.offsets), (std::vector<int32_t>{0, 128, 128, 256, 384}));
  for (int64_t r = 384; r < m.num_rows; ++r)
    ASSERT_EQ(m.token_of.data_as<int32_t>()[r], -1) << "row " << r;
}

TEST(MoePermute, LayoutInvariantsOnRandomRoutings) {
  struct Case {
    int64_t T, k, E, empty_tail;
  };
  for (const Case c :
       {Case{1, 1, 8, 0}, Case{127, 8, 32, 5}, Case{1481, 8, 256, 17}, Case{129, 3, 8, 2}}) {
    for (PermutePadding pad : {PermutePadding::kNone, PermutePadding::kTo128}) {
      const Tensor idx = random_routing(c.T, c.k, c.E, 5 + c.T, c.empty_tail);
      const PermuteMap m =
          moe_permute_map(cpu(), {.topk_idx = idx, .num_experts = c.E, .padding = pad});
      const int32_t* off = m.offsets.data_as<int32_t>();
      const int32_t* tok = m.token_of.data_as<int32_t>();
      const int32_t* row = m.row_of.data_as<int32_t>();
      const int32_t* ids = idx.data_as<int32_t>();
      std::vector<int64_t> count(c.E, 0);
      for (int64_t i = 0; i < c.T * c.k; ++i) ++count[ids[i]];
      for (int64_t e = 0; e < c.E; ++e) {
        ASSERT_EQ(m.counts.data_as<int32_t>()[e], count[e]) << "expert " << e;
        ASSERT_EQ(off[e + 1] - off[e], m.group_sizes.data_as<int32_t>()[e]) << "expert " << e;
        if (pad == PermutePadding::kTo128) {
          ASSERT_EQ(off[e] % 128, 0) << "expert " << e;
          ASSERT_EQ(m.group_sizes.data_as<int32_t>()[e], (count[e] + 127) / 128 * 128)
              << "expert " << e;
        }
        // Rows of the expert: its tokens in ascending order, then padding.
        for (int64_t r = off[e]; r < off[e + 1]; ++r) {
          if (r - off[e] < count[e]) {
            ASSERT_GE(tok[r], 0) << "row " << r;
            if (r > off[e])
              ASSERT_LT(tok[r - 1], tok[r]) << "rows " << r - 1 << ", " << r << " of expert " << e;
          } else {
            ASSERT_EQ(tok[r], -1) << "padding row " << r;
          }
        }
      }
      for (int64_t r = off[c.E]; r < m.num_rows; ++r) ASSERT_EQ(tok[r], -1) << "tail row " << r;
      for (int64_t i = 0; i < c.T * c.k; ++i) {
        const int32_t r = row[i], e = ids[i];
        ASSERT_TRUE(r >= off[e] && r < off[e] + count[e]) << "assignment " << i << " row " << r;
        ASSERT_EQ(tok[r], i / c.k) << "assignment " << i;
      }
    }
  }
}

TEST(MoePermute, RejectsBadRoutings) {
  EXPECT_THROW(moe_permute_map(cpu(), {.topk_idx = i32({2, 2}, {0, 4, 1, 2}),
                                       .num_experts = 4,
                                       .padding = PermutePadding::kNone}),
               Error);  // id 4
  EXPECT_THROW(moe_permute_map(cpu(), {.topk_idx = i32({2, 2}, {0, 1, 2, 2}),
                                       .num_experts = 4,
                                       .padding = PermutePadding::kNone}),
               Error);  // twice
  EXPECT_THROW(moe_permute_map(cpu(), {.topk_idx = i32({2, 2}, {0, -1, 1, 2}),
                                       .num_experts = 4,
                                       .padding = PermutePadding::kNone}),
               Error);
  const PermuteMap m = moe_permute_map(
      cpu(),
      {.topk_idx = i32({2, 2}, {0, 1, 1, 2}), .num_experts = 4, .padding = PermutePadding::kNone});
  try {
    moe_permute(cpu(), m, test::random_tensor({3, 8}, DType::kBF16, 1));
    FAIL() << "a 3-token payload was accepted for a 2-token map";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("permute input"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[3, 8]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(moe_combine(cpu(), m,
                           {.expert_out = test::random_tensor({4, 8}, DType::kBF16, 2),
                            .topk_weight = test::random_tensor({2, 3}, DType::kF32, 3)}),
               Error);
}

TEST(MoePermute, PayloadRowsMoveWithTheirScales) {
  const int64_t T = 129, k = 4, E = 16, D = 300;  // D: a partial last scale group
  const Tensor idx = random_routing(T, k, E, 9, 3);
  const Tensor x = test::random_tensor({T, D}, DType::kBF16, 10, test::Dist::kOutliers);
  const QuantTensor q = quantize(cpu(), {.input = x,
                                         .format = Fp8Format::kE4M3,
                                         .granularity = Granularity::k1x128,
                                         .rounding = ScaleRounding::kPow2});
  for (PermutePadding pad : {PermutePadding::kNone, PermutePadding::kTo128}) {
    const PermuteMap m =
        moe_permute_map(cpu(), {.topk_idx = idx, .num_experts = E, .padding = pad});
    const Tensor px = moe_permute(cpu(), m, x);
    const QuantTensor pq = moe_permute(cpu(), m, q);
    ASSERT_EQ(px.shape(), (Shape{m.num_rows, D}));
    ASSERT_EQ(pq.scale_inv.shape(), (Shape{m.num_rows, 3}));
    for (int64_t r = 0; r < m.num_rows; ++r) {
      const int32_t t = m.token_of.data_as<int32_t>()[r];
      for (int64_t d = 0; d < D; ++d) {
        const uint16_t want = t >= 0 ? x.data_as<uint16_t>()[t * D + d] : 0;
        const uint8_t want_q = t >= 0 ? q.data.data_as<uint8_t>()[t * D + d] : 0;
        ASSERT_EQ(px.data_as<uint16_t>()[r * D + d], want) << "bf16 row " << r << " col " << d;
        ASSERT_EQ(pq.data.data_as<uint8_t>()[r * D + d], want_q) << "fp8 row " << r << " col " << d;
      }
      for (int64_t g = 0; g < 3; ++g)
        ASSERT_EQ(pq.scale_inv.data_as<float>()[r * 3 + g],
                  t >= 0 ? q.scale_inv.data_as<float>()[t * 3 + g] : 1.0f)
            << "scale row " << r << " group " << g;
    }
    // The permuted FP8 tensor dequantizes to the permuted dequantized input.
    const Tensor a = moe_permute(cpu(), m, dequantize(cpu(), q, DType::kF32));
    ASSERT_TRUE(test::bitwise_equal(a, dequantize(cpu(), pq, DType::kF32)));
  }
}

// FP64 reference of the combine: out[t] = sum_j w * x[row_of[t, j]].
double combine_ref(const PermuteMap& m, const Tensor& x, const Tensor& w, int64_t t, int64_t d) {
  const int64_t D = x.cols(), k = m.top_k;
  double acc = 0.0;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t r = m.row_of.data_as<int32_t>()[t * k + j];
    const double xv = x.dtype() == DType::kF32 ? x.data_as<float>()[r * D + d]
                                               : bf16_to_float(x.data_as<uint16_t>()[r * D + d]);
    acc += (w.data() ? w.data_as<float>()[t * k + j] : 1.0) * xv;
  }
  return acc;
}

TEST(MoePermute, CombineAndGatherBackMatchFp64) {
  const int64_t T = 127, k = 8, E = 32, D = 136;
  const Tensor idx = random_routing(T, k, E, 31, 4);
  for (PermutePadding pad : {PermutePadding::kNone, PermutePadding::kTo128}) {
    const PermuteMap m =
        moe_permute_map(cpu(), {.topk_idx = idx, .num_experts = E, .padding = pad});
    const Tensor y = test::random_tensor({m.num_rows, D}, DType::kBF16, 32);
    const Tensor w = test::random_tensor({T, k}, DType::kF32, 33);
    for (DType out_dt : {DType::kF32, DType::kBF16}) {
      const Tensor out =
          moe_combine(cpu(), m, {.expert_out = y, .topk_weight = w, .out_dtype = out_dt});
      const Tensor back = moe_permute_backward(cpu(), m, y, out_dt);
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t d = 0; d < D; ++d) {
          const double want = combine_ref(m, y, w, t, d),
                       want_b = combine_ref(m, y, Tensor(), t, d);
          const double got = out_dt == DType::kF32
                                 ? out.data_as<float>()[t * D + d]
                                 : bf16_to_float(out.data_as<uint16_t>()[t * D + d]);
          const double got_b = out_dt == DType::kF32
                                   ? back.data_as<float>()[t * D + d]
                                   : bf16_to_float(back.data_as<uint16_t>()[t * D + d]);
          const double tol = out_dt == DType::kF32 ? 1e-5 : 8e-3;
          ASSERT_NEAR(got, want, tol * (1.0 + std::fabs(want)))
              << "combine (" << t << ", " << d << ")";
          ASSERT_NEAR(got_b, want_b, tol * (1.0 + std::fabs(want_b)))
              << "gather back (" << t << ", " << d << ")";
        }
      }
    }
  }
}

TEST(MoePermute, GatherThenAddIsGatherThenAddInto) {
  // then_add gives the bits of the op followed by add_into with each tensor in order, in both out
  // dtypes, for the combine and the permutation's backward; bad addends are rejected.
  const int64_t T = 53, k = 4, E = 8, D = 40;
  const PermuteMap m = moe_permute_map(cpu(), {.topk_idx = random_routing(T, k, E, 51, 1),
                                               .num_experts = E,
                                               .padding = PermutePadding::kTo128});
  const Tensor y = test::random_tensor({m.num_rows, D}, DType::kBF16, 52);
  const Tensor w = test::random_tensor({T, k}, DType::kF32, 53);
  for (DType dt : {DType::kBF16, DType::kF32}) {
    const Tensor a0 = test::random_tensor({T, D}, dt, 54), a1 = test::random_tensor({T, D}, dt, 55);
    Tensor want_c = moe_combine(cpu(), m, {.expert_out = y, .topk_weight = w, .out_dtype = dt});
    Tensor want_b = moe_permute_backward(cpu(), m, y, dt);
    for (Tensor* t : {&want_c, &want_b}) {
      add_into(cpu(), *t, a0);
      add_into(cpu(), *t, a1);
    }
    const Tensor got_c = moe_combine(
        cpu(), m, {.expert_out = y, .topk_weight = w, .out_dtype = dt, .then_add = {a0, a1}});
    const Tensor got_b = moe_permute_backward(cpu(), m, y, dt, {a0, a1});
    EXPECT_TRUE(test::bitwise_equal(want_c, got_c)) << dtype_name(dt);
    EXPECT_TRUE(test::bitwise_equal(want_b, got_b)) << dtype_name(dt);
    // One addend: the first alone.
    Tensor one = moe_permute_backward(cpu(), m, y, dt);
    add_into(cpu(), one, a0);
    EXPECT_TRUE(test::bitwise_equal(one, moe_permute_backward(cpu(), m, y, dt, {a0})));
    // In BF16 the adds do not commute in rounding: the order is part of the contract.
    if (dt == DType::kBF16)
      EXPECT_FALSE(test::bitwise_equal(got_b, moe_permute_backward(cpu(), m, y, dt, {a1, a0})));
  }
  const Tensor a = test::random_tensor({T, D}, DType::kBF16, 56);
  EXPECT_THROW(moe_permute_backward(cpu(), m, y, DType::kBF16, {a, a, a}), Error);
  EXPECT_THROW(moe_permute_backward(cpu(), m, y, DType::kF32, {a}), Error);  // dtype
  EXPECT_THROW(moe_permute_backward(cpu(), m, y, DType::kBF16,
                                    {test::random_tensor({T, D + 8}, DType::kBF16, 57)}),
               Error);  // shape
  EXPECT_THROW(
      moe_combine(
          cpu(), m,
          {.expert_out = y, .topk_weight = w, .out_dtype = DType::kBF16, .then_add = {Tensor()}}),
      Error);
}

TEST(MoePermute, PermuteBackwardIsTheAdjoint) {
  // <permute(x), y> == <x, permute_backward(y)> for any x, y (padding rows carry nothing).
  const int64_t T = 61, k = 4, E = 8, D = 24;
  const PermuteMap m = moe_permute_map(cpu(), {.topk_idx = random_routing(T, k, E, 41, 1),
                                               .num_experts = E,
                                               .padding = PermutePadding::kTo128});
  const Tensor x = test::random_tensor({T, D}, DType::kF32, 42);
  const Tensor y = test::random_tensor({m.num_rows, D}, DType::kF32, 43);
  const Tensor px = moe_permute(cpu(), m, x);
  const Tensor by = moe_permute_backward(cpu(), m, y, DType::kF32);
  double lhs = 0.0, rhs = 0.0;
  for (int64_t i = 0; i < m.num_rows * D; ++i)
    lhs += double{px.data_as<float>()[i]} * y.data_as<float>()[i];
  for (int64_t i = 0; i < T * D; ++i) rhs += double{x.data_as<float>()[i]} * by.data_as<float>()[i];
  EXPECT_NEAR(lhs, rhs, 1e-4 * (1.0 + std::fabs(lhs)));
}

TEST(MoePermute, CombineBackwardMatchesFiniteDifferences) {
  // L = sum_{t,d} r[t, d] * combine(x, w)[t, d], all in F32.
  const int64_t T = 9, k = 3, E = 6, D = 70;
  const PermuteMap m = moe_permute_map(cpu(), {.topk_idx = random_routing(T, k, E, 51, 1),
                                               .num_experts = E,
                                               .padding = PermutePadding::kTo128});
  Tensor x = test::random_tensor({m.num_rows, D}, DType::kF32, 52);
  Tensor w = test::random_tensor({T, k}, DType::kF32, 53);
  const Tensor r = test::random_tensor({T, D}, DType::kF32, 54);
  auto loss = [&]() {
    const Tensor out =
        moe_combine(cpu(), m, {.expert_out = x, .topk_weight = w, .out_dtype = DType::kF32});
    double L = 0.0;
    for (int64_t i = 0; i < T * D; ++i)
      L += double{r.data_as<float>()[i]} * out.data_as<float>()[i];
    return L;
  };
  const CombineGrads g = moe_combine_backward(
      cpu(), m, {.d_out = r, .expert_out = x, .topk_weight = w, .d_expert_out_dtype = DType::kF32});
  const float h = 1e-2f;
  for (int64_t i = 0; i < T * k; ++i) {
    const float w0 = w.data_as<float>()[i];
    w.data_as<float>()[i] = w0 + h;
    const double lp = loss();
    w.data_as<float>()[i] = w0 - h;
    const double lm = loss();
    w.data_as<float>()[i] = w0;
    const double fd = (lp - lm) / (2.0 * h);
    ASSERT_NEAR(g.d_topk_weight.data_as<float>()[i], fd, 2e-3 * (1.0 + std::fabs(fd)))
        << "d_weight " << i;
  }
  for (int64_t row = 0; row < m.num_rows; row += 7) {
    for (int64_t d = 0; d < D; d += 5) {
      const int64_t i = row * D + d;
      const float x0 = x.data_as<float>()[i];
      x.data_as<float>()[i] = x0 + h;
      const double lp = loss();
      x.data_as<float>()[i] = x0 - h;
      const double lm = loss();
      x.data_as<float>()[i] = x0;
      const double fd = (lp - lm) / (2.0 * h);
      ASSERT_NEAR(g.d_expert_out.data_as<float>()[i], fd, 2e-3 * (1.0 + std::fabs(fd)))
          << "d_expert_out row " << row << " (token " << m.token_of.data_as<int32_t>()[row]
          << ") col " << d;
    }
  }
  // Padding rows get exactly zero.
  for (int64_t row = 0; row < m.num_rows; ++row)
    if (m.token_of.data_as<int32_t>()[row] < 0)
      for (int64_t d = 0; d < D; ++d)
        ASSERT_EQ(g.d_expert_out.data_as<float>()[row * D + d], 0.0f) << "row " << row;
}

// The fused FP8 dispatch equals quantize-then-permute (its definition), padding rows included, and
// takes only the dispatch's quantization.
TEST(MoePermute, BackwardWithWeightsIsBothBackwards) {
  const int64_t T = 29, k = 3, E = 8, D = 40;
  const PermuteMap m = moe_permute_map(cpu(), {.topk_idx = random_routing(T, k, E, 51, 1),
                                               .num_experts = E,
                                               .padding = PermutePadding::kTo128});
  const Tensor y = test::random_tensor({m.num_rows, D}, DType::kBF16, 52);
  const Tensor d_rows = test::random_tensor({m.num_rows}, DType::kF32, 53);
  const PermuteBackwardResult r =
      moe_permute_backward_with_weights(cpu(), m, y, DType::kBF16, d_rows);
  EXPECT_TRUE(test::bitwise_equal(moe_permute_backward(cpu(), m, y, DType::kBF16), r.d_x));
  EXPECT_TRUE(test::bitwise_equal(moe_permute_weights_backward(cpu(), m, d_rows), r.d_topk_weight));
  EXPECT_THROW(moe_permute_backward_with_weights(cpu(), m, y, DType::kBF16,
                                                 Tensor::empty({m.num_rows + 1}, DType::kF32)),
               Error);
}

// The FP8 dispatch's case of the tests below: 37 tokens x 200 (a partial last group) top-3 of 8
// experts (2 of them empty), rows padded to 128, quantized in 1x128 E4M3 power-of-2 groups.
struct DispatchCase {
  PermuteMap map;
  QuantizeArgs args;
};

DispatchCase dispatch_case(uint64_t x_seed) {
  const Tensor idx = random_routing(37, 3, 8, 5, 2);
  const Tensor x = test::random_tensor({37, 200}, DType::kBF16, x_seed, test::Dist::kOutliers);
  return {moe_permute_map(cpu(),
                          {.topk_idx = idx, .num_experts = 8, .padding = PermutePadding::kTo128}),
          {.input = x,
           .format = Fp8Format::kE4M3,
           .granularity = Granularity::k1x128,
           .rounding = ScaleRounding::kPow2}};
}

TEST(MoePermute, FusedDispatchIsQuantizeThenPermute) {
  auto [m, qa] = dispatch_case(6);
  const QuantTensor fused = moe_permute_quantize(cpu(), m, qa);
  const QuantTensor ref = moe_permute(cpu(), m, quantize(cpu(), qa));
  EXPECT_TRUE(test::bitwise_equal(ref.data, fused.data));
  EXPECT_TRUE(test::bitwise_equal(ref.scale_inv, fused.scale_inv));
  EXPECT_TRUE(test::bitwise_equal(ref.amax, fused.amax));
  EXPECT_EQ(fused.rows(), m.num_rows);
  // Keeping the token rows: the same dispatch, and the rows quantize()'s, with one cast counted.
  const QuantTensor q = quantize(cpu(), qa);
  Context counted = make_context(Device::kCpu);
  counted.casts = std::make_shared<CastCounter>();
  const PermuteQuantizeResult kept = moe_permute_quantize_keeping_rows(counted, m, qa);
  EXPECT_EQ(counted.casts->at("other")[CastKind::kQuantize], 1);
  EXPECT_TRUE(test::bitwise_equal(fused.data, kept.permuted.data));
  EXPECT_TRUE(test::bitwise_equal(fused.scale_inv, kept.permuted.scale_inv));
  EXPECT_TRUE(test::bitwise_equal(q.data, kept.rows.data));
  EXPECT_TRUE(test::bitwise_equal(q.scale_inv, kept.rows.scale_inv));
  EXPECT_TRUE(test::bitwise_equal(q.amax, kept.rows.amax));
  EXPECT_EQ(kept.rows.rounding, ScaleRounding::kPow2);
  EXPECT_FALSE(kept.w_rows.defined());
  // With the routing weights: moe_permute_weights' rows from the same call; a wrong shape is
  // refused.
  const Tensor w = test::random_tensor({37, 3}, DType::kF32, 7);
  const PermuteQuantizeResult weighted = moe_permute_quantize_keeping_rows(cpu(), m, qa, w);
  EXPECT_TRUE(test::bitwise_equal(moe_permute_weights(cpu(), m, w), weighted.w_rows));
  EXPECT_TRUE(test::bitwise_equal(fused.data, weighted.permuted.data));
  EXPECT_THROW(moe_permute_quantize_keeping_rows(cpu(), m, qa, Tensor::empty({37, 2}, DType::kF32)),
               Error);
  qa.output = QuantizeOutput::kBoth;
  EXPECT_THROW(moe_permute_quantize(cpu(), m, qa), Error);
  qa.output = QuantizeOutput::kRowwise;
  qa.granularity = Granularity::kTensor;
  EXPECT_THROW(moe_permute_quantize(cpu(), m, qa), Error);
}

// The dispatch with its column-wise copy: the dispatch's rows, and the scaling-aware transpose of
// them (128x128 tiles or their 1x128 form), counted as one quantization and one transpose; scales
// that are not powers of 2, or a column-wise granularity the transpose does not write, refused.
TEST(MoePermute, TransposedDispatchIsDispatchThenTranspose) {
  auto [m, qa] = dispatch_case(9);
  const QuantTensor dispatched = moe_permute_quantize(cpu(), m, qa);
  for (const Granularity cg : {Granularity::k128x128, Granularity::k1x128}) {
    Context counted = make_context(Device::kCpu);
    counted.casts = std::make_shared<CastCounter>();
    const QuantTensor t = moe_permute_quantize_transposed(counted, m, qa, cg);
    EXPECT_EQ(counted.casts->at("other")[CastKind::kQuantize], 1);
    EXPECT_EQ(counted.casts->at("other")[CastKind::kTranspose], 1);
    EXPECT_TRUE(test::bitwise_equal(dispatched.data, t.data));
    EXPECT_TRUE(test::bitwise_equal(dispatched.scale_inv, t.scale_inv));
    EXPECT_TRUE(test::bitwise_equal(dispatched.amax, t.amax));
    QuantTensor ref = dispatched;
    scaling_aware_transpose(cpu(), ref, cg);
    EXPECT_EQ(t.columnwise_granularity, cg);
    EXPECT_TRUE(test::bitwise_equal(ref.columnwise_data, t.columnwise_data));
    EXPECT_TRUE(test::bitwise_equal(ref.columnwise_scale_inv, t.columnwise_scale_inv));
  }
  EXPECT_THROW(moe_permute_quantize_transposed(cpu(), m, qa, Granularity::kRow), Error);
  qa.rounding = ScaleRounding::kExact;
  EXPECT_THROW(moe_permute_quantize_transposed(cpu(), m, qa, Granularity::k1x128), Error);
}

}  // namespace
}  // namespace octet
