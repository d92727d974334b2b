// The fused operators of the fp8-flow dataflow on the CPU: swiglu_quantize with routing weights
// and swiglu_backward_quantize bit for bit against quantize() of the unfused FP32 results
// (swiglu_forward / swiglu_backward, the weight applied as swiglu.h states), the weight gradient
// against FP64 and its documented summation order; and the routing weights' move to the permuted
// layout (ops/moe_permute/moe_row_weight.h) on a hand-computed map.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/backend.h"
#include "norm_act_test_util.h"
#include "numerics/fp32_rn.h"
#include "ops/moe_permute/moe_row_weight.h"
#include "ops/quantize/quantize.h"
#include "ops/swiglu/swiglu.h"
#include "ops/swiglu/swiglu_math.h"

namespace octet {
namespace {

using test::Dist;
using test::random_tensor;

Context& cpu() {
  static Context c = make_context(Device::kCpu);
  return c;
}

Tensor f32_copy(const Tensor& t) {
  Tensor o = Tensor::empty(t.shape(), DType::kF32);
  for (int64_t i = 0; i < t.numel(); ++i)
    o.data_as<float>()[i] = static_cast<float>(test::value_at(t, i));
  return o;
}

// Routing weights as the router makes them: positive, a few exact zeros (padding rows).
Tensor row_weights(int64_t rows, uint64_t seed) {
  Tensor w = random_tensor({rows}, DType::kF32, seed, Dist::kGaussian);
  for (int64_t r = 0; r < rows; ++r) {
    float& v = w.data_as<float>()[r];
    v = r % 7 == 3 ? 0.0f : std::fabs(v) * 0.7f + 0.05f;
  }
  return w;
}

QuantizeArgs rowwise(const Tensor& x, Fp8Format fmt, ScaleRounding rnd) {
  return {x, fmt, Granularity::k1x128, rnd, 0.0f, QuantizeOutput::kRowwise, {}};
}

::testing::AssertionResult same(const QuantTensor& want, const QuantTensor& got) {
  for (auto [a, b, what] : {std::tuple{&want.data, &got.data, "data"},
                            std::tuple{&want.scale_inv, &got.scale_inv, "scale_inv"},
                            std::tuple{&want.amax, &got.amax, "amax"}}) {
    auto r = test::bitwise_equal(*a, *b);
    if (!r) return r << " [" << what << "]";
  }
  return ::testing::AssertionSuccess();
}

const Shape kShapes[] = {Shape{1, 14}, Shape{5, 258}, Shape{3, 512}, Shape{17, 2 * 300},
                         Shape{9, 2 * 64}};

TEST(SwigluFlow, WeightedQuantizeEqualsQuantizeOfWeightedOutput) {
  for (const Shape& shape : kShapes)
    for (DType dt : {DType::kBF16, DType::kF32})
      for (Fp8Format fmt : {Fp8Format::kE4M3, Fp8Format::kE5M2})
        for (Dist dist : {Dist::kGaussian, Dist::kOutliers, Dist::kWide}) {
          const Tensor gu = random_tensor(shape, dt, 40 + static_cast<int>(dist), dist);
          const Tensor w = row_weights(shape[0], 41);
          const QuantTensor got = swiglu_quantize(
              cpu(),
              {.gate_up = gu, .format = fmt, .rounding = ScaleRounding::kPow2, .row_weight = w});
          Tensor h = Tensor::empty({shape[0], shape[1] / 2}, DType::kF32);
          swiglu_forward(cpu(), {gu, h});
          for (int64_t r = 0; r < h.rows(); ++r)
            for (int64_t j = 0; j < h.cols(); ++j) {
              float& v = h.data_as<float>()[r * h.cols() + j];
              v = swiglu_math::canonical_nan(rn::mul(v, w.data_as<float>()[r]));
            }
          const QuantTensor want = quantize(cpu(), rowwise(h, fmt, ScaleRounding::kPow2));
          ASSERT_TRUE(same(want, got)) << shape_str(shape) << " " << dtype_name(dt);
        }
}

TEST(SwigluFlow, BackwardQuantizeEqualsQuantizeOfBackward) {
  for (const Shape& shape : kShapes)
    for (DType dt : {DType::kBF16, DType::kF32})
      for (bool weighted : {false, true})
        for (Dist dist : {Dist::kGaussian, Dist::kOutliers, Dist::kWide}) {
          const int64_t rows = shape[0], f = shape[1] / 2;
          const Tensor gu = random_tensor(shape, dt, 50 + static_cast<int>(dist), dist);
          const Tensor dh = random_tensor({rows, f}, dt, 51 + static_cast<int>(dist), dist);
          const Tensor w = weighted ? row_weights(rows, 52) : Tensor();
          const SwigluBackwardQuantizeResult got =
              swiglu_backward_quantize(cpu(), {.dh = dh, .gate_up = gu, .row_weight = w});
          // Unfused: dh * w in FP32, swiglu_backward in FP32, quantize().
          Tensor dhw = f32_copy(dh);
          if (weighted)
            for (int64_t r = 0; r < rows; ++r)
              for (int64_t j = 0; j < f; ++j) {
                float& v = dhw.data_as<float>()[r * f + j];
                v = rn::mul(v, w.data_as<float>()[r]);
              }
          Tensor d = Tensor::empty({rows, 2 * f}, DType::kF32);
          swiglu_backward(cpu(), {dhw, gu, d});
          const QuantTensor want =
              quantize(cpu(), rowwise(d, Fp8Format::kE4M3, ScaleRounding::kPow2));
          const std::string where = shape_str(shape) + " " + std::string(dtype_name(dt)) +
                                    (weighted ? " weighted" : "") + " dist " +
                                    std::to_string(static_cast<int>(dist));
          ASSERT_TRUE(same(want, got.d_gate_up)) << where;
          EXPECT_EQ(got.d_gate_up.rounding, ScaleRounding::kPow2);
          if (!weighted) {
            EXPECT_FALSE(got.d_row_weight.defined()) << where;
            continue;
          }
          // d w[r] = sum_j dh h: FP64 within FP32 summation error, and the documented order
          // exactly.
          for (int64_t r = 0; r < rows; ++r) {
            double ref = 0, mag = 0;
            float partial[32] = {};
            for (int64_t j = 0; j < f; ++j) {
              const float g = static_cast<float>(test::value_at(gu, r * 2 * f + j));
              const float u = static_cast<float>(test::value_at(gu, r * 2 * f + f + j));
              const float hj = swiglu_math::swiglu(g, u);
              const double dj = test::value_at(dh, r * f + j);
              ref += dj * hj;
              mag += std::fabs(dj * hj);
              partial[j % 32] = rn::add(partial[j % 32], rn::mul(static_cast<float>(dj), hj));
            }
            for (int s = 16; s >= 1; s /= 2)
              for (int l = 0; l < s; ++l) partial[l] = rn::add(partial[l], partial[l + s]);
            const float gotw = got.d_row_weight.data_as<float>()[r];
            if (!std::isfinite(ref)) continue;
            EXPECT_NEAR(gotw, ref, 1e-5 * mag + 1e-30) << where << " row " << r;
            EXPECT_EQ(float_bits(gotw), float_bits(partial[0])) << where << " row " << r;
          }
        }
}

TEST(SwigluFlow, BackwardQuantizeZeroRowsAndBadArguments) {
  const SwigluBackwardQuantizeResult z =
      swiglu_backward_quantize(cpu(), {.dh = Tensor::empty({0, 64}, DType::kBF16),
                                       .gate_up = Tensor::empty({0, 128}, DType::kBF16),
                                       .row_weight = Tensor::empty({0}, DType::kF32),
                                       .want_h = true});
  EXPECT_EQ(z.d_gate_up.amax.data_as<float>()[0], 0.0f);
  EXPECT_EQ(z.d_row_weight.numel(), 0);
  EXPECT_EQ(z.h.data.shape(), (Shape{0, 64}));
  EXPECT_EQ(z.h.amax.data_as<float>()[0], 0.0f);
  const Tensor gu = random_tensor({4, 256}, DType::kBF16, 60);
  const Tensor dh = random_tensor({4, 128}, DType::kBF16, 61);
  EXPECT_THROW(swiglu_backward_quantize(
                   cpu(), {.dh = random_tensor({4, 127}, DType::kBF16, 62), .gate_up = gu}),
               Error);
  EXPECT_THROW(swiglu_backward_quantize(
                   cpu(), {.dh = dh, .gate_up = gu, .row_weight = Tensor::empty({5}, DType::kF32)}),
               Error);
  EXPECT_THROW(
      swiglu_backward_quantize(
          cpu(), {.dh = dh, .gate_up = gu, .row_weight = Tensor::empty({4}, DType::kBF16)}),
      Error);
  EXPECT_THROW(
      swiglu_quantize(cpu(), {.gate_up = gu, .row_weight = Tensor::empty({3}, DType::kF32)}),
      Error);
}

Tensor i32(const Shape& shape, const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty(shape, DType::kI32);
  std::copy(v.begin(), v.end(), t.data_as<int32_t>());
  return t;
}

TEST(MoeRowWeight, HandComputedScatterAndGather) {
  // 3 tokens, top-2 over 4 experts, padded to 128: expert 0 rows [0, 128) holds tokens 0, 1;
  // expert 2 rows [128, 256) holds token 0, 2; expert 3 rows [256, 384) holds 1, 2.
  const PermuteMap m =
      moe_permute_map(cpu(), {i32({3, 2}, {2, 0, 0, 3, 2, 3}), 4, PermutePadding::kTo128});
  const float tw[] = {0.5f, 0.25f, 0.125f, 2.0f, 3.0f, -1.5f};
  Tensor w = Tensor::empty({3, 2}, DType::kF32);
  std::copy(tw, tw + 6, w.data_as<float>());
  const Tensor rows = moe_permute_weights(cpu(), m, w);
  ASSERT_EQ(rows.numel(), m.num_rows);
  const int32_t* row_of = m.row_of.data_as<const int32_t>();
  std::vector<float> want(static_cast<size_t>(m.num_rows), 0.0f);
  for (int i = 0; i < 6; ++i) want[static_cast<size_t>(row_of[i])] = tw[i];
  EXPECT_EQ(row_of[0], 128);  // token 0's first choice, expert 2, is that expert's first row
  EXPECT_EQ(row_of[1], 0);
  EXPECT_EQ(row_of[2], 1);
  for (int64_t r = 0; r < m.num_rows; ++r)
    ASSERT_EQ(rows.data_as<float>()[r], want[static_cast<size_t>(r)]) << "row " << r;
  // The backward gathers: d topk[t, j] = d_rows[row_of[t, j]].
  Tensor d = Tensor::empty({m.num_rows}, DType::kF32);
  for (int64_t r = 0; r < m.num_rows; ++r) d.data_as<float>()[r] = static_cast<float>(r) + 0.5f;
  const Tensor back = moe_permute_weights_backward(cpu(), m, d);
  ASSERT_EQ(back.shape(), (Shape{3, 2}));
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(back.data_as<float>()[i], static_cast<float>(row_of[i]) + 0.5f) << i;
  EXPECT_THROW(moe_permute_weights(cpu(), m, Tensor::empty({3, 3}, DType::kF32)), Error);
  EXPECT_THROW(moe_permute_weights_backward(cpu(), m, Tensor::empty({7}, DType::kF32)), Error);
}

}  // namespace
}  // namespace octet
