// Device-side parameter initialisation (ops/init, model/init.h init_model) against the host, bit
// for bit: every parameter of a small model, and a large tensor with the certification margin at
// its default and narrowed so that many elements take the host fix-up path.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <set>

#include "backend/backend.h"
#include "dist/comm.h"
#include "model/init.h"
#include "model/model.h"
#include "ops/init/init_normal.h"
#include "test_util.h"
#include "tiny_model.h"

namespace octet {
namespace {

using test::bitwise_equal;

TEST(InitCuda, EveryParameterMatchesTheHostBitwise) {
  OCTET_REQUIRE_GPU();
  ModelConfig c = test::tiny_model_config();
  c.intermediate_size = 192;  // GEMM-friendly widths, as model_gpu_test's
  c.moe_intermediate_size = 64;
  c.extra["pad_token_id"] = 5;
  c.num_nextn_predict_layers = 2;
  Context gpu = make_context(Device::kCuda);
  Model m(gpu, c, Precision{recipe_preset("bf16"), DType::kBF16});
  for (uint64_t seed : {uint64_t{0}, uint64_t{1234}, uint64_t{0xFFFFFFFFFFFFull}}) {
    init_model(gpu, m, seed);
    const io::NamedTensors want = init_parameters(c, seed), got = m.export_tensors(gpu);
    ASSERT_EQ(want.size(), got.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(want[i].first, got[i].first);
      EXPECT_TRUE(bitwise_equal(want[i].second, got[i].second))
          << want[i].first << " seed " << seed;
    }
  }
}

// 2^24 + 5 values per case. At the default margin the kernel certifies all but about 2^-15.5 of
// them (a few hundred, computed by the host and scattered in); at margin 2^-20 hardly any is
// certified, the list overflows and the whole tensor comes from the host. Either way the tensor
// is the host's.
TEST(InitCuda, ManyValuesMatchTheHostBitwise) {
  OCTET_REQUIRE_GPU();
  Context cpu = make_context(Device::kCpu), gpu = make_context(Device::kCuda);
  const int64_t n = (int64_t{1} << 24) + 5;
  for (const double std : {0.02, 1.0, 3.0e-5}) {
    Tensor want = Tensor::empty({n}, DType::kF32);
    init_normal(cpu, {.out = want, .seed = 42, .stream = 9, .std = std});
    for (const int margin : {40, 20}) {
      Tensor d = Tensor::empty(gpu, {n}, DType::kF32);
      const InitNormalStats st =
          init_normal(gpu, {.out = d, .seed = 42, .stream = 9, .std = std, .margin_log2 = margin});
      EXPECT_TRUE(bitwise_equal(want, d.to_host(gpu))) << "std " << std << " margin " << margin;
      if (margin == 40) {
        EXPECT_GT(st.host_elements, 0) << std;  // the scatter path ran
        EXPECT_LT(st.host_elements, n / 4096) << std;
      } else {
        EXPECT_EQ(st.host_elements, n) << std;  // the whole-tensor fallback ran
      }
    }
  }
}

// An expert group's rank and size without a transport: enough to build a model whose routed
// experts are sharded (init_model runs no collective); any collective fails the test.
class RankOnlyComm : public Comm {
 public:
  RankOnlyComm(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "rank-only"; }
  void all_reduce(Context&, const void*, void*, int64_t, DType, ReduceOp) override { fail(); }
  void reduce_scatter(Context&, const void*, void*, int64_t, DType, ReduceOp) override { fail(); }
  void all_gather(Context&, const void*, void*, int64_t, DType) override { fail(); }
  void all_to_all_v(Context&, const void*, const int64_t*, const int64_t*, void*, const int64_t*,
                    const int64_t*, DType) override {
    fail();
  }
  void broadcast(Context&, void*, int64_t, DType, int) override { fail(); }
  void barrier(Context&) override { fail(); }
  std::shared_ptr<Comm> split(Context&, int, int) override {
    fail();
    return nullptr;
  }
  void abort(const std::string&) noexcept override {}

 private:
  static void fail() { OCTET_THROW("init_model ran a collective over the expert group"); }
  int rank_, size_;
};

// Expert parallelism: EP rank r of 2 and 4 draws its own experts on the GPU, bit for bit the
// single rank's (host) values of those experts.
TEST(InitCuda, ExpertParallelRanksDrawTheirOwnExperts) {
  OCTET_REQUIRE_GPU();
  ModelConfig c = test::tiny_model_config();
  c.intermediate_size = 192;
  c.moe_intermediate_size = 64;
  ASSERT_EQ(c.n_routed_experts % 4, 0);
  const Precision p{recipe_preset("bf16"), DType::kBF16};
  Context cpu = make_context(Device::kCpu), gpu = make_context(Device::kCuda);
  Model one(cpu, c, p);
  init_model(cpu, one, 77);
  for (const int size : {2, 4}) {
    for (int r = 0; r < size; ++r) {
      Model m(gpu, c, p, std::make_shared<RankOnlyComm>(r, size));
      ASSERT_TRUE(m.experts_sharded());
      init_model(gpu, m, 77);
      std::set<const Parameter*> experts;
      for (const Parameter* e : m.expert_parameters()) experts.insert(e);
      for (Parameter* q : m.parameters()) {
        const Tensor got = q->value.to_host(gpu);
        const Tensor& full = one.parameter(q->name).value;
        const int64_t from = experts.count(q) ? r * got.numel() : 0;
        EXPECT_EQ(std::memcmp(got.data(), full.data_as<const float>() + from, got.nbytes()), 0)
            << "EP rank " << r << " of " << size << ": " << q->name;
      }
    }
  }
}

}  // namespace
}  // namespace octet
