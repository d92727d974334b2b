// ops/quantize/quantize_grouped.h on the CPU: each group equals quantize(kTensor) of its rows on
// their own, bit for bit (data, scale, amax), in both copies and both column-wise scale layouts;
// empty groups, a padded tail, delayed scales, and the one clear error for misaligned groups.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "ops/quantize/quantize_grouped.h"
#include "test_util.h"

namespace octet::test {
namespace {

Context& cpu() {
  static Context ctx = make_context(Device::kCpu);
  return ctx;
}

Tensor sizes_tensor(const std::vector<int32_t>& sizes) {
  Tensor t = Tensor::empty({static_cast<int64_t>(sizes.size())}, DType::kI32);
  std::memcpy(t.data(), sizes.data(), sizes.size() * 4);
  return t;
}

Tensor rows_of(const Tensor& t, int64_t r0, int64_t rows) {
  Tensor out = Tensor::empty({rows, t.cols()}, t.dtype());
  const int64_t bytes = t.cols() * dtype_size(t.dtype());
  if (rows > 0)
    std::memcpy(out.data(), static_cast<const char*>(t.data()) + r0 * bytes,
                static_cast<size_t>(rows * bytes));
  return out;
}

// Checks a grouped quantization against per-group quantize(kTensor) on the CPU.
void expect_matches_per_group(const Tensor& x, const std::vector<int32_t>& sizes,
                              const GroupedQuantizeArgs& args, const GroupedQuantTensor& g) {
  const int64_t rows = x.rows(), cols = x.cols(), cb = ceil_div(cols, kGroup),
                rb = ceil_div(rows, kGroup);
  const uint8_t* q = g.q.data.data_as<const uint8_t>();
  const uint8_t* qt = g.q.columnwise_data.data_as<const uint8_t>();
  int64_t row = 0;
  std::vector<float> row_scale_inv(static_cast<size_t>(rows), 1.0f);
  for (size_t e = 0; e < sizes.size(); ++e) {
    const int64_t m = sizes[e];
    QuantizeArgs qa;
    qa.input = rows_of(x, row, m);
    qa.format = args.format;
    qa.granularity = Granularity::kTensor;
    qa.rounding = args.rounding;
    qa.output = QuantizeOutput::kRowwise;
    if (args.scale.defined()) {
      qa.scale = Tensor::empty({1}, DType::kF32);
      qa.scale.data_as<float>()[0] = args.scale.data_as<const float>()[e];
    }
    if (m > 0) {
      const QuantTensor ref = quantize(cpu(), qa);
      EXPECT_EQ(g.amax.data_as<const float>()[e], ref.amax.data_as<const float>()[0])
          << "group " << e;
      EXPECT_EQ(g.scale_inv.data_as<const float>()[e], ref.scale_inv.data_as<const float>()[0])
          << "group " << e;
      for (int64_t i = 0; i < m * cols; ++i) {
        ASSERT_EQ(q[row * cols + i], ref.data.data_as<const uint8_t>()[i])
            << "group " << e << " element " << i;
        const int64_t r = row + i / cols, c = i % cols;
        ASSERT_EQ(qt[c * rows + r], q[r * cols + c]) << "column-wise copy at " << r << ", " << c;
      }
    } else {
      EXPECT_EQ(g.amax.data_as<const float>()[e], 0.0f) << "empty group " << e;
    }
    for (int64_t r = row; r < row + m; ++r)
      row_scale_inv[r] = g.scale_inv.data_as<const float>()[e];
    row += m;
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cb; ++b)
      ASSERT_EQ(g.q.scale_inv.data_as<const float>()[r * cb + b], row_scale_inv[r]) << "row " << r;
  const bool tile = args.columnwise_granularity == Granularity::k128x128;
  for (int64_t i = 0; i < (tile ? cb : cols); ++i)
    for (int64_t b = 0; b < rb; ++b)
      ASSERT_EQ(g.q.columnwise_scale_inv.data_as<const float>()[i * rb + b],
                row_scale_inv[b * kGroup])
          << "column-wise scale " << i << ", " << b;
}

TEST(QuantizeGrouped, EachGroupIsItsOwnTensor) {
  // Empty groups, skewed groups, one group holding almost everything, a padded tail.
  const std::vector<std::vector<int32_t>> layouts = {
      {128, 0, 256, 0, 0, 128}, {0, 0, 384, 0}, {128, 128, 128, 128}, {0, 128, 0}};
  for (const auto& sizes : layouts) {
    for (const int64_t cols : {int64_t{200}, int64_t{256}}) {
      for (const DType dt : {DType::kBF16, DType::kF32}) {
        const int64_t rows = 512 + 64;  // a tail past every layout's sum
        const Tensor x = random_tensor({rows, cols}, dt, 11, Dist::kOutliers);
        for (const Granularity cg : {Granularity::k1x128, Granularity::k128x128}) {
          GroupedQuantizeArgs a{.input = x,
                                .group_sizes = sizes_tensor(sizes),
                                .format = Fp8Format::kE5M2,
                                .output = QuantizeOutput::kBoth,
                                .columnwise_granularity = cg};
          const GroupedQuantTensor g = quantize_grouped_tensorwise(cpu(), a);
          expect_matches_per_group(x, sizes, a, g);
        }
      }
    }
  }
}

TEST(QuantizeGrouped, DelayedScalesAndPow2) {
  const std::vector<int32_t> sizes = {128, 0, 128};
  const Tensor x = random_tensor({256, 72}, DType::kBF16, 3);
  Tensor scale = Tensor::empty({3}, DType::kF32);
  scale.data_as<float>()[0] = 16.0f;
  scale.data_as<float>()[1] = 3.0f;
  scale.data_as<float>()[2] = 0.75f;
  GroupedQuantizeArgs a{.input = x,
                        .group_sizes = sizes_tensor(sizes),
                        .format = Fp8Format::kE4M3,
                        .output = QuantizeOutput::kBoth,
                        .scale = scale};
  expect_matches_per_group(x, sizes, a, quantize_grouped_tensorwise(cpu(), a));
  a.scale = Tensor();
  a.rounding = ScaleRounding::kPow2;
  expect_matches_per_group(x, sizes, a, quantize_grouped_tensorwise(cpu(), a));
}

TEST(QuantizeGrouped, RowwiseOnlyTakesAnyOffsets) {
  const std::vector<int32_t> sizes = {3, 0, 17, 1};
  const Tensor x = random_tensor({30, 40}, DType::kBF16, 5);
  GroupedQuantizeArgs a{.input = x, .group_sizes = sizes_tensor(sizes)};
  const GroupedQuantTensor g = quantize_grouped_tensorwise(cpu(), a);
  EXPECT_FALSE(g.q.has_columnwise());
  int64_t row = 0;
  for (size_t e = 0; e < sizes.size(); ++e) {
    if (sizes[e] > 0) {
      QuantizeArgs qa;
      qa.input = rows_of(x, row, sizes[e]);
      qa.granularity = Granularity::kTensor;
      const QuantTensor ref = quantize(cpu(), qa);
      EXPECT_TRUE(bitwise_equal(ref.data, rows_of(g.q.data, row, sizes[e]))) << "group " << e;
    }
    row += sizes[e];
  }
}

TEST(QuantizeGrouped, BadArgumentsGiveOneClearError) {
  const Tensor x = random_tensor({256, 64}, DType::kBF16, 5);
  GroupedQuantizeArgs a{
      .input = x, .group_sizes = sizes_tensor({100, 28}), .output = QuantizeOutput::kBoth};
  EXPECT_THROW(
      {
        try {
          quantize_grouped_tensorwise(cpu(), a);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("not a multiple of 128"), std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
  a.group_sizes = sizes_tensor({200, 100});
  EXPECT_THROW(quantize_grouped_tensorwise(cpu(), a), Error);  // past the rows
  a.group_sizes = sizes_tensor({128});
  a.scale = Tensor::empty({2}, DType::kF32);
  EXPECT_THROW(quantize_grouped_tensorwise(cpu(), a), Error);  // one scale per group
}

}  // namespace
}  // namespace octet::test
