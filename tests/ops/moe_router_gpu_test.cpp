// CUDA moe_router family against the CPU reference, bit for bit: selection, weights, counts,
// backward, bias update and balance loss, on odd token counts and DeepSeek-V3's routing shape;
// determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <sstream>
#include <tuple>

#include "backend/backend.h"
#include "ops/moe_router/moe_router.h"
#include "test_util.h"

namespace octet {
namespace {

using test::bitwise_equal;

struct Devices {
  Context cpu = make_context(Device::kCpu);
  Context gpu = make_context(Device::kCuda);
};

Devices& devices() {
  static Devices d;
  return d;
}

// Fills the device pool with a poison pattern and frees it, so that unwritten outputs show up.
void poison_pool(Context& gpu, int64_t bytes) {
  Tensor t = Tensor::empty(gpu, {bytes}, DType::kU8);
  gpu.be().memset(t.data(), 0xA5, bytes);
}

Tensor to_gpu(const Tensor& t) {
  return t.to(devices().gpu, Device::kCuda);
}
Tensor to_cpu(const Tensor& t) {
  return t.to_host(devices().gpu);
}

// NaN payloads differ between x86 (propagates the operand's) and the GPU (canonical 0x7FFFFFFF);
// with NaN logits only "NaN here" is part of the contract, so both sides' NaNs become one pattern
// first.
Tensor nan_canonical(const Tensor& host) {
  Tensor t = host.to_host(devices().cpu);
  if (t.dtype() != DType::kF32) return t;
  for (int64_t i = 0; i < t.numel(); ++i)
    if (std::isnan(t.data_as<float>()[i])) t.data_as<float>()[i] = std::nanf("");
  return t;
}

::testing::AssertionResult same_bits(const Tensor& want, const Tensor& got_device) {
  return bitwise_equal(nan_canonical(want), nan_canonical(to_cpu(got_device)));
}

struct RouterCase {
  int64_t T, E, n_group, topk_group, k;
  GroupMaskFill fill;
  TopkNorm norm;
};

std::string describe(const RouterCase& c) {
  std::ostringstream os;
  os << "T=" << c.T << " E=" << c.E << " n_group=" << c.n_group << " topk_group=" << c.topk_group
     << " k=" << c.k << (c.fill == GroupMaskFill::kExclude ? " exclude" : " zero-fill")
     << (c.norm == TopkNorm::kSumToOne ? " norm" : " no-norm");
  return os.str();
}

RouterConfig config_of(const RouterCase& c) {
  RouterConfig r;
  r.num_experts = c.E;
  r.top_k = c.k;
  r.n_group = c.n_group;
  r.topk_group = c.topk_group;
  r.norm = c.norm;
  r.routed_scaling_factor = 2.5f;
  r.mask_fill = c.fill;
  return r;
}

enum class Logits { kGaussian, kTies, kSpecial };

// kTies: a coarse grid (many equal scores); kSpecial: wide magnitudes with some +-inf and NaN.
Tensor make_logits(int64_t T, int64_t E, Logits kind, uint64_t seed) {
  Tensor t =
      test::random_tensor({T, E}, DType::kF32, seed,
                          kind == Logits::kSpecial ? test::Dist::kWide : test::Dist::kGaussian);
  float* x = t.data_as<float>();
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < T * E; ++i) {
    if (kind == Logits::kTies) x[i] = std::round(x[i] * 2.0f) * 0.5f;
    if (kind == Logits::kSpecial && rng() % 97 == 0) {
      const float specials[] = {std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity(), std::nanf(""), -0.0f,
                                0.0f};
      x[i] = specials[rng() % 5];
    }
  }
  return t;
}

// Bias in [-0.5, 0.5) with expert 3 pushed far down: it never wins, so some expert has zero tokens.
Tensor make_bias(int64_t E, uint64_t seed) {
  Tensor t = test::random_tensor({E}, DType::kF32, seed);
  for (int64_t e = 0; e < E; ++e) t.data_as<float>()[e] *= 0.25f;
  if (E > 3) t.data_as<float>()[3] = -10.0f;
  return t;
}

class MoeRouterGpu : public ::testing::TestWithParam<RouterCase> {};

TEST_P(MoeRouterGpu, ForwardBackwardMatchCpuBitwise) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const RouterCase& c = GetParam();
  const RouterConfig cfg = config_of(c);
  for (Logits kind : {Logits::kGaussian, Logits::kTies, Logits::kSpecial}) {
    SCOPED_TRACE(describe(c) + " logits kind " + std::to_string(static_cast<int>(kind)));
    const Tensor logits = make_logits(c.T, c.E, kind, 1000 + c.T + c.E);
    const Tensor bias = make_bias(c.E, 7 + c.E);
    const RouterOutput want =
        moe_router_forward(cpu, {.logits = logits, .bias = bias, .config = cfg});
    poison_pool(gpu, 8 * logits.nbytes() + (1 << 20));
    const Tensor glogits = to_gpu(logits);
    const RouterOutput got =
        moe_router_forward(gpu, {.logits = glogits, .bias = to_gpu(bias), .config = cfg});
    ASSERT_TRUE(bitwise_equal(want.topk_idx, to_cpu(got.topk_idx))) << "topk_idx";
    ASSERT_TRUE(same_bits(want.topk_weight, got.topk_weight)) << "topk_weight";
    ASSERT_TRUE(bitwise_equal(want.counts, to_cpu(got.counts))) << "counts";
    if (c.E > 3 && c.k < c.E && kind != Logits::kSpecial)
      EXPECT_EQ(want.counts.data_as<int32_t>()[3], 0) << "expert 3 should be empty";

    // Determinism: a second run gives the same bits.
    const RouterOutput again =
        moe_router_forward(gpu, {.logits = glogits, .bias = to_gpu(bias), .config = cfg});
    ASSERT_TRUE(same_bits(to_cpu(got.topk_weight), again.topk_weight)) << "second run";
    ASSERT_TRUE(bitwise_equal(to_cpu(got.topk_idx), to_cpu(again.topk_idx))) << "second run";

    const Tensor dw = test::random_tensor({c.T, c.k}, DType::kF32, 77);
    const Tensor d_want = moe_router_backward(
        cpu, {.logits = logits, .topk_idx = want.topk_idx, .d_topk_weight = dw, .config = cfg});
    poison_pool(gpu, 8 * logits.nbytes() + (1 << 20));
    const Tensor d_got = moe_router_backward(
        gpu,
        {.logits = glogits, .topk_idx = got.topk_idx, .d_topk_weight = to_gpu(dw), .config = cfg});
    ASSERT_TRUE(same_bits(d_want, d_got)) << "d_logits";
  }
}

const RouterCase kRouterCases[] = {
    {1, 8, 1, 1, 2, GroupMaskFill::kZero, TopkNorm::kSumToOne},
    {127, 8, 4, 2, 3, GroupMaskFill::kZero, TopkNorm::kNone},
    {127, 32, 4, 2, 4, GroupMaskFill::kExclude, TopkNorm::kSumToOne},
    {1481, 32, 1, 1, 8, GroupMaskFill::kZero, TopkNorm::kSumToOne},
    {1, 256, 8, 4, 8, GroupMaskFill::kZero, TopkNorm::kSumToOne},  // DeepSeek-V3
    {127, 256, 8, 4, 8, GroupMaskFill::kZero, TopkNorm::kSumToOne},
    {1481, 256, 8, 4, 8, GroupMaskFill::kZero, TopkNorm::kSumToOne},
    {1481, 256, 8, 4, 8, GroupMaskFill::kExclude, TopkNorm::kNone},
    {129, 64, 32, 3, 6, GroupMaskFill::kZero, TopkNorm::kSumToOne},
    {257, 1024, 8, 4, 32, GroupMaskFill::kExclude, TopkNorm::kSumToOne},
    {31, 10, 5, 5, 10, GroupMaskFill::kZero, TopkNorm::kSumToOne},  // k == E
    // More tokens than the forward's grid has warps (each block strides over several tokens and
    // flushes its shared histogram once), at the baseline configuration's 32 experts, top-4.
    {9001, 32, 1, 1, 4, GroupMaskFill::kZero, TopkNorm::kSumToOne},
};

INSTANTIATE_TEST_SUITE_P(Shapes, MoeRouterGpu, ::testing::ValuesIn(kRouterCases));

TEST(MoeRouterGpuMisc, ZeroTokens) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  RouterConfig cfg = config_of({0, 16, 4, 2, 4, GroupMaskFill::kZero, TopkNorm::kSumToOne});
  const RouterOutput got =
      moe_router_forward(gpu, {.logits = Tensor::empty(gpu, {0, 16}, DType::kF32),
                               .bias = to_gpu(make_bias(16, 1)),
                               .config = cfg});
  EXPECT_EQ(got.topk_idx.shape(), (Shape{0, 4}));
  const Tensor counts = to_cpu(got.counts);
  for (int e = 0; e < 16; ++e) EXPECT_EQ(counts.data_as<int32_t>()[e], 0) << "expert " << e;
}

TEST(MoeRouterGpuMisc, BiasUpdateMatchesCpu) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  for (int64_t E : {1, 8, 256, 1000, 3000}) {
    Tensor bias = make_bias(E, 3);
    Tensor counts = Tensor::empty({E}, DType::kI32);
    std::mt19937_64 rng(E);
    for (int64_t e = 0; e < E; ++e) counts.data_as<int32_t>()[e] = static_cast<int32_t>(rng() % 9);
    if (E >= 8) counts.data_as<int32_t>()[5] = 0;
    Tensor gbias = to_gpu(bias);
    moe_router_bias_update(cpu, {.bias = bias, .counts = counts, .rate = 1e-3f});
    moe_router_bias_update(gpu, {.bias = gbias, .counts = to_gpu(counts), .rate = 1e-3f});
    ASSERT_TRUE(bitwise_equal(bias, to_cpu(gbias))) << "E = " << E;
  }
}

TEST(MoeRouterGpuMisc, SeqBalanceLossMatchesCpuBitwise) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  struct Case {
    int64_t B, T, E, n_group, topk_group, k;
  };
  for (const Case c :
       {Case{1, 1, 8, 1, 1, 2}, Case{3, 127, 32, 4, 2, 4}, Case{2, 1481, 256, 8, 4, 8},
        Case{7, 33, 64, 8, 2, 6},
        // The baseline configuration (8 sequences of 2048, 32 experts top-4): many
        // tiles per sequence; 1024 experts (7-token tiles); E < 32 and tiles that
        // straddle sequences.
        Case{8, 2048, 32, 1, 1, 4}, Case{1, 300, 1024, 8, 4, 8}, Case{5, 65, 16, 1, 1, 4}}) {
    SCOPED_TRACE("B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) +
                 " E=" + std::to_string(c.E));
    const RouterConfig cfg = config_of(
        {c.B * c.T, c.E, c.n_group, c.topk_group, c.k, GroupMaskFill::kZero, TopkNorm::kSumToOne});
    const Tensor logits = make_logits(c.B * c.T, c.E, Logits::kGaussian, 55 + c.T);
    const RouterOutput r =
        moe_router_forward(cpu, {.logits = logits, .bias = make_bias(c.E, 56), .config = cfg});
    const SeqBalanceLossArgs a{
        .logits = logits, .topk_idx = r.topk_idx, .num_sequences = c.B, .alpha = 1e-3f};
    const SeqBalanceLossArgs ga{.logits = to_gpu(logits),
                                .topk_idx = to_gpu(r.topk_idx),
                                .num_sequences = c.B,
                                .alpha = 1e-3f};
    ASSERT_TRUE(bitwise_equal(moe_seq_balance_loss_forward(cpu, a),
                              to_cpu(moe_seq_balance_loss_forward(gpu, ga))))
        << "loss";
    Tensor d = test::random_tensor({c.B * c.T, c.E}, DType::kF32, 57);
    Tensor gd = to_gpu(d);
    moe_seq_balance_loss_backward(cpu, a, 0.5f, d);
    moe_seq_balance_loss_backward(gpu, ga, 0.5f, gd);
    ASSERT_TRUE(bitwise_equal(d, to_cpu(gd))) << "d_logits (+=)";
  }
}

}  // namespace
}  // namespace octet
