// CUDA embedding against the CPU reference, bit for bit: the gather is a copy, and the backward's
// summation order is part of the contract (embedding.h), which the sort-and-reduce kernel follows.
// The backward runs twice and must give the same bits. Outputs are poisoned with NaN first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "norm_act_test_util.h"
#include "ops/embedding/embedding.h"

namespace octet {
namespace {

using test::bitwise_equal;
using test::random_tensor;

struct Devices {
  Context cpu = make_context(Device::kCpu);
  Context gpu = make_context(Device::kCuda);
};

Devices& devices() {
  static Devices d;
  return d;
}

Tensor forward(Context& ctx, const Tensor& ids, const Tensor& table, DType out_dt) {
  const Shape s{ids.numel(), table.size(1)};
  Tensor out =
      ctx.device == Device::kCuda ? test::poisoned(ctx, s, out_dt) : Tensor::empty(s, out_dt);
  if (ctx.device == Device::kCuda)
    embedding_forward(
        ctx,
        {.ids = ids.to(ctx, Device::kCuda), .table = table.to(ctx, Device::kCuda), .out = out});
  else
    embedding_forward(ctx, {.ids = ids, .table = table, .out = out});
  return out.to_host(ctx);
}

Tensor backward(Context& ctx, const Tensor& ids, const Tensor& dout, const Tensor& dtable0) {
  if (ctx.device == Device::kCpu) {
    Tensor dt = dtable0.to_host(ctx);
    embedding_backward(ctx, {.ids = ids, .dout = dout, .dtable = dt});
    return dt;
  }
  Tensor dt = dtable0.to(ctx, Device::kCuda);
  embedding_backward(
      ctx, {.ids = ids.to(ctx, Device::kCuda), .dout = dout.to(ctx, Device::kCuda), .dtable = dt});
  return dt.to_host(ctx);
}

using Case = std::tuple<int64_t, int64_t, int64_t, DType>;  // rows, D, V, dout and out dtype

class EmbeddingGpu : public ::testing::TestWithParam<Case> {};

TEST_P(EmbeddingGpu, MatchesCpuBitwiseAndIsDeterministic) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const auto& [rows, d, vocab, dt] = GetParam();
  const std::string where = "rows " + std::to_string(rows) + " D " + std::to_string(d) + " V " +
                            std::to_string(vocab) + " " + std::string(dtype_name(dt));
  const Tensor ids =
      test::random_ints({rows}, 0, static_cast<int32_t>(vocab - 1), 2000 + rows + vocab);
  for (DType table_dt : {DType::kF32, DType::kBF16}) {
    const Tensor table = test::hashed_tensor({vocab, d}, table_dt, 2100 + d);
    ASSERT_TRUE(bitwise_equal(forward(cpu, ids, table, dt), forward(gpu, ids, table, dt)))
        << where << " forward, table " << dtype_name(table_dt);
  }
  const Tensor dout = random_tensor({rows, d}, dt, 2200 + rows, test::Dist::kWide);
  const Tensor dtable0 = test::hashed_tensor({vocab, d}, DType::kF32, 2300 + vocab);
  const Tensor got = backward(gpu, ids, dout, dtable0);
  ASSERT_TRUE(bitwise_equal(backward(cpu, ids, dout, dtable0), got)) << where << " backward";
  ASSERT_TRUE(bitwise_equal(got, backward(gpu, ids, dout, dtable0)))
      << where << " backward not deterministic";
}

// V = 7 makes runs of ~200 equal ids at 1481 rows; V = 65537 makes most ids unique (17-bit keys).
INSTANTIATE_TEST_SUITE_P(OddShapes, EmbeddingGpu,
                         ::testing::Combine(::testing::Values(1, 127, 129, 1481),
                                            ::testing::Values(7, 129, 1000),
                                            ::testing::Values(7, 1000, 65537),
                                            ::testing::Values(DType::kBF16, DType::kF32)));

TEST(EmbeddingGpuSpecial, ModelSizedBackward) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  // 8 x 4096 tokens of a 32000-word vocabulary with a skewed distribution (a few ids very
  // frequent).
  Tensor ids = test::random_ints({8, 4096}, 0, 31999, 2400);
  for (int64_t t = 0; t < ids.numel(); t += 3)
    ids.data_as<int32_t>()[t] = static_cast<int32_t>(t % 5);
  const Tensor dout = random_tensor({8 * 4096, 256}, DType::kBF16, 2401);
  const Tensor dtable0 = random_tensor({32000, 256}, DType::kF32, 2402);
  const Tensor got = backward(gpu, ids, dout, dtable0);
  ASSERT_TRUE(bitwise_equal(backward(cpu, ids, dout, dtable0), got));
  ASSERT_TRUE(bitwise_equal(got, backward(gpu, ids, dout, dtable0))) << "not deterministic";
}

// The backward loads a run's rows a batch at a time into a shared tile (64 rows of BF16, 32 of
// FP32) and adds them in order: runs of every length around those batches (1 to 150 rows,
// including 31 to 33, 63 to 65 and 127 to 129), their rows scattered over the positions, and one
// run of a thousand as real text has them (a space). D = 300 fills the BF16 tile element by element
// and D = 520 by 16-byte pieces, with a last slab of 8 columns.
TEST(EmbeddingGpuSpecial, RunsOfEveryLengthAroundTheLoadBatch) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  std::vector<int32_t> order;
  for (int32_t len = 1; len <= 150; ++len) order.insert(order.end(), len, len);
  order.insert(order.end(), 1000, 0);
  std::mt19937 rng(2500);
  std::shuffle(order.begin(), order.end(), rng);
  Tensor ids = Tensor::empty({static_cast<int64_t>(order.size())}, DType::kI32);
  std::copy(order.begin(), order.end(), ids.data_as<int32_t>());
  for (int64_t d : {300, 520}) {
    for (DType dt : {DType::kBF16, DType::kF32}) {
      const Tensor dout = random_tensor({ids.numel(), d}, dt, 2501, test::Dist::kWide);
      const Tensor dtable0 = random_tensor({151, d}, DType::kF32, 2502);
      const Tensor got = backward(gpu, ids, dout, dtable0);
      ASSERT_TRUE(bitwise_equal(backward(cpu, ids, dout, dtable0), got))
          << dtype_name(dt) << " D " << d;
    }
  }
}

// Out-of-range ids on the GPU: a NaN row in the forward, skipped in the backward (embedding.h).
TEST(EmbeddingGpuSpecial, InvalidIdsGiveNaNRowsAndAreSkipped) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const int64_t rows = 300, d = 33, vocab = 50;
  Tensor ids = test::random_ints({rows}, 0, 49, 2500);
  const int64_t bad[] = {0, 17, 299};
  ids.data_as<int32_t>()[0] = -1;
  ids.data_as<int32_t>()[17] = 50;
  ids.data_as<int32_t>()[299] = 1 << 30;
  const Tensor table = random_tensor({vocab, d}, DType::kF32, 2501);
  const Tensor out = forward(gpu, ids, table, DType::kF32);
  for (int64_t t : bad)
    for (int64_t j = 0; j < d; ++j)
      ASSERT_TRUE(std::isnan(out.data_as<float>()[t * d + j])) << "row " << t;
  // The reference: the valid positions only, in their order.
  Tensor ids_ok = Tensor::empty({rows - 3}, DType::kI32);
  const Tensor dout = random_tensor({rows, d}, DType::kF32, 2502);
  Tensor dout_ok = Tensor::empty({rows - 3, d}, DType::kF32);
  for (int64_t t = 0, k = 0; t < rows; ++t) {
    if (t == 0 || t == 17 || t == 299) continue;
    ids_ok.data_as<int32_t>()[k] = ids.data_as<int32_t>()[t];
    for (int64_t j = 0; j < d; ++j)
      dout_ok.data_as<float>()[k * d + j] = dout.data_as<float>()[t * d + j];
    ++k;
  }
  const Tensor dtable0 = random_tensor({vocab, d}, DType::kF32, 2503);
  ASSERT_TRUE(
      bitwise_equal(backward(cpu, ids_ok, dout_ok, dtable0), backward(gpu, ids, dout, dtable0)));
}

}  // namespace
}  // namespace octet
