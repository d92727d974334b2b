// RoPE on the CPU: against an independent transcription of transformers' DeepseekV3 rope (explicit
// de-interleave, cos/sin = cat(freqs, freqs), x*cos + rotate_half(x)*sin) in FP64, the inverse and
// transpose properties of the backward, a finite-difference check, and argument validation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "numerics/fp8.h"
#include "ops/rope/rope.h"
#include "test_util.h"

namespace octet {
namespace {

using test::random_tensor;

float get(const Tensor& t, int64_t i) {
  return t.dtype() == DType::kF32 ? t.data_as<const float>()[i]
                                  : bf16_to_float(t.data_as<const uint16_t>()[i]);
}

// transformers: q = q.view(..., d/2, 2).transpose(-1, -2).reshape(..., d) when interleaved, then
// q*cos + rotate_half(q)*sin with cos = cat(freqs, freqs).cos(). FP64 throughout.
std::vector<double> hf_rope_row(const std::vector<double>& x, int64_t t, double theta,
                                bool interleave) {
  const int64_t d = static_cast<int64_t>(x.size()), h = d / 2;
  std::vector<double> xp(x.size()), y(x.size());
  for (int64_t i = 0; i < d; ++i)
    xp[i] = interleave ? (i < h ? x[2 * i] : x[2 * (i - h) + 1]) : x[i];
  for (int64_t i = 0; i < d; ++i) {
    const int64_t j = i % h;
    const double angle = static_cast<double>(t) / std::pow(theta, 2.0 * j / d);
    const double rot = i < h ? -xp[i + h] : xp[i - h];  // rotate_half
    y[i] = xp[i] * std::cos(angle) + rot * std::sin(angle);
  }
  return y;
}

struct RopeCase {
  Shape shape;
  int64_t offset, dim;
  RopePairing pairing;
};

class RopeCpu : public ::testing::TestWithParam<RopeCase> {};

TEST_P(RopeCpu, MatchesTransformersFormula) {
  Context cpu = make_context(Device::kCpu);
  const RopeCase c = GetParam();
  const double theta = 10000.0;
  const int64_t T = c.shape[1], H = c.shape.size() == 4 ? c.shape[2] : 1, W = c.shape.back();
  RopeTable tb = make_rope_table(cpu, T + 3, c.dim, theta);
  Tensor x = random_tensor(c.shape, DType::kF32, 11);
  const Tensor y =
      rope_forward(cpu, {.input = x, .table = tb, .pairing = c.pairing, .offset = c.offset});
  double max_err = 0;
  for (int64_t r = 0; r < x.numel() / W; ++r) {
    const int64_t t = (r / H) % T;
    std::vector<double> xr(static_cast<size_t>(c.dim));
    for (int64_t i = 0; i < c.dim; ++i) xr[i] = get(x, r * W + c.offset + i);
    const auto want = hf_rope_row(xr, t, theta, c.pairing == RopePairing::kInterleave);
    for (int64_t i = 0; i < W; ++i) {
      const float got = get(y, r * W + i);
      if (i < c.offset || i >= c.offset + c.dim) {
        ASSERT_EQ(std::memcmp(&got, x.data_as<float>() + r * W + i, 4), 0)
            << "pass-through channel " << i << " row " << r;
      } else {
        max_err = std::max(max_err, std::abs(got - want[i - c.offset]));
      }
    }
  }
  // FP32 table and FP32 math on N(0,1) inputs: a few ulps of values of size ~4.
  EXPECT_LT(max_err, 2e-6) << "max |y - transformers formula|";
}

TEST_P(RopeCpu, BackwardIsTransposeAndInverse) {
  Context cpu = make_context(Device::kCpu);
  const RopeCase c = GetParam();
  RopeTable tb = make_rope_table(cpu, c.shape[1], c.dim, 10000.0);
  const Tensor x = random_tensor(c.shape, DType::kF32, 21);
  const Tensor w = random_tensor(c.shape, DType::kF32, 22);
  const Tensor y =
      rope_forward(cpu, {.input = x, .table = tb, .pairing = c.pairing, .offset = c.offset});
  const Tensor gx =
      rope_backward(cpu, {.input = w, .table = tb, .pairing = c.pairing, .offset = c.offset});
  const Tensor back =
      rope_backward(cpu, {.input = y, .table = tb, .pairing = c.pairing, .offset = c.offset});
  // <R x, w> == <x, R^T w>, and R^T R x == x (rotations are orthogonal).
  double lhs = 0, rhs = 0, inv_err = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    lhs += double{get(y, i)} * get(w, i);
    rhs += double{get(x, i)} * get(gx, i);
    inv_err = std::max(inv_err, std::abs(double{get(back, i)} - get(x, i)));
  }
  EXPECT_NEAR(lhs, rhs, 1e-5 * (std::abs(lhs) + 1.0)) << "backward is not the transpose of forward";
  EXPECT_LT(inv_err, 2e-6) << "backward(forward(x)) != x";
}

TEST_P(RopeCpu, FiniteDifferenceGradient) {
  Context cpu = make_context(Device::kCpu);
  const RopeCase c = GetParam();
  RopeTable tb = make_rope_table(cpu, c.shape[1], c.dim, 10000.0);
  Tensor x = random_tensor(c.shape, DType::kF32, 31);
  const Tensor w = random_tensor(c.shape, DType::kF32, 32);
  auto loss = [&](const Tensor& in) {
    const Tensor y =
        rope_forward(cpu, {.input = in, .table = tb, .pairing = c.pairing, .offset = c.offset});
    double s = 0;
    for (int64_t i = 0; i < y.numel(); ++i) s += double{get(y, i)} * get(w, i);
    return s;
  };
  const Tensor g =
      rope_backward(cpu, {.input = w, .table = tb, .pairing = c.pairing, .offset = c.offset});
  const float eps = 1e-2f;
  for (int64_t i = 0; i < x.numel(); i += 7) {
    float* p = x.data_as<float>() + i;
    const float keep = *p;
    *p = keep + eps;
    const double lp = loss(x);
    *p = keep - eps;
    const double lm = loss(x);
    *p = keep;
    const double fd = (lp - lm) / (2.0 * double{eps});
    ASSERT_NEAR(fd, get(g, i), 2e-3) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, RopeCpu,
    ::testing::Values(RopeCase{{2, 5, 3, 96}, 64, 32, RopePairing::kHalf},  // q: nope 64 + rope 32
                      RopeCase{{2, 5, 3, 96}, 64, 32, RopePairing::kInterleave},
                      RopeCase{
                          {1, 7, 64}, 0, 64, RopePairing::kInterleave},   // shared k_pe (B, T, d)
                      RopeCase{{3, 4, 2, 10}, 2, 6, RopePairing::kHalf},  // rope in the middle
                      RopeCase{{1, 3, 1, 2}, 0, 2, RopePairing::kInterleave}));

TEST(RopeCpuSpecial, PositionZeroIsIdentityUpToTheDeinterleave) {
  Context cpu = make_context(Device::kCpu);
  RopeTable tb = make_rope_table(cpu, 1, 8, 10000.0);
  const Tensor x = random_tensor({1, 1, 1, 8}, DType::kF32, 3);
  const Tensor yh =
      rope_forward(cpu, {.input = x, .table = tb, .pairing = RopePairing::kHalf, .offset = 0});
  const Tensor yi = rope_forward(
      cpu, {.input = x, .table = tb, .pairing = RopePairing::kInterleave, .offset = 0});
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(get(yh, i), get(x, i));
    EXPECT_EQ(get(yi, i), get(x, i < 4 ? 2 * i : 2 * (i - 4) + 1)) << "interleave output " << i;
  }
}

TEST(RopeCpuSpecial, ScoresDependOnRelativePosition) {
  Context cpu = make_context(Device::kCpu);
  const int64_t T = 40, d = 16;
  RopeTable tb = make_rope_table(cpu, T, d, 10000.0);
  // The same q and k vector at every position: q_m . k_n must depend on m - n only.
  Tensor q = random_tensor({1, 1, 1, d}, DType::kF32, 5),
         k = random_tensor({1, 1, 1, d}, DType::kF32, 6);
  Tensor qs = Tensor::empty({1, T, 1, d}, DType::kF32),
         ks = Tensor::empty({1, T, 1, d}, DType::kF32);
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(qs.data_as<float>() + t * d, q.data(), d * 4);
    std::memcpy(ks.data_as<float>() + t * d, k.data(), d * 4);
  }
  for (RopePairing pr : {RopePairing::kHalf, RopePairing::kInterleave}) {
    const Tensor rq = rope_forward(cpu, {.input = qs, .table = tb, .pairing = pr, .offset = 0}),
                 rk = rope_forward(cpu, {.input = ks, .table = tb, .pairing = pr, .offset = 0});
    auto dotp = [&](int64_t m, int64_t n) {
      double s = 0;
      for (int64_t i = 0; i < d; ++i) s += double{get(rq, m * d + i)} * get(rk, n * d + i);
      return s;
    };
    for (int64_t delta : {0, 3, 17})
      EXPECT_NEAR(dotp(delta, 0), dotp(delta + 20, 20), 1e-4) << "relative offset " << delta;
  }
}

TEST(RopeCpuSpecial, Bf16RoundsTheF32Result) {
  Context cpu = make_context(Device::kCpu);
  RopeTable tb = make_rope_table(cpu, 9, 32, 10000.0);
  const Tensor xb = random_tensor({2, 9, 3, 48}, DType::kBF16, 8);
  Tensor xf = Tensor::empty(xb.shape(), DType::kF32);
  for (int64_t i = 0; i < xb.numel(); ++i) xf.data_as<float>()[i] = get(xb, i);
  for (RopePairing pr : {RopePairing::kHalf, RopePairing::kInterleave}) {
    const Tensor yb = rope_forward(cpu, {.input = xb, .table = tb, .pairing = pr, .offset = 16}),
                 yf = rope_forward(cpu, {.input = xf, .table = tb, .pairing = pr, .offset = 16});
    for (int64_t i = 0; i < yb.numel(); ++i)
      ASSERT_EQ(yb.data_as<uint16_t>()[i], float_to_bf16(yf.data_as<float>()[i]))
          << "element " << i;
  }
}

TEST(RopeCpuSpecial, RejectsBadArguments) {
  Context cpu = make_context(Device::kCpu);
  EXPECT_THROW(make_rope_table(cpu, 8, 7, 10000.0), Error);  // odd rope_dim
  EXPECT_THROW(make_rope_table(cpu, 0, 8, 10000.0), Error);
  EXPECT_THROW(make_rope_table(cpu, 8, 8, 0.5), Error);
  RopeTable tb = make_rope_table(cpu, 4, 8, 10000.0);
  const Tensor x = random_tensor({1, 5, 2, 8}, DType::kF32, 1);  // T = 5 > 4 positions
  EXPECT_THROW(
      rope_forward(cpu, {.input = x, .table = tb, .pairing = RopePairing::kHalf, .offset = 0}),
      Error);
  const Tensor x2 = random_tensor({1, 4, 2, 12}, DType::kF32, 1);
  EXPECT_THROW(
      rope_forward(cpu, {.input = x2, .table = tb, .pairing = RopePairing::kHalf, .offset = 5}),
      Error);  // 5 + 8 > 12
  EXPECT_NO_THROW(
      rope_forward(cpu, {.input = x2, .table = tb, .pairing = RopePairing::kHalf, .offset = 4}));
  try {
    rope_forward(cpu, {.input = x2, .table = tb, .pairing = RopePairing::kHalf, .offset = 5});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("do not fit"), std::string::npos) << e.what();
  }
  Tensor bad = Tensor::empty({1, 4, 8}, DType::kI32);
  EXPECT_THROW(
      rope_forward(cpu, {.input = bad, .table = tb, .pairing = RopePairing::kHalf, .offset = 0}),
      Error);
}

}  // namespace
}  // namespace octet
