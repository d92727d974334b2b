// Embedding on the CPU: the gather is exact, the backward follows its stated summation order bit
// for bit (checked by a loop of a different shape), matches FP64 central differences, accumulates,
// leaves unused rows untouched, and rejects bad ids naming the position.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/backend.h"
#include "norm_act_test_util.h"
#include "ops/embedding/embedding.h"

namespace octet {
namespace {

using test::random_tensor;

TEST(Embedding, ForwardGathersRows) {
  Context cpu = make_context(Device::kCpu);
  const Tensor table = random_tensor({11, 13}, DType::kF32, 31);
  const Tensor ids = test::random_ints({2, 9}, 0, 10, 32);
  for (DType out_dt : {DType::kF32, DType::kBF16}) {
    Tensor out = Tensor::empty({2, 9, 13}, out_dt);
    test::poison(out, 0xFF);
    embedding_forward(cpu, {.ids = ids, .table = table, .out = out});
    for (int64_t t = 0; t < 18; ++t)
      for (int64_t j = 0; j < 13; ++j) {
        const float want = table.data_as<float>()[ids.data_as<int32_t>()[t] * 13 + j];
        if (out_dt == DType::kF32)
          ASSERT_EQ(out.data_as<float>()[t * 13 + j], want) << t << "," << j;
        else
          ASSERT_EQ(out.data_as<uint16_t>()[t * 13 + j], float_to_bf16(want)) << t << "," << j;
      }
  }
}

// dtable[v] += (FP32 sum over t with ids[t] == v, t increasing, from 0), written as a loop over the
// vocabulary instead of over positions.
Tensor expected_dtable(const Tensor& ids, const Tensor& dout, const Tensor& dtable0) {
  Tensor want = Tensor::empty(dtable0.shape(), DType::kF32);
  const int64_t vocab = dtable0.size(0), d = dtable0.size(1);
  for (int64_t v = 0; v < vocab; ++v) {
    for (int64_t j = 0; j < d; ++j) {
      float s = 0.0f;
      bool any = false;
      for (int64_t t = 0; t < ids.numel(); ++t)
        if (ids.data_as<int32_t>()[t] == v)
          s += static_cast<float>(test::value_at(dout, t * d + j)), any = true;
      const float before = dtable0.data_as<float>()[v * d + j];
      want.data_as<float>()[v * d + j] = any ? before + s : before;
    }
  }
  return want;
}

TEST(Embedding, BackwardFollowsItsSummationOrder) {
  Context cpu = make_context(Device::kCpu);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const Tensor ids = test::random_ints({40}, 0, 6, 33);  // many repeats, some ids unused
    const Tensor dout = random_tensor({40, 9}, dt, 34, test::Dist::kWide);
    const Tensor dtable0 = random_tensor({9, 9}, DType::kF32, 35);
    Tensor dtable = dtable0.to_host(cpu);
    embedding_backward(cpu, {.ids = ids, .dout = dout, .dtable = dtable});
    EXPECT_TRUE(test::bitwise_equal(expected_dtable(ids, dout, dtable0), dtable)) << dtype_name(dt);
  }
}

TEST(Embedding, BackwardMatchesFiniteDifferences) {
  Context cpu = make_context(Device::kCpu);
  Tensor table = random_tensor({5, 3}, DType::kF32, 36);
  const Tensor ids =
      test::host_tensor({6}, DType::kI32, [](int64_t t) { return (t * 3) % 4; });  // 0 3 2 1 0 3
  const Tensor r = random_tensor({6, 3}, DType::kF32, 37);
  auto loss = [&] {
    Tensor out = Tensor::empty({6, 3}, DType::kF32);
    embedding_forward(cpu, {.ids = ids, .table = table, .out = out});
    return test::weighted_sum(out, r);
  };
  Tensor dtable = test::host_tensor({5, 3}, DType::kF32, [](int64_t) { return 0.0; });
  embedding_backward(cpu, {.ids = ids, .dout = r, .dtable = dtable});
  for (int64_t i = 0; i < table.numel(); ++i) {
    const double fd = test::central_difference(table.data_as<float>() + i, 1e-2, loss);
    EXPECT_NEAR(dtable.data_as<float>()[i], fd, 1e-4 * std::max(1.0, std::fabs(fd)))
        << "element " << i;
  }
  for (int64_t j = 0; j < 3; ++j)
    EXPECT_EQ(dtable.data_as<float>()[4 * 3 + j], 0.0f) << "unused id 4";
}

TEST(Embedding, RejectsBadArguments) {
  Context cpu = make_context(Device::kCpu);
  const Tensor table = random_tensor({7, 4}, DType::kF32, 38);
  Tensor ids = test::random_ints({5}, 0, 6, 39);
  Tensor out = Tensor::empty({5, 4}, DType::kBF16);
  ids.data_as<int32_t>()[3] = 7;
  test::expect_error([&] { embedding_forward(cpu, {.ids = ids, .table = table, .out = out}); },
                     {"position 3", "holds 7", "[0, 7)"});
  Tensor dtable = Tensor::empty({7, 4}, DType::kF32);
  test::expect_error([&] { embedding_backward(cpu, {.ids = ids, .dout = out, .dtable = dtable}); },
                     {"position 3"});
  ids.data_as<int32_t>()[3] = -1;
  test::expect_error([&] { embedding_forward(cpu, {.ids = ids, .table = table, .out = out}); },
                     {"position 3", "holds -1"});
  ids.data_as<int32_t>()[3] = 0;
  test::expect_error(
      [&] {
        embedding_forward(cpu,
                          {.ids = ids, .table = table, .out = Tensor::empty({5, 5}, DType::kBF16)});
      },
      {"embedding out", "(5, 4)", "[5, 5]"});
  test::expect_error(
      [&] {
        embedding_forward(cpu,
                          {.ids = random_tensor({5}, DType::kF32, 1), .table = table, .out = out});
      },
      {"embedding ids", "I32", "F32"});
  test::expect_error(
      [&] {
        embedding_backward(
            cpu, {.ids = ids, .dout = out, .dtable = Tensor::empty({7, 4}, DType::kBF16)});
      },
      {"embedding dtable", "F32", "BF16"});
}

}  // namespace
}  // namespace octet
